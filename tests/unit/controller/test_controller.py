"""The controller's decisions with short leases: moves, cancel, election timeout and fencing,
failover, and a deposed controller. A session or election timeout is short only in the tests
of that timeout (SHORT_SESSIONS, SHORT_ELECTION); the rest run on PATIENT. Brokers are played by the test through the controller's own
RPC surface (register, heartbeat, report closed/opened); metadata lives in a real local-directory
object store."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerFenced,
    ControllerSettings,
    NewTopic,
    ObjectStoreMetadataLog,
)
from tidalmq_core.metadata import NO_LEADER, BrokerInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry
from tidalmq_core.records import marker_record

from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker
from tests.support.leaders import walked_leaders
from tests.support.waiting import eventually

# Every clock short: the base of the settings below, and what test_data_loss.py starts from.
FAST = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=0.6,
    clock_margin_s=0.05,
    election_timeout_s=0.4,
    auto_rebalance=False,
    offsets_topic_partitions=2,
    tick_s=0.01,
)

# What every test runs on unless a timeout is what it tests. FAST's 0.6 s sessions and 0.4 s
# election timeout raced the tests' own waits: on a loaded 2-core machine a late heartbeat
# declared a fake broker dead (its partitions failed over), or a stall of the event loop fenced
# a source before it could close. A fence now takes 3 s and a death 5 s, after everything these
# tests wait for; `assert not fenced` still catches a move that went that way. Leases (0.3 s)
# and the role window stay short: several tests wait for a lease to run out.
PATIENT = dataclasses.replace(FAST, election_timeout_s=3.0, session_timeout_s=5.0)

# For the tests of the session timeout itself (a silent broker declared dead, a failover, a
# held failover): only the session is short, a fence still takes 3 s.
SHORT_SESSIONS = dataclasses.replace(PATIENT, session_timeout_s=FAST.session_timeout_s)

# For the test of the election timeout itself (a source that never closes is fenced): only the
# election timeout is short, a late heartbeat cannot declare the source dead instead.
SHORT_ELECTION = dataclasses.replace(PATIENT, election_timeout_s=FAST.election_timeout_s)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, PATIENT) as c:
        yield c


@pytest.fixture
async def short_sessions(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SHORT_SESSIONS) as c:
        yield c


@pytest.fixture
async def short_election(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SHORT_ELECTION) as c:
        yield c


wait_for = partial(eventually, timeout_s=5.0)  # this module's default wait


def fences(c: Controller) -> list[str]:
    """The controller's BrokerFenced events from now on: a move that finishes on its fast path
    (the source closed) must not have gone through the election timeout's fence instead."""
    seen: list[str] = []
    c.add_event_sink(
        lambda reason, message, _: seen.append(message) if reason == "BrokerFenced" else None
    )
    return seen


def fenced_now(c: Controller, broker_id: int) -> bool:
    """The controller no longer renews the lease of the broker's current incarnation."""
    live = c.membership.get(broker_id)
    return live is not None and live.fenced_at is not None


def part(c: Controller, topic: str, index: int):  # type: ignore[no-untyped-def]
    return c.metadata.topics[topic].partitions[index]


async def cluster_of(c: Controller, n: int, *, reconcile: bool = False) -> list[FakeBroker]:
    brokers = [FakeBroker(c, i, reconcile=reconcile) for i in range(n)]
    for b in brokers:
        await b.register()
    return brokers


async def test_new_topics_are_placed_round_robin(controller: Controller) -> None:
    await cluster_of(controller, 3)
    (result,) = await controller.create_topics([NewTopic("t", 7)])
    assert result.error is None
    assert [p.leader for p in controller.metadata.topics["t"].partitions] == [0, 1, 2, 0, 1, 2, 0]


async def test_create_topics_waits_for_each_partition_reported_open_at_its_epoch(
    controller: Controller,
) -> None:
    """CreateTopics with a wait answers once every leader reported its partition open: the
    reports strike them off, an open at another epoch does not count, the answer comes at once
    after the last report (not on the next once-a-second check)."""
    fakes = await cluster_of(controller, 2)
    task = asyncio.create_task(controller.create_topics([NewTopic("w", 4)], wait_s=10.0))
    await wait_for(lambda: "w" in controller.metadata.topics)
    parts = controller.metadata.topics["w"].partitions
    reports = [
        {"kind": "opened", "topic": "w", "partition": i, "epoch": p.leader_epoch, "stored": False}
        for i, p in enumerate(parts)
    ]
    by_broker = {b: [r for i, r in enumerate(reports) if parts[i].leader == b] for b in (0, 1)}

    def report(broker_id: int, opened: list[dict[str, Any]]) -> None:
        # what a broker reports open is also in its heartbeats' full list, as a real broker's:
        # a heartbeat listing less (the fake's empty `open`) would take the opens back
        for r in opened:
            fakes[broker_id].open[TopicPartition("w", r["partition"])] = r["epoch"]
        controller.partitions_reported(broker_id, opened)

    report(0, by_broker[0])
    report(1, [dict(r, epoch=r["epoch"] + 5) for r in by_broker[1]])
    await asyncio.sleep(0.05)
    assert not task.done(), "partitions open at another epoch count as not open"
    report(1, by_broker[1])
    # answered by the report itself, within a few turns of the event loop: the once-a-second
    # check would need a timeout to pass first (no wall clock here: a loaded machine is slow)
    for _ in range(50):
        if task.done():
            break
        await asyncio.sleep(0)
    assert task.done(), "the last report did not end the wait at once"
    (result,) = task.result()
    assert result.error is None
    assert controller.open_waits.waiting == []  # nothing left behind


