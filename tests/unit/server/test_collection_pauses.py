"""[M1] 4: a Prometheus scrape builds its samples with the cyclic garbage collector held off.

A scrape of a broker leading 10,000 partitions builds about 140,000 short-lived objects; with
the collector on they set off young and middle-generation collections (15-165 ms of CPU each,
the GIL held) that delayed the broker's heartbeats past 100 ms (bench/metadata_scale.py).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import aiohttp
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from tidalmq_broker.server.http import HealthServer
from tidalmq_core.collection_pauses import collection_paused


def test_the_collector_is_off_inside_and_back_on_after() -> None:
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():  # nested
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block is still running
    assert gc.isenabled()


def test_a_collector_someone_else_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_blocks_on_two_threads_enable_it_once_both_are_done() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collection_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with collection_paused():
        pass
    assert not gc.isenabled(), "the other thread's block still runs"
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_an_exception_inside_still_enables_it() -> None:
    try:
        with collection_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


class _SeesTheCollector:
    """A collector that notes whether the garbage collector was on while it was read."""

    def __init__(self) -> None:
        self.enabled_during: list[bool] = []

    def describe(self) -> Iterator[Metric]:  # so that registering it does not collect
        yield GaugeMetricFamily("tidalmq_test_collection_paused", "test")

    def collect(self) -> Iterator[Metric]:
        self.enabled_during.append(gc.isenabled())
        yield GaugeMetricFamily("tidalmq_test_collection_paused", "test", value=1)


async def test_a_broker_scrape_runs_with_the_collector_off() -> None:
    seen = _SeesTheCollector()
    REGISTRY.register(seen)  # type: ignore[arg-type]
    server = HealthServer(lambda: (True, "serving"))
    await server.start("127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/metrics") as resp,
        ):
            assert "tidalmq_test_collection_paused 1.0" in await resp.text()
    finally:
        await server.stop()
        REGISTRY.unregister(seen)  # type: ignore[arg-type]
    assert seen.enabled_during == [False]
    assert gc.isenabled()
