"""The response bounds on a TLS listener of a real broker process ([R1] item 2): consumers
that pipeline fetches over TLS and never read get no more than the response budget, as plain
ones do (test_connection_bounds.py, whose attack this repeats and whose checks it uses).

The event loop's TLS layer counts only the bytes it holds itself and hands all of them to the
socket transport underneath whenever that has room, out of the count the bounds release answers
by: each TLS connection's first answer (16 MiB at the cap) used to go there whole, uncounted,
so 10 such consumers held about 160 MiB more than the budget said. The listener now writes a TLS
connection's answers in 64 KiB pieces, each only while the transport is not paused
(server/framing.py).

And idle TLS connections (each with its SSL object and the TLS layer's buffers) cost what the
budget says and leave nothing behind: RSS back to where it was within 10 s. 2,000 of them here,
not the 5,000 of the plain test: their handshakes took 31 s on the loaded 2-core CI machine
(bench/connection_bounds.py opens 5,000).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import pytest
from tidalmq_broker.security import certs

from tests.integration.broker.clients import create_topic
from tests.integration.broker.test_connection_bounds import (
    DATA_MIB,
    RESPONSE_BUDGET_MIB,
    RETURN_MARGIN_MIB,
    SLACK_MIB,
    TOPIC,
    Attack,
    check_alive_and_served,
    gauge,
    idle_wave,
    leave,
)
from tests.support import attacks
from tests.support.broker_process import BrokerProcess, free_port
from tests.support.fuzz_broker import address_space_limit, cap_address_space, vm_size_kb

# alone: its RSS and latency bounds and its thousands of loopback connects must not share the
# machine with another test worker (Makefile, `make integration`)
pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(180)]

TLS_IDLE_CONNECTIONS = 2000
TLS_PER_CONNECTION_KIB = 64  # an idle TLS connection: its SSL object, the TLS layer's buffers


class TlsBroker:
    def __init__(self, proc: BrokerProcess, tls_port: int, client: ssl.SSLContext) -> None:
        self.proc, self.tls_port, self.client = proc, tls_port, client


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    tmp = tmp_path_factory.mktemp("tls-bounds")
    ca = certs.new_ca("test CA")
    (tmp / "ca.pem").write_bytes(ca.cert_pem())
    certs.write_keystore(tmp / "broker.pem", certs.issue(ca, "broker", hosts=["localhost"]), ca)
    attacks.raise_fd_limit(2 * TLS_IDLE_CONNECTIONS + 1000)  # the broker inherits it
    tls_port = free_port()
    proc = BrokerProcess(f"file://{tmp / 'objects'}", tmp / "logs")
    proc.args = [
        "--listeners",
        f"PLAINTEXT://127.0.0.1:{proc.port},SSL://127.0.0.1:{tls_port}",
        "--ssl-keystore-location",
        str(tmp / "broker.pem"),
        # a TLS listener turns authorization on: every client may do anything here
        "--allow-everyone-if-no-acl-found",
        "true",
        "--queued-max-response-bytes",
        str(RESPONSE_BUDGET_MIB << 20),
    ]
    with proc:
        assert proc.proc is not None
        pid = proc.proc.pid
        cap_address_space(pid, vm_size_kb(pid) * 1024 + (2 << 30))
        assert 0 < address_space_limit(pid) < 8 << 30
        create_topic(proc.bootstrap, TOPIC, 1)
        create_topic(proc.bootstrap, "probe", 1)
        asyncio.run(attacks.fill_partition(proc.port, TOPIC, DATA_MIB << 20))
        client = ssl.create_default_context(cafile=str(tmp / "ca.pem"))
        yield TlsBroker(proc, tls_port, client)


def test_tls_consumers_that_never_read_hold_at_most_the_response_budget(
    tls_broker: TlsBroker,
) -> None:
    broker = tls_broker.proc

    async def run() -> None:
        attack = Attack(broker)
        async with attacks.ProduceProbe(broker.port, "probe") as probe, attack.rss:
            await asyncio.sleep(0.5)
            attack.baseline = attack.rss.reset()
            mark = probe.mark()
            opened = await attacks.tls_never_reading_fetchers(
                tls_broker.tls_port,
                10,
                TOPIC,
                tls_broker.client,
                max_bytes=50 << 20,
                pipelined=16,
                sources=["127.0.0.5"],
            )
            await asyncio.sleep(4.0)
            check_alive_and_served(broker, probe, mark)
            metrics = broker.metrics()
            peak = attack.rss.peak
            await leave(attack, opened)
        attack.report("10 TLS consumers pipelining Fetch(50 MiB), never reading", probe)
        held = gauge(metrics, "tidalmq_buffered_bytes", 'kind="response"')
        muted = gauge(metrics, "tidalmq_connections_muted")
        print(f"response bytes held {held / 2**20:.1f} MiB, {muted:.0f} connections muted")
        batch = 1  # MiB: a fetch may pass the budget by one batch (KIP-74)
        assert held <= (RESPONSE_BUDGET_MIB + batch) << 20
        # what the TLS layer passed on and no longer counts: ~128 KiB a connection at most
        tls_slack = 10 * 0.25
        assert peak < attack.baseline + RESPONSE_BUDGET_MIB + batch + tls_slack + SLACK_MIB
        assert attack.returned[0] <= attack.baseline + RETURN_MARGIN_MIB

    asyncio.run(run())


def test_idle_tls_connections(tls_broker: TlsBroker) -> None:
    broker = tls_broker.proc
    sources = [f"127.0.0.{i}" for i in range(20, 26)]  # under the per-address default

    async def run() -> None:
        await idle_wave(
            broker,
            lambda: attacks.tls_idle_clients(
                tls_broker.tls_port, TLS_IDLE_CONNECTIONS, tls_broker.client, sources
            ),
            TLS_IDLE_CONNECTIONS,
            TLS_PER_CONNECTION_KIB,
            "TLS",
            opening_bound_s=6.0,
        )

    asyncio.run(run())
