"""The controller's garbage collection policy (tidalmq_controller/gc_policy.py): a freeze after
batches that changed many partitions, none after small ones; a young collection before each
freeze so garbage cycles are freed, not frozen; a deleted topic's memory still released by
reference counting although its objects were frozen."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections.abc import Iterator

import pytest
from tidalmq_controller import Controller, ControllerSettings, NewTopic, gc_policy
from tidalmq_controller._log import MemoryMetadataLog

from tests.support.fake_broker import FakeBroker

FAST = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=2.0,
    clock_margin_s=0.05,
    offsets_topic_partitions=1,
    tick_s=0.01,
)


@pytest.fixture(autouse=True)
def no_policy_left() -> Iterator[None]:
    gc_policy.uninstall()
    yield
    gc_policy.uninstall()
    gc.unfreeze()  # what a test froze goes back to the collector


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self) -> None:
        self.calls.append("collect")

    def freeze(self) -> None:
        self.calls.append("freeze")


def test_a_freeze_after_many_partitions_changed_once_per_turn() -> None:
    r = Recorder()
    scheduled: list[object] = []
    policy = gc_policy.GcPolicy(
        1000, collect_young=r.collect, freeze=r.freeze, schedule=scheduled.append
    )
    policy.changed(400)
    policy.changed(500)
    assert scheduled == [] and policy.pending == 900  # small batches: nothing
    policy.changed(200)  # 1,100 since the last freeze
    policy.changed(5000)  # in the same turn: still one freeze
    assert scheduled == [policy.freeze_now]
    policy.freeze_now()
    assert r.calls == ["collect", "freeze"]  # the young generations first
    assert policy.pending == 0 and policy.freezes == 1
    policy.changed(999)
    assert len(scheduled) == 1  # counted afresh from the freeze


async def start(c: Controller) -> FakeBroker:
    await c.start()
    broker = FakeBroker(c, 0)
    await broker.register()
    return broker


async def test_the_controller_freezes_after_a_big_topic_and_not_after_a_small_one() -> None:
    r = Recorder()
    gc_policy.install(gc_policy.GcPolicy(2000, collect_young=r.collect, freeze=r.freeze))
    c = Controller(MemoryMetadataLog(), FAST)
    broker = await start(c)
    try:
        await c.create_topics([NewTopic("small", 100)])
        await asyncio.sleep(0.05)
        assert r.calls == []
        await c.create_topics([NewTopic("big", 3000)])
        await asyncio.sleep(0.05)
        assert r.calls == ["collect", "freeze"]
    finally:
        broker.silence()
        await c.stop()


async def memory_of_a_deleted_topic(policy: gc_policy.GcPolicy | None) -> tuple[int, int]:
    """(bytes a topic of 5,000 partitions added, bytes still held once it was deleted), as
    tracemalloc counts them, with `policy` installed or none."""
    gc_policy.uninstall()
    if policy is not None:
        gc_policy.install(policy)
    c = Controller(MemoryMetadataLog(), FAST)
    broker = await start(c)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await c.create_topics([NewTopic("doomed", 5000)])
        await asyncio.sleep(0.05)
        created = tracemalloc.get_traced_memory()[0]
        if policy is not None:
            assert policy.freezes == 1 and gc.get_freeze_count() > 5000
        await c.delete_topics(["doomed"])
        await asyncio.sleep(0.3)  # the broker applies the deletion too
        gc.collect()  # frees nothing frozen: what the policy froze goes by reference counting
        return created - before, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        broker.silence()
        await c.stop()


async def test_a_deleted_topics_memory_is_released_though_it_was_frozen() -> None:
    grown, kept = await memory_of_a_deleted_topic(gc_policy.GcPolicy(2000))  # real gc calls
    assert grown > 2_000_000, grown  # the partitions in the image, the indexes, the broker's
    gc.unfreeze()
    assert gc.collect() < 100  # no garbage cycles hid among the frozen objects
    grown_off, kept_off = await memory_of_a_deleted_topic(None)
    # kept either way: the indexes' emptied hash tables (they do not shrink), the creation's
    # batch in the journal's ring; the policy keeps nothing more
    assert kept < 0.4 * grown, (grown, kept)
    assert kept < kept_off + 0.05 * grown_off, (kept, kept_off, grown_off)


class Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_garbage_cycles_made_before_a_freeze_are_collected_not_frozen() -> None:
    policy = gc_policy.GcPolicy(1)
    garbage = Cyclic()
    gone = weakref.ref(garbage)
    del garbage  # a cycle: only the collector frees it
    assert gone() is not None
    policy.freeze_now()
    assert gone() is None
