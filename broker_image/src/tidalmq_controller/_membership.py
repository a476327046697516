"""Brokers and their leases: who is registered, who heartbeats, who may acknowledge writes.

Liveness never waits: `heartbeat` runs on the controller's liveness thread (_rpc_server.py), apart from
the event loop that commits, computes rebalances and pushes metadata, so a busy controller never
declares a healthy broker dead. It touches only what is guarded by `lock`: the broker's
timestamps and its inbox. What a heartbeat reports (partitions opened or closed since the last
heartbeat that was answered, static queues' high watermarks, acknowledged ends) waits in the
inbox until the event loop takes it (`drain_inboxes`), so the controller's decisions read state
that only the event loop changes.

A heartbeat carries changes only: a broker with ten thousand partitions sends what opened and
closed since its last answered heartbeat. A controller that does not know what a broker has
open (it just started) answers `resync`, and the broker sends everything once.

Leases: a broker may acknowledge writes only until `lease_s` after it sent a heartbeat that was
answered with a grant. A grant is given only while the controller confirmed its role in the
metadata log within the role window, so a deposed controller stops vouching for brokers within
that window even when it has nothing to write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter
from tidalmq_core.model import TopicPartition

FENCINGS = Counter(
    "tidalmq_controller_broker_fencings_total",
    "Brokers whose lease the controller stopped renewing (a moving partition not closed within "
    "the election timeout, or fenced by an operator action); each gives up its partitions",
)

Floors = dict[TopicPartition, tuple[str, int]]


@dataclass(slots=True)
class BrokerLiveness:
    incarnation: str
    last_heartbeat: float  # monotonic
    last_grant: float  # monotonic time of the last lease granted
    applied_version: int = -1
    # what it has open, at which epoch; known once it sent its full set to this controller
    open_partitions: dict[TopicPartition, int] = field(default_factory=dict)
    known: bool = True
    fenced_at: float | None = None
    # monotonic: when this controller first heard from it (registration or a heartbeat); None
    # for a broker known only from the metadata (inherited from a predecessor) and silent since
    heard_at: float | None = None
    # high watermarks of the static topics' physical queues it has open
    high_watermarks: dict[TopicPartition, int] = field(default_factory=dict)
    # reported by the liveness thread, taken by the event loop: (full, open changes, hwm
    # changes, floors) per heartbeat
    inbox: list[
        tuple[bool, dict[TopicPartition, int | None], dict[TopicPartition, int | None], Floors]
    ] = field(default_factory=list)


@dataclass(slots=True)
class HeartbeatReply:
    lease_s: float
    metadata_version: int
    controller_epoch: int
    fenced: bool = False
    reason: str = ""
    resync: bool = False  # send every open partition (not only the changes) next time

    def to_json(self) -> dict[str, Any]:
        return {
            "lease_s": self.lease_s,
            "metadata_version": self.metadata_version,
            "controller_epoch": self.controller_epoch,
            "fenced": self.fenced,
            "reason": self.reason,
            "resync": self.resync,
        }


@dataclass(slots=True)
class Heartbeat:
    """What a broker says in one heartbeat. `full`: `open` is everything it has open (else
    the changes since its last answered heartbeat, None for closed)."""

    broker_id: int
    incarnation: str
    applied_version: int
    open: dict[TopicPartition, int | None]
    full: bool = False
    hwm: dict[TopicPartition, int | None] = field(default_factory=dict)
    floors: Floors = field(default_factory=dict)


class Membership:
    """The liveness table. `lock` guards it between the liveness thread and the event loop."""

    def __init__(
        self,
        *,
        lease_s: float,
        clock_margin_s: float,
        role_window_s: float,
        state_of: Callable[[int], str | None],
        version: Callable[[], int],
        epoch: Callable[[], int],
    ) -> None:
        self.lock = threading.Lock()
        self.lease_s = lease_s
        self.clock_margin_s = clock_margin_s
        self.role_window_s = role_window_s
        self._state_of = state_of  # broker id -> state in the image (None: unregistered)
        self._version = version  # the committed metadata version
        self._epoch = epoch
        self._live: dict[int, BrokerLiveness] = {}
        self.role_confirmed_at = float("-inf")
        self.active = False
        self.on_report: Callable[[], None] = lambda: None  # wakes the event loop

    # ------------------------------------------------------------------ the liveness path
    def heartbeat(self, beat: Heartbeat) -> HeartbeatReply:
        """Answer one heartbeat (any thread). Never waits for the event loop."""
        now = time.monotonic()
        with self.lock:
            version, epoch = self._version(), self._epoch()
            live = self._live.get(beat.broker_id)
            state = self._state_of(beat.broker_id)
            if (
                live is None
                or state is None
                or state == "dead"
                or live.incarnation != beat.incarnation
            ):
                return HeartbeatReply(
                    0.0, version, epoch, True, "not registered (or declared dead): register again"
                )
            live.last_heartbeat = now
            if live.heard_at is None:
                live.heard_at = now
            live.applied_version = beat.applied_version
            resync = False
            if beat.full or live.known:
                live.inbox.append((beat.full, beat.open, beat.hwm, beat.floors))
            else:
                resync = True  # changes on top of a set we do not know: ask for all of it
                if beat.floors:
                    live.inbox.append((False, {}, {}, beat.floors))
            if live.fenced_at is not None:
                reply = HeartbeatReply(
                    0.0, version, epoch, True, "fenced: a partition did not close in time"
                )
            elif not self.active or now - self.role_confirmed_at > self.role_window_s:
                # not confirmed as the controller recently: a successor may be running, so
                # renew nothing. The answer is what is left of the last grant
                left = max(0.0, live.last_grant + self.lease_s - now) if self.active else 0.0
                reply = HeartbeatReply(
                    left,
                    version,
                    epoch,
                    False,
                    "controller role not confirmed recently: lease not renewed",
                )
            else:
                live.last_grant = max(live.last_grant, now)  # an inherited grant may run longer
                reply = HeartbeatReply(self.lease_s, version, epoch)
            reply.resync = resync
        self.on_report()
        return reply

    # ------------------------------------------------------------------ the event loop's side
    def drain_inboxes(self) -> dict[int, list[Any]]:
        """Take what the heartbeats reported (event loop)."""
        out: dict[int, list[Any]] = {}
        with self.lock:
            for broker_id, live in self._live.items():
                if live.inbox:
                    out[broker_id] = live.inbox
                    live.inbox = []
        return out

    def apply_reports(
        self, broker_id: int, reports: list[Any]
    ) -> tuple[set[TopicPartition], set[TopicPartition], Floors]:
        """Fold heartbeats' reports into the table (event loop). Returns the partitions now
        open, now closed, and the floors reported."""
        live = self._live.get(broker_id)
        opened: set[TopicPartition] = set()
        closed: set[TopicPartition] = set()
        floors: Floors = {}
        if live is None:
            return opened, closed, floors
        for full, changes, hwms, reported_floors in reports:
            floors.update(reported_floors)
            if full:
                closed |= set(live.open_partitions) - set(changes)
                live.open_partitions = {}
                live.high_watermarks = {}
                live.known = True
            for tp, epoch in changes.items():
                if epoch is None:
                    if live.open_partitions.pop(tp, None) is not None:
                        closed.add(tp)
                else:
                    live.open_partitions[tp] = epoch
                    opened.add(tp)
                    closed.discard(tp)
            for tp, hwm in hwms.items():
                if hwm is None:
                    live.high_watermarks.pop(tp, None)
                else:
                    live.high_watermarks[tp] = hwm
        return opened, closed, floors

    def get(self, broker_id: int) -> BrokerLiveness | None:
        return self._live.get(broker_id)

    def items(self) -> list[tuple[int, BrokerLiveness]]:
        with self.lock:
            return list(self._live.items())

    def snapshot(self) -> dict[int, BrokerLiveness]:
        with self.lock:
            return dict(self._live)

    def __contains__(self, broker_id: int) -> bool:
        return broker_id in self._live

    def set(self, broker_id: int, live: BrokerLiveness) -> None:
        with self.lock:
            self._live[broker_id] = live

    def forget(self, broker_id: int) -> BrokerLiveness | None:
        with self.lock:
            return self._live.pop(broker_id, None)

    def fence(self, broker_id: int, now: float) -> bool:
        """Stop renewing a broker's lease. True when it was not fenced yet."""
        with self.lock:
            live = self._live.get(broker_id)
            if live is None or live.fenced_at is not None:
                return False
            live.fenced_at = now
            FENCINGS.inc()
            return True

    def lease_end(self, broker_id: int) -> float:
        """When every lease this broker may hold has certainly run out (monotonic)."""
        live = self._live.get(broker_id)
        if live is None:
            return 0.0
        return live.last_grant + self.lease_s + self.clock_margin_s

    def silent(self, now: float, session_timeout_s: float) -> list[int]:
        with self.lock:
            return [
                b for b, live in self._live.items() if now - live.last_heartbeat > session_timeout_s
            ]

    def is_open(self, broker_id: int, tp: TopicPartition, epoch: int | None = None) -> bool:
        live = self._live.get(broker_id)
        if live is None:
            return False
        have = live.open_partitions.get(tp)
        return have is not None and (epoch is None or have == epoch)

    def confirm_role(self, started: float) -> None:
        self.role_confirmed_at = max(self.role_confirmed_at, started)
