"""Membership (tidalmq_controller/_membership.py): heartbeats are answered from the liveness table
alone (from any thread, whatever the event loop is doing), carry changes that wait in an inbox
for the loop, ask for everything when the controller does not know what a broker has open, and
grant a lease only while the controller's role was confirmed recently and the broker is not
fenced."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest
from tidalmq_controller import Controller, ControllerSettings, NewTopic
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_controller._membership import (
    BrokerLiveness,
    Heartbeat,
    HeartbeatReply,
    Membership,
)
from tidalmq_core.metadata import BrokerInfo
from tidalmq_core.model import TopicPartition

from tests.support.fake_broker import FakeBroker

A, B, C, D = (TopicPartition("t", i) for i in range(4))
LEASE, MARGIN, WINDOW = 4.0, 0.5, 3.0


def membership(states: dict[int, str] | None = None) -> Membership:
    states = {0: "alive", 1: "draining", 2: "dead"} if states is None else states
    m = Membership(
        lease_s=LEASE,
        clock_margin_s=MARGIN,
        role_window_s=WINDOW,
        state_of=states.get,
        version=lambda: 7,
        epoch=lambda: 3,
    )
    now = time.monotonic()
    for broker_id in states:
        m.set(broker_id, BrokerLiveness("a", now, now - 1.0))
    m.active = True
    m.confirm_role(now)
    return m


def beat(
    broker_id: int = 0,
    *,
    full: bool = False,
    incarnation: str = "a",
    open: dict[TopicPartition, int | None] | None = None,
    hwm: dict[TopicPartition, int | None] | None = None,
    floors: dict[TopicPartition, tuple[str, int]] | None = None,
) -> Heartbeat:
    return Heartbeat(broker_id, incarnation, 5, open or {}, full, hwm or {}, floors or {})


def test_a_heartbeat_is_granted_a_lease_and_its_report_waits_in_the_inbox() -> None:
    m = membership()
    woken: list[int] = []
    m.on_report = lambda: woken.append(1)
    before = time.monotonic()
    reply = m.heartbeat(beat(open={A: 2}, hwm={B: 10}, floors={A: ("id", 99)}))
    assert reply == HeartbeatReply(LEASE, 7, 3)
    live = m.get(0)
    assert live is not None and live.applied_version == 5
    assert before <= live.last_grant <= time.monotonic()
    assert m.drain_inboxes() == {0: [(False, {A: 2}, {B: 10}, {A: ("id", 99)})]}
    assert m.drain_inboxes() == {}, "taken once"
    assert woken == [1], "the event loop is woken to take it"
    assert m.lease_end(0) == live.last_grant + LEASE + MARGIN


@pytest.mark.parametrize(
    ("broker_id", "incarnation"),
    [(9, "a"), (2, "a"), (0, "old")],
    ids=["unknown", "dead", "another incarnation"],
)
def test_a_broker_that_must_register_again_is_told_so(broker_id: int, incarnation: str) -> None:
    m = membership()
    reply = m.heartbeat(beat(broker_id, incarnation=incarnation, open={A: 1}))
    assert reply.fenced and reply.lease_s == 0.0 and "register again" in reply.reason
    assert m.drain_inboxes() == {}


def test_changes_on_top_of_an_unknown_set_ask_for_everything() -> None:
    """A new controller does not know what a broker has open: changes alone are useless to
    it, so it answers `resync` and the broker sends everything once."""
    m = membership()
    live = m.get(0)
    assert live is not None
    live.known = False
    reply = m.heartbeat(beat(open={A: 1}, floors={A: ("id", 5)}))
    assert reply.resync and not reply.fenced
    assert m.drain_inboxes() == {0: [(False, {}, {}, {A: ("id", 5)})]}, "floors are kept"
    reply = m.heartbeat(beat(full=True, open={A: 1, B: 1}))
    assert not reply.resync
    opened, closed, _ = m.apply_reports(0, m.drain_inboxes()[0])
    assert live.known and opened == {A, B} and not closed
    assert not m.heartbeat(beat(open={C: 4})).resync, "known now: changes are enough"


def test_full_and_delta_reports() -> None:
    m = membership()
    live = m.get(0)
    assert live is not None
    live.open_partitions = {A: 1, B: 1}
    live.high_watermarks = {A: 100, B: 5}
    # changes: C opened, A closed, a close of something not open, D opened and closed again
    opened, closed, floors = m.apply_reports(
        0,
        [
            (False, {C: 2, A: None, TopicPartition("x", 0): None}, {A: None, C: 0}, {}),
            (False, {D: 1}, {}, {D: ("id", 1)}),
            (False, {D: None}, {}, {C: ("id", 7)}),
        ],
    )
    assert live.open_partitions == {B: 1, C: 2}
    assert live.high_watermarks == {B: 5, C: 0}
    assert closed == {A, D}
    assert opened & live.open_partitions.keys() == {C} and A not in opened
    assert floors == {D: ("id", 1), C: ("id", 7)}
    # everything: what is not in it is closed, whatever was known
    opened, closed, _ = m.apply_reports(0, [(True, {B: 3, A: 4}, {A: 1}, {})])
    assert live.open_partitions == {B: 3, A: 4}
    assert closed == {C} and opened == {A, B}
    assert live.high_watermarks == {A: 1}, "a full report replaces the high watermarks too"
    # closed, then open again in the same drain: open
    opened, closed, _ = m.apply_reports(0, [(False, {A: None}, {}, {}), (False, {A: 5}, {}, {})])
    assert live.open_partitions[A] == 5 and A in opened and A not in closed
    assert m.apply_reports(99, [(True, {A: 1}, {}, {})]) == (set(), set(), {})


def test_no_lease_is_renewed_while_the_role_is_not_confirmed() -> None:
    """A controller that has not confirmed its role within the window may have been replaced:
    it renews nothing, and answers with what is left of the last grant."""
    m = membership()
    first = m.heartbeat(beat())
    live = m.get(0)
    assert live is not None and first.lease_s == LEASE
    granted = live.last_grant
    m.role_confirmed_at = time.monotonic() - WINDOW - 0.5
    reply = m.heartbeat(beat())
    assert not reply.fenced and "not confirmed" in reply.reason
    assert live.last_grant == granted, "not renewed"
    assert 0.0 < reply.lease_s <= granted + LEASE - time.monotonic() + 0.01
    m.confirm_role(time.monotonic())
    assert m.heartbeat(beat()).lease_s == LEASE and live.last_grant > granted
    m.active = False  # stopped, or deposed
    assert m.heartbeat(beat()).lease_s == 0.0


def test_confirming_the_role_never_goes_back() -> None:
    m = membership()
    now = time.monotonic()
    m.confirm_role(now + 1)
    m.confirm_role(now)
    assert m.role_confirmed_at == now + 1


def test_an_inherited_grant_is_never_shortened() -> None:
    m = membership()
    live = m.get(0)
    assert live is not None
    ahead = time.monotonic() + 2.0  # granted by the previous controller, as a new one assumes
    live.last_grant = ahead
    m.heartbeat(beat())
    assert live.last_grant == ahead


def test_a_fenced_broker_gets_no_lease_but_its_reports_are_kept() -> None:
    m = membership()
    now = time.monotonic()
    assert m.fence(0, now) and not m.fence(0, now + 1), "fenced once"
    assert not m.fence(9, now), "unknown"
    reply = m.heartbeat(beat(open={A: None}))
    assert reply.fenced and reply.lease_s == 0.0 and "fenced" in reply.reason
    assert m.drain_inboxes() == {0: [(False, {A: None}, {}, {})]}
    assert m.lease_end(9) == 0.0


def test_silent_brokers() -> None:
    m = membership()
    now = time.monotonic()
    live = m.get(1)
    assert live is not None
    live.last_heartbeat = now - 10
    assert m.silent(now, 6.0) == [1]
    m.heartbeat(beat(1))
    assert m.silent(time.monotonic(), 6.0) == []


def test_is_open_at_an_epoch() -> None:
    m = membership()
    m.apply_reports(0, [(True, {A: 3}, {}, {})])
    assert m.is_open(0, A) and m.is_open(0, A, 3) and not m.is_open(0, A, 2)
    assert not m.is_open(0, B) and not m.is_open(9, A)


# ------------------------------------------------------------------ liveness never waits
# short leases, but sessions and an election timeout no loaded machine runs into: what is
# tested is that heartbeats are answered while the loop is blocked, not when a broker dies
PATIENT = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=5.0,
    clock_margin_s=0.05,
    election_timeout_s=3.0,
    auto_rebalance=False,
    offsets_topic_partitions=2,
    tick_s=0.01,
)


def block_the_loop(seconds: float) -> None:
    """What a long computation on the controller's event loop does to it."""
    time.sleep(seconds)


