"""The controller's event loop works in bounded slices (docs/control-plane.md, "Liveness never
waits"): a join's or a drain's rebalance queues its moves `max_moves_per_step` at a time and
yields to the loop between them, and a step elects at most `max_moves_per_step` partitions, so
no callback of the loop proposes more than a few steps' worth of records however many moves a
scale-out or scale-in makes. Before, the fair share of a new broker (10,000 moves at 50,000
partitions) was queued in one slice and elected in one step: 100-300 ms of CPU during which
nothing else on the loop ran and the liveness thread fought for the GIL. Counted structurally
(records per slice of the loop), never timed."""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import partial

from tidalmq_controller import Controller, ControllerSettings, NewTopic
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import Record

from tests.support.fake_broker import FakeBroker
from tests.support.waiting import eventually

STEP = 20  # max_moves_per_step: the slices' bound
SETTINGS = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=5.0,  # no broker dies on a loaded machine's late heartbeat
    clock_margin_s=0.05,
    election_timeout_s=3.0,
    auto_rebalance=True,
    offsets_topic_partitions=2,
    tick_s=0.01,
    max_moves_per_step=STEP,
)


wait_for = partial(eventually, timeout_s=20.0)  # this module's default wait


def leaders(c: Controller) -> Counter[int]:
    return Counter(p.leader for topic in c.image.topics.values() for p in topic.partitions)


class SliceCounter:
    """Records proposed per slice of the event loop. A slice is one callback: one step of one
    task in one iteration of the loop (a ticker task counts the iterations)."""

    def __init__(self, c: Controller) -> None:
        self.iteration = 0
        self.per_slice: Counter[tuple[int, int]] = Counter()
        self._ticker = asyncio.create_task(self._tick())
        original = c.journal.propose

        def propose(records: list[Record]) -> int:
            task = asyncio.current_task()
            self.per_slice[(self.iteration, id(task))] += len(records)
            return original(records)

        c.journal.propose = propose  # type: ignore[method-assign]

    async def _tick(self) -> None:
        while True:
            self.iteration += 1
            await asyncio.sleep(0)

    def largest(self) -> int:
        return max(self.per_slice.values(), default=0)

    def stop(self) -> None:
        self._ticker.cancel()


async def test_a_join_and_a_drain_of_many_moves_run_in_bounded_slices() -> None:
    c = Controller(MemoryMetadataLog(), SETTINGS)
    await c.start()
    brokers = [FakeBroker(c, 0, reconcile=True)]
    slices: SliceCounter | None = None
    try:
        await brokers[0].register()
        await c.create_topics([NewTopic("t", 398)])  # 400 partitions with the offsets topic
        await wait_for(lambda: all(c.membership.is_open(0, tp) for tp in partitions(c)))

        slices = SliceCounter(c)
        joining = FakeBroker(c, 1, reconcile=True)
        brokers.append(joining)
        await joining.register()  # the join's fair share: 200 moves, ten times the bound
        await wait_for(lambda: not c.moves.active() and leaders(c) == {0: 200, 1: 200})
        joined = slices.largest()

        slices.per_slice.clear()
        assert await c.drain_broker(0, timeout_s=20.0)  # scale-in: its 200 partitions move
        await wait_for(lambda: not c.moves.active() and leaders(c) == {1: 400})
        drained = slices.largest()

        # a step proposes at most STEP elections plus STEP moves started plus STEP first
        # openings (and a floors record per topic); queueing proposes STEP moves a slice.
        # Before, one slice queued all 200 moves, and one step elected them all
        assert 0 < joined <= 3 * STEP + 2, slices.per_slice.most_common(3)
        assert 0 < drained <= 3 * STEP + 2, slices.per_slice.most_common(3)
        assert all(c.membership.is_open(1, tp) for tp in partitions(c))
    finally:
        if slices is not None:
            slices.stop()
        for b in brokers:
            b.silence()
        await c.stop()


def partitions(c: Controller) -> list[TopicPartition]:
    return [
        TopicPartition(name, i)
        for name, topic in c.image.topics.items()
        for i in range(len(topic.partitions))
    ]
