"""Moves run in waves (tidalmq_controller/_leadership.py): a rebalance queues every move at once,
and the controller starts them while each broker has fewer than `max_moves_per_broker` in flight
as source or target. Through the real Controller with brokers played by the test."""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import partial
from pathlib import Path

from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, NewTopic, ObjectStoreMetadataLog
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.metadata import NO_LEADER
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry
from tidalmq_core.records import MetadataDelta

from tests.support.fake_broker import FakeBroker
from tests.support.waiting import eventually

WAVES = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    # moves here finish by their sources closing, never by fencing, and no broker dies: a
    # loaded machine's late heartbeat must not declare one dead (0.6 s did) or fence a source
    session_timeout_s=5.0,
    clock_margin_s=0.05,
    election_timeout_s=3.0,
    auto_rebalance=True,
    offsets_topic_partitions=2,
    tick_s=0.01,
    max_moves_per_broker=2,
)


wait_for = partial(eventually, timeout_s=10.0)  # this module's default wait


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


async def test_waves_go_on_after_a_controller_restart_whose_target_restarted_too(
    tmp_path: Path,
) -> None:
    """bench/controller_crash.py with --max-moves-per-broker: the whole cluster is killed in
    the middle of a rebalance in waves and started again, controller first. The new controller
    resumes the closing moves and elects their target before the target's process is back; the
    target then registers as a new incarnation, which takes its partitions back at epoch + 1.
    The moves elected at the earlier epoch must still finish (they did not: they waited
    forever for an open at their own epoch, holding the target's wave slots, so no queued move
    ever started again)."""
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    settings = dataclasses.replace(WAVES, auto_rebalance=False)  # only the moves below
    first = Controller(store, settings)
    second = Controller(store, settings)
    await first.start()
    source, target = FakeBroker(first, 0), FakeBroker(first, 1)
    back = FakeBroker(second, 0, incarnation="b", reconcile=True)
    late = FakeBroker(second, 1, incarnation="b", reconcile=True)
    stopped = False
    moving = [TopicPartition("t", i) for i in range(6)]

    def epoch(c: Controller, tp: TopicPartition) -> int:
        return c.image.topics[tp.topic].partitions[tp.partition].leader_epoch

    try:
        for b in (source, target):
            await b.register()
        await first.create_topics([NewTopic("t", 8, assignment=[0] * 8)])
        await wait_for(lambda: leaders(first).get(TopicPartition("t", 7)) == 0)
        # the source keeps every partition open: the first wave stays closing until the kill
        source.open.update({tp: epoch(first, tp) for tp in moving})
        await first.alter_reassignments([PlanEntry(tp, 1) for tp in moving])
        assert first.moves.count(Phase.CLOSING) == 2 and first.moves.count(Phase.PENDING) == 4
        source.silence()  # killed with the controller (the brokers follow its process)
        target.silence()
        await first.stop()
        stopped = True

        await second.start()
        assert second.moves.count(Phase.CLOSING) == 2 and second.moves.count(Phase.PENDING) == 4
        # the source's process is back first; the target's only once its moves were elected
        await back.register()
        await wait_for(lambda: second.moves.count(Phase.OPENING) == 2)
        elected = {m.tp: m.epoch for m in second.moves.in_phase(Phase.OPENING)}
        await late.register()
        # its new incarnation took back what was elected on the old one, at epoch + 1
        assert all(epoch(second, tp) == (e or 0) + 1 for tp, e in elected.items())
        await wait_for(lambda: not second.moves.active(), timeout_s=15)
        assert all(leaders(second)[tp] == 1 for tp in moving)
        done = {m.tp for m in second.moves.recent() if m.phase is Phase.DONE}
        assert done >= set(moving)
    finally:
        for b in (source, target, back, late):
            b.silence()
        if not stopped:
            await first.stop()
        await second.stop()