@pytest.fixture
async def controller() -> AsyncIterator[Controller]:
    c = Controller(MemoryMetadataLog(), PATIENT)
    await c.start()
    yield c
    await c.stop()


async def test_heartbeats_are_answered_while_the_event_loop_is_blocked(
    controller: Controller,
) -> None:
    c = controller
    await c.register_broker(BrokerInfo(0, "127.0.0.1", 9000, incarnation="a"), FakeBroker(c, 0))
    await c.create_topics([NewTopic("t", 1)])
    epoch = c.image.topics["t"].partitions[0].leader_epoch
    tp = TopicPartition("t", 0)
    latencies: list[float] = []
    replies: list[HeartbeatReply] = []
    stop = threading.Event()

    def beats() -> None:  # the liveness thread's side (_rpc_server.py runs the same call there)
        while not stop.is_set():
            started = time.perf_counter()
            replies.append(c.beat(Heartbeat(0, "a", 1, {tp: epoch}, full=True)))
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)

    thread = threading.Thread(target=beats, daemon=True)
    thread.start()
    block_the_loop(0.4)
    answered = len(latencies)
    stop.set()
    thread.join()
    assert answered >= 10, f"only {answered} heartbeats answered in 0.4 s"
    assert max(latencies) < 0.05, f"slowest answer {max(latencies) * 1000:.1f} ms"
    assert not any(r.fenced for r in replies)
    assert not c.membership.is_open(0, tp), "nothing was taken by the blocked loop"
    deadline = time.monotonic() + 2
    while not c.membership.is_open(0, tp, epoch):  # the loop takes the reports afterwards
        assert time.monotonic() < deadline, "the reports never reached the controller"
        await asyncio.sleep(0.01)
