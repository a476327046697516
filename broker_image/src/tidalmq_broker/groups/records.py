"""The records the group coordinator writes to `__consumer_offsets`.

Keys and values are small versioned JSON documents (internal: no client reads them). A key names
either a committed offset (group, topic, partition) or a group's membership; a record with a null
value deletes its key. Replaying a partition from its log start in offset order rebuilds every
group it holds, and a snapshot is just the live keys written again.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

FORMAT = 1


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class TxnOffsetKey:
    """An offset committed inside a transaction (TxnOffsetCommit): pending until the
    transaction's marker reaches this partition (commit: it becomes the group's offset; abort:
    it is dropped). Replay settles it at the marker, as the live coordinator does."""

    producer_id: int
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes  # metadata of the chosen protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str | None
    generation: int
    protocol_name: str | None
    leader: str | None
    members: tuple[MemberValue, ...]
    state_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupValue:
    """A group of the consumer group protocol (KIP-848), stored whole under its GroupKey (a
    group id is one kind of group or the other): the document of
    groups/consumer_groups.py's `group_document`, which also reads it back."""

    document: dict[str, Any]


Key = OffsetKey | GroupKey | TxnOffsetKey
Value = OffsetValue | GroupValue | ConsumerGroupValue


def encode_key(key: Key) -> bytes:
    if isinstance(key, OffsetKey):
        doc: dict[str, Any] = {"v": FORMAT, "k": "offset", "g": key.group, "t": key.topic}
        doc["p"] = key.partition
    elif isinstance(key, TxnOffsetKey):
        doc = {"v": FORMAT, "k": "txn_offset", "pid": key.producer_id, "g": key.group}
        doc["t"], doc["p"] = key.topic, key.partition
    else:
        doc = {"v": FORMAT, "k": "group", "g": key.group}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode_key(data: bytes) -> Key:
    doc = json.loads(data)
    if doc["k"] == "offset":
        return OffsetKey(doc["g"], doc["t"], int(doc["p"]))
    if doc["k"] == "group":
        return GroupKey(doc["g"])
    if doc["k"] == "txn_offset":
        return TxnOffsetKey(int(doc["pid"]), doc["g"], doc["t"], int(doc["p"]))
    raise ValueError(f"unknown __consumer_offsets key kind {doc['k']!r}")


def encode_value(value: Value | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, OffsetValue):
        doc: dict[str, Any] = {
            "v": FORMAT,
            "o": value.offset,
            "e": value.leader_epoch,
            "m": value.metadata,
            "ts": value.commit_timestamp_ms,
        }
    elif isinstance(value, ConsumerGroupValue):
        doc = {"v": FORMAT, "type": "consumer", "group": value.document}
    else:
        doc = {
            "v": FORMAT,
            "pt": value.protocol_type,
            "gen": value.generation,
            "pn": value.protocol_name,
            "leader": value.leader,
            "ts": value.state_timestamp_ms,
            "members": [
                {
                    "id": m.member_id,
                    "iid": m.group_instance_id,
                    "cid": m.client_id,
                    "host": m.client_host,
                    "st": m.session_timeout_ms,
                    "rt": m.rebalance_timeout_ms,
                    "sub": base64.b64encode(m.subscription).decode(),
                    "asg": base64.b64encode(m.assignment).decode(),
                }
                for m in value.members
            ],
        }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_value(key: Key, data: bytes | None) -> Value | None:
    if data is None:
        return None
    doc = json.loads(data)
    if isinstance(key, OffsetKey | TxnOffsetKey):
        return OffsetValue(int(doc["o"]), int(doc["e"]), doc["m"], int(doc["ts"]))
    if doc.get("type") == "consumer":
        return ConsumerGroupValue(doc["group"])
    return GroupValue(
        protocol_type=doc["pt"],
        generation=int(doc["gen"]),
        protocol_name=doc["pn"],
        leader=doc["leader"],
        state_timestamp_ms=int(doc["ts"]),
        members=tuple(
            MemberValue(
                member_id=m["id"],
                group_instance_id=m["iid"],
                client_id=m["cid"],
                client_host=m["host"],
                session_timeout_ms=int(m["st"]),
                rebalance_timeout_ms=int(m["rt"]),
                subscription=base64.b64decode(m["sub"]),
                assignment=base64.b64decode(m["asg"]),
            )
            for m in doc["members"]
        ),
    )


def marker_is_commit(raw_key: bytes) -> bool | None:
    """The type of a control record's key (int16 version, int16 type: 0 abort, 1 commit);
    None when it is not a transaction marker."""
    if len(raw_key) < 4:
        return None
    kind = int.from_bytes(raw_key[2:4], "big", signed=True)
    return {0: False, 1: True}.get(kind)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as Kafka uses to place groups."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_group(group_id: str, partitions: int) -> int:
    """Kafka's `Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions
