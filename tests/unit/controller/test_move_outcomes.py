"""Every end of a move attempt is counted once, with the outcome that says what happened
(`tidalmq_controller_reassignments_total{outcome}`, `Outcome` in tidalmq_controller/_moves.py;
docs/architecture/partition-move.md, "How a move ends"): one test per path, each asserting the
whole change of the counter (every other outcome unchanged), the move's phase and its reason.
Brokers are played by FakeBroker against a controller with fast clocks."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from tidalmq_controller import (
    TROUBLE,
    Controller,
    ControllerSettings,
    NewTopic,
    Outcome,
)
from tidalmq_core.metadata import NO_LEADER
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry
from tidalmq_core.records import partition_record

from observability.alerts import ALERTS, MOVE_TROUBLE
from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker
from tests.support.waiting import eventually

TP = TopicPartition("t", 0)
SETTINGS = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=0.6,
    clock_margin_s=0.05,
    election_timeout_s=0.4,
    open_timeout_s=5.0,  # no move is handed on unless a test shortens it
    auto_rebalance=False,
    offsets_topic_partitions=2,
    tick_s=0.01,
)
# What a test runs on unless a broker's death or a fence is its subject: with SETTINGS' 0.6 s
# sessions and 0.4 s election timeout a late heartbeat on a loaded machine declared a fake
# broker dead (or a stalled loop fenced a source) and the move ended another way.
PATIENT = dataclasses.replace(SETTINGS, election_timeout_s=3.0, session_timeout_s=5.0)
# A target that dies is the subject: only the session timeout is short (a source that keeps
# its partition open is not fenced meanwhile).
SHORT_SESSIONS = dataclasses.replace(PATIENT, session_timeout_s=SETTINGS.session_timeout_s)


class Outcomes:
    """The counter's values when made; `since()` is the change per outcome from then, for the
    partition t-0 only: a broker that dies also fails over the internal topics' partitions it
    led, and an opening of those onto a broker that dies next ends `target_lost` too (counted,
    and listed among the controller's finished moves, which is how they are told apart)."""

    def __init__(self, c: Controller) -> None:
        self.c = c
        self.finished = len(c.moves.recent())
        self.before = self.now()

    @staticmethod
    def now() -> dict[str, float]:
        name = "tidalmq_controller_reassignments_total"
        return {
            o.value: REGISTRY.get_sample_value(name, {"outcome": o.value}) or 0.0 for o in Outcome
        }

    def since(self) -> dict[str, float]:
        after = self.now()
        for m in self.c.moves.recent()[self.finished :]:
            if m.tp != TP:
                after[m.outcome] -= 1
        return {o: after[o] - self.before[o] for o in after if after[o] != self.before[o]}


async def controller(tmp_path: Path, settings: ControllerSettings) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, settings) as c:
        yield c


@pytest.fixture
async def c(tmp_path: Path) -> AsyncIterator[Controller]:
    async for each in controller(tmp_path, PATIENT):
        yield each


@pytest.fixture
async def short_sessions(tmp_path: Path) -> AsyncIterator[Controller]:
    """A controller that declares a silent broker dead after 0.6 s."""
    async for each in controller(tmp_path, SHORT_SESSIONS):
        yield each


@pytest.fixture
async def quick_open(tmp_path: Path) -> AsyncIterator[Controller]:
    """A controller whose targets have half a second to open a partition."""
    async for each in controller(tmp_path, dataclasses.replace(PATIENT, open_timeout_s=0.5)):
        yield each


@pytest.fixture
async def slow_fence(tmp_path: Path) -> AsyncIterator[Controller]:
    """A controller that fences a source which does not close only after its session ran out:
    a silent source is then declared dead (and its move released) before it can be fenced.
    The session timeout and its order with the fence are the subject; the session is 1.5 s,
    not SETTINGS' 0.6: with 0.6 a loaded machine (a CI run's image builds beside the unit
    tests) declared the target dead by a late heartbeat before the test silenced it."""
    settings = dataclasses.replace(SETTINGS, session_timeout_s=1.5, election_timeout_s=4.5)
    async for each in controller(tmp_path, settings):
        yield each


wait_for = partial(eventually, timeout_s=5.0)  # this module's default wait


async def brokers(c: Controller, n: int) -> list[FakeBroker]:
    out = [FakeBroker(c, i) for i in range(n)]
    for b in out:
        await b.register()
    return out


def leader(c: Controller) -> tuple[int, int]:
    p = c.metadata.topics[TP.topic].partitions[TP.partition]
    return p.leader, p.leader_epoch


async def on_broker_0(c: Controller, fakes: list[FakeBroker]) -> None:
    """Topic t, one partition, led and open on broker 0."""
    await c.create_topics([NewTopic("t", 1, assignment=[0])])
    assert leader(c) == (0, 0)
    fakes[0].open[TP] = 0


async def elected_on(c: Controller, fakes: list[FakeBroker], target: int) -> None:
    """The move from broker 0 to `target`: the source closes, the target is elected (Opening)."""
    await c.alter_reassignments([PlanEntry(TP, target)])
    del fakes[0].open[TP]
    c.partition_closed(0, TP, 0)
    await wait_for(lambda: leader(c) == (target, 1))
    assert c.moves.get(TP).phase is Phase.OPENING  # type: ignore[union-attr]


def last(c: Controller) -> tuple[Phase, str, str]:
    m = c.moves.recent()[-1]
    return m.phase, m.outcome, m.reason


async def test_a_move_served_by_its_target_is_done(c: Controller) -> None:
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    fakes[1].open[TP] = 1
    await wait_for(lambda: c.moves.get(TP) is None)
    assert last(c)[:2] == (Phase.DONE, "done")
    assert outcomes.since() == {"done": 1}


async def test_a_users_cancel_is_cancelled_and_no_trouble(c: Controller) -> None:
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await c.alter_reassignments([PlanEntry(TP, 1)])
    await c.alter_reassignments([PlanEntry(TP, None)])
    assert last(c)[:2] == (Phase.CANCELLED, "cancelled")
    assert outcomes.since() == {"cancelled": 1}
    assert Outcome.CANCELLED not in TROUBLE


async def test_a_target_gone_before_its_election_rolls_back_as_target_lost(
    short_sessions: Controller,
) -> None:
    c = short_sessions  # the target dies by its session timeout
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    events: list[str] = []
    c.add_event_sink(lambda reason, message, _: events.append(f"{reason}: {message}"))
    await c.alter_reassignments([PlanEntry(TP, 1)])  # the source keeps it open: Closing
    fakes[1].silence()
    await wait_for(lambda: c.metadata.brokers[1].state == "dead")
    del fakes[0].open[TP]
    c.partition_closed(0, TP, 0)
    await wait_for(lambda: c.moves.get(TP) is None)
    assert leader(c) == (0, 1)  # back on its source, at a higher epoch
    assert last(c) == (
        Phase.CANCELLED,
        "target_lost",
        "target broker 1 went away: rolled back to broker 0",
    )
    assert outcomes.since() == {"target_lost": 1}
    assert "PartitionTargetLost: t-0: target broker 1 went away: rolled back to broker 0" in events


async def test_a_target_and_source_both_gone_hand_the_move_on_in_place(
    slow_fence: Controller,
) -> None:
    # Without the longer election timeout the silent source is fenced (SETTINGS: 0.4 s)
    # before it is declared dead (its session), once the new controller's restart guard has
    # passed: the target is then elected while still alive, and its death fails the move over
    # instead.
    c = slow_fence
    fakes = await brokers(c, 3)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await c.alter_reassignments([PlanEntry(TP, 1)])  # Closing: broker 0 keeps it open
    fakes[1].silence()
    fakes[0].silence()  # the source dies too: its lease runs out, the move is released
    # Both silent since the same instant, so one failover step declares both dead. Left to
    # their own last heartbeats, one may be declared a step before the other, and then the
    # move is first rolled back to broker 0 (or elected on broker 1) and broker 0's failover
    # opens the partition on broker 2 as a move of its own ("session timed out").
    with c.membership.lock:
        assert all(c.membership.get(b) is not None for b in (0, 1)), "declared dead too early"
        silent_since = min(c.membership.get(b).last_heartbeat for b in (0, 1))  # type: ignore[union-attr]
        for b in (0, 1):
            c.membership.get(b).last_heartbeat = silent_since  # type: ignore[union-attr]
    await wait_for(lambda: leader(c)[0] == 2)
    status = c.moves.get(TP)
    assert status is not None and status.target == 2 and status.phase is Phase.OPENING
    assert status.reason == "target broker 1 and source broker 0 went away: moving it to broker 2"
    assert outcomes.since() == {"target_lost": 1}
    fakes[2].open[TP] = leader(c)[1]
    await wait_for(lambda: c.moves.get(TP) is None)
    assert outcomes.since() == {"target_lost": 1, "done": 1}