async def test_create_topics_wait_also_sees_opens_from_full_heartbeats(
    controller: Controller,
) -> None:
    """A broker that reports its opens only in its heartbeat's full list still ends the wait
    (the once-a-second check); a wait that nobody answers ends at its deadline."""
    (a,) = await cluster_of(controller, 1, reconcile=True)
    started = time.monotonic()
    (result,) = await controller.create_topics([NewTopic("h", 3)], wait_s=5.0)
    assert result.error is None and time.monotonic() - started < 2.5
    assert all(controller.membership.is_open(0, TopicPartition("h", i)) for i in range(3))
    a.reconcile = False
    a.open.clear()  # from now on it never opens anything
    started = time.monotonic()
    await controller.create_topics([NewTopic("never", 2)], wait_s=0.3)
    assert 0.3 <= time.monotonic() - started < 1.5
    assert controller.open_waits.waiting == []  # nothing left behind


async def test_move_records_target_then_elects_after_the_source_closes(
    controller: Controller,
) -> None:
    a, b = await cluster_of(controller, 2)
    fenced = fences(controller)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0
    epoch = part(controller, "t", 0).leader_epoch
    errors = await controller.alter_reassignments([PlanEntry(tp, 1)])
    assert errors == {tp: None}
    p = part(controller, "t", 0)
    assert p.leader == NO_LEADER and p.target_replicas == [1] and p.leader_epoch == epoch
    led = controller.leaders_per_broker()
    assert led == walked_leaders(controller.metadata) and led[-1] == 1 and 1 not in led
    assert controller.moves.get(tp).phase is Phase.CLOSING  # type: ignore[union-attr]
    await asyncio.sleep(0.1)
    assert part(controller, "t", 0).leader == NO_LEADER, "no election before the source closed"
    del a.open[tp]
    controller.partition_closed(0, tp, epoch)
    await wait_for(lambda: part(controller, "t", 0).leader == 1)
    assert part(controller, "t", 0).leader_epoch == epoch + 1
    b.open[tp] = epoch + 1
    await wait_for(lambda: controller.moves.get(tp) is None)
    led = controller.leaders_per_broker()
    assert led == walked_leaders(controller.metadata) and led[1] == 1 and -1 not in led
    assert controller.moves.recent()[-1].phase is Phase.DONE
    assert not fenced and not a.fenced, "elected through the timeout, not the source's report"


async def test_heartbeat_without_the_partition_counts_as_closed(controller: Controller) -> None:
    """A lost "closed" report is repaired by the next heartbeat (level-based)."""
    a, _ = await cluster_of(controller, 2)
    fenced = fences(controller)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    await a.catch_up()  # the broker applied the move...
    del a.open[tp]  # ...and closed the partition, but its report was lost
    await wait_for(lambda: part(controller, "t", 0).leader == 1)
    assert not fenced and not a.fenced, "elected through the timeout, not the heartbeat"


async def test_cancel_rolls_back_with_a_higher_epoch(controller: Controller) -> None:
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0
    epoch = part(controller, "t", 0).leader_epoch
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    assert controller.list_reassignments() == [(tp, [1, 0], [1], [0])]
    errors = await controller.alter_reassignments([PlanEntry(tp, None)])
    assert errors == {tp: None}
    p = part(controller, "t", 0)
    assert (p.leader, p.leader_epoch, p.moving) == (0, epoch + 1, False)
    assert controller.moves.recent()[-1].phase is Phase.CANCELLED
    again = await controller.alter_reassignments([PlanEntry(tp, None)])
    assert "not being reassigned" in str(again[tp])


async def test_election_timeout_fences_the_source_and_waits_for_its_lease(
    short_election: Controller,
) -> None:
    # the election timeout is what is tested: SHORT_ELECTION keeps it at 0.4 s
    controller = short_election
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0  # the source never closes
    started = time.monotonic()
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    await wait_for(lambda: a.fenced, timeout_s=5)
    # when the controller fenced it (the test may see it later on a loaded machine)
    live = controller.membership.get(0)
    assert live is not None and live.fenced_at is not None
    fenced_at = live.fenced_at
    assert fenced_at - started >= SHORT_ELECTION.election_timeout_s * 0.9
    # the last lease broker 0 was granted, before the fence (a fenced broker's is not renewed):
    # on a loaded machine its last heartbeat may have come well before the fence, so the bound
    # is the grant's own end, not the fence plus a lease
    lease_end = controller.membership.lease_end(0)
    assert lease_end > live.last_grant
    await wait_for(lambda: part(controller, "t", 0).leader == 1, timeout_s=5)
    elected_at = time.monotonic()
    # elected no sooner than the source's last lease expired
    assert elected_at >= lease_end, (elected_at - fenced_at, lease_end - fenced_at)
    assert part(controller, "t", 0).leader_epoch == 1


