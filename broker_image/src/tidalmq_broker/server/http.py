"""The broker's HTTP side: liveness, readiness and Prometheus metrics (and, with a cluster
controller, the control endpoints it calls).

Only `/healthz`, `/livez`, `/readyz` and `/metrics` are served without a token (kubelet probes and
Prometheus scrape them; they tell whether the process serves, and counters). Every other path, the
control endpoints the broker adds (metadata pushes, drain), needs a bearer token that
`authenticate` accepts (tidalmq_core.control_auth.BrokerCredentials); without `authenticate` (a
broker given no control token, the operator's health server) every such call is refused. A
refusal answers 401 and is one rate-limited log line, never a traceback.

With control-plane mTLS (`tls`, tidalmq_core.control_tls) the server speaks HTTPS and asks for a
client certificate: the open paths are served without one (probes, Prometheus), every other path
needs a certificate of the cluster CA whose role `check_role` accepts (the controller's, or this
broker's own) besides the token: 401 without one, 403 for another role.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter
from tidalmq_core.collection_pauses import metrics_text
from tidalmq_core.control_tls import NO_CERTIFICATE, ControlTls, Role, peercert_of, role_of

from tidalmq_broker.server.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})

Authenticate = Callable[[str | None], tuple[bool, str]]  # Authorization header -> (ok, why not)
CheckRole = Callable[[Role], str]  # a client certificate's role -> why it may not call ("": may)

REFUSALS = Counter(
    "tidalmq_broker_control_refusals_total",
    "Control calls this process's HTTP server refused (no or a wrong control token, no or "
    "another role's client certificate)",
    ["reason"],
)
REFUSAL_LOG = RateLimitedLog()
"""The process's budget of lines about refused control calls."""


def _no_token_configured(header: str | None) -> tuple[bool, str]:
    return False, "no control token is configured here: control calls are refused"


def refuse_control_call(
    request: web.Request,
    status: int,
    reason: str,
    why: str,
    *,
    refusals: Counter,
    budget: RateLimitedLog,
    logger: logging.Logger,
    token: str,
) -> web.Response:
    """How a control server refuses a call, the broker's and the controller's
    (tidalmq_controller._control_auth) alike: a count in `refusals` by `reason`, one line within
    `budget` (never the token), and the answer: 403 with `why`, or 401 naming what the call needs
    (a client certificate, or `token`) with the Bearer challenge."""
    refusals.labels(reason).inc()
    budget.warning(
        logger,
        "control call refused (%d): %s %s from %s: %s",
        status,
        request.method,
        request.path,
        getattr(request, "remote", None) or "?",
        why,
    )
    if status == 403:
        return web.json_response({"error": f"forbidden: {why}"}, status=403)
    needs = "a client certificate" if reason == "no_certificate" else token
    return web.json_response(
        {"error": f"unauthorized: this call needs {needs}"},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="tidalmq-control"'},
    )


def _refuse(request: web.Request, status: int, reason: str, why: str) -> web.Response:
    return refuse_control_call(
        request,
        status,
        reason,
        why,
        refusals=REFUSALS,
        budget=REFUSAL_LOG,
        logger=log,
        token="the broker's control token",
    )


def control_auth(
    authenticate: Authenticate | None,
    open_paths: frozenset[str] = OPEN_PATHS,
    check_role: CheckRole | None = None,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware: every path but `open_paths` needs a token `authenticate` accepts, and
    with `check_role` (mTLS) a client certificate whose role it accepts."""
    check = authenticate or _no_token_configured

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        role: Role | None = None
        if check_role is not None:
            role, why = role_of(peercert_of(request.transport))
            if role is None:  # none: 401; one of the cluster CA naming no role: 403
                if why == NO_CERTIFICATE:
                    return _refuse(request, 401, "no_certificate", why)
                return _refuse(request, 403, "forbidden", why)
        ok, why = check(request.headers.get("Authorization"))
        if not ok:
            return _refuse(request, 401, "no_token" if why.startswith("no") else "wrong_token", why)
        if check_role is not None and role is not None and (why := check_role(role)):
            return _refuse(request, 403, "forbidden", why)
        return await handler(request)

    return middleware


# At stop, how long a request still being answered (a metadata push, a scrape, a relayed call)
# may take before its connection is closed. aiohttp's default (60 s) is past any stop deadline,
# so one slow handler could hold a stopping broker until it is killed. Every caller retries.
REQUEST_GRACE_AT_STOP_S = 1.0


class HttpServer:
    """An aiohttp application on one address, every path but `open_paths` behind the token."""

    def __init__(
        self,
        authenticate: Authenticate | None = None,
        open_paths: frozenset[str] = frozenset(),
        *,
        tls: ControlTls | None = None,
        check_role: CheckRole | None = None,
    ) -> None:
        if tls is not None and check_role is None:
            raise ValueError("a control server with TLS needs check_role")
        self._ssl: ssl.SSLContext | None = tls.server_context() if tls is not None else None
        self.app = web.Application(
            client_max_size=64 * 1024 * 1024,
            middlewares=[control_auth(authenticate, open_paths, check_role if tls else None)],
        )
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(
            self.app, access_log=None, shutdown_timeout=REQUEST_GRACE_AT_STOP_S
        )
        await self._runner.setup()
        self._site = web.TCPSite(
            self._runner, host, port, reuse_address=True, ssl_context=self._ssl
        )
        await self._site.start()
        server = self._site._server
        assert server is not None
        # an asyncio or a uvloop Server (AbstractServer declares no sockets, both have them)
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class HealthServer(HttpServer):
    def __init__(
        self,
        ready: Callable[[], tuple[bool, str]],
        authenticate: Authenticate | None = None,
        before_scrape: Callable[[], object] | None = None,
        *,
        tls: ControlTls | None = None,
        check_role: CheckRole | None = None,
    ) -> None:
        super().__init__(authenticate, OPEN_PATHS, tls=tls, check_role=check_role)
        self._ready = ready
        self._before_scrape = before_scrape  # series published lazily are published now
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/livez", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)

    async def _healthz(self, request: web.Request) -> web.Response:
        # liveness: the event loop answers promptly
        started = time.perf_counter()
        await asyncio.sleep(0)
        return web.json_response(
            {"status": "ok", "loop_ms": (time.perf_counter() - started) * 1000}
        )

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, reason = self._ready()
        return web.json_response({"ready": ok, "reason": reason}, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._before_scrape is not None:
            self._before_scrape()
        return web.Response(body=metrics_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})
