"""The controller's HTTP server checks the control token on every route (_control_auth.py), over
real HTTP on the liveness thread: no token or a wrong one is 401 before anything is read, a
broker's token acts for its own broker only, and the controller pushes to a broker with that
broker's token."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tidalmq_broker.server.http import HttpServer
from tidalmq_broker.server.ratelog import RateLimitedLog
from tidalmq_controller import (
    Controller,
    ControllerServer,
    ControllerSettings,
    Heartbeat,
    HttpControllerClient,
    _control_auth,
)
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_controller._rpc_wire import PROTOCOL, ControlRefused
from tidalmq_core import updates
from tidalmq_core.control_auth import BrokerCredentials, ControlAuth, broker_token
from tidalmq_core.metadata import BrokerInfo

TOKEN = "unit-test-cluster-token-" + "t" * 30
SETTINGS = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=2.0,
    session_timeout_s=5.0,
    clock_margin_s=0.05,
    election_timeout_s=5.0,
    auto_rebalance=False,
    offsets_topic_partitions=1,
    tick_s=0.01,
)
OPEN = {"/healthz", "/metrics"}


class Served:
    def __init__(self, controller: Controller, server: ControllerServer) -> None:
        self.controller = controller
        self.server = server
        self.local_calls: list[str] = []  # a route the host adds (as `local up` does)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None if body is None else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.url + path, data=data, headers=headers) as resp,
        ):
            text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path) the server answers, the host's added routes included."""
        return sorted(
            {
                (r.method, r.resource.canonical)  # type: ignore[union-attr]
                for r in self.server.app.router.routes()
                if r.method != "HEAD"
            }
        )


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    controller = Controller(MemoryMetadataLog(), SETTINGS)
    await controller.start()
    server = ControllerServer(controller, ControlAuth([TOKEN]))
    served = Served(controller, server)

    async def local_kill(request: web.Request) -> web.Response:
        served.local_calls.append(request.path)
        return web.json_response({"killed": 0})

    server.app.router.add_post("/v1/local/kill-broker", local_kill)
    await server.start("127.0.0.1", 0)
    try:
        yield served
    finally:
        await server.stop()
        await controller.stop()


class BrokerSide:
    """A broker's control endpoint (the broker's own HttpServer), recording each push."""

    def __init__(self, broker_id: int) -> None:
        self.credentials = BrokerCredentials([broker_token(TOKEN, broker_id)], broker_id)
        self.server = HttpServer(self.credentials.authenticate)
        self.pushes: list[str] = []
        self.server.app.router.add_post("/v1/metadata/updates", self._update)

    async def _update(self, request: web.Request) -> web.Response:
        self.pushes.append(request.headers["Authorization"])
        return web.json_response({"applied": updates.decode(await request.read()).last_version})


def registration(broker_id: int, control_port: int = 1) -> dict[str, Any]:
    info = BrokerInfo(
        broker_id,
        "127.0.0.1",
        9092 + broker_id,
        incarnation="i1",
        control_url=f"http://127.0.0.1:{control_port}",
    )
    return {**info.to_json(), "protocol": PROTOCOL}


def heartbeat(broker_id: int) -> dict[str, Any]:
    return {
        "broker_id": broker_id,
        "incarnation": "i1",
        "applied_version": 0,
        "protocol": PROTOCOL,
        "full": True,
        "open": [],
        "hwm": [],
        "floors": [],
    }


async def test_every_route_refuses_a_missing_or_wrong_token(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    version = served.controller.metadata.version
    routes = served.routes()
    assert ("POST", "/v1/brokers/register") in routes and (
        "POST",
        "/v1/local/kill-broker",
    ) in routes
    assert ("POST", "/v1/static-topics/remap") in routes
    bodies = {
        "/v1/brokers/register": registration(1),
        "/v1/brokers/heartbeat": heartbeat(1),
        "/v1/local/kill-broker": {"broker_id": 0},
    }
    for method, path in routes:
        if path in OPEN:
            continue
        body = bodies.get(path, {}) if method == "POST" else None
        for token in (None, "wrong-" + TOKEN, broker_token("another-secret-" + "x" * 30, 1)):
            status, doc = await served.call(method, path, body, token)
            assert status == 401, (method, path, token, status, doc)
            # the controller's wording (the refusal itself is server/http.py's, shared)
            assert doc["error"] == "unauthorized: this call needs the control token"
    assert served.controller.metadata.version == version, "a refused call changed the metadata"
    assert 1 not in served.controller.metadata.brokers
    assert served.local_calls == [], "the host's route ran without a token"
    for path in OPEN:
        status, _ = await served.call("GET", path)
        assert status == 200, path
    lines = [r for r in caplog.records if r.name == "tidalmq_controller._control_auth"]
    assert lines, "refusals are logged"
    for record in lines:
        text = record.getMessage()
        assert "\n" not in text and record.exc_info is None and TOKEN not in text


async def test_a_token_is_checked_before_the_body_is_read(served: Served) -> None:
    """A heartbeat that is not even JSON: without a token it is refused (401), not parsed
    (400): the liveness thread spends one comparison on it."""
    for path in ("/v1/brokers/heartbeat", "/v1/brokers/register"):
        async with (
            aiohttp.ClientSession() as session,
            session.post(served.url + path, data=b"\xff not json") as resp,
        ):
            assert resp.status == 401, path
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                served.url + "/v1/brokers/heartbeat",
                data=b"\xff not json",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp,
        ):
            assert resp.status == 400  # with the token it gets as far as the parser