async def fence_a_source_that_never_closes(controller: Controller) -> None:
    """Broker 0 leads t-0, keeps it open through a move onto broker 1, is fenced for it (leases
    of 2 s: its own cannot run out before the caller's next step), and falls silent."""
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    assert part(controller, "t", 0).leader == 0
    a.open[tp] = 0  # the source never closes
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    await wait_for(lambda: fenced_now(controller, 0), timeout_s=10)
    a.silence()


async def test_a_fenced_source_registering_again_is_not_fenced_again_before_it_heartbeats(
    tmp_path: Path,
) -> None:
    """A source fenced for a move it did not close gives up everything and registers again as a
    new incarnation (as a broker does on a fence), then catches up the metadata before its
    first heartbeat. Fenced again in that window (its predecessor's close long overdue, and no
    heartbeat yet to say it applied the close and has nothing open), it registered again, to be
    fenced again before its next first heartbeat: the livelock that kept a restarted local
    cluster's brokers fenced every 1-4 s, their moves never elected (docs/control-plane.md, "A
    controller restart"). The new incarnation has until its first heartbeat (an election timeout
    at most), which elects the move: no second fence. Leases of 2 s: the fenced incarnation's
    own lease (which would elect the move without the new one) cannot run out before the new
    incarnation registered."""
    settings = dataclasses.replace(SHORT_ELECTION, lease_s=2.0)
    async with running_controller(tmp_path, settings) as controller:
        await fence_a_source_that_never_closes(controller)
        fenced = fences(controller)
        back = FakeBroker(controller, 0, incarnation="b")
        await back.register(heartbeat=False)  # catching up: no heartbeat yet
        for _ in range(3):  # the decisions the controller's loop takes meanwhile
            await controller._step()
        live = controller.membership.get(0)
        assert live is not None and live.incarnation == "b"
        assert not fenced_now(controller, 0) and not fenced, "fenced before its first heartbeat"
        assert part(controller, "t", 0).moving
        back.start_heartbeats()  # applied the close, has nothing open
        await wait_for(lambda: part(controller, "t", 0).leader == 1, timeout_s=10)
        assert not fenced and not back.fenced


async def test_a_fenced_source_registering_again_does_not_cut_its_old_lease_short(
    tmp_path: Path,
) -> None:
    """A fenced source's moves elect once its lease has run out. Registered again as a new
    incarnation (it no longer counts as fenced) whose first heartbeat says it applied the close
    and has nothing open, its moves still wait for the fenced incarnation's lease: the new
    one's word says nothing of what the old one may still acknowledge."""
    settings = dataclasses.replace(SHORT_ELECTION, lease_s=2.0)
    async with running_controller(tmp_path, settings) as controller:
        await fence_a_source_that_never_closes(controller)
        lease_end = controller.membership.lease_end(0)
        back = FakeBroker(controller, 0, incarnation="b")
        await back.register()  # and heartbeats at once: nothing open, the close applied
        await wait_for(lambda: part(controller, "t", 0).leader == 1, timeout_s=10)
        assert time.monotonic() >= lease_end


async def test_dead_broker_partitions_open_elsewhere_with_higher_epochs(
    short_sessions: Controller,
) -> None:
    # a broker dies by its session timeout here: SHORT_SESSIONS keeps it at 0.6 s
    controller = short_sessions
    *_, c = await cluster_of(controller, 3)
    await controller.create_topics([NewTopic("t", 6)])
    before = {
        i: (p.leader, p.leader_epoch)
        for i, p in enumerate(controller.metadata.topics["t"].partitions)
    }
    c.silence()
    silenced = time.monotonic()
    await wait_for(lambda: controller.metadata.brokers[2].state == "dead", timeout_s=5)
    assert (
        time.monotonic() - silenced
        >= SHORT_SESSIONS.session_timeout_s - SHORT_SESSIONS.heartbeat_interval_s
    )
    after = controller.metadata.topics["t"].partitions
    for i, (leader, epoch) in before.items():
        if leader == 2:
            assert after[i].leader in (0, 1) and after[i].leader_epoch == epoch + 1
        else:
            assert (after[i].leader, after[i].leader_epoch) == (leader, epoch)
    reply = await controller.heartbeat(2, "a", 99, {})
    assert reply.fenced, "a dead broker must register again"


