"""The broker's HTTP servers (server/http.py): probes and metrics are open, every other path needs
the broker's control token, and a broker without one refuses every control call."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from tidalmq_broker.apis import KAFKA_APIS
from tidalmq_broker.broker import Broker
from tidalmq_broker.security import SecurityConfigError
from tidalmq_broker.server.http import HealthServer, HttpServer
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.control_auth import BrokerCredentials, broker_token

SECRET = "brokers-secret-for-unit-tests-" + "s" * 20
OPEN = ("/healthz", "/livez", "/readyz", "/metrics")


async def answer(url: str, token: str | None = None, method: str = "GET") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, data=b"{}") as resp,
    ):
        return resp.status, await resp.text()


def with_control_route(server: HttpServer, calls: list[str]) -> None:
    async def push(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"applied": 1})

    server.app.router.add_post("/v1/metadata", push)


@pytest.fixture
async def no_token() -> AsyncIterator[tuple[HealthServer, list[str]]]:
    server, calls = HealthServer(lambda: (True, "serving")), []
    with_control_route(server, calls)
    await server.start("127.0.0.1", 0)
    yield server, calls
    await server.stop()


async def test_without_a_token_the_probes_answer_and_control_calls_are_refused(
    no_token: tuple[HealthServer, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    server, calls = no_token
    base = f"http://127.0.0.1:{server.port}"
    for path in OPEN:
        status, _ = await answer(base + path)
        assert status == 200, path
    for token in (None, SECRET, broker_token(SECRET, 0)):
        status, text = await answer(base + "/v1/metadata", token, "POST")
        assert status == 401
        # the broker's wording (server/http.py's refuse_control_call, shared with the controller)
        assert (
            json.loads(text)["error"] == "unauthorized: this call needs the broker's control token"
        )
    status, _ = await answer(base + "/anything/else", SECRET)
    assert status == 401
    assert calls == []
    refused = [r for r in caplog.records if r.name == "tidalmq_broker.server.http"]
    assert refused and all(r.levelno == logging.WARNING and r.exc_info is None for r in refused)
    assert "no control token is configured here" in refused[0].getMessage()
    assert all(SECRET not in r.getMessage() for r in refused)


async def test_with_credentials_the_brokers_own_token_and_its_secret_are_accepted() -> None:
    creds = BrokerCredentials([SECRET], 2)
    calls: list[str] = []
    health = HealthServer(lambda: (False, "opening partitions"), creds.authenticate)
    control = HttpServer(creds.authenticate)  # a separate control port: nothing open there
    for server in (health, control):
        with_control_route(server, calls)
        await server.start("127.0.0.1", 0)
    try:
        for server in (health, control):
            url = f"http://127.0.0.1:{server.port}/v1/metadata"
            for token in (broker_token(SECRET, 2), SECRET):
                assert (await answer(url, token, "POST"))[0] == 200
            for token in (None, broker_token(SECRET, 1), SECRET + "x", "Bearer"):
                assert (await answer(url, token, "POST"))[0] == 401
        assert len(calls) == 4
        assert (await answer(f"http://127.0.0.1:{health.port}/readyz"))[0] == 503
        assert (await answer(f"http://127.0.0.1:{control.port}/metrics"))[0] == 401
    finally:
        for server in (health, control):
            await server.stop()


def test_a_broker_with_a_remote_controller_needs_its_token() -> None:
    with pytest.raises(SecurityConfigError, match="needs the control-plane token"):
        Broker(BrokerSettings(controller_url="http://127.0.0.1:9690"), apis=KAFKA_APIS)
    with pytest.raises(SecurityConfigError, match="broker 1's token, and this is broker 0"):
        Broker(
            BrokerSettings(controller_url="http://x:1", control_token=broker_token(SECRET, 1)),
            apis=KAFKA_APIS,
        )
    with pytest.raises(SecurityConfigError, match="too short"):
        Broker(BrokerSettings(controller_url="http://x:1", control_token="short"), apis=KAFKA_APIS)
    broker = Broker(
        BrokerSettings(controller_url="http://x:1", control_token=SECRET), apis=KAFKA_APIS
    )
    assert broker._control is not None and broker._control.token == broker_token(SECRET, 0)
    # a standalone broker needs none (its control calls are refused)
    Broker(BrokerSettings(), apis=KAFKA_APIS)


def test_settings_keep_the_token_out_of_repr_and_say_where_control_calls_go() -> None:
    s = BrokerSettings(control_token=SECRET, http_host="0.0.0.0", http_port=9644)
    assert SECRET not in repr(s)
    assert s.control_url() == "http://127.0.0.1:9644"
    s = BrokerSettings(http_host="10.1.2.3", http_port=9644, control_port=9645)
    assert s.control_url() == "http://10.1.2.3:9645"
    s = BrokerSettings(http_host="fd00::7", control_host="fd00::8", control_port=0)
    assert s.control_url(40001) == "http://[fd00::8]:40001"
