"""A broker's link to its controller: the client side of the controller RPC.

Owns: `ControllerClient` (what a broker calls: register, heartbeat, reports, metadata updates,
forwarded admin requests), `LocalControllerClient` (the same calls on a Controller in this
process) and `HttpControllerClient` (over HTTP, with the heartbeats on a blocking connection of
their own so that the broker's liveness thread never waits for its event loop), and the broker's
heartbeat latency histogram.

Must not touch: the controller's state (only the Controller's public methods, through
LocalControllerClient) or the server's routes (_rpc_server.py); the documents are
_rpc_wire.py's.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import Histogram
from tidalmq_core import updates
from tidalmq_core.acls import AclBinding, AclBindingFilter
from tidalmq_core.control_auth import authorization
from tidalmq_core.control_tls import ControlTls, server_is_admin
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata, features_json
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry

from tidalmq_controller._acls import AclCreateResult, AclDeleteResult
from tidalmq_controller._errors import ControllerError
from tidalmq_controller._features import FeatureUpdate
from tidalmq_controller._membership import Heartbeat, HeartbeatReply
from tidalmq_controller._rpc_wire import (
    PROTOCOL,
    ControllerUnavailable,
    b64,
    blocking_refusal,
    decode_error,
    filter_doc,
    heartbeat_doc,
    refusal,
    result_from,
    tp_doc,
    tp_from,
)
from tidalmq_controller._scram_credentials import (
    ScramAlterResult,
    ScramDeletion,
    ScramUpsertion,
)
from tidalmq_controller._topics import NewTopic, TopicResult

if TYPE_CHECKING:  # a broker talks to a remote controller and never loads the controller itself
    from tidalmq_controller._controller import Controller

# A broker's view of the controller's liveness path: from sending a heartbeat to its answer.
HEARTBEAT_SECONDS = Histogram(
    "tidalmq_broker_heartbeat_seconds",
    "Time from sending a heartbeat to the controller to its answer (as the broker sees it)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)

log = logging.getLogger(__name__)


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
        self, topics: list[NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[TopicResult]: ...
    async def delete_topics(self, names: list[str]) -> list[TopicResult]: ...
    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> TopicResult: ...
    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult: ...
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
    async def update_features(
        self, updates: list[FeatureUpdate], *, validate_only: bool
    ) -> tuple[str | None, int]: ...


class LocalControllerClient:
    """The client interface over a Controller in the same process."""

    def __init__(self, controller: Controller) -> None:
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
        self, topics: list[NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[TopicResult]:
        return await self.controller.create_topics(
            topics, validate_only=validate_only, wait_s=wait_s
        )

    async def delete_topics(self, names: list[str]) -> list[TopicResult]:
        return await self.controller.delete_topics(names)

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> TopicResult:
        return await self.controller.create_partitions(
            name, total, validate_only=validate_only, assignment=assignment
        )

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult:
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

    async def update_features(
        self, updates: list[FeatureUpdate], *, validate_only: bool
    ) -> tuple[str | None, int]:
        return await self.controller.update_features(updates, validate_only=validate_only)


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
                    raise await refusal(resp, f"the controller at {self._base}")
                doc = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ControllerUnavailable(f"controller at {self._base} unreachable: {exc}") from exc
        if "fault" in doc:
            raise decode_error(doc["fault"]) or ControllerError("controller error")
        return doc

    async def register_broker(self, info: BrokerInfo, channel: Any) -> int:
        doc: dict[str, Any] = {**info.to_json(), "protocol": PROTOCOL}
        if info.supported_features is not None:
            doc["supported_features"] = features_json(info.supported_features)
        doc = await self._call("/v1/brokers/register", doc)
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
                    raise blocking_refusal(resp.status, data, f"the controller at {self._base}")
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
            raise decode_error(doc["fault"]) or ControllerError("controller error")
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
                    raise await refusal(resp, f"the controller at {self._base}")
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
        self, topics: list[NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[TopicResult]:
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
        return [result_from(r) for r in doc["results"]]

    async def delete_topics(self, names: list[str]) -> list[TopicResult]:
        doc = await self._call("/v1/topics/delete", {"names": names})
        return [result_from(r) for r in doc["results"]]

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> TopicResult:
        doc = await self._call(
            "/v1/topics/partitions",
            {
                "name": name,
                "total": total,
                "validate_only": validate_only,
                "assignment": assignment,
            },
        )
        return result_from(doc["result"])

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult:
        doc = await self._call(
            "/v1/topics/configs",
            {
                "name": name,
                "changes": changes,
                "incremental": incremental,
                "validate_only": validate_only,
            },
        )
        return result_from(doc["result"])

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
            {"entries": [{**tp_doc(e.tp), "target": e.target} for e in entries]},
        )
        return {tp_from(r): decode_error(r["error"]) for r in doc["results"]}

    async def list_reassignments(
        self, tps: list[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]:
        doc = await self._call(
            "/v1/reassignments/list",
            {"partitions": None if tps is None else [tp_doc(tp) for tp in tps]},
        )
        return [
            (tp_from(r), r["replicas"], r["adding"], r["removing"]) for r in doc["reassignments"]
        ]

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
                        "salt": b64(u.salt),
                        "salted_password": b64(u.salted_password),
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
        doc = await self._call("/v1/acls/delete", {"filters": [filter_doc(f) for f in filters]})
        results = [
            AclDeleteResult(
                int(r["error_code"]),
                r.get("error_message"),
                [AclBinding.from_json(b) for b in r["deleted"]],
            )
            for r in doc["results"]
        ]
        return results, int(doc["version"])

    async def register_controller(
        self, controller_id: str, supported_features: dict[str, tuple[int, int]]
    ) -> bool:
        """A standby controller's registration (`Controller.register_controller`; the cluster
        token only): whether the active controller wrote it now (False: it had it already)."""
        doc = await self._call(
            "/v1/controllers/register",
            {"id": controller_id, "supported_features": features_json(supported_features)},
        )
        return bool(doc["registered_now"])

    async def update_features(
        self, updates: list[FeatureUpdate], *, validate_only: bool
    ) -> tuple[str | None, int]:
        doc = await self._call(
            "/v1/features/update",
            {
                "updates": [
                    {"name": u.name, "level": u.level, "upgrade_type": u.upgrade_type}
                    for u in updates
                ],
                "validate_only": validate_only,
            },
        )
        return doc.get("refused"), int(doc["version"])
