"""Control-plane mTLS over real HTTPS (tidalmq_core.control_tls): the controller's server and a
broker's control endpoint ask for a client certificate of the cluster CA, and its role must allow
the token presented; the clients (HttpControllerClient, both its aiohttp and its liveness-thread
paths, and the controller's pushes) present theirs."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tidalmq_broker.security import certs
from tidalmq_broker.server.http import HealthServer
from tidalmq_controller import (
    Controller,
    ControllerServer,
    ControllerSettings,
    Heartbeat,
    HttpControllerClient,
)
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_controller._rpc_wire import PROTOCOL, ControllerUnavailable, ControlRefused
from tidalmq_core import updates
from tidalmq_core.control_auth import BrokerCredentials, ControlAuth, broker_token
from tidalmq_core.control_tls import ControlTls, may_call_broker, server_is_broker
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


class Pki:
    """The cluster CA's certificates, and one of another CA (as the Kafka clients CA's)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = certs.new_ca("control CA")
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self.ca.cert_pem())
        other = certs.new_ca("Kafka clients CA")
        (directory / "other-ca.pem").write_bytes(other.cert_pem())
        self.other = self._write("wrong-ca-controller", other, "controller", other=True)

    def _write(self, file: str, ca: certs.Issued, cn: str, other: bool = False) -> ControlTls:
        path = self.directory / f"{file}.pem"
        certs.write_keystore(path, certs.issue(ca, cn, hosts=["127.0.0.1"], client=True))
        ca_file = self.directory / ("other-ca.pem" if other else "ca.pem")
        return ControlTls(str(path), str(path), str(ca_file))

    def tls(self, cn: str) -> ControlTls:
        return self._write(cn, self.ca, cn)


def context(tls: ControlTls | None, pki: Pki) -> ssl.SSLContext:
    """A client context presenting `tls`'s certificate (none: no certificate)."""
    if tls is not None:
        return tls.client_context()
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.check_hostname = False
    return ctx


async def call(url: str, path: str, body: Any, token: str, ctx: ssl.SSLContext) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + path,
            data=json.dumps(body).encode(),
            ssl=ctx,
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        return resp.status, json.loads(await resp.text())


class BrokerSide:
    """Broker 1's control endpoint with mTLS (the broker's own HealthServer), recording pushes."""

    def __init__(self, pki: Pki) -> None:
        credentials = BrokerCredentials([broker_token(TOKEN, 1)], 1)
        self.server = HealthServer(
            lambda: (True, ""),
            credentials.authenticate,
            tls=pki.tls("broker-1"),
            check_role=lambda role: may_call_broker(role, 1),
        )
        self.pushes: list[int] = []
        self.server.app.router.add_post("/v1/metadata/updates", self._update)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    async def _update(self, request: web.Request) -> web.Response:
        applied = updates.decode(await request.read()).last_version
        self.pushes.append(applied)
        return web.json_response({"applied": applied})


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
async def served(pki: Pki) -> AsyncIterator[tuple[Controller, ControllerServer, list[str]]]:
    controller = Controller(MemoryMetadataLog(), SETTINGS)
    await controller.start()
    server = ControllerServer(controller, ControlAuth([TOKEN]), pki.tls("controller"))
    killed: list[str] = []

    async def local_kill(request: web.Request) -> web.Response:
        killed.append(request.path)
        return web.json_response({"killed": 0})

    server.app.router.add_post("/v1/local/kill-broker", local_kill)
    await server.start("127.0.0.1", 0)
    try:
        yield controller, server, killed
    finally:
        await server.stop()
        await controller.stop()


async def test_brokers_register_heartbeat_and_get_pushes_over_mtls(
    served: tuple[Controller, ControllerServer, list[str]], pki: Pki
) -> None:
    controller, server, _ = served
    url = f"https://127.0.0.1:{server.port}"
    broker = BrokerSide(pki)
    await broker.server.start("127.0.0.1", 0)
    client = HttpControllerClient(url, token=broker_token(TOKEN, 1), tls=pki.tls("broker-1"))
    try:
        info = BrokerInfo(1, "127.0.0.1", 9093, incarnation="i1", control_url=broker.url)
        await client.register_broker(info, None)
        assert controller.metadata.brokers[1].port == 9093
        beat = Heartbeat(1, "i1", controller.metadata.version, {}, full=True)
        reply = await asyncio.to_thread(client.beat_blocking, beat)  # http.client over TLS
        assert reply.fenced is False and reply.lease_s > 0
        assert (await client.beat(beat)).fenced is False
        for _ in range(200):  # the controller pushes with its certificate and broker 1's token
            if broker.pushes:
                break
            await asyncio.sleep(0.02)
        assert broker.pushes
        # the open paths answer over TLS without a certificate (probes, Prometheus)
        async with (
            aiohttp.ClientSession() as session,
            session.get(broker.url + "/readyz", ssl=context(None, pki)) as resp,
        ):
            assert resp.status == 200
    finally:
        await client.close()
        await broker.server.stop()


