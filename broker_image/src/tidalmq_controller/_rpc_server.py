"""The controller's HTTP server: the controller side of the controller RPC.

Owns: `ControllerServer` (the routes brokers, the CLI and the operator call, served on the
controller's liveness thread: heartbeats, /healthz and /metrics are answered there, every other
request is handed to the controller's event loop), and `HttpBrokerChannel` (how the controller
pushes metadata updates to a broker in another process).

Must not touch: the controller's decisions (every route calls one public Controller method and
encodes its answer); the static topics' routes are _static_topics_http.py's, the documents
_rpc_wire.py's.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from tidalmq_core import updates
from tidalmq_core.acls import AclBinding
from tidalmq_core.collection_pauses import metrics_text
from tidalmq_core.control_auth import ControlAuth, authorization
from tidalmq_core.control_tls import ControlTls, server_is_broker
from tidalmq_core.metadata import BrokerInfo, DataLoss, features_from_json, features_json
from tidalmq_core.reassignment import PlanEntry

from tidalmq_controller import _controller as ctl
from tidalmq_controller._control_auth import PRINCIPAL, refuse_other_broker
from tidalmq_controller._control_auth import middleware as control_auth_middleware
from tidalmq_controller._features import FeatureUpdate
from tidalmq_controller._log import Batch
from tidalmq_controller._rpc_wire import (
    ControllerUnavailable,
    accepted_doc,
    encode_error,
    filter_from,
    heartbeat_from,
    refusal,
    result_doc,
    tp_doc,
    tp_from,
)
from tidalmq_controller._scram_credentials import ScramDeletion, ScramUpsertion
from tidalmq_controller._static_topics_http import add_static_topic_routes

log = logging.getLogger(__name__)


# requests the liveness thread answers itself (everything else runs on the controller's loop)
_LIVENESS_PATHS = frozenset({"/v1/brokers/heartbeat", "/healthz", "/metrics"})


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
                raise await refusal(resp, f"the broker at {self._url}")
            resp.raise_for_status()
            doc = await resp.json()
        return int(doc["applied"])


def controllers_doc(controller: ctl.Controller) -> dict[str, Any]:
    """`GET /v1/controllers`: the active controller's id and every registered controller's
    supported feature ranges ({name: [lowest, highest]}), by id."""
    return {
        "active": controller.settings.controller_id,
        "controllers": {
            cid: features_json(r) for cid, r in controller.registered_controllers().items()
        },
    }


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
        r.add_post("/v1/features/update", self._update_features)
        # controllers' registrations (standbys) and forgetting one: the cluster token only
        r.add_get("/v1/controllers", self._controllers)
        r.add_post("/v1/controllers/register", self._register_controller)
        r.add_post("/v1/controllers/forget", self._forget_controller)
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
        supported = features_from_json(body.pop("supported_features", None))
        info = BrokerInfo.from_json(body)
        info.supported_features = supported  # None: a build from before it sent them
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
            int(b["broker_id"]), tp_from(b), int(b["epoch"]), **self._reported_end(b)
        )
        return self._ok({})

    async def _opened(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        self.controller.partition_opened(
            int(b["broker_id"]), tp_from(b), int(b["epoch"]), **self._reported_end(b)
        )
        return self._ok({})

    async def _lost(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        if refused := refuse_other_broker(request, int(b["broker_id"])):
            return refused
        try:
            await self.controller.partition_lost_data(
                int(b["broker_id"]), tp_from(b), int(b["epoch"]), DataLoss.from_json(b["loss"])
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
                    {**tp_doc(tp), **loss.to_json(), "missing_offsets": loss.missing_offsets}
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
        return self._ok({"accepted": [accepted_doc(a) for a in accepted]})

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
        return self._ok({"results": [result_doc(r) for r in results]})

    async def _delete_topics(self, request: web.Request) -> web.Response:
        try:
            results = await self.controller.delete_topics((await self._body(request))["names"])
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"results": [result_doc(r) for r in results]})

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
        return self._ok({"result": result_doc(r)})

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
        return self._ok({"result": result_doc(r)})

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
        filters = [filter_from(d) for d in b["filters"]]
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

    async def _controllers(self, request: web.Request) -> web.Response:
        try:
            self.controller.require_active()
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(controllers_doc(self.controller))

    async def _register_controller(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            ranges = features_from_json(b.get("supported_features")) or {}
            controller_id = str(b["id"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # the standby logs it
            return self._fault(ctl.ControllerError(f"bad registration: {exc!r}"))
        try:
            version, wrote = await self.controller.register_controller(controller_id, ranges)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        doc = {"version": version, "registered_now": wrote, **controllers_doc(self.controller)}
        return self._ok(doc)

    async def _forget_controller(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        try:
            version = await self.controller.forget_controller(str(b.get("id", "")))
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"version": version, **controllers_doc(self.controller)})

    async def _update_features(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        updates = [
            FeatureUpdate(str(u["name"]), int(u["level"]), int(u["upgrade_type"]))
            for u in b["updates"]
        ]
        try:
            refused, version = await self.controller.update_features(
                updates, validate_only=bool(b.get("validate_only", False))
            )
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok({"version": version, "refused": refused})

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
        entries = [PlanEntry(tp_from(e), e["target"]) for e in b["entries"]]
        try:
            results = await self.controller.alter_reassignments(entries)
        except ctl.ControllerError as exc:
            return self._fault(exc)
        return self._ok(
            {"results": [{**tp_doc(tp), "error": encode_error(err)} for tp, err in results.items()]}
        )

    async def _list_reassignments(self, request: web.Request) -> web.Response:
        b = await self._body(request)
        tps = None if b.get("partitions") is None else [tp_from(d) for d in b["partitions"]]
        rows = self.controller.list_reassignments(tps)
        return self._ok(
            {
                "reassignments": [
                    {**tp_doc(tp), "replicas": rs, "adding": ar, "removing": rr}
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
                    {**tp_doc(m.partition), "source": m.source, "target": m.target}
                    for m in plan.moves
                ]
            }
        )

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._ok({"status": "ok", "version": self.controller.metadata.version})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=metrics_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})
