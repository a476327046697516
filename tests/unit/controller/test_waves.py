"""Moves run in waves (tidalmq_controller/_leadership.py): a rebalance queues every move at once,
and the controller starts them while each broker has fewer than `max_moves_per_broker` in flight
as source or target. Through the real Controller with brokers played by the test."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from tidalmq_controller import Controller, ControllerSettings, NewTopic
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.metadata import NO_LEADER
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase
from tidalmq_core.records import MetadataDelta

from tests.support.fake_broker import FakeBroker

WAVES = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=0.6,
    clock_margin_s=0.05,
    election_timeout_s=2.0,  # moves here finish by their sources closing, never by fencing
    auto_rebalance=True,
    offsets_topic_partitions=2,
    tick_s=0.01,
    max_moves_per_broker=2,
)


async def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


def leaders(c: Controller) -> dict[TopicPartition, int]:
    return {
        TopicPartition(name, i): p.leader
        for name, topic in c.image.topics.items()
        for i, p in enumerate(topic.partitions)
    }


async def test_a_rebalance_onto_a_new_broker_runs_in_waves_of_at_most_the_cap() -> None:
    c = Controller(MemoryMetadataLog(), WAVES)
    await c.start()
    brokers = [FakeBroker(c, 0, reconcile=True)]
    fenced: list[str] = []
    c.add_event_sink(
        lambda reason, msg, _: fenced.append(msg) if reason == "BrokerFenced" else None
    )
    try:
        await brokers[0].register()
        await c.create_topics([NewTopic("t", 18)])  # 20 partitions with the offsets topic
        await wait_for(lambda: all(c.membership.is_open(0, tp) for tp in leaders(c)))

        # what is in flight on each broker, seen after every proposal the controller makes:
        # by the tracker, and from the image and the brokers' reports themselves
        seen_tracker: Counter[int] = Counter()
        seen_image: Counter[int] = Counter()

        def in_flight_now(_: MetadataDelta) -> None:
            closing = opening = 0
            for name, topic in c.image.topics.items():
                for i, p in enumerate(topic.partitions):
                    tp = TopicPartition(name, i)
                    if p.target_replicas == [1] and p.leader == NO_LEADER:
                        closing += 1  # the source closes it for broker 1
                    elif p.leader == 1 and not c.membership.is_open(1, tp, p.leader_epoch):
                        opening += 1  # elected on broker 1, not open there yet
            seen_image[1] = max(seen_image[1], closing + opening)
            for b in (0, 1):
                seen_tracker[b] = max(seen_tracker[b], c.moves.inflight_on(b))

        c.journal.add_applied_hook(in_flight_now)
        joining = FakeBroker(c, 1, reconcile=True)
        brokers.append(joining)
        await joining.register()  # the join rebalance queues the fair share: 10 moves
        queued = {tp for tp, *_ in c.list_reassignments()}
        assert len(queued) == 10
        await wait_for(lambda: not c.moves.active())
        assert Counter(leaders(c).values()) == {0: 10, 1: 10}
        done = [m for m in c.moves.recent() if m.tp in queued]
        assert len(done) == 10 and all(m.phase is Phase.DONE and m.target == 1 for m in done)
        assert seen_image[1] <= 2 and seen_tracker[1] <= 2, (seen_image, seen_tracker)
        assert seen_tracker[0] <= 2, "the source is capped too"
        assert seen_tracker[1] == 2, "moves ran two at a time, not one by one"
        assert not fenced, "every move finished by its source closing"
    finally:
        for b in brokers:
            b.silence()
        await c.stop()