async def test_calls_without_the_right_certificate_are_refused(
    served: tuple[Controller, ControllerServer, list[str]], pki: Pki
) -> None:
    controller, server, killed = served
    url = f"https://127.0.0.1:{server.port}"
    version = controller.metadata.version
    kill = ("/v1/local/kill-broker", {"broker_id": 0})
    register = (
        "/v1/brokers/register",
        {
            **BrokerInfo(
                1, "127.0.0.1", 9093, incarnation="x", control_url="https://127.0.0.1:1"
            ).to_json(),
            "protocol": PROTOCOL,
        },
    )
    # no certificate: 401 whatever the token
    for path, body in (kill, register):
        status, doc = await call(url, path, body, TOKEN, context(None, pki))
        assert status == 401 and "client certificate" in doc["error"], (path, doc)
    # a broker's certificate, even with the cluster token, makes no administrator's call
    status, doc = await call(url, *kill, TOKEN, context(pki.tls("broker-1"), pki))
    assert status == 403 and "CN=broker-1 may not make the administrator" in doc["error"]
    # a broker's certificate with another broker's token
    status, doc = await call(
        url, *register, broker_token(TOKEN, 1), context(pki.tls("broker-0"), pki)
    )
    assert status == 403 and "CN=broker-0 may not act for broker 1" in doc["error"]
    # a certificate of no role (a Kafka client's name)
    status, doc = await call(url, *kill, TOKEN, context(pki.tls("alice"), pki))
    assert status == 403 and "CN=alice names no control-plane role" in doc["error"]
    # another CA's certificate (the Kafka clients CA): the handshake fails
    with pytest.raises(aiohttp.ClientError):
        await call(url, *kill, TOKEN, context(pki.other, pki))
    # a client that does not trust the server's CA does not talk to it either
    with pytest.raises(aiohttp.ClientError):
        await call(url, *kill, TOKEN, pki.other.client_context())
    # plain HTTP to the TLS port
    with pytest.raises(aiohttp.ClientError):
        await call(url.replace("https", "http"), *kill, TOKEN, context(None, pki))
    assert killed == [] and controller.metadata.version == version
    assert 1 not in controller.metadata.brokers
    # the liveness thread's heartbeat with a broker's certificate of another id
    client = HttpControllerClient(url, token=broker_token(TOKEN, 1), tls=pki.tls("broker-0"))
    with pytest.raises(ControlRefused, match="403"):
        await asyncio.to_thread(client.beat_blocking, Heartbeat(1, "x", 0, {}, full=True))
    # the administrator's certificate with the cluster token may
    status, _ = await call(url, *kill, TOKEN, context(pki.tls("admin"), pki))
    assert status == 200 and killed == ["/v1/local/kill-broker"]


async def test_a_brokers_endpoint_lets_in_the_controller_and_itself_only(pki: Pki) -> None:
    broker = BrokerSide(pki)
    await broker.server.start("127.0.0.1", 0)
    push = b"".join(updates.encode(0, None, []))
    token = broker_token(TOKEN, 1)
    try:
        for tls, status in ((None, 401), (pki.tls("broker-2"), 403), (pki.tls("controller"), 200)):
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    broker.url + "/v1/metadata/updates",
                    data=push,
                    ssl=context(tls, pki),
                    headers={"Authorization": f"Bearer {token}"},
                ) as resp,
            ):
                assert resp.status == status, (tls, await resp.text())
        assert len(broker.pushes) == 1
    finally:
        await broker.server.stop()


async def test_clients_talk_only_to_the_role_they_expect(
    served: tuple[Controller, ControllerServer, list[str]], pki: Pki
) -> None:
    """A broker's certificate posing as the controller (a broker that redirected traffic) fails
    the handshake of a broker's heartbeats and calls; the controller's pushes go only to a
    broker's certificate."""
    impostor = BrokerSide(pki)  # serves with broker 1's certificate
    await impostor.server.start("127.0.0.1", 0)
    client = HttpControllerClient(
        impostor.url, token=broker_token(TOKEN, 2), tls=pki.tls("broker-2")
    )
    try:
        beat = Heartbeat(2, "i1", 0, {}, full=True)
        with pytest.raises(ControllerUnavailable, match="not the controller's"):
            await asyncio.to_thread(client.beat_blocking, beat)
        with pytest.raises(ControllerUnavailable):
            await client.beat(beat)
        # and the controller's own client side refuses an administrator's certificate as a broker
        controller_side = pki.tls("controller").client_context(server_is_broker)
        _, server, _ = served
        with pytest.raises(aiohttp.ClientError):
            await call(
                f"https://127.0.0.1:{server.port}", "/v1/producer-ids", {}, TOKEN, controller_side
            )
    finally:
        await client.close()
        await impostor.server.stop()