async def test_a_target_that_dies_while_opening_fails_the_move_as_target_lost(
    short_sessions: Controller,
) -> None:
    c = short_sessions  # the target dies by its session timeout
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    fakes[1].silence()  # never opens it, and dies: the failover opens it on broker 0
    await wait_for(lambda: leader(c) == (0, 2))
    failed = [m for m in c.moves.recent() if m.tp == TP and m.target == 1]
    assert [(m.phase, m.outcome) for m in failed] == [(Phase.FAILED, "target_lost")]
    assert failed[0].reason.startswith("target broker 1 went away before it opened the partition")
    assert outcomes.since() == {"target_lost": 1}
    # the failover's own opening (no source) is tracked and counted as usual
    opening = c.moves.get(TP)
    assert opening is not None and opening.source is None and opening.target == 0
    fakes[0].open[TP] = 2
    await wait_for(lambda: c.moves.get(TP) is None)
    assert outcomes.since() == {"target_lost": 1, "done": 1}


async def test_a_target_restarted_while_opening_still_finishes_the_move(c: Controller) -> None:
    """A new incarnation of the target takes the partition back at epoch + 1 (its earlier
    incarnation, the one elected, may not write): the move waits for the open at that epoch.
    It waited for one at its own epoch forever (bench/controller_crash.py with waves: no
    queued move started again on that broker)."""
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    fakes[1].silence()
    restarted = FakeBroker(c, 1, incarnation="b")
    try:
        await restarted.register()
        await wait_for(lambda: leader(c) == (1, 2))  # once the old incarnation's lease ran out
        status = c.moves.get(TP)
        assert status is not None and (status.phase, status.epoch) == (Phase.OPENING, 2)
        restarted.open[TP] = 2
        await wait_for(lambda: c.moves.get(TP) is None)
        assert outcomes.since() == {"done": 1}
    finally:
        restarted.silence()


async def test_an_opening_move_whose_partition_another_broker_leads_ended(c: Controller) -> None:
    """Any record giving the partition of an opening move another leader at a later epoch
    ends the move, counted `target_lost`: it no longer waits for an open that cannot come."""
    fakes = await brokers(c, 3)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    c.propose([partition_record(TP, replicas=[2], leader=2, leader_epoch=2)])
    assert c.moves.get(TP) is None
    failed = [m for m in c.moves.recent() if m.tp == TP]
    assert [(m.phase, m.outcome) for m in failed] == [(Phase.FAILED, "target_lost")]
    assert failed[0].reason.startswith("broker 2 leads it at epoch 2")
    assert outcomes.since() == {"target_lost": 1}


async def test_a_target_that_does_not_open_in_time_is_retargeted(quick_open: Controller) -> None:
    c = quick_open
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    await wait_for(lambda: leader(c)[0] == NO_LEADER)  # handed on: broker 1 closes it first
    assert outcomes.since() == {"retargeted": 1}
    status = c.moves.get(TP)
    assert status is not None and (status.source, status.target) == (1, 0)
    assert status.reason == "broker 1 did not open it within 0.5s; moving it to broker 0"
    await wait_for(lambda: leader(c) == (0, 2))  # broker 1 shows it does not have it open
    fakes[0].open[TP] = 2
    await wait_for(lambda: c.moves.get(TP) is None)
    assert outcomes.since() == {"retargeted": 1, "done": 1}


async def test_a_topic_deleted_under_its_move_failed(c: Controller) -> None:
    fakes = await brokers(c, 2)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await c.alter_reassignments([PlanEntry(TP, 1)])
    await c.delete_topics(["t"])
    assert last(c) == (Phase.FAILED, "failed", "topic deleted")
    assert outcomes.since() == {"failed": 1}


async def test_a_new_reassignment_of_a_move_still_opening_supersedes_it(c: Controller) -> None:
    fakes = await brokers(c, 3)
    await on_broker_0(c, fakes)
    outcomes = Outcomes(c)
    await elected_on(c, fakes, 1)
    await c.alter_reassignments([PlanEntry(TP, 2)])
    status = c.moves.get(TP)
    assert status is not None and (status.source, status.target) == (1, 2)
    assert outcomes.since() == {"superseded": 1}
    assert Outcome.SUPERSEDED not in TROUBLE


def test_the_alert_fires_on_exactly_the_trouble_outcomes() -> None:
    """TidalMQMovesFailing's matcher names the outcomes the controller calls trouble: not
    done, not a user's cancel, not a superseded move."""
    assert set(MOVE_TROUBLE.split("|")) == {o.value for o in TROUBLE}
    [alert] = [a for a in ALERTS if a.name == "TidalMQMovesFailing"]
    assert f'outcome=~"{MOVE_TROUBLE}"' in alert.expr