async def test_restarted_broker_waits_for_its_old_lease(controller: Controller) -> None:
    (a,) = await cluster_of(controller, 1)
    await controller.create_topics([NewTopic("t", 1)])
    epoch = part(controller, "t", 0).leader_epoch
    a.silence()
    restarted = FakeBroker(controller, 0, incarnation="b")
    t0 = time.monotonic()
    await restarted.register()
    assert part(controller, "t", 0).leader == NO_LEADER, "old incarnation may still hold a lease"
    await wait_for(lambda: part(controller, "t", 0).leader == 0, timeout_s=5)
    assert time.monotonic() - t0 >= PATIENT.lease_s - 0.1
    assert part(controller, "t", 0).leader_epoch == epoch + 1


async def test_a_deposed_controller_cannot_write(tmp_path: Path) -> None:
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    old = Controller(store, PATIENT)
    await old.start()
    new = Controller(store, PATIENT)
    await new.start()
    assert new.metadata.controller_epoch == old.metadata.controller_epoch + 1
    with pytest.raises(ControllerFenced):
        await old.allocate_producer_id()
    assert await new.allocate_producer_id() >= 1000
    await old.stop()
    await new.stop()


async def test_producer_ids_are_unique_across_controller_restarts(tmp_path: Path) -> None:
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, PATIENT)
    await first.start()
    ids = {await first.allocate_producer_id() for _ in range(5)}
    await first.stop()
    second = Controller(store, PATIENT)
    await second.start()
    more = {await second.allocate_producer_id() for _ in range(5)}
    await second.stop()
    assert len(ids | more) == 10


async def test_an_old_incarnation_cannot_drain_or_remove_its_replacement(
    controller: Controller,
) -> None:
    """A pod deleted with grace period 0 may still run its preStop drain after its replacement
    (same broker id, new incarnation) registered."""
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 4)])
    a.silence()
    replacement = FakeBroker(controller, 0, incarnation="b")
    await replacement.register()
    assert await controller.drain_broker(0, timeout_s=0.5, incarnation="a")
    assert controller.metadata.brokers[0].state == "alive"
    await controller.remove_broker(0, incarnation="a")
    assert 0 in controller.metadata.brokers
    await controller.remove_broker(0, incarnation="b")
    assert 0 not in controller.metadata.brokers


async def test_removing_a_live_broker_waits_for_its_lease(controller: Controller) -> None:
    await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 2)])
    t0 = time.monotonic()
    await controller.remove_broker(1)  # not the broker itself: it may still hold a lease
    assert part(controller, "t", 1).leader == NO_LEADER
    await wait_for(lambda: part(controller, "t", 1).leader == 0, timeout_s=5)
    assert time.monotonic() - t0 >= PATIENT.lease_s - 0.1


async def test_a_late_closed_report_of_an_earlier_epoch_does_not_elect(
    controller: Controller,
) -> None:
    """A "closed" report of an earlier close (delayed in flight) must not elect the target
    while the source has the partition open again at a newer epoch."""
    # with FAST's 0.4 s election timeout the source was fenced once beside four busy loops
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    await controller.alter_reassignments([PlanEntry(tp, None)])  # cancel: back on 0, epoch 1
    assert part(controller, "t", 0).leader_epoch == 1
    a.open[tp] = 1  # the source serves it again
    await controller.alter_reassignments([PlanEntry(tp, 1)])  # a second move
    controller.partition_closed(0, tp, 0)  # the first move's close, reported late
    await asyncio.sleep(0.2)  # many ticks (10 ms): a wrong election would come within them
    assert part(controller, "t", 0).leader == NO_LEADER, "elected while the source serves it"
    controller.partition_closed(0, tp, 1)  # the real close of the second move
    del a.open[tp]
    # before the election timeout could have fenced the source (PATIENT: 3 s)
    await wait_for(lambda: part(controller, "t", 0).leader == 1, timeout_s=2)
    assert not a.fenced


async def test_a_deposed_controller_stops_granting_leases(tmp_path: Path) -> None:
    """A deposed controller that has nothing to write learns of its successor only from the
    store; until then it must not keep renewing leases, or a broker it vouches for could
    acknowledge writes after the successor moved its partitions away."""
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    old = Controller(store, PATIENT)
    await old.start()
    await old.register_broker(BrokerInfo(0, "127.0.0.1", 9000, incarnation="a"), FakeBroker(old, 0))
    assert (await old.heartbeat(0, "a", -1, {})).lease_s > 0
    new = Controller(store, PATIENT)
    await new.start()
    replaced = time.monotonic()
    try:
        while time.monotonic() - replaced < 5:
            try:
                reply = await old.heartbeat(0, "a", -1, {})
            except ControllerFenced:
                break
            # never a lease beyond what the old controller granted before it was replaced
            assert (
                time.monotonic() + reply.lease_s
                <= replaced + PATIENT.role_window_s + PATIENT.lease_s
            )
            await asyncio.sleep(PATIENT.heartbeat_interval_s / 5)
        else:
            pytest.fail("the deposed controller kept answering heartbeats")
        assert old.broker_liveness()[0].last_grant - replaced <= PATIENT.role_window_s
    finally:
        await old.stop()
        await new.stop()
    stopped = Controller(store, PATIENT)
    with pytest.raises(ControllerFenced):  # neither before start nor after stop
        await stopped.heartbeat(0, "a", -1, {})


