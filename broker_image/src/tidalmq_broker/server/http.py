"""The broker's HTTP side: liveness, readiness and Prometheus metrics (and, with a cluster
controller, the control endpoints it calls).

Only `/healthz`, `/livez`, `/readyz` and `/metrics` are served without a token (kubelet probes and
Prometheus scrape them; they tell whether the process serves, and counters). Every other path, the
control endpoints the broker adds (metadata pushes, drain), needs a bearer token that
`authenticate` accepts (tidalmq_core.control_auth.BrokerCredentials); without `authenticate` (a
broker given no control token, the operator's health server) every such call is refused. A
refusal answers 401 and is one rate-limited log line, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from tidalmq_broker.server.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})

Authenticate = Callable[[str | None], tuple[bool, str]]  # Authorization header -> (ok, why not)

REFUSALS = Counter(
    "tidalmq_broker_control_refusals_total",
    "Control calls this process's HTTP server refused (no or a wrong control token)",
    ["reason"],
)
REFUSAL_LOG = RateLimitedLog()
"""The process's budget of lines about refused control calls."""


def _no_token_configured(header: str | None) -> tuple[bool, str]:
    return False, "no control token is configured here: control calls are refused"


def control_auth(
    authenticate: Authenticate | None, open_paths: frozenset[str] = OPEN_PATHS
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware: every path but `open_paths` needs a token `authenticate` accepts."""
    check = authenticate or _no_token_configured

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        ok, why = check(request.headers.get("Authorization"))
        if not ok:
            REFUSALS.labels("no_token" if why.startswith("no") else "wrong_token").inc()
            REFUSAL_LOG.warning(log, "control call refused (401): %s %s from %s: %s",
                                request.method, request.path, request.remote or "?", why)  # fmt: skip
            return web.json_response(
                {"error": "unauthorized: this call needs the broker's control token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="tidalmq-control"'},
            )
        return await handler(request)

    return middleware


class HttpServer:
    """An aiohttp application on one address, every path but `open_paths` behind the token."""

    def __init__(
        self, authenticate: Authenticate | None = None, open_paths: frozenset[str] = frozenset()
    ) -> None:
        self.app = web.Application(
            client_max_size=64 * 1024 * 1024, middlewares=[control_auth(authenticate, open_paths)]
        )
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await self._site.start()
        server = self._site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class HealthServer(HttpServer):
    def __init__(
        self,
        ready: Callable[[], tuple[bool, str]],
        authenticate: Authenticate | None = None,
        before_scrape: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(authenticate, OPEN_PATHS)
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
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
