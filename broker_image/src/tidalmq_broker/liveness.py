"""The broker's liveness thread: heartbeats to the controller that never wait for the event loop.

A broker's lease (it acknowledges writes only while one is valid) is renewed by heartbeats. Sent
from the event loop, a heartbeat waited behind whatever the loop was doing: opening or closing
thousands of partitions in a rebalance, a large Metadata answer, a metadata update. A loop late
by a few seconds missed its heartbeats, the controller declared a healthy broker dead, moved its
partitions away, and the rebalance collapsed into failovers.

Here a thread of its own sends a heartbeat every interval. Its content (what opened and closed
since the last answered heartbeat, the acknowledged ends to keep as floors) belongs to the event
loop, which prepares it on request; if the loop does not answer within `prepare_wait_s`, the
heartbeat goes without it: it renews the lease and carries nothing new (what is pending is sent
with a later one). The lease counts from when the heartbeat was sent, as before; the loop applies
the rest of the answer (acknowledged changes, a newer metadata version, a resync request). An
answer saying the broker is fenced ends the lease at once, from this thread.

Kafka's brokers do the same: BrokerLifecycleManager heartbeats from its own event queue, apart
from the request handlers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from prometheus_client import Counter
from tidalmq_controller import Heartbeat, HeartbeatReply

log = logging.getLogger(__name__)

LOOP_LATE = Counter(
    "tidalmq_broker_heartbeats_without_loop_total",
    "Heartbeats sent without news because the broker's event loop was too busy to prepare them "
    "in time (the lease is renewed all the same)",
)

P = TypeVar("P")


class LivenessThread(Generic[P]):
    """Sends a heartbeat every `interval_s` while `enabled` (see the module's docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float,
        prepare: Callable[[], Coroutine[Any, Any, tuple[Heartbeat, P] | None]],
        bare: Callable[[], Heartbeat],
        send: Callable[[Heartbeat], HeartbeatReply],
        on_lease: Callable[[Heartbeat, float, HeartbeatReply], None],
        on_reply: Callable[[Heartbeat, P | None, float, HeartbeatReply], None],
        prepare_wait_s: float = 0.2,
    ) -> None:
        self._loop = loop
        self._interval = interval_s
        self._prepare = prepare
        self._bare = bare
        self._send = send
        self._on_lease = on_lease
        self._on_reply = on_reply
        self._prepare_wait = prepare_wait_s
        self.enabled = False  # set by the broker once registered, cleared while re-registering
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._failures = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self.enabled:
                continue
            try:
                self.beat_once()
                self._failures = 0
            except Exception as exc:
                self._failures += 1
                if self._failures == 1 or self._failures % 30 == 0:  # one line, then every 30
                    log.warning("heartbeat failed (%d in a row): %s", self._failures, exc)

    def beat_once(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._prepare(), self._loop)
        late = False
        try:
            prepared = future.result(self._prepare_wait)
        except concurrent.futures.TimeoutError:
            future.cancel()
            LOOP_LATE.inc()
            late = True
        if self._stop.is_set():
            return
        extra: P | None = None
        if late:
            heartbeat = self._bare()
        elif prepared is None:
            return  # the broker says not now (not registered yet, or registering again)
        else:
            heartbeat, extra = prepared
        sent = time.monotonic()
        reply = self._send(heartbeat)
        self._on_lease(heartbeat, sent, reply)
        if not self._stop.is_set():
            self._loop.call_soon_threadsafe(self._on_reply, heartbeat, extra, sent, reply)
