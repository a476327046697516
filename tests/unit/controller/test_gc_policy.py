"""The controller's garbage collection policy (tidalmq_controller/gc_policy.py): a freeze after
batches that changed many partitions, none after small ones; a young collection before each
freeze so garbage cycles are freed, not frozen; a deleted topic's memory still released by
reference counting although its objects were frozen; the unfreeze rule (when a controller stops:
its objects hold each other) and what it rests on (a join's moves leave no frozen garbage)."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from tidalmq_controller import Controller, NewTopic, gc_policy
from tidalmq_controller._log import MemoryMetadataLog

from tests.support.controllers import FAST
from tests.support.fake_broker import FakeBroker

SLICED = replace(FAST, offsets_topic_partitions=2, auto_rebalance=True, max_moves_per_step=20)


@pytest.fixture(autouse=True)
def no_policy_left() -> Iterator[None]:
    gc_policy.uninstall()
    gc.collect()  # no garbage of an earlier test in any generation (a freeze would keep it)
    yield
    gc_policy.uninstall()
    gc.unfreeze()  # what a test froze goes back to the collector
    gc.collect()


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self) -> None:
        self.calls.append("collect")

    def collect_all(self) -> None:
        self.calls.append("collect all")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def policy(self, freeze_after: int, **kwargs: object) -> gc_policy.GcPolicy:
        return gc_policy.GcPolicy(
            freeze_after,
            collect_young=self.collect,
            collect_all=self.collect_all,
            freeze=self.freeze,
            unfreeze=self.unfreeze,
            **kwargs,  # type: ignore[arg-type]
        )

    def freeze(self) -> None:
        self.calls.append("freeze")


def test_a_freeze_after_many_partitions_changed_once_per_turn() -> None:
    r = Recorder()
    scheduled: list[object] = []
    policy = r.policy(1000, schedule=scheduled.append)
    policy.changed(400)
    policy.changed(500)
    assert scheduled == [] and policy.pending == 900  # small batches: nothing
    policy.changed(200)  # 1,100 since the last freeze
    policy.changed(5000)  # in the same turn: still one freeze
    assert scheduled == [policy.freeze_now]
    policy.freeze_now()
    assert r.calls == ["collect all", "freeze"]  # the first freeze: everything collected first
    assert policy.pending == 0 and policy.freezes == 1
    policy.changed(999)
    assert len(scheduled) == 1  # counted afresh from the freeze
    policy.changed(1)
    policy.freeze_now()
    assert r.calls[2:] == ["collect", "freeze"]  # then only what was made since
    policy.unfreeze()  # a controller stopped
    policy.changed(1000)
    policy.freeze_now()
    assert r.calls[4:] == ["unfreeze", "collect all", "freeze"]


async def start(c: Controller) -> FakeBroker:
    await c.start()
    broker = FakeBroker(c, 0)
    await broker.register()
    return broker


async def test_the_controller_freezes_after_a_big_topic_and_not_after_a_small_one() -> None:
    r = Recorder()
    gc_policy.install(r.policy(2000))
    assert r.calls == ["collect all", "freeze"]  # what the process holds at start-up
    c = Controller(MemoryMetadataLog(), FAST)
    broker = await start(c)
    try:
        await c.create_topics([NewTopic("small", 100)])
        await asyncio.sleep(0.05)
        assert r.calls == ["collect all", "freeze"]
        await c.create_topics([NewTopic("big", 3000)])
        await asyncio.sleep(0.05)
        assert r.calls[2:] == ["collect", "freeze"]  # what was made since
    finally:
        broker.silence()
        await c.stop()
    assert r.calls[-1] == "unfreeze"  # the controller stopped


async def test_a_stopped_controller_is_freed_though_it_was_frozen() -> None:
    """The operator starts a new controller in the same process each time its replica is
    elected again; the old one's objects hold each other, so only a collection frees them."""
    log = MemoryMetadataLog()
    first = Controller(log, FAST)
    policy = gc_policy.install(gc_policy.GcPolicy(2000))  # the real gc calls
    broker = await start(first)
    await first.create_topics([NewTopic("t", 3000)])
    await asyncio.sleep(0.05)
    assert policy.freezes == 2  # at install, and after the topic
    broker.silence()
    await first.stop()
    gone = weakref.ref(first)
    del first, broker
    second = Controller(log, FAST)
    await second.start()  # loads 3,000 partitions: a freeze, everything collected first
    try:
        await asyncio.sleep(0.05)
        assert policy.freezes == 3
        assert gone() is None
    finally:
        await second.stop()


