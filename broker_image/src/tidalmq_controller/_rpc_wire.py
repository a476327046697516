"""The controller RPC (the controller decides and pushes, brokers report).

Brokers call the controller: register, heartbeat (what opened and closed since the last answered
heartbeat), report closed, opened and lost partitions (many per request), fetch the metadata
they miss, and forward admin requests (topics, configs, producer ids, reassignments). The
controller calls brokers: push the metadata batches after the version each holds (a snapshot
when it is too far behind). Both directions are HTTP (aiohttp); in a single process the same
client interface calls the Controller directly, so the broker code does not know which it has.

The controller's HTTP server runs on a thread of its own (its liveness thread): heartbeats are
answered there, from the membership table, whatever the controller's event loop is doing; every
other request is read there and handled on the controller's loop.

Brokers of the earlier protocol (no "protocol" in their registration: a rolling upgrade) still
work: they send full heartbeats and one report per request, and read the whole metadata
document (GET /v1/metadata) when a heartbeat answer says theirs is old.

Exceptions cross the wire by name and are rebuilt from an explicit registry.

Every call but /healthz and /metrics carries a control token, both ways (`_control_auth.py`,
tidalmq_core.control_auth): brokers present their own broker token to the controller, and the
controller presents each broker's token when it pushes to that broker. With control-plane mTLS
(tidalmq_core.control_tls) both directions also go over TLS with client certificates: the server
asks for one, and its role must allow the token presented.

This module: the wire format, the JSON documents both sides exchange.

Owns: the protocol version (`PROTOCOL`), the registry of exceptions that cross the wire by name
(`encode_error`/`decode_error`: only the classes listed are rebuilt, anything else arrives as a
ControllerError), the refusals of a control token (`ControlRefused`), and the documents of
heartbeats, partition reports, topic results, ACL filters and accepted data losses.

Must not touch: connections or sessions (it only reads an answer it is handed), nor the
controller's state. The broker's client (_rpc_client.py) and the controller's server
(_rpc_server.py) both stand on this module; it imports neither.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
from tidalmq_core import acls
from tidalmq_core.acls import AclBindingFilter
from tidalmq_core.metadata import DataLoss
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, NoReassignmentInProgress
from tidalmq_core.topics import InvalidConfig, InvalidPartitions, InvalidTopic, StaticConfig

from tidalmq_controller._data_loss import AcceptedLoss
from tidalmq_controller._errors import (
    ControllerError,
    ControllerFenced,
    ForeignStore,
    InternalTopic,
    InvalidReplicaAssignment,
    NoBrokers,
    TopicAlreadyExists,
    UnknownBroker,
    UnknownTopic,
    UnsupportedFeatureLevel,
)
from tidalmq_controller._membership import Heartbeat
from tidalmq_controller._topics import TopicResult

PROTOCOL = 2  # metadata as batches of records, heartbeats of changes, batched reports


_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        ControllerError,
        TopicAlreadyExists,
        UnknownTopic,
        NoBrokers,
        ControllerFenced,
        UnknownBroker,
        InvalidReplicaAssignment,
        ForeignStore,
        UnsupportedFeatureLevel,
        InternalTopic,
        InvalidTopic,
        InvalidPartitions,
        InvalidConfig,
        StaticConfig,
        InvalidPlan,
        NoReassignmentInProgress,
    )
}


class ControllerUnavailable(ControllerError):
    """The controller could not be reached (the broker retries)."""


class ControlRefused(ControllerError):
    """The controller refused the control token (401) or what it may do (403)."""


def blocking_refusal(status: int, body: bytes, who: str) -> ControlRefused:
    """A 401/403 answer read with http.client (the liveness thread's heartbeats)."""
    try:
        detail = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        detail = ""
    return ControlRefused(f"{who} refused the control token ({status}): {detail}"[:300])


async def refusal(resp: aiohttp.ClientResponse, who: str) -> ControlRefused:
    try:
        detail = str((await resp.json(content_type=None)).get("error", ""))
    except (ValueError, aiohttp.ClientError):
        detail = ""
    return ControlRefused(f"{who} refused the control token ({resp.status}): {detail}"[:300])


def encode_error(exc: Exception | None) -> dict[str, str] | None:
    if exc is None:
        return None
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "ControllerError"
    return {"type": name, "message": str(exc)}


def decode_error(doc: dict[str, str] | None) -> Exception | None:
    if doc is None:
        return None
    return _ERRORS.get(doc["type"], ControllerError)(doc["message"])


def filter_doc(f: AclBindingFilter) -> list[Any]:
    return [
        int(f.resource_type),
        f.name,
        int(f.pattern_type),
        f.principal,
        f.host,
        int(f.operation),
        int(f.permission),
    ]


def filter_from(doc: list[Any]) -> AclBindingFilter:
    rt, name, pt, principal, host, op, perm = doc
    return AclBindingFilter(
        acls.resource_type(int(rt)),
        None if name is None else str(name),
        acls.pattern_type(int(pt)),
        None if principal is None else str(principal),
        None if host is None else str(host),
        acls.operation(int(op)),
        acls.permission_type(int(perm)),
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tp_from(doc: dict[str, Any]) -> TopicPartition:
    return TopicPartition(doc["topic"], int(doc["partition"]))


def tp_doc(tp: TopicPartition) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition}


def result_doc(r: TopicResult) -> dict[str, Any]:
    return {
        "name": r.name,
        "error": encode_error(r.error),
        "topic_id": r.topic_id,
        "num_partitions": r.num_partitions,
        "configs": r.configs,
    }


def result_from(doc: dict[str, Any]) -> TopicResult:
    return TopicResult(
        doc["name"],
        decode_error(doc["error"]),
        doc["topic_id"],
        doc["num_partitions"],
        doc["configs"],
    )


Floors = dict[TopicPartition, tuple[str, int]]  # (topic id, high watermark) that changed


def _floors_doc(floors: Floors | None) -> list[list[Any]]:
    return [[tp.topic, tp.partition, tid, hwm] for tp, (tid, hwm) in (floors or {}).items()]


def _floors(doc: list[list[Any]] | None) -> Floors:
    return {TopicPartition(t, int(p)): (str(tid), int(h)) for t, p, tid, h in doc or []}


def accepted_doc(a: AcceptedLoss) -> dict[str, Any]:
    return {
        "partition": a.partition,
        "continues_at": a.continues_at,
        "given_up": a.given_up,
        "loss": None if a.loss is None else a.loss.to_json(),
    }


def _pairs(doc: list[list[Any]] | None) -> dict[TopicPartition, int | None]:
    return {TopicPartition(t, int(p)): (None if v is None else int(v)) for t, p, v in doc or []}


def _pairs_doc(changes: dict[TopicPartition, int | None]) -> list[list[Any]]:
    return [[tp.topic, tp.partition, v] for tp, v in changes.items()]


def heartbeat_doc(beat: Heartbeat) -> dict[str, Any]:
    return {
        "broker_id": beat.broker_id,
        "incarnation": beat.incarnation,
        "applied_version": beat.applied_version,
        "protocol": PROTOCOL,
        "full": beat.full,
        "open": _pairs_doc(beat.open),
        "hwm": _pairs_doc(beat.hwm),
        "floors": _floors_doc(beat.floors),
    }


def heartbeat_from(doc: dict[str, Any]) -> Heartbeat:
    """A heartbeat from its JSON; one without "protocol" (an earlier broker) lists everything
    it has open."""
    full = bool(doc.get("full", True)) if doc.get("protocol") else True
    return Heartbeat(
        int(doc["broker_id"]),
        str(doc["incarnation"]),
        int(doc["applied_version"]),
        _pairs(doc.get("open")),
        full=full,
        hwm=_pairs(doc.get("hwm")),
        floors=_floors(doc.get("floors")),
    )


def report_doc(
    kind: str,
    tp: TopicPartition,
    epoch: int,
    *,
    topic_id: str | None = None,
    high_watermark: int | None = None,
    loss: DataLoss | None = None,
    stored: bool = True,
) -> dict[str, Any]:
    """One partition report. `stored`: an opened partition's checkpoint is in the store (a new
    one's is written with its first data, and reported opened again then). Keys without a value
    are left out (None, stored True: what `Controller.partitions_reported` assumes when absent):
    a creation's reports are thousands at a time."""
    doc: dict[str, Any] = {
        "kind": kind,
        "topic": tp.topic,
        "partition": tp.partition,
        "epoch": epoch,
    }
    if topic_id is not None:
        doc["topic_id"] = topic_id
    if high_watermark is not None:
        doc["high_watermark"] = high_watermark
    if loss is not None:
        doc["loss"] = loss.to_json()
    if not stored:
        doc["stored"] = False
    return doc