async def test_a_restarted_controller_still_elects_partitions_waiting_for_a_lease(
    tmp_path: Path,
) -> None:
    """A partition waiting for an old owner's lease to run out (a restarted broker's) has no
    leader; a controller restarted inside that window must still elect it, once the leases
    its predecessor may have granted have run out."""
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, PATIENT)
    await first.start()
    (a,) = await cluster_of(first, 1)
    await first.create_topics([NewTopic("t", 1)])
    epoch = part(first, "t", 0).leader_epoch
    a.silence()
    restarted = FakeBroker(first, 0, incarnation="b")
    await restarted.register()
    assert part(first, "t", 0).leader == NO_LEADER
    await first.stop()
    second = Controller(store, PATIENT)
    await second.start()
    started = time.monotonic()
    restarted.controller = second  # the broker heartbeats to the new controller
    try:
        await wait_for(lambda: part(second, "t", 0).leader == 0, timeout_s=5)
        assert time.monotonic() - started >= PATIENT.lease_s, "elected before old leases ran out"
        assert part(second, "t", 0).leader_epoch == epoch + 1
    finally:
        restarted.silence()
        await second.stop()


async def test_partitions_left_without_any_live_broker_go_to_the_next_one(
    short_sessions: Controller,
) -> None:
    """Every broker died: their partitions have no leader and nowhere to go. The first broker
    that comes back takes them all, its own and the others'."""
    # a broker dies by its session timeout here: SHORT_SESSIONS keeps it at 0.6 s
    controller = short_sessions
    a, b = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 2)])
    a.silence()
    b.silence()
    await wait_for(lambda: all(i.state == "dead" for i in controller.metadata.brokers.values()))
    assert [p.leader for p in controller.metadata.topics["t"].partitions] == [NO_LEADER] * 2
    epochs = [p.leader_epoch for p in controller.metadata.topics["t"].partitions]
    back = FakeBroker(controller, 0, incarnation="b")
    await back.register()
    await wait_for(lambda: [p.leader for p in controller.metadata.topics["t"].partitions] == [0, 0])
    assert [p.leader_epoch for p in controller.metadata.topics["t"].partitions] == [
        e + 1 for e in epochs
    ]


async def test_a_move_waits_for_the_lease_its_partition_was_waiting_for(
    controller: Controller,
) -> None:
    """A partition whose broker restarted waits (no leader) for the old incarnation's lease.
    Moving it meanwhile must not skip that wait: the new incarnation not having it open says
    nothing about the old one."""
    a, _ = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0
    a.silence()
    old_grant = controller.broker_liveness()[0].last_grant
    restarted = FakeBroker(controller, 0, incarnation="b")
    await restarted.register()
    assert part(controller, "t", 0).leader == NO_LEADER
    await controller.alter_reassignments([PlanEntry(tp, 1)])
    await wait_for(lambda: part(controller, "t", 0).leader == 1, timeout_s=5)
    assert time.monotonic() >= old_grant + PATIENT.lease_s + PATIENT.clock_margin_s


async def test_moves_off_a_removed_broker_wait_for_its_lease(controller: Controller) -> None:
    """remove_broker without the broker's word (it may still hold a lease) defers its moves
    too, not only the partitions it leads."""
    _, b = await cluster_of(controller, 2)
    await controller.create_topics([NewTopic("t", 2)])
    tp = TopicPartition("t", 1)
    b.open[tp] = 0  # broker 1 never closes it
    await controller.alter_reassignments([PlanEntry(tp, 0)])
    b.silence()
    last_grant = controller.broker_liveness()[1].last_grant
    await controller.remove_broker(1)
    await wait_for(lambda: part(controller, "t", 1).leader == 0, timeout_s=5)
    assert time.monotonic() >= last_grant + PATIENT.lease_s + PATIENT.clock_margin_s


async def test_a_restarted_controller_keeps_counting_the_election_timeout(
    tmp_path: Path,
) -> None:
    """The election timeout of a move in flight counts from when the move started (recorded in
    the metadata), not from a controller restart: a controller restarting every few seconds
    must not keep a stuck source from being fenced."""
    # The new controller elects and fences nothing before its restart guard (role window +
    # lease + clock margin = 0.65 s after it is active): with a 1 s timeout and a restart
    # 0.7 s into the move, the fence came at 1.35 s plus the stop and start, close to where a
    # timeout started over would put it. With 4 s and a restart 1 s in, a timeout counted from
    # the move fences 4 s after it, 3 s after the restart at the latest; one started over, 4 s
    # after the restart at the earliest. The 1 s between them is for the new controller's start
    # (reading the metadata log) on a loaded machine: with 2 s there was none, and a CI run
    # whose image builds loaded the disk took 1.4 s to start and failed. Sessions long enough
    # that a loaded machine never declares the silent-looking source dead instead of fencing it.
    settings = dataclasses.replace(PATIENT, election_timeout_s=4.0)
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, settings)
    await first.start()
    a, b = await cluster_of(first, 2)
    await first.create_topics([NewTopic("t", 1)])
    tp = TopicPartition("t", 0)
    a.open[tp] = 0  # the source never closes
    await first.alter_reassignments([PlanEntry(tp, 1)])
    await asyncio.sleep(1.0)
    await first.stop()
    second = Controller(store, settings)
    fenced: list[float] = []
    second.add_event_sink(
        lambda reason, *_: fenced.append(time.monotonic()) if reason == "BrokerFenced" else None
    )
    restarted = time.monotonic()
    await second.start()
    a.controller = b.controller = second
    try:
        await wait_for(lambda: bool(fenced), timeout_s=8)
        # measured from the restart, not the move: how long the stop took on a loaded machine
        # does not matter, a timeout counted again from the restart would still be later
        assert fenced[0] < restarted + settings.election_timeout_s, "the timeout started over"
        await wait_for(lambda: part(second, "t", 0).leader == 1, timeout_s=5)
    finally:
        a.silence()
        b.silence()
        await second.stop()


