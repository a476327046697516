"""Snapshots of the cluster metadata image: JSON lines, written and read in small pieces.

A snapshot is the image after batch `version` of the metadata log. It is written as lines of
JSON so that no single encode or decode call runs long (a Python thread holding the GIL in one
long C call would stall the event loop beside it): a header line (everything but the topics),
then per topic a line with its fields and lines of at most CHUNK partitions each. A partition
is a short array in the common case (one replica, not moving, nothing lost):
`[replica, leader, epoch, created, floor]`; any other partition is its full JSON object.
The header holds the SCRAM credentials (salted) and the ACL bindings when there are any, and a
broker's listeners when it has more than one PLAINTEXT listener: all optional, so snapshots
written before them read as they were (no credentials, no ACLs; one PLAINTEXT listener per
broker).

`roll` makes the next snapshot from the previous one and the batches after it, without the
controller's live image: the controller runs it in a worker thread while it goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from tidalmq_core.acls import acls_from, acls_json
from tidalmq_core.metadata import (
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicInfo,
    brokers_features_json,
    controllers_features_from_json,
    controllers_features_json,
    load_brokers_features,
    scram_credentials_from,
    scram_credentials_json,
)
from tidalmq_core.records import Record, apply_batch
from tidalmq_core.static_mapping import StaticTopicState

FORMAT = 1
CHUNK = 2000  # partitions per line

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class SnapshotError(ValueError):
    """A snapshot that cannot be read (corrupt, or of an unknown format)."""


def _compact(part: PartitionState) -> Any:
    if (
        len(part.replicas) == 1
        and part.original_replicas is None
        and part.target_replicas is None
        and part.move_started_ms is None
        and part.lost is None
        and part.accepted_from is None
    ):
        return [
            part.replicas[0],
            part.leader,
            part.leader_epoch,
            int(part.created),
            part.end_offset_floor,
        ]
    return part.to_json()


def _expand(row: Any) -> PartitionState:
    if isinstance(row, list):
        replica, leader, epoch, created, floor = row
        return PartitionState(
            leader, epoch, [replica], created=bool(created), end_offset_floor=floor
        )
    return PartitionState.from_json(row)


def encode(meta: ClusterMetadata) -> Iterator[bytes]:
    """The snapshot of `meta` as lines (each ending in a newline)."""
    header = {
        "format": FORMAT,
        "cluster_id": meta.cluster_id,
        "controller_epoch": meta.controller_epoch,
        "version": meta.version,
        "brokers": [b.to_json() for _, b in sorted(meta.brokers.items())],
        "next_producer_id": meta.next_producer_id,
        "pending_deletions": [list(d) for d in meta.pending_deletions],
        "broker_configs": {k: dict(v) for k, v in sorted(meta.broker_configs.items())},
        "static_topics": {k: v.to_json() for k, v in sorted(meta.static_topics.items())},
        "store_marker": meta.store_marker,
        "topics": len(meta.topics),
    }
    if meta.scram_credentials:  # optional: snapshots without it (older ones) hold none
        header["scram_credentials"] = scram_credentials_json(meta.scram_credentials)
    if meta.acls:  # the same
        header["acls"] = acls_json(meta.acls)
    if meta.features:  # the same: absent while every feature is at its default
        header["features"] = dict(sorted(meta.features.items()))
    supported = brokers_features_json(meta.brokers)
    if supported:  # the same: absent while no broker sent them (older builds)
        header["broker_features"] = supported
    if meta.controllers:  # the same: absent while no controller registered its levels
        header["controller_features"] = controllers_features_json(meta.controllers)
    yield _dumps(header).encode() + b"\n"
    for name, topic in sorted(meta.topics.items()):
        yield (
            _dumps(
                {
                    "topic": name,
                    "id": topic.topic_id,
                    "configs": topic.configs,
                    "internal": topic.internal,
                    "kind": topic.kind,
                    "count": len(topic.partitions),
                }
            ).encode()
            + b"\n"
        )
        parts = topic.partitions
        for start in range(0, len(parts), CHUNK):
            rows = [_compact(p) for p in parts[start : start + CHUNK]]
            yield _dumps({"n": name, "from": start, "rows": rows}).encode() + b"\n"


def encode_bytes(meta: ClusterMetadata) -> bytes:
    return b"".join(encode(meta))


def decode(data: bytes | memoryview) -> ClusterMetadata:
    """The image a snapshot holds. Raises SnapshotError."""
    lines = bytes(data).split(b"\n")
    try:
        header = json.loads(lines[0])
        if header.get("format") != FORMAT:
            raise SnapshotError(f"unknown snapshot format {header.get('format')!r}")
        meta = ClusterMetadata(
            cluster_id=header["cluster_id"],
            controller_epoch=int(header["controller_epoch"]),
            version=int(header["version"]),
            brokers={int(b["broker_id"]): BrokerInfo.from_json(b) for b in header["brokers"]},
            next_producer_id=int(header["next_producer_id"]),
            pending_deletions=[(n, i) for n, i in header["pending_deletions"]],
            broker_configs={k: dict(v) for k, v in header["broker_configs"].items()},
            static_topics={
                k: StaticTopicState.from_json(v) for k, v in header["static_topics"].items()
            },
            store_marker=bool(header["store_marker"]),
            scram_credentials=scram_credentials_from(header.get("scram_credentials") or {}),
            acls=acls_from(header.get("acls") or []),
            features={str(k): int(v) for k, v in (header.get("features") or {}).items()},
            controllers=controllers_features_from_json(header.get("controller_features")),
        )
        load_brokers_features(meta.brokers, header.get("broker_features"))
        counts: dict[str, int] = {}
        for line in lines[1:]:
            if not line:
                continue
            doc = json.loads(line)
            if "topic" in doc:
                meta.topics[doc["topic"]] = TopicInfo(
                    name=doc["topic"],
                    topic_id=doc["id"],
                    partitions=[],
                    configs=dict(doc["configs"]),
                    internal=bool(doc["internal"]),
                    kind=str(doc["kind"]),
                )
                counts[doc["topic"]] = int(doc["count"])
                continue
            topic = meta.topics[doc["n"]]
            if doc["from"] != len(topic.partitions):
                raise SnapshotError(f"topic {doc['n']}: partitions out of order")
            topic.partitions.extend(_expand(row) for row in doc["rows"])
        if len(meta.topics) != header["topics"]:
            raise SnapshotError(
                f"snapshot names {header['topics']} topics but holds {len(meta.topics)}"
            )
        for name, topic in meta.topics.items():
            if len(topic.partitions) != counts[name]:
                raise SnapshotError(
                    f"topic {name}: snapshot names {counts[name]} partitions but holds "
                    f"{len(topic.partitions)}"
                )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"corrupt snapshot: {exc}") from exc
    return meta


def roll(
    previous: bytes | None,
    batches: Iterable[tuple[int, list[Record]]],
    empty: ClusterMetadata | None = None,
) -> bytes:
    """The snapshot after `batches` ((version, records) in order) applied to the `previous`
    snapshot (None: to `empty`, a new cluster's image)."""
    if previous is not None:
        meta = decode(previous)
    elif empty is not None:
        meta = empty
    else:
        raise SnapshotError("no snapshot to roll from")
    for version, records in batches:
        if version <= meta.version:
            continue
        apply_batch(meta, records, version)
    return encode_bytes(meta)
