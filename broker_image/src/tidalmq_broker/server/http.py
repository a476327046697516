"""The broker's HTTP side: liveness, readiness and Prometheus metrics (and, with a cluster
controller, the control endpoints it calls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


class HealthServer:
    def __init__(self, ready: Callable[[], tuple[bool, str]]) -> None:
        self._ready = ready
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/livez", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
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
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