async def memory_of_a_deleted_topic(
    policy: gc_policy.GcPolicy | None,
) -> tuple[int, int, int]:
    """(bytes a topic of 5,000 partitions added, bytes still held once it was deleted, as
    tracemalloc counts them; garbage a full collection finds once everything is unfrozen),
    with `policy` installed or none."""
    gc_policy.uninstall()
    c = Controller(MemoryMetadataLog(), FAST)  # first: it replaces an earlier test's
    # controller in the journal's queue gauge, which kept it alive until now
    if policy is not None:
        gc_policy.install(policy)
    broker = await start(c)
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await c.create_topics([NewTopic("doomed", 5000)])
        await asyncio.sleep(0.05)
        created = tracemalloc.get_traced_memory()[0]
        if policy is not None:  # at install, and after the topic
            assert policy.freezes == 2 and gc.get_freeze_count() > 5000
        await c.delete_topics(["doomed"])
        await asyncio.sleep(0.3)  # the broker applies the deletion too
        gc.collect()  # frees nothing frozen: what the policy froze goes by reference counting
        kept = tracemalloc.get_traced_memory()[0] - before
        gc.unfreeze()
        return created - before, kept, gc.collect()  # garbage cycles hidden among the frozen
    finally:
        tracemalloc.stop()
        broker.silence()
        await c.stop()


async def test_a_deleted_topics_memory_is_released_though_it_was_frozen() -> None:
    grown, kept, garbage = await memory_of_a_deleted_topic(gc_policy.GcPolicy(2000))  # real gc
    assert grown > 2_000_000, grown  # the partitions in the image, the indexes, the broker's
    assert garbage < 50  # no garbage cycles hid among the frozen objects
    grown_off, kept_off, _ = await memory_of_a_deleted_topic(None)
    # kept either way: the indexes' emptied hash tables (they do not shrink), the creation's
    # batch in the journal's ring; the policy keeps nothing more
    assert kept < 0.4 * grown, (grown, kept)
    assert kept < kept_off + 0.05 * grown_off, (kept, kept_off, grown_off)


class Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_garbage_cycles_made_before_a_freeze_are_collected_not_frozen() -> None:
    policy = gc_policy.GcPolicy(1)
    policy.freeze_now()  # the first freeze (at install) collects everything
    garbage = Cyclic()
    gone = weakref.ref(garbage)
    del garbage  # a cycle: only the collector frees it
    assert gone() is not None
    policy.freeze_now()  # the young generations
    assert gone() is None


async def test_moves_leave_no_garbage_cycles_among_frozen_objects() -> None:
    """The policy unfreezes only when a controller stops: that rests on what was frozen while
    it runs not becoming garbage cycles, which only a full collection of everything finds. A join's moves are the controller's
    busiest bookkeeping (each move's status, the indexes, the membership's reports)."""
    c = Controller(MemoryMetadataLog(), SLICED)  # before: see memory_of_a_deleted_topic
    policy = gc_policy.install(gc_policy.GcPolicy(50))  # freezes again and again during the join
    brokers = [FakeBroker(c, 0, reconcile=True)]
    await c.start()
    try:
        await brokers[0].register()
        await c.create_topics([NewTopic("t", 398)])  # 400 partitions with the offsets topic
        await wait_for(lambda: len(brokers[0].open) == 400)
        joining = FakeBroker(c, 1, reconcile=True)
        brokers.append(joining)
        await joining.register()  # its fair share: 200 moves
        await wait_for(lambda: not c.moves.active() and len(joining.open) == 200)
        assert policy.freezes > 3
        gc.collect()  # what is not frozen
        gc.unfreeze()
        assert gc.collect() < 50  # what the freezes kept that a full collection frees
    finally:
        for b in brokers:
            b.silence()
        await c.stop()
