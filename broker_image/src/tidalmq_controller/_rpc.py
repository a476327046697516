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
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from tidalmq_core import acls, updates
from tidalmq_core.acls import AclBinding, AclBindingFilter
from tidalmq_core.control_auth import ControlAuth, authorization
from tidalmq_core.control_tls import ControlTls, server_is_admin, server_is_broker
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata, DataLoss
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, NoReassignmentInProgress, PlanEntry
from tidalmq_core.topics import InvalidConfig, InvalidPartitions, InvalidTopic, StaticConfig

from tidalmq_controller import _controller as ctl
from tidalmq_controller._acls import AclCreateResult, AclDeleteResult
from tidalmq_controller._control_auth import PRINCIPAL, refuse_other_broker
from tidalmq_controller._control_auth import middleware as control_auth_middleware
from tidalmq_controller._errors import InternalTopic
from tidalmq_controller._log import Batch
from tidalmq_controller._membership import Heartbeat, HeartbeatReply
from tidalmq_controller._scram_credentials import (
    ScramAlterResult,
    ScramDeletion,
    ScramUpsertion,
)
from tidalmq_controller._static_topics_http import add_static_topic_routes

# A broker's view of the controller's liveness path: from sending a heartbeat to its answer.
HEARTBEAT_SECONDS = Histogram(
    "tidalmq_broker_heartbeat_seconds",
    "Time from sending a heartbeat to the controller to its answer (as the broker sees it)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)

log = logging.getLogger(__name__)

PROTOCOL = 2  # metadata as batches of records, heartbeats of changes, batched reports
# requests the liveness thread answers itself (everything else runs on the controller's loop)
_LIVENESS_PATHS = frozenset({"/v1/brokers/heartbeat", "/healthz", "/metrics"})

_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        ctl.ControllerError,
        ctl.TopicAlreadyExists,
        ctl.UnknownTopic,
        ctl.NoBrokers,
        ctl.ControllerFenced,
        ctl.UnknownBroker,
        ctl.InvalidReplicaAssignment,
        ctl.ForeignStore,
        InternalTopic,
        InvalidTopic,
        InvalidPartitions,
        InvalidConfig,
        StaticConfig,
        InvalidPlan,
        NoReassignmentInProgress,
    )
}


class ControllerUnavailable(ctl.ControllerError):
    """The controller could not be reached (the broker retries)."""


class ControlRefused(ctl.ControllerError):
    """The controller refused the control token (401) or what it may do (403)."""


def _blocking_refusal(status: int, body: bytes, who: str) -> ControlRefused:
    """A 401/403 answer read with http.client (the liveness thread's heartbeats)."""
    try:
        detail = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        detail = ""
    return ControlRefused(f"{who} refused the control token ({status}): {detail}"[:300])


async def _refusal(resp: aiohttp.ClientResponse, who: str) -> ControlRefused:
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
    return _ERRORS.get(doc["type"], ctl.ControllerError)(doc["message"])


def _filter_doc(f: AclBindingFilter) -> list[Any]:
    return [
        int(f.resource_type),
        f.name,
        int(f.pattern_type),
        f.principal,
        f.host,
        int(f.operation),
        int(f.permission),
    ]


def _filter_from(doc: list[Any]) -> AclBindingFilter:
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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _tp(doc: dict[str, Any]) -> TopicPartition:
    return TopicPartition(doc["topic"], int(doc["partition"]))


def _tp_doc(tp: TopicPartition) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition}


def _result_doc(r: ctl.TopicResult) -> dict[str, Any]:
    return {
        "name": r.name,
        "error": encode_error(r.error),
        "topic_id": r.topic_id,
        "num_partitions": r.num_partitions,
        "configs": r.configs,
    }


