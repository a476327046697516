"""The store's write health ([R1] item 7): a store that hangs or refuses writes fails appends
with a retriable error within flush_timeout_ms and at once afterwards, the engine says why
(readiness), an idle engine notices through its probe, and all of it ends when a write
succeeds again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tidalmq_broker.storage.api import ObjectStoreUnavailable, PartitionConfig, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.health import WriteHealth
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_core.model import TopicPartition

from tests.support.storage_helpers import FaultyStore, batch

TP = TopicPartition("orders", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-000000000001"


def config(**changes: float) -> StorageConfig:
    values: dict[str, float] = {
        "flush_interval_ms": 5,
        "checkpoint_interval_s": 3600,
        "compaction_interval_s": 3600,
        "retention_check_interval_s": 3600,
        "garbage_sweep_interval_s": 3600,
        "flush_timeout_ms": 300,
        "store_probe_interval_ms": 200,
    }
    values.update(changes)
    return StorageConfig(**values)  # type: ignore[arg-type]


async def engine_on(tmp_path: Path, **changes: float) -> tuple[ObjectStreamEngine, FaultyStore]:
    store = FaultyStore(LocalDirObjectStore(tmp_path / "objects"))
    engine = ObjectStreamEngine(store, 1, config(**changes), owns_store=True)
    await engine.start()
    return engine, store


async def until(check: object, timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - started < timeout_s, "not in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def test_health_follows_the_last_write() -> None:
    now = [100.0]
    health = WriteHealth("1", clock=lambda: now[0])
    changes: list[str | None] = []
    health.on_change = changes.append
    assert health.problem is None
    health.failed(ObjectStoreUnavailable("disk full"))
    now[0] += 2.5
    health.failed(ObjectStoreUnavailable("disk still full"))
    assert health.problem == ("object store writes failing for 2.5s (2 failed): disk still full")
    assert len(changes) == 1  # once per outage, not per failed PUT
    health.ok()
    assert health.problem is None and changes[-1] is None and health.failures == 0


async def test_a_hanging_store_fails_appends_in_time_then_at_once(tmp_path: Path) -> None:
    engine, store = await engine_on(tmp_path)
    try:
        log = await engine.open_partition(TP, TOPIC_ID, 1, PartitionConfig())
        await log.append(batch(1))
        store.gate = asyncio.Event()  # every WAL PUT now hangs
        started = time.monotonic()
        with pytest.raises(ObjectStoreUnavailable, match=r"not durable within 0\.3s"):
            await asyncio.wait_for(log.append(batch(1)), 5)
        assert 0.25 < time.monotonic() - started < 2.0
        assert engine.write_problem is not None
        assert "not durable within" in engine.write_problem
        started = time.monotonic()
        with pytest.raises(ObjectStoreUnavailable):
            await log.append(batch(1))  # refused at once: no flush is tried
        assert time.monotonic() - started < 0.1
        store.gate.set()  # the store answers again: the probe sees it, appends go on
        store.gate = None
        await until(lambda: engine.write_problem is None)
        await until(lambda: log.state.value == "open")
        result = await log.append(batch(1))
        assert result.base_offset == 1  # the failed appends took no offsets
    finally:
        await engine.stop()


async def test_an_idle_engine_notices_through_its_probe(tmp_path: Path) -> None:
    engine, store = await engine_on(tmp_path)
    try:
        await asyncio.sleep(0.3)
        assert engine.write_problem is None
        assert store.ops["put"] >= 1  # probes: nothing else was written
        store.fail_put = lambda key: True  # e.g. the disk is full
        took = await until(lambda: engine.write_problem is not None)
        assert took < 1.5
        assert "injected failure" in (engine.write_problem or "")
        store.fail_put = None
        took = await until(lambda: engine.write_problem is None)
        assert took < 1.5  # probed every second while failing
    finally:
        await engine.stop()


async def test_no_probe_before_the_interval(tmp_path: Path) -> None:
    engine, store = await engine_on(tmp_path, store_probe_interval_ms=60_000)
    try:
        await asyncio.sleep(1.2)
        assert store.ops["put"] == 0
    finally:
        await engine.stop()