async def test_a_target_that_never_opens_hands_the_partition_back(tmp_path: Path) -> None:
    """An elected target that heartbeats but never opens the partition must not leave it
    unavailable forever: after the open timeout it moves back to the source (the usual flow,
    so the stuck target is not fenced: it shows it does not have the partition open)."""
    # Only the open timeout is waited for. Sessions and the election timeout long enough that
    # a loaded machine neither declares the source dead (a late heartbeat past 0.6 s: then
    # nothing is handed back to it) nor fences the target before its heartbeat shows it does
    # not have the partition open (0.4 s); a hand-back that relied on fencing it would not
    # come within the 5 s this test waits.
    settings = dataclasses.replace(PATIENT, open_timeout_s=0.5, election_timeout_s=5.0)
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), settings)
    await c.start()
    try:
        a, b = await cluster_of(c, 2)
        fenced = fences(c)
        await c.create_topics([NewTopic("t", 1)])
        tp = TopicPartition("t", 0)
        a.open[tp] = 0
        await c.alter_reassignments([PlanEntry(tp, 1)])
        del a.open[tp]
        c.partition_closed(0, tp, 0)

        def elected_on_b() -> list[float]:
            # the controller's election time (wall clock) of the move to broker 1, whether it
            # is still in flight or already handed back: a test that first sees it late (or
            # after the hand-back, 0.5 s later) still reads when it happened
            moves = [c.moves.get(tp), *c.moves.recent()]
            return [m.elected for m in moves if m and m.target == 1 and m.elected is not None]

        await wait_for(elected_on_b)
        elected = elected_on_b()[0]
        await wait_for(lambda: part(c, "t", 0).leader == 0, timeout_s=5)  # b never opened it
        assert time.time() - elected >= settings.open_timeout_s
        assert part(c, "t", 0).leader_epoch == 2
        a.open[tp] = 2
        await wait_for(lambda: c.moves.get(tp) is None)
        last = c.moves.recent()[-1]
        assert (last.phase, last.source, last.target) == (Phase.DONE, 1, 0)
        assert "did not open" in last.reason
        assert not fenced and not b.fenced
    finally:
        for fake in (a, b):
            fake.silence()
        await c.stop()


def leaders(c: Controller) -> dict[TopicPartition, int]:
    return {
        TopicPartition(name, i): p.leader
        for name, topic in c.metadata.topics.items()
        for i, p in enumerate(topic.partitions)
    }


def settled(c: Controller) -> bool:
    return not c.moves.active() and NO_LEADER not in leaders(c).values()


async def test_a_joining_broker_gets_a_fair_share_with_minimal_moves(tmp_path: Path) -> None:
    # nothing here waits for a timeout: sessions long enough that a loaded machine (CI's
    # background builds) never declares a fake broker dead and moves its partitions instead
    settings = dataclasses.replace(PATIENT, auto_rebalance=True, election_timeout_s=5.0)
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), settings)
    await c.start()
    brokers = await cluster_of(c, 2, reconcile=True)
    try:
        fenced = fences(c)
        await c.create_topics([NewTopic("t", 7)])
        await wait_for(lambda: settled(c))
        before = leaders(c)  # 9 partitions (2 of __consumer_offsets) on brokers 0 and 1
        joining = FakeBroker(c, 2, reconcile=True)
        brokers.append(joining)
        await joining.register()
        # recorded before the registration is answered: whoever waits for the join sees them
        assert {tp for tp, *_ in c.list_reassignments()}, "no move recorded for the new broker"
        await wait_for(lambda: settled(c))
        after = leaders(c)
        counts = sorted(Counter(after.values()).items())
        assert counts == [(0, 3), (1, 3), (2, 3)], counts
        moved = {tp for tp in before if before[tp] != after[tp]}
        assert len(moved) == 3 and all(after[tp] == 2 for tp in moved), "only the fair share"
        assert not fenced
    finally:
        for b in brokers:
            b.silence()
        await c.stop()


