"""The broker's liveness thread keeps renewing the lease while the event loop is busy: a loop
stuck for longer than the session timeout no longer silences the broker ([M1] item 4)."""

from __future__ import annotations

import asyncio
import threading
import time

from tidalmq_broker.liveness import LOOP_LATE, LivenessThread
from tidalmq_controller import Heartbeat, HeartbeatReply
from tidalmq_core.model import TopicPartition

TP = TopicPartition("t", 0)


class Recorder:
    def __init__(self, *, fenced: bool = False) -> None:
        self.sent: list[Heartbeat] = []
        self.leases: list[float] = []
        self.answered: list[tuple[Heartbeat, object, bool]] = []
        self.fenced = fenced
        self.lock = threading.Lock()

    async def prepare(self) -> tuple[Heartbeat, str]:
        return Heartbeat(1, "inc", 7, {TP: 3}), "news"

    def bare(self) -> Heartbeat:
        return Heartbeat(1, "inc", 7, {})

    def send(self, beat: Heartbeat) -> HeartbeatReply:
        with self.lock:
            self.sent.append(beat)
        return HeartbeatReply(0.0 if self.fenced else 4.0, 7, 1, self.fenced)

    def on_lease(self, beat: Heartbeat, sent: float, reply: HeartbeatReply) -> None:
        self.leases.append(0.0 if reply.fenced else sent + reply.lease_s)

    def on_reply(self, beat: Heartbeat, news: object, sent: float, reply: HeartbeatReply) -> None:
        self.answered.append((beat, news, threading.current_thread() is threading.main_thread()))


def thread_for(r: Recorder) -> LivenessThread[str]:
    return LivenessThread(
        asyncio.get_running_loop(),
        interval_s=0.05,
        prepare=r.prepare,
        bare=r.bare,
        send=r.send,
        on_lease=r.on_lease,
        on_reply=r.on_reply,
        prepare_wait_s=0.05,
    )


async def test_heartbeats_carry_the_loops_news_and_answers_come_back_on_the_loop() -> None:
    r = Recorder()
    t = thread_for(r)
    t.enabled = True
    t.start()
    try:
        while len(r.answered) < 3:  # noqa: ASYNC110 (answers come from another thread)
            await asyncio.sleep(0.02)
    finally:
        t.stop()
    assert all(b.open == {TP: 3} for b in r.sent[:3]), r.sent[:3]
    assert all(news == "news" and on_main for _, news, on_main in r.answered[:3])
    assert r.leases and r.leases[-1] > time.monotonic()


async def test_a_blocked_loop_does_not_stop_the_lease_renewals() -> None:
    r = Recorder()
    t = thread_for(r)
    t.enabled = True
    late_before = LOOP_LATE._value.get()
    t.start()
    try:
        await asyncio.sleep(0.1)
        before = len(r.sent)
        blocked = time.monotonic()
        # the event loop does nothing else for a second (a long synchronous step)
        time.sleep(1.0)  # noqa: ASYNC251
        during = list(r.sent[before:])
        renewed = [lease for lease in r.leases if lease - 4.0 > blocked]
    finally:
        t.stop()
    assert len(during) >= 5, f"only {len(during)} heartbeats while the loop was blocked for 1 s"
    assert any(b.open == {} for b in during), "heartbeats without the loop carry no news"
    assert len(renewed) >= 5, "the lease was renewed from the thread while the loop was blocked"
    assert LOOP_LATE._value.get() > late_before


async def test_a_fenced_answer_ends_the_lease_and_disabled_means_silent() -> None:
    r = Recorder(fenced=True)
    t = thread_for(r)
    t.start()
    try:
        await asyncio.sleep(0.2)
        assert r.sent == [], "a disabled thread sends nothing (the broker is not registered)"
        t.enabled = True
        while not r.answered:  # noqa: ASYNC110 (answers come from another thread)
            await asyncio.sleep(0.02)
    finally:
        t.stop()
    assert r.leases[0] == 0.0


async def test_nothing_is_sent_while_the_broker_says_not_now() -> None:
    """The loop answers None while the broker is not registered (or registers again): no
    heartbeat, not even a bare one, goes out under an incarnation the controller does not know."""
    r = Recorder()

    async def not_now() -> None:
        return None

    t = LivenessThread(
        asyncio.get_running_loop(),
        interval_s=0.02,
        prepare=not_now,
        bare=r.bare,
        send=r.send,
        on_lease=r.on_lease,
        on_reply=r.on_reply,
        prepare_wait_s=0.2,
    )
    t.enabled = True
    t.start()
    try:
        await asyncio.sleep(0.3)
    finally:
        t.stop()
    assert r.sent == []
