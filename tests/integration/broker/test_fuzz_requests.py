"""Untrusted bytes never crash the broker and never allocate more than they carry ([R1]).

A real broker process, under an address-space cap as in the issue (prlimit on its pid), gets
thousands of mutated requests of every API and version it serves: huge and negative counts and
lengths, truncations, bit flips, unknown tagged fields, bad struct markers (the mutations are in
tests/support/request_fuzz.py), led by the frames the issue measured killing a broker (the
49-byte Fetch v12, int32 counts in Fetch v4 and ListOffsets v1). The broker must stay up and
serving, its RSS must stay near where it started, no handler may fail, and its log must hold one
line per error, no more than the rate limit lets out.

Over real sockets too: eight connections each announcing a 100 MiB request and sending nothing
more must not grow the broker's RSS (they grew it by 878 MiB).

The longer run, with figures, is bench/fuzz_requests.py.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.fuzz_broker import (
    Fuzzer,
    address_space_limit,
    cap_address_space,
    prepare_topics,
    rss_kb,
    serves,
    vm_size_kb,
)
from tests.support.request_fuzz import cases, known_killers, served_pairs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

SEED = 20261125
CASES = 3000  # ~19 per served API/version; 5 to 15 s on the 2-core CI machine
HEADROOM = 1 << 30  # the cap: the broker's address space at start plus this
RSS_GROWTH_MIB = 100  # a run grows RSS by ~15 MiB; one unchecked count takes gigabytes
LOG_RATE, LOG_BURST = 5, 20  # server/ratelog.py's REQUEST_ERRORS


@pytest.fixture
def capped_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs") as broker:
        assert broker.proc is not None
        pid = broker.proc.pid
        cap_address_space(pid, vm_size_kb(pid) * 1024 + HEADROOM)
        assert address_space_limit(pid) < 4 << 30
        prepare_topics(broker.bootstrap)
        yield broker


def test_mutated_requests_of_every_api_and_version(capped_broker: BrokerProcess) -> None:
    broker = capped_broker
    assert broker.proc is not None
    fuzzer = Fuzzer(
        broker.bootstrap, broker.proc.pid, broker.log_path, metrics_url=f"{broker.http_url}/metrics"
    )
    killers = known_killers()
    mutated = list(cases(SEED, CASES))
    assert {(c.api_key, c.version) for c in mutated} == set(served_pairs())
    report = fuzzer.run([*killers, *mutated])
    print(report.summary())
    assert report.alive, "\n".join(
        ["the broker died:", *report.last_words, "cases in flight then:"]
        + [c.describe() for c in report.suspects]
    )
    assert report.cases == len(killers) + CASES
    growth_mib = (report.rss_max_kb - report.rss_start_kb) / 1024
    assert growth_mib < RSS_GROWTH_MIB, report.summary()
    assert report.not_one_line == [], "\n".join(report.not_one_line[:20])
    assert report.failed_requests == {}, [line for _, line in report.handler_failures[:10]]
    allowed = LOG_BURST + LOG_RATE * report.seconds + 5
    assert report.request_error_lines <= allowed, report.summary()
    assert report.results["closed"] > CASES // 2  # most mutations cannot be decoded
    assert report.results["answered"] > CASES // 20  # and some still reach the handlers
    assert serves(broker.bootstrap)


def test_announced_sizes_do_not_grow_the_broker(local_broker: BrokerProcess) -> None:
    assert local_broker.proc is not None
    pid = local_broker.proc.pid
    host, port = local_broker.bootstrap.rsplit(":", 1)
    serves(local_broker.bootstrap)  # the first requests' allocations are done
    before = rss_kb(pid)
    announced = 100 << 20  # socket.request.max.bytes: a size the broker must accept
    sockets = []
    try:
        for correlation in range(8):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(struct.pack(">ihhi", announced, 0, 9, correlation))
            sockets.append(sock)
        peak = before
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            peak = max(peak, rss_kb(pid))
            time.sleep(0.05)
        assert serves(local_broker.bootstrap)  # the broker still answers others meanwhile
    finally:
        for sock in sockets:
            sock.close()
    growth_mib = (peak - before) / 1024
    print(f"8 connections announcing 100 MiB: RSS {before // 1024} -> {peak // 1024} MiB")
    assert growth_mib < 16  # was +878 MiB: the announced size allocated up front
    assert serves(local_broker.bootstrap)