async def test_drain_moves_every_partition_off_a_broker(controller: Controller) -> None:
    brokers = await cluster_of(controller, 3, reconcile=True)
    fenced = fences(controller)
    await controller.create_topics([NewTopic("t", 6)])
    await wait_for(lambda: settled(controller))
    assert 1 in leaders(controller).values()
    assert await controller.drain_broker(1, timeout_s=5)
    await wait_for(lambda: settled(controller))
    assert 1 not in leaders(controller).values()
    assert not brokers[1].open, "the drained broker closed everything"
    assert controller.metadata.brokers[1].state == "draining"
    assert not fenced
    await controller.create_topics([NewTopic("u", 4)])  # a draining broker takes nothing new
    assert 1 not in [p.leader for p in controller.metadata.topics["u"].partitions]
    done = controller.moves.recent()
    assert done and all(m.phase is Phase.DONE and m.source == 1 for m in done)


async def test_a_broker_restarted_after_a_drain_gets_its_share_back(tmp_path: Path) -> None:
    """A pod that drained (preStop) and was killed before it removed itself (grace period 0,
    or a rolling restart) comes back as a new incarnation of the same broker id: it joins
    again and takes a fair share, although the metadata still says it is draining."""
    settings = dataclasses.replace(PATIENT, auto_rebalance=True)
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), settings)
    await c.start()
    brokers = await cluster_of(c, 3, reconcile=True)
    try:
        await c.create_topics([NewTopic("t", 6)])
        await wait_for(lambda: settled(c))
        assert await c.drain_broker(1, timeout_s=5)
        await wait_for(lambda: settled(c))
        assert 1 not in leaders(c).values()
        brokers[1].silence()  # killed before it could remove itself: still "draining"
        assert c.metadata.brokers[1].state == "draining"
        back = FakeBroker(c, 1, incarnation="b", reconcile=True)
        brokers.append(back)
        await back.register()
        assert c.metadata.brokers[1].state == "alive"
        await wait_for(lambda: settled(c))
        counts = Counter(leaders(c).values())
        assert counts[1] >= min(counts[0], counts[2]) - 1 and counts[1] > 0, counts
    finally:
        for b in brokers:
            b.silence()
        await c.stop()


async def test_a_restarted_controller_keeps_its_predecessors_grants_in_view(
    tmp_path: Path,
) -> None:
    """What a restarted controller knows of a broker's lease never goes back in time: the
    predecessor may have renewed it up to a role window after our start, and a heartbeat to
    us must not make the lease look shorter (a fence would then expire too early)."""
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, PATIENT)
    await first.start()
    (a,) = await cluster_of(first, 1)
    await first.stop()
    second = Controller(store, PATIENT)
    await second.start()
    started = time.monotonic()
    try:
        await second.heartbeat(0, "a", -1, {})
        assert second.broker_liveness()[0].last_grant >= started + PATIENT.role_window_s - 0.05
    finally:
        a.silence()
        await second.stop()


async def test_expected_brokers_get_time_to_come_back_after_a_restart(tmp_path: Path) -> None:
    """`local up` restarts the controller, then starts the brokers of the last run: however
    slow they are, they are not declared dead (and their partitions moved) within the time
    the cluster gives them; after it, a broker that never came back is."""
    # the session timeout is what is tested: SHORT_SESSIONS keeps it at 0.6 s
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, SHORT_SESSIONS)
    await first.start()
    (a,) = await cluster_of(first, 1)
    a.silence()
    await first.stop()
    second = Controller(store, SHORT_SESSIONS)
    await second.start()
    started = time.monotonic()
    second.expect_brokers([0], within_s=2.0)
    try:
        default_deadline = SHORT_SESSIONS.role_window_s + SHORT_SESSIONS.session_timeout_s
        await asyncio.sleep(default_deadline + 0.3)
        assert second.metadata.brokers[0].state == "alive", "declared dead while expected"
        await wait_for(lambda: second.metadata.brokers[0].state == "dead", timeout_s=5)
        assert time.monotonic() - started >= 2.0
    finally:
        await second.stop()