def _result(doc: dict[str, Any]) -> ctl.TopicResult:
    return ctl.TopicResult(
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


def _accepted_doc(a: ctl.AcceptedLoss) -> dict[str, Any]:
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


class ControllerClient(Protocol):
    async def register_broker(self, info: BrokerInfo, channel: Any) -> int: ...
    async def beat(self, heartbeat: Heartbeat) -> HeartbeatReply: ...
    def beat_blocking(self, heartbeat: Heartbeat) -> HeartbeatReply:
        """A heartbeat from a thread of the broker's own (its liveness thread): never waits
        for the broker's event loop."""
        ...

    async def report(self, broker_id: int, reports: list[dict[str, Any]]) -> None: ...
    async def fetch_update(self, since: int) -> updates.MetadataUpdate: ...
    async def fetch_metadata(self) -> ClusterMetadata: ...
    async def create_topics(
        self, topics: list[ctl.NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[ctl.TopicResult]: ...
    async def delete_topics(self, names: list[str]) -> list[ctl.TopicResult]: ...
    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> ctl.TopicResult: ...
    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> ctl.TopicResult: ...
    async def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> Exception | None: ...
    async def allocate_producer_id(self) -> int: ...
    async def ensure_transaction_state_topic(self) -> None: ...
    async def forward_txn_markers(self, broker_id: int, doc: dict[str, Any]) -> dict[str, Any]: ...
    async def forward_txn_verification(
        self, broker_id: int, doc: dict[str, Any]
    ) -> dict[str, Any]: ...
    async def alter_reassignments(
        self, entries: list[PlanEntry]
    ) -> dict[TopicPartition, Exception | None]: ...
    async def list_reassignments(
        self, tps: list[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]: ...
    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool: ...
    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None: ...
    async def alter_scram_credentials(
        self, deletions: list[ScramDeletion], upsertions: list[ScramUpsertion]
    ) -> tuple[list[ScramAlterResult], int]: ...
    async def create_acls(
        self, bindings: list[AclBinding]
    ) -> tuple[list[AclCreateResult], int]: ...
    async def delete_acls(
        self, filters: list[AclBindingFilter]
    ) -> tuple[list[AclDeleteResult], int]: ...


class LocalControllerClient:
    """The client interface over a Controller in the same process."""

    def __init__(self, controller: ctl.Controller) -> None:
        self.controller = controller

    async def register_broker(self, info: BrokerInfo, channel: Any) -> int:
        return await self.controller.register_broker(info, channel)

    async def beat(self, heartbeat: Heartbeat) -> HeartbeatReply:
        return self.controller.beat(heartbeat)

    def beat_blocking(self, heartbeat: Heartbeat) -> HeartbeatReply:
        return self.controller.beat(heartbeat)  # safe from any thread

    async def report(self, broker_id: int, reports: list[dict[str, Any]]) -> None:
        self.controller.partitions_reported(broker_id, reports)

    async def fetch_update(self, since: int) -> updates.MetadataUpdate:
        base, snapshot, batches = self.controller.update_for(since)
        return updates.MetadataUpdate(base, snapshot, [(b.version, b.records) for b in batches])

    async def fetch_metadata(self) -> ClusterMetadata:
        return self.controller.snapshot()

    async def create_topics(
        self, topics: list[ctl.NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[ctl.TopicResult]:
        return await self.controller.create_topics(
            topics, validate_only=validate_only, wait_s=wait_s
        )

    async def delete_topics(self, names: list[str]) -> list[ctl.TopicResult]:
        return await self.controller.delete_topics(names)

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> ctl.TopicResult:
        return await self.controller.create_partitions(
            name, total, validate_only=validate_only, assignment=assignment
        )

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> ctl.TopicResult:
        return await self.controller.alter_topic_configs(
            name, changes, incremental=incremental, validate_only=validate_only
        )

    async def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> Exception | None:
        return await self.controller.alter_broker_configs(
            scope, changes, incremental=incremental, validate_only=validate_only
        )

    async def allocate_producer_id(self) -> int:
        return await self.controller.allocate_producer_id()

    async def ensure_transaction_state_topic(self) -> None:
        await self.controller.ensure_transaction_state_topic(wait_s=5.0)

    async def forward_txn_markers(self, broker_id: int, doc: dict[str, Any]) -> dict[str, Any]:
        # an embedded controller serves one broker, which leads every partition it can reach
        raise ControllerUnavailable(f"no channel to broker {broker_id} from an embedded controller")

    async def forward_txn_verification(self, broker_id: int, doc: dict[str, Any]) -> dict[str, Any]:
        raise ControllerUnavailable(f"no channel to broker {broker_id} from an embedded controller")

    async def alter_reassignments(
        self, entries: list[PlanEntry]
    ) -> dict[TopicPartition, Exception | None]:
        return await self.controller.alter_reassignments(entries)

    async def list_reassignments(
        self, tps: list[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]:
        return self.controller.list_reassignments(tps)

    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool:
        return await self.controller.drain_broker(
            broker_id, timeout_s=timeout_s, incarnation=incarnation
        )

    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None:
        await self.controller.remove_broker(broker_id, incarnation=incarnation)

    async def alter_scram_credentials(
        self, deletions: list[ScramDeletion], upsertions: list[ScramUpsertion]
    ) -> tuple[list[ScramAlterResult], int]:
        return await self.controller.alter_scram_credentials(deletions, upsertions)

    async def create_acls(self, bindings: list[AclBinding]) -> tuple[list[AclCreateResult], int]:
        return await self.controller.create_acls(bindings)

    async def delete_acls(
        self, filters: list[AclBindingFilter]
    ) -> tuple[list[AclDeleteResult], int]:
        return await self.controller.delete_acls(filters)


class HttpControllerClient:
    """The client interface over HTTP, for brokers in other processes or pods."""

    HEARTBEAT_TIMEOUT_S = 2.0

    def __init__(
        self, base_url: str, *, token: str, timeout_s: float = 10.0, tls: ControlTls | None = None
    ) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = authorization(token)  # the broker's own token
        # control-plane mTLS: the broker's certificate, the cluster CA
        self._ssl: ssl.SSLContext | None = (
            tls.client_context(server_is_admin) if tls is not None else None
        )
        self._session: aiohttp.ClientSession | None = None
        # the heartbeats' own connection (http.client: no event loop involved), one at a time
        self._beat_conn: http.client.HTTPConnection | None = None
        self._beat_lock = threading.Lock()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, path: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        try:
            async with self._open().post(
                self._base + path, json=body or {}, timeout=timeout
            ) as resp:
                if resp.status in (401, 403):
                    raise await _refusal(resp, f"the controller at {self._base}")
                doc = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ControllerUnavailable(f"controller at {self._base} unreachable: {exc}") from exc
        if "fault" in doc:
            raise decode_error(doc["fault"]) or ctl.ControllerError("controller error")
        return doc

    async def register_broker(self, info: BrokerInfo, channel: Any) -> int:
        doc = await self._call("/v1/brokers/register", {**info.to_json(), "protocol": PROTOCOL})
        return int(doc["version"])

    async def beat(self, heartbeat: Heartbeat) -> HeartbeatReply:
        started = time.monotonic()
        doc = await self._call(
            "/v1/brokers/heartbeat", heartbeat_doc(heartbeat), timeout_s=self.HEARTBEAT_TIMEOUT_S
        )
        HEARTBEAT_SECONDS.observe(time.monotonic() - started)
        return HeartbeatReply(**doc["reply"])

    def beat_blocking(self, heartbeat: Heartbeat) -> HeartbeatReply:
        """One heartbeat over a kept-alive connection (from any thread, one at a time)."""
        with self._beat_lock:
            return self._beat_blocking(heartbeat)

    def _beat_blocking(self, heartbeat: Heartbeat) -> HeartbeatReply:
        body = json.dumps(heartbeat_doc(heartbeat)).encode()
        url = urlsplit(self._base)
        started = time.monotonic()
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more, anew
            conn = self._beat_conn
            if conn is None:
                host = url.hostname or "127.0.0.1"
                if url.scheme == "https":
                    conn = http.client.HTTPSConnection(
                        host, url.port or 443, timeout=self.HEARTBEAT_TIMEOUT_S, context=self._ssl
                    )
                else:
                    conn = http.client.HTTPConnection(
                        host, url.port or 80, timeout=self.HEARTBEAT_TIMEOUT_S
                    )
                self._beat_conn = conn
            try:
                conn.request(
                    "POST",
                    url.path.rstrip("/") + "/v1/brokers/heartbeat",
                    body,
                    {"Content-Type": "application/json", **self._headers},
                )
                resp = conn.getresponse()
                data = resp.read()
                if resp.status in (401, 403):
                    raise _blocking_refusal(resp.status, data, f"the controller at {self._base}")
                if resp.status >= 300 and not data.startswith(b"{"):
                    raise ControllerUnavailable(
                        f"controller at {self._base}: heartbeat answered {resp.status}"
                    )
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._beat_conn = None
                if attempt == 2 or time.monotonic() - started > self.HEARTBEAT_TIMEOUT_S / 2:
                    raise ControllerUnavailable(
                        f"controller at {self._base} unreachable: {exc!r}"
                    ) from exc
        doc = json.loads(data)
        if "fault" in doc:
            raise decode_error(doc["fault"]) or ctl.ControllerError("controller error")
        HEARTBEAT_SECONDS.observe(time.monotonic() - started)
        return HeartbeatReply(**doc["reply"])

    async def report(self, broker_id: int, reports: list[dict[str, Any]]) -> None:
        await self._call("/v1/partitions/reports", {"broker_id": broker_id, "reports": reports})

    async def fetch_update(self, since: int) -> updates.MetadataUpdate:
        try:
            async with self._open().get(
                f"{self._base}/v1/metadata/updates", params={"since": str(since)}
            ) as resp:
                if resp.status in (401, 403):
                    raise await _refusal(resp, f"the controller at {self._base}")
                resp.raise_for_status()
                data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ControllerUnavailable(f"controller at {self._base} unreachable: {exc}") from exc
        return updates.decode(data)

    async def data_loss(self) -> dict[str, Any]:
        """{"store_problem": str | None, "lost": [{topic, partition, loss...}]}"""
        doc: dict[str, Any] = await self._call("/v1/data-loss")
        return doc

    async def accept_data_loss(
        self, topic: str, partitions: list[int] | None = None
    ) -> list[dict[str, Any]]:
        doc = await self._call("/v1/data-loss/accept", {"topic": topic, "partitions": partitions})
        return list(doc["accepted"])

    async def fetch_metadata(self) -> ClusterMetadata:
        return ClusterMetadata.from_json((await self._call("/v1/metadata"))["metadata"])

    async def create_topics(
        self, topics: list[ctl.NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[ctl.TopicResult]:
        doc = await self._call(
            "/v1/topics/create",
            {
                "validate_only": validate_only,
                "wait_s": wait_s,
                "topics": [
                    {
                        "name": t.name,
                        "num_partitions": t.num_partitions,
                        "configs": t.configs,
                        "assignment": t.assignment,
                    }
                    for t in topics
                ],
            },
            timeout_s=wait_s + 10.0 if wait_s > 0 else None,
        )
        return [_result(r) for r in doc["results"]]

    async def delete_topics(self, names: list[str]) -> list[ctl.TopicResult]:
        doc = await self._call("/v1/topics/delete", {"names": names})
        return [_result(r) for r in doc["results"]]

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> ctl.TopicResult:
        doc = await self._call(
            "/v1/topics/partitions",
            {
                "name": name,
                "total": total,
                "validate_only": validate_only,
                "assignment": assignment,
            },
        )
        return _result(doc["result"])

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> ctl.TopicResult:
        doc = await self._call(
            "/v1/topics/configs",
            {
                "name": name,
                "changes": changes,
                "incremental": incremental,
                "validate_only": validate_only,
            },
        )
        return _result(doc["result"])

    async def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> Exception | None:
        doc = await self._call(
            "/v1/brokers/configs",
            {
                "scope": scope,
                "changes": changes,
                "incremental": incremental,
                "validate_only": validate_only,
            },
        )
        return decode_error(doc["error"])

    async def allocate_producer_id(self) -> int:
        return int((await self._call("/v1/producer-ids"))["producer_id"])

    async def ensure_transaction_state_topic(self) -> None:
        await self._call("/v1/transactions/state-topic", timeout_s=15.0)

    async def forward_txn_markers(self, broker_id: int, doc: dict[str, Any]) -> dict[str, Any]:
        """Markers for the partitions broker `broker_id` leads, through the controller (which
        holds every broker's control token; brokers hold only their own)."""
        return dict(
            await self._call("/v1/transactions/markers", {"broker_id": broker_id, "markers": doc})
        )

    async def forward_txn_verification(self, broker_id: int, doc: dict[str, Any]) -> dict[str, Any]:
        """KIP-890's verify-only question to the transaction coordinator on broker
        `broker_id`, through the controller as markers go."""
        return dict(
            await self._call("/v1/transactions/verify", {"broker_id": broker_id, "verify": doc})
        )

    async def alter_reassignments(
        self, entries: list[PlanEntry]
    ) -> dict[TopicPartition, Exception | None]:
        doc = await self._call(
            "/v1/reassignments/alter",
            {"entries": [{**_tp_doc(e.tp), "target": e.target} for e in entries]},
        )
        return {_tp(r): decode_error(r["error"]) for r in doc["results"]}

    async def list_reassignments(
        self, tps: list[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]:
        doc = await self._call(
            "/v1/reassignments/list",
            {"partitions": None if tps is None else [_tp_doc(tp) for tp in tps]},
        )
        return [(_tp(r), r["replicas"], r["adding"], r["removing"]) for r in doc["reassignments"]]

    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool:
        doc = await self._call(
            "/v1/brokers/drain",
            {
                "broker_id": broker_id,
                "timeout_s": timeout_s,
                "incarnation": incarnation,
            },
            timeout_s=timeout_s + 5,
        )
        return bool(doc["drained"])

    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None:
        await self._call("/v1/brokers/remove", {"broker_id": broker_id, "incarnation": incarnation})

    async def alter_scram_credentials(
        self, deletions: list[ScramDeletion], upsertions: list[ScramUpsertion]
    ) -> tuple[list[ScramAlterResult], int]:
        doc = await self._call(
            "/v1/scram-credentials/alter",
            {
                "deletions": [{"name": d.name, "mechanism": d.mechanism} for d in deletions],
                "upsertions": [
                    {
                        "name": u.name,
                        "mechanism": u.mechanism,
                        "iterations": u.iterations,
                        "salt": _b64(u.salt),
                        "salted_password": _b64(u.salted_password),
                    }
                    for u in upsertions
                ],
            },
        )
        results = [
            ScramAlterResult(r["user"], int(r["error_code"]), r.get("error_message"))
            for r in doc["results"]
        ]
        return results, int(doc["version"])

    async def create_acls(self, bindings: list[AclBinding]) -> tuple[list[AclCreateResult], int]:
        doc = await self._call("/v1/acls/create", {"bindings": [b.to_json() for b in bindings]})
        results = [
            AclCreateResult(int(r["error_code"]), r.get("error_message")) for r in doc["results"]
        ]
        return results, int(doc["version"])

    async def delete_acls(
        self, filters: list[AclBindingFilter]
    ) -> tuple[list[AclDeleteResult], int]:
        doc = await self._call("/v1/acls/delete", {"filters": [_filter_doc(f) for f in filters]})
        results = [
            AclDeleteResult(
                int(r["error_code"]),
                r.get("error_message"),
                [AclBinding.from_json(b) for b in r["deleted"]],
            )
            for r in doc["results"]
        ]
        return results, int(doc["version"])


class HttpBrokerChannel:
    """The controller's channel to a broker in another process: POST the batches it misses."""

    def __init__(self, control_url: str, session: aiohttp.ClientSession, token: str) -> None:
        self._url = control_url.rstrip("/") + "/v1/metadata/updates"
        self._session = session
        self._headers = authorization(token)  # that broker's own token

    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        body = b"".join(updates.encode(base, snapshot, [b.data for b in batches]))
        async with self._session.post(self._url, data=body, headers=self._headers) as resp:
            if resp.status in (401, 403):
                raise await _refusal(resp, f"the broker at {self._url}")
            resp.raise_for_status()
            doc = await resp.json()
        return int(doc["applied"])


class _Forwarded:
    """A request read on the liveness thread, handed to a handler on the controller's loop."""

    def __init__(self, request: web.Request, body: bytes) -> None:
        self.method = request.method
        self.path = request.path
        self.query = request.query
        self.match_info = request.match_info
        self.remote = request.remote
        self._principal = request.get(PRINCIPAL)
        self._body = body

    def get(self, key: str, default: Any = None) -> Any:
        return self._principal if key == PRINCIPAL and self._principal is not None else default

    @property
    def can_read_body(self) -> bool:
        return bool(self._body)

    async def read(self) -> bytes:
        return self._body

    async def json(self) -> Any:
        return json.loads(self._body)


class ControllerServer:
    """The controller's HTTP endpoints (plus status pages for the CLI and local cluster), on
    the controller's liveness thread. Every call but /healthz and /metrics needs a control token
    that `auth` accepts (_control_auth.py); there is no way to serve without one. With `tls`
    (control-plane mTLS) it serves HTTPS, every such call also needs a client certificate of the
    cluster CA, and its pushes to brokers present the controller's certificate."""

    def __init__(
        self, controller: ctl.Controller, auth: ControlAuth, tls: ControlTls | None = None
    ) -> None:
        self.controller = controller
        self.auth = auth
        self.tls = tls
        self.app = web.Application(
            client_max_size=256 * 1024 * 1024,
            middlewares=[
                control_auth_middleware(auth, require_certificate=tls is not None),
                self._on_controller_loop,
            ],
        )
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        r = self.app.router
        r.add_post("/v1/brokers/register", self._register)
        r.add_post("/v1/brokers/heartbeat", self._heartbeat)
        r.add_post("/v1/brokers/drain", self._drain)
        r.add_post("/v1/brokers/remove", self._remove)
        r.add_post("/v1/partitions/reports", self._reports)
        r.add_post("/v1/partitions/closed", self._closed)
        r.add_post("/v1/partitions/opened", self._opened)
        r.add_post("/v1/partitions/lost", self._lost)
        r.add_get("/v1/data-loss", self._data_loss)
        r.add_post("/v1/data-loss", self._data_loss)
        r.add_post("/v1/data-loss/accept", self._accept_data_loss)
        r.add_post("/v1/metadata", self._metadata)
        r.add_get("/v1/metadata", self._metadata)
        r.add_get("/v1/metadata/updates", self._updates)
        r.add_post("/v1/topics/create", self._create_topics)
        r.add_post("/v1/topics/delete", self._delete_topics)
        r.add_post("/v1/topics/partitions", self._create_partitions)
        r.add_post("/v1/topics/configs", self._alter_configs)
        r.add_post("/v1/brokers/configs", self._alter_broker_configs)
        r.add_post("/v1/scram-credentials/alter", self._alter_scram_credentials)
        r.add_post("/v1/acls/create", self._create_acls)
        r.add_post("/v1/acls/delete", self._delete_acls)
        r.add_post("/v1/producer-ids", self._producer_id)
        r.add_post("/v1/transactions/state-topic", self._txn_state_topic)
        r.add_post("/v1/transactions/markers", self._txn_markers)
        r.add_post("/v1/transactions/verify", self._txn_verify)
        r.add_post("/v1/reassignments/alter", self._alter_reassignments)
        r.add_post("/v1/reassignments/list", self._list_reassignments)
        r.add_get("/v1/moves", self._moves)
        r.add_post("/v1/rebalance", self._rebalance)
        r.add_get("/healthz", self._healthz)
        add_static_topic_routes(r, controller)
        r.add_get("/metrics", self._metrics)  # reassignment counts and durations (_moves.py)

    async def start(self, host: str, port: int) -> None:
        """Serve on the liveness thread; returns once the port is bound."""
        self._main_loop = asyncio.get_running_loop()
        # pushes to brokers run on the controller's loop: their session belongs there
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=10),
            connector=aiohttp.TCPConnector(
                ssl=self.tls.client_context(server_is_broker) if self.tls is not None else True
            ),
        )
        server_ssl = self.tls.server_context() if self.tls is not None else None
        bound: concurrent.futures.Future[int] = concurrent.futures.Future()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._thread_loop = loop
            asyncio.set_event_loop(loop)

            async def setup() -> int:
                self._runner = web.AppRunner(self.app, access_log=None)
                await self._runner.setup()
                site = web.TCPSite(
                    self._runner, host, port, reuse_address=True, ssl_context=server_ssl
                )
                await site.start()
                # an asyncio or a uvloop Server (AbstractServer declares no sockets)
                return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

            try:
                bound.set_result(loop.run_until_complete(setup()))
            except BaseException as exc:
                bound.set_exception(exc)
                loop.close()
                return
            try:
                loop.run_forever()
            finally:
                # setup() set the runner before the loop ran
                loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
                loop.close()

        self._thread = threading.Thread(target=serve, name="controller liveness", daemon=True)
        self._thread.start()
        self.port = await asyncio.wrap_future(bound)

    async def stop(self) -> None:
        loop, thread = self._thread_loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 10)
        if self._session is not None:
            await self._session.close()

    @web.middleware
    async def _on_controller_loop(
        self, request: web.Request, handler: Callable[[Any], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Heartbeats, health and metrics are answered here; the rest runs on the controller's
        loop (where the controller's state may change)."""
        if request.path in _LIVENESS_PATHS or self._main_loop is None:
            return await handler(request)
        body = await request.read()

        async def forwarded() -> web.StreamResponse:
            return await handler(_Forwarded(request, body))

        future = asyncio.run_coroutine_threadsafe(forwarded(), self._main_loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), 600)
        except TimeoutError:
            future.cancel()
            return self._fault(ctl.ControllerError("the controller did not answer in time"))

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        if request.method == "GET" or not request.can_read_body:
            return {}
        doc = await request.json()
        if not isinstance(doc, dict):
            raise web.HTTPBadRequest(text="the request body must be a JSON object")
        return doc

    @staticmethod
    def _ok(doc: dict[str, Any]) -> web.Response:
        return web.json_response(doc)

    @staticmethod
    def _fault(exc: Exception) -> web.Response:
        return web.json_response({"fault": encode_error(exc)})

    async def _register(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        protocol = int(body.pop("protocol", 1))
        info = BrokerInfo.from_json(body)
        refused = refuse_other_broker(request, info.broker_id)
        if refused is not None:
            return refused
        assert self._session is not None
        channel = (
            HttpBrokerChannel(
                info.control_url, self._session, self.auth.broker_token(info.broker_id)
            )
            if protocol >= 2
            else None
        )
        try:
            version = await self.controller.register_broker(info, channel)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        if protocol < 2:  # an earlier broker: the whole document, as it expects
            return self._ok({"metadata": self.controller.snapshot().to_json(), "version": version})
        return self._ok({"version": version})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        try:
            beat = heartbeat_from(await request.json())
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"bad heartbeat: {exc}"}, status=400)
        refused = refuse_other_broker(request, beat.broker_id)
        if refused is not None:
            return refused
        try:
            reply = self.controller.beat(beat)
        except ctl.ControllerError as exc:  # not the active controller: no lease from here
            return self._fault(exc)
        return self._ok({"reply": reply.to_json()})

    async def _reports(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        self.controller.partitions_reported(int(b["broker_id"]), list(b["reports"]))
        return self._ok({})

    async def _updates(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", "-1"))
        base, snapshot, batches = self.controller.update_for(since)
        body = b"".join(updates.encode(base, snapshot, [b.data for b in batches]))
        return web.Response(body=body, content_type="application/x-ndjson")

    async def _drain(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        try:
            drained = await self.controller.drain_broker(
                int(b["broker_id"]), timeout_s=float(b.get("timeout_s", 60))
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"drained": drained})

    async def _remove(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        await self.controller.remove_broker(int(b["broker_id"]), incarnation=b.get("incarnation"))
        return self._ok({})

    @staticmethod
    def _reported_end(b: dict[str, Any]) -> dict[str, Any]:
        hwm = b.get("high_watermark")
        return {"topic_id": b.get("topic_id"), "high_watermark": None if hwm is None else int(hwm)}

    async def _closed(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        self.controller.partition_closed(
            int(b["broker_id"]), _tp(b), int(b["epoch"]), **self._reported_end(b)
        )
        return self._ok({})

    async def _opened(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        self.controller.partition_opened(
            int(b["broker_id"]), _tp(b), int(b["epoch"]), **self._reported_end(b)
        )
        return self._ok({})

    async def _lost(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        try:
            await self.controller.partition_lost_data(
                int(b["broker_id"]), _tp(b), int(b["epoch"]), DataLoss.from_json(b["loss"])
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({})

    async def _data_loss(self, request: web.Request) -> web.Response:
        lost = self.controller.lost_partitions()
        return self._ok(
            {
                "store_problem": self.controller.store_problem,
                "lost": [
                    {**_tp_doc(tp), **loss.to_json(), "missing_offsets": loss.missing_offsets}
                    for tp, loss in sorted(lost.items())
                ],
            }
        )

    async def _accept_data_loss(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        partitions = b.get("partitions")
        try:
            accepted = await self.controller.accept_data_loss_detailed(
                str(b["topic"]), None if partitions is None else [int(p) for p in partitions]
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"accepted": [_accepted_doc(a) for a in accepted]})

    async def _metadata(self, request: web.Request) -> web.Response:
        return self._ok({"metadata": self.controller.snapshot().to_json()})

    async def _create_topics(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        topics = [
            ctl.NewTopic(
                t["name"],
                int(t["num_partitions"]),
                dict(t.get("configs") or {}),
                assignment=t.get("assignment"),
            )
            for t in b["topics"]
        ]
        try:
            results = await self.controller.create_topics(
                topics,
                validate_only=bool(b.get("validate_only")),
                wait_s=min(max(float(b.get("wait_s") or 0.0), 0.0), 30.0),
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"results": [_result_doc(r) for r in results]})

    async def _delete_topics(self, request: web.Request) -> web.Response:
        try:
            results = await self.controller.delete_topics((await self._body(request))["names"])
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"results": [_result_doc(r) for r in results]})

    async def _create_partitions(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            r = await self.controller.create_partitions(
                b["name"],
                int(b["total"]),
                validate_only=bool(b.get("validate_only")),
                assignment=b.get("assignment"),
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"result": _result_doc(r)})

    async def _alter_configs(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            r = await self.controller.alter_topic_configs(
                b["name"],
                b["changes"],
                incremental=bool(b["incremental"]),
                validate_only=bool(b["validate_only"]),
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"result": _result_doc(r)})

    async def _alter_broker_configs(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            error = await self.controller.alter_broker_configs(
                str(b["scope"]),
                b["changes"],
                incremental=bool(b["incremental"]),
                validate_only=bool(b["validate_only"]),
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"error": encode_error(error)})

    async def _alter_scram_credentials(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        deletions = [ScramDeletion(str(d["name"]), int(d["mechanism"])) for d in b["deletions"]]
        upsertions = [
            ScramUpsertion(
                str(u["name"]),
                int(u["mechanism"]),
                int(u["iterations"]),
                base64.b64decode(u["salt"]),
                base64.b64decode(u["salted_password"]),
            )
            for u in b["upsertions"]
        ]
        try:
            results, version = await self.controller.alter_scram_credentials(deletions, upsertions)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {
                "version": version,
                "results": [
                    {"user": r.user, "error_code": r.error_code, "error_message": r.error_message}
                    for r in results
                ],
            }
        )

    async def _create_acls(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        bindings = [AclBinding.from_json(d) for d in b["bindings"]]
        try:
            results, version = await self.controller.create_acls(bindings)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {
                "version": version,
                "results": [
                    {"error_code": r.error_code, "error_message": r.error_message} for r in results
                ],
            }
        )

    async def _delete_acls(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        filters = [_filter_from(d) for d in b["filters"]]
        try:
            results, version = await self.controller.delete_acls(filters)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {
                "version": version,
                "results": [
                    {
                        "error_code": r.error_code,
                        "error_message": r.error_message,
                        "deleted": [d.to_json() for d in r.deleted],
                    }
                    for r in results
                ],
            }
        )

    async def _producer_id(self, request: web.Request) -> web.Response:
        try:
            return self._ok({"producer_id": await self.controller.allocate_producer_id()})
        except ctl.ControllerError as exc:
            return self._fault(exc)

    async def _txn_state_topic(self, request: web.Request) -> web.Response:
        try:
            await self.controller.ensure_transaction_state_topic(wait_s=5.0)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({})

    async def _txn_markers(self, request: web.Request) -> web.Response:
        """A transaction coordinator's markers for the partitions another broker leads: passed
        on to that broker's control endpoint with its token (docs/transactions.md)."""
        return await self._to_broker(request, "/v1/transactions/markers", "markers")

    async def _txn_verify(self, request: web.Request) -> web.Response:
        """A partition leader's verify-only question (KIP-890) for the broker coordinating a
        transactional id: passed on as markers are."""
        return await self._to_broker(request, "/v1/transactions/verify", "verify")

    async def _to_broker(self, request: web.Request, path: str, key: str) -> web.Response:
        """The document under `key` of the request, posted to `path` on the broker it names."""
        b = await self._body(request)
        info = self.controller.image.brokers.get(int(b["broker_id"]))
        if info is None or not info.control_url or info.state == "dead":
            return self._fault(ctl.ControllerError(f"broker {b['broker_id']} is not reachable"))
        assert self._session is not None
        url = info.control_url.rstrip("/") + path
        headers = authorization(self.auth.broker_token(info.broker_id))
        try:
            async with self._session.post(url, json=b[key], headers=headers) as resp:
                resp.raise_for_status()
                doc = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._fault(ControllerUnavailable(f"broker {info.broker_id}: {exc}"))
        return self._ok(doc)

    async def _alter_reassignments(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        entries = [PlanEntry(_tp(e), e["target"]) for e in b["entries"]]
        try:
            results = await self.controller.alter_reassignments(entries)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {
                "results": [
                    {**_tp_doc(tp), "error": encode_error(err)} for tp, err in results.items()
                ]
            }
        )

    async def _list_reassignments(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        tps = None if b.get("partitions") is None else [_tp(d) for d in b["partitions"]]
        rows = self.controller.list_reassignments(tps)
        return self._ok(
            {
                "reassignments": [
                    {**_tp_doc(tp), "replicas": rs, "adding": ar, "removing": rr}
                    for tp, rs, ar, rr in rows
                ]
            }
        )

    async def _moves(self, request: web.Request) -> web.Response:
        active, recent = self.controller.move_statuses()
        return self._ok(
            {"active": [m.to_json() for m in active], "recent": [m.to_json() for m in recent]}
        )

    async def _rebalance(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            plan = await self.controller.rebalance(
                reason=b.get("reason", "requested"), dry_run=bool(b.get("dry_run"))
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {
                "moves": [
                    {**_tp_doc(m.partition), "source": m.source, "target": m.target}
                    for m in plan.moves
                ]
            }
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._ok({"status": "ok", "version": self.controller.metadata.version})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
