"""A broker's memory stays bounded whatever its clients do ([R1] item 2), on real sockets against a
real broker process under an address-space cap (prlimit --as: the broker's size at start + 2 GiB).

The issue measured: 8 headers announcing 100 MiB took 878 MiB; 10 connections pipelining
Fetch(50 MiB) without reading took a broker to 18 GB; 4,000 idle connections cost 265 KiB each
and came back only when the cyclic collector ran. Here each attack runs while an ordinary
producer sends a batch every 100 ms; afterwards the attackers leave. Each test checks that

- the broker's RSS stays within the budget docs/limits.md gives for the settings it runs with
  (`queued_max_response_bytes` 64 MiB here, so the bound has something to bite on);
- the producer is answered throughout, without errors;
- RSS is back within RETURN_MARGIN_MIB of where it was before the attack within 10 s of the
  attackers leaving ([R1]'s acceptance: back to the baseline within 10 s; the margin is what
  docs/limits.md justifies), also after 5,000 idle connections: the broker releases its heap
  once a wave of closes is over (server/heap.py). A second wave of 5,000 must come back to the
  first wave's baseline too, and peak no higher than the first: nothing is kept per connection.

Durations are printed (pytest -s); together they are kept under a minute on the 2-core CI box.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tests.integration.broker.clients import create_topic
from tests.support import attacks
from tests.support.broker_process import BrokerProcess
from tests.support.fuzz_broker import address_space_limit, cap_address_space, vm_size_kb

# alone: its RSS and latency bounds and its thousands of loopback connects must not share the
# machine with another test worker (Makefile, `make integration`)
pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(180)]

RESPONSE_BUDGET_MIB = 64
PER_CONNECTION_MIB = 16
IDLE_CONNECTIONS = 5000
PER_CONNECTION_KIB = 16  # what an idle connection may cost (8 KiB measured; docs/limits.md)
SLACK_MIB = 48  # decoded requests, answers in flight, allocator rounding
RETURN_MARGIN_MIB = 8  # what may stay (docs/limits.md "Back to the baseline": measured 3-5)
REUSE_MARGIN_MIB = 8  # a second wave of 5,000 may peak this much higher; a leak would add ~40
TOPIC = "bounds"
DATA_MIB = 24


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    attacks.raise_fd_limit(2 * IDLE_CONNECTIONS + 1000)  # the broker inherits it
    tmp = tmp_path_factory.mktemp("bounds")
    args = [
        "--max-connections",
        str(IDLE_CONNECTIONS + 200),
        "--max-connections-per-ip-overrides",
        "127.0.0.3:20",
        "--queued-max-response-bytes",
        str(RESPONSE_BUDGET_MIB << 20),
    ]
    with BrokerProcess(f"file://{tmp / 'objects'}", tmp / "logs", args=args) as proc:
        assert proc.proc is not None
        pid = proc.proc.pid
        cap_address_space(pid, vm_size_kb(pid) * 1024 + (2 << 30))
        assert 0 < address_space_limit(pid) < 8 << 30
        create_topic(proc.bootstrap, TOPIC, 1)
        create_topic(proc.bootstrap, "probe", 1)
        asyncio.run(attacks.fill_partition(proc.port, TOPIC, DATA_MIB << 20))
        yield proc


class Attack:
    """Baseline, attack, leave: RSS and the probe producer around one attack."""

    def __init__(self, broker: BrokerProcess) -> None:
        assert broker.proc is not None
        self.broker = broker
        self.rss = attacks.Rss(broker.proc.pid)
        self.started = time.monotonic()
        self.baseline = 0.0
        self.returned = (0.0, 0.0)

    def report(self, what: str, probe: attacks.ProduceProbe) -> None:
        rss, took = self.returned
        print(
            f"\n{what}: RSS {self.baseline:.0f} MiB before, peak {self.rss.peak:.0f}, "
            f"{rss:.0f} {took:.1f} s after the clients left; producer: {probe.summary()}; "
            f"{time.monotonic() - self.started:.1f} s, load {attacks.load_average()}"
        )


def check_alive_and_served(
    broker: BrokerProcess, probe: attacks.ProduceProbe, since: int, bound_s: float = 2.0
) -> None:
    assert broker.alive(), broker.tail_log()
    answered = len(probe.latencies) + len(probe.errors) - since
    assert answered > 0, probe.summary()
    assert probe.errors == [], probe.summary()
    assert max(probe.latencies[-answered:], default=0) < bound_s, probe.summary()


async def leave(
    attack: Attack, opened: attacks.Opened, margin_mib: float = RETURN_MARGIN_MIB
) -> None:
    opened.close()
    attack.returned = await attack.rss.settle(attack.baseline + margin_mib, 10.0)


def test_announced_sizes_take_no_memory(broker: BrokerProcess) -> None:
    async def run() -> None:
        attack = Attack(broker)
        async with attacks.ProduceProbe(broker.port, "probe") as probe, attack.rss:
            await asyncio.sleep(0.5)
            attack.baseline = attack.rss.reset()
            mark = probe.mark()
            opened = await attacks.announcers(broker.port, 200, 100 << 20, ["127.0.0.4"])
            await asyncio.sleep(2.0)
            check_alive_and_served(broker, probe, mark)
            peak = attack.rss.peak
            await leave(attack, opened)
        attack.report("200 headers announcing 100 MiB", probe)
        assert peak < attack.baseline + 200 * 8 / 1024 + SLACK_MIB  # 4 KiB buffers, not 100 MiB
        assert attack.returned[0] <= attack.baseline + RETURN_MARGIN_MIB

    asyncio.run(run())


def test_consumers_that_never_read_hold_at_most_the_response_budget(broker: BrokerProcess) -> None:
    async def run() -> None:
        attack = Attack(broker)
        async with attacks.ProduceProbe(broker.port, "probe") as probe, attack.rss:
            await asyncio.sleep(0.5)
            attack.baseline = attack.rss.reset()
            mark = probe.mark()
            opened = await attacks.never_reading_fetchers(
                broker.port, 10, TOPIC, max_bytes=50 << 20, pipelined=16, sources=["127.0.0.5"]
            )
            await asyncio.sleep(4.0)
            check_alive_and_served(broker, probe, mark)
            metrics = broker.metrics()
            peak = attack.rss.peak
            await leave(attack, opened)
        attack.report("10 consumers pipelining Fetch(50 MiB), never reading", probe)
        held = gauge(metrics, "tidalmq_buffered_bytes", 'kind="response"')
        muted = gauge(metrics, "tidalmq_connections_muted")
        print(f"response bytes held {held / 2**20:.1f} MiB, {muted:.0f} connections muted")
        batch = 1  # MiB: a fetch may pass the budget by one batch (KIP-74)
        assert held <= (RESPONSE_BUDGET_MIB + batch) << 20
        assert muted >= RESPONSE_BUDGET_MIB // PER_CONNECTION_MIB  # those that filled their cap
        # each response is a copy of the records: without the budget, 10 x 16 x 24 MiB
        assert peak < attack.baseline + RESPONSE_BUDGET_MIB + batch + SLACK_MIB
        assert attack.returned[0] <= attack.baseline + RETURN_MARGIN_MIB

    asyncio.run(run())


async def idle_wave(
    broker: BrokerProcess,
    open_clients: Callable[[], Awaitable[Any]],
    count: int,
    per_connection_kib: float,
    label: str,
    *,
    baseline: float = 0.0,
    opening_bound_s: float = 2.0,
) -> tuple[Attack, float]:
    """`count` idle connections (`open_clients`, plain or TLS) opened while a producer keeps
    being served, then closed: every one accepted, RSS under `per_connection_kib` each, back
    to the baseline (the one given, else measured first) within 10 s. The attack and its peak.

    The producer is answered within `opening_bound_s` while the connections open and the
    second after. TLS gives it more: each handshake costs CPU in the broker's event loop and in
    this process's (where the probe runs too), so on a loaded 2-core machine 2,000 of them
    delayed the probe 2.0-3.5 s. (Holding the connections open longer, to check the idle
    second on its own, made the second of the plain test's waves keep 1 MiB more than its
    margin past the 10 s: the wave's timing is part of what the memory checks measure.)"""
    attack = Attack(broker)
    async with attacks.ProduceProbe(broker.port, "probe") as probe, attack.rss:
        await asyncio.sleep(0.5)
        attack.baseline = baseline or attack.rss.reset()
        mark = probe.mark()
        opened = await open_clients()
        await asyncio.sleep(1.0)
        check_alive_and_served(broker, probe, mark, opening_bound_s)
        peak = attack.rss.peak
        connections = gauge(broker.metrics(), "tidalmq_connections")
        await leave(attack, opened)
    attack.report(f"{label}: {count} idle connections", probe)
    print(
        f"{connections:.0f} connections open at the peak ({opened.connect_retries} connects "
        f"tried again); "
        f"{(peak - attack.baseline) * 1024 / count:.1f} KiB each"
    )
    assert opened.refused == 0 and connections >= count
    # a connect tried again is a client's reconnect, rare: more would be the broker not accepting
    assert opened.connect_retries <= count // 100, opened.connect_retries
    assert peak < attack.baseline + count * per_connection_kib / 1024 + SLACK_MIB
    assert attack.returned[0] <= attack.baseline + RETURN_MARGIN_MIB  # within 10 s
    return attack, peak


def test_five_thousand_idle_connections(broker: BrokerProcess) -> None:
    sources = [f"127.0.0.{i}" for i in range(10, 16)]  # under the per-address default

    async def run() -> None:
        def open_clients() -> Awaitable[Any]:
            return attacks.idle_clients(broker.port, IDLE_CONNECTIONS, sources)

        first, first_peak = await idle_wave(
            broker, open_clients, IDLE_CONNECTIONS, PER_CONNECTION_KIB, "first wave"
        )
        _, second_peak = await idle_wave(  # the same baseline
            broker,
            open_clients,
            IDLE_CONNECTIONS,
            PER_CONNECTION_KIB,
            "second wave",
            baseline=first.baseline,
        )
        assert second_peak <= first_peak + REUSE_MARGIN_MIB  # nothing kept per connection

    asyncio.run(run())


def test_slowloris(broker: BrokerProcess) -> None:
    async def run() -> None:
        attack = Attack(broker)
        async with attacks.ProduceProbe(broker.port, "probe") as probe, attack.rss:
            await asyncio.sleep(0.5)
            attack.baseline = attack.rss.reset()
            mark = probe.mark()
            opened = await attacks.slowloris(broker.port, 500, 6, ["127.0.0.6"])
            check_alive_and_served(broker, probe, mark)
            peak = attack.rss.peak
            await leave(attack, opened)
        attack.report("500 connections sending a byte a second", probe)
        assert opened.refused == 0  # one byte a second is activity: not idle
        assert peak < attack.baseline + 500 * PER_CONNECTION_KIB / 1024 + SLACK_MIB
        assert attack.returned[0] <= attack.baseline + RETURN_MARGIN_MIB

    asyncio.run(run())


def test_connections_over_the_per_address_cap_are_refused(broker: BrokerProcess) -> None:
    async def run() -> attacks.Opened:
        return await attacks.idle_clients(broker.port, 25, ["127.0.0.3"], concurrency=1)

    before = counter(
        broker.metrics(), "tidalmq_connections_refused_total", 'reason="max_connections_per_ip"'
    )
    log_from = broker.log_path.stat().st_size
    opened = asyncio.run(run())
    try:
        assert (len(opened.sockets), opened.refused) == (20, 5)  # the override: 127.0.0.3:20
        refused = counter(
            broker.metrics(), "tidalmq_connections_refused_total", 'reason="max_connections_per_ip"'
        )
        assert refused - before == 5
        time.sleep(0.2)
        with broker.log_path.open("rb") as f:
            f.seek(log_from)
            lines = [ln for ln in f.read().decode().splitlines() if "refusing connection" in ln]
        assert 1 <= len(lines) <= 5, lines  # rate-limited: one line a second, bursts of 5
        assert "max.connections.per.ip 20" in lines[0] and "127.0.0.3" in lines[0]
    finally:
        opened.close()


def gauge(metrics: str, name: str, labels: str = "") -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{labels}}} not in the metrics")


def counter(metrics: str, name: str, labels: str) -> float:
    pattern = re.compile(rf"^{name}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$", re.M)
    found = pattern.search(metrics)
    return float(found.group(1)) if found else 0.0