async def test_the_role_check_never_takes_our_own_append_for_another_controllers(
    controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role check looks whether the next version of the log is taken. A batch of ours
    open or being appended at that version is ours: before, a check that ran while our own
    append landed deposed the only controller (an e2e run: "version 24 of the metadata log was
    appended by another controller", then no controller at all)."""
    await cluster_of(controller, 1)
    journal = controller.journal
    journal.last_commit_at = float("-inf")  # no recent commit vouches for the role
    version = journal.propose([marker_record(True)])  # open, about to be appended
    await controller.check_role()
    assert not journal.deposed
    await journal.committed(version)

    journal.last_commit_at = float("-inf")
    checked: list[int] = []

    async def our_append_lands_meanwhile(epoch: int, next_version: int) -> bool:
        checked.append(next_version)
        journal.propose([marker_record(True)])  # ours, at the very version being checked
        return False  # the version is taken: by us

    monkeypatch.setattr(controller.log_store, "confirm", our_append_lands_meanwhile)
    await controller.check_role()
    assert checked == [version + 1]
    assert not journal.deposed

    async def someone_else_appended(epoch: int, next_version: int) -> bool:
        return False

    # our append lands first: swapped in before, the controller's own periodic check could run
    # the new confirm while the append was still in flight (a loaded machine) and depose it then
    await journal.committed(version + 1)
    monkeypatch.setattr(controller.log_store, "confirm", someone_else_appended)
    journal.last_commit_at = float("-inf")
    await controller.check_role()
    assert journal.deposed


async def test_a_held_failover_declares_no_broker_dead_while_every_broker_stops(
    tmp_path: Path,
) -> None:
    """[U1]: `local up`'s Ctrl-C stops every broker; one that exited first was declared dead
    (session timed out) while another still closed, its partitions failed over, and the next
    start reshuffled the cluster. Held, the silence of a stopping broker changes nothing, and
    the next controller finds every broker alive with its partitions where they were."""
    # the session timeout is what is tested: SHORT_SESSIONS keeps it at 0.6 s
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, SHORT_SESSIONS)
    await first.start()
    a, b = await cluster_of(first, 2)
    await first.create_topics([NewTopic("t", 4)])
    leaders = [p.leader for p in first.metadata.topics["t"].partitions]
    first.hold_failover()
    a.silence()  # exited first; b still closes its partitions
    await asyncio.sleep(SHORT_SESSIONS.session_timeout_s * 2.5)
    try:
        assert first.metadata.brokers[0].state == "alive", "declared dead while stopping"
        assert [p.leader for p in first.metadata.topics["t"].partitions] == leaders
        assert first.move_counts() == (0, 0)
    finally:
        b.silence()
        await first.stop()
    second = Controller(store, SHORT_SESSIONS)
    await second.start()
    try:
        assert {i.state for i in second.metadata.brokers.values()} == {"alive"}
        assert [p.leader for p in second.metadata.topics["t"].partitions] == leaders
    finally:
        await second.stop()


async def test_move_counts_are_the_listed_reassignments_and_the_failover_openings(
    short_sessions: Controller,
) -> None:
    """`local status`'s "moves in flight" is what ListPartitionReassignments lists; the
    partitions a failover opens elsewhere are counted apart until their broker opens them."""
    # a broker dies by its session timeout here: SHORT_SESSIONS keeps it at 0.6 s
    controller = short_sessions
    _, _, c = await cluster_of(controller, 3)  # they open nothing (no reconcile)
    await controller.create_topics([NewTopic("t", 6)])
    assert controller.move_counts() == (0, 0)
    on_c = [i for i, p in enumerate(controller.metadata.topics["t"].partitions) if p.leader == 2]
    assert on_c
    c.silence()
    await wait_for(lambda: controller.metadata.brokers[2].state == "dead", timeout_s=5)
    assert controller.move_counts() == (0, len(on_c)), "failovers are no reassignments"
    assert controller.list_reassignments() == []
    on_a = [i for i, p in enumerate(controller.metadata.topics["t"].partitions) if p.leader == 0]
    errors = await controller.alter_reassignments([PlanEntry(TopicPartition("t", on_a[0]), 1)])
    assert list(errors.values()) == [None]
    moving, _ = controller.move_counts()
    assert moving == len(controller.list_reassignments()) == 1  # its source never closes


async def test_a_restarted_controller_does_not_fence_a_source_it_has_not_heard_from(
    tmp_path: Path,
) -> None:
    """The whole cluster restarted, controller first, in the middle of a move (as in
    bench/controller_crash.py): the move's election timeout passes while its source's process
    is not back yet. The source cannot be blamed for a close it could not do (it may not even
    have had it): it is not fenced. Back, it reports the partition closed and the target is
    elected; had it stayed silent, the session timeout would have declared it dead."""
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    first = Controller(store, PATIENT)
    second = Controller(store, PATIENT)
    await first.start()
    a, b = await cluster_of(first, 2)
    stopped = False
    try:
        await first.create_topics([NewTopic("t", 1, assignment=[0])])
        tp = TopicPartition("t", 0)
        a.open[tp] = part(first, "t", 0).leader_epoch  # killed before it could close it
        await first.alter_reassignments([PlanEntry(tp, 1)])
        moved_at = time.time()
        await first.stop()
        stopped = True
        fenced = fences(second)
        await second.start()
        b.controller = second  # the target is back at once, the source is not
        await b.catch_up()
        past_timeout = moved_at + PATIENT.election_timeout_s + 0.5
        await wait_for(lambda: time.time() > past_timeout, timeout_s=10)
        assert not fenced, "fenced a source it never heard from"
        assert part(second, "t", 0).leader == NO_LEADER, "elected while the source may serve"
        # the source's process is back (its partitions closed: a new process opens nothing
        # before the metadata says so)
        a.open.pop(tp)
        a.controller = second
        await a.catch_up()
        await wait_for(lambda: part(second, "t", 0).leader == 1)
        assert not fenced
    finally:
        a.silence()
        b.silence()
        if not stopped:
            await first.stop()
        await second.stop()