async def test_a_body_that_is_not_a_json_object_is_refused_in_one_line(served: Served) -> None:
    """JSON, but not an object: 400 with one line, from the controller's RPC and from the static
    topics' routes alike (not an error inside a handler)."""
    version = served.controller.metadata.version
    for path in ("/v1/brokers/register", "/v1/static-topics/describe"):
        status, doc = await served.call("POST", path, [1, 2], TOKEN)
        assert (status, doc) == (400, "the request body must be a JSON object"), path
    assert served.controller.metadata.version == version


async def test_a_brokers_token_acts_for_that_broker_only(served: Served) -> None:
    one, zero = broker_token(TOKEN, 1), broker_token(TOKEN, 0)
    broker = BrokerSide(1)
    await broker.server.start("127.0.0.1", 0)
    try:
        # broker 0's token cannot register broker 1, nor heartbeat, report or drain as it
        for path, body in (
            ("/v1/brokers/register", registration(1, broker.server.port)),
            ("/v1/brokers/heartbeat", heartbeat(1)),
            ("/v1/partitions/reports", {"broker_id": 1, "reports": []}),
            ("/v1/brokers/drain", {"broker_id": 1, "timeout_s": 1}),
            ("/v1/brokers/remove", {"broker_id": 1}),
        ):
            status, doc = await served.call("POST", path, body, zero)
            assert status == 403, (path, doc)
            assert "broker 0's token may not act for broker 1" in doc["error"]
        assert 1 not in served.controller.metadata.brokers
        # its own token registers it; the controller pushes with that broker's token
        status, doc = await served.call(
            "POST", "/v1/brokers/register", registration(1, broker.server.port), one
        )
        assert status == 200 and "version" in doc, doc
        assert served.controller.metadata.brokers[1].port == 9093
        status, doc = await served.call("POST", "/v1/brokers/heartbeat", heartbeat(1), one)
        assert status == 200 and doc["reply"]["fenced"] is False, doc
        status, doc = await served.call("POST", "/v1/brokers/heartbeat", heartbeat(1), zero)
        assert status == 403
        for _ in range(100):
            if broker.pushes:
                break
            await _sleep()
        assert broker.pushes and set(broker.pushes) == {f"Bearer {one}"}
        # what a broker forwards for its clients, and its metadata, it may ask for
        status, doc = await served.call("GET", "/v1/metadata", None, zero)
        assert status == 200 and doc["metadata"]["brokers"]
        status, _ = await served.call("POST", "/v1/producer-ids", {}, zero)
        assert status == 200
        # CreateAcls and DeleteAcls, which a broker forwards for its clients (authorized there)
        status, doc = await served.call("POST", "/v1/acls/create", {"bindings": []}, zero)
        assert status == 200 and doc["results"] == []
        status, doc = await served.call("POST", "/v1/acls/delete", {"filters": []}, zero)
        assert status == 200 and doc["results"] == []
        # admin-only calls are not for brokers
        for method, path in served.routes():
            if path in OPEN or path in _control_auth.BROKER_SELF:
                continue
            if path in _control_auth.BROKER_FORWARDED:
                continue
            status, _ = await served.call(method, path, {} if method == "POST" else None, one)
            assert status == 403, (method, path)
        assert served.local_calls == []
        # the cluster token may do them
        status, doc = await served.call("POST", "/v1/local/kill-broker", {"broker_id": 0}, TOKEN)
        assert status == 200 and served.local_calls == ["/v1/local/kill-broker"]
    finally:
        await broker.server.stop()


async def test_the_liveness_threads_heartbeats_carry_the_brokers_token(served: Served) -> None:
    """HttpControllerClient.beat_blocking (http.client, from the broker's liveness thread, no
    event loop) presents the broker's own token like the client's aiohttp calls; a refusal is
    ControlRefused with the controller's reason, never a reply to act on."""
    one = broker_token(TOKEN, 1)
    broker = BrokerSide(1)
    await broker.server.start("127.0.0.1", 0)
    clients = {
        token: HttpControllerClient(served.url, token=token)
        for token in (one, broker_token(TOKEN, 0), "wrong-" + TOKEN)
    }
    try:
        status, _ = await served.call(
            "POST", "/v1/brokers/register", registration(1, broker.server.port), one
        )
        assert status == 200
        beat = Heartbeat(1, "i1", served.controller.metadata.version, {}, full=True)
        reply = await asyncio.to_thread(clients[one].beat_blocking, beat)
        assert reply.fenced is False and reply.lease_s > 0
        assert (await clients[one].beat(beat)).fenced is False  # the aiohttp path, same token
        for token, status in ((broker_token(TOKEN, 0), 403), ("wrong-" + TOKEN, 401)):
            with pytest.raises(ControlRefused, match=f"refused the control token \\({status}\\)"):
                await asyncio.to_thread(clients[token].beat_blocking, beat)
    finally:
        for client in clients.values():
            await client.close()
        await broker.server.stop()


async def test_refusals_are_rate_limited_one_line_each(
    served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_control_auth, "REFUSAL_LOG", RateLimitedLog(rate=1.0, burst=5))
    caplog.set_level(logging.WARNING, "tidalmq_controller._control_auth")
    for _ in range(40):
        status, _ = await served.call("POST", "/v1/brokers/heartbeat", heartbeat(0), "x" * 40)
        assert status == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "tidalmq_controller._control_auth"]
    assert 5 <= len(lines) <= 10, lines  # the burst, then about one a second
    assert all(
        line.startswith(
            "control call refused (401): POST /v1/brokers/heartbeat from 127.0.0.1: wrong token"
        )
        for line in lines
    )


async def _sleep() -> None:
    await asyncio.sleep(0.02)
