"""Brokers joining, reporting and leaving: registration, partition reports, drain, removal, fencing.

Owns (Kafka's cluster control): a broker's registration (a new incarnation takes back its
partitions with bumped epochs once the previous incarnation's lease has certainly expired; a
draining broker's new incarnation joins again), heartbeats as the controller answers them (the
leases themselves are membership's), the partition reports brokers send (closed, opened, lost),
draining a broker (scale-in, SIGTERM) and removing one, fencing one (its lease is no longer
renewed), and holding failover while the hosting process stops every broker.

Must not touch: where partitions go (leadership decides moves, failovers and elections; this
module tells it what brokers did), the leases' arithmetic (membership), or the data-loss state
(a loss report is handed to the data-loss manager).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from tidalmq_core.balance import Plan
from tidalmq_core.metadata import OFFSETS_TOPIC, BrokerInfo, ClusterMetadata, DataLoss
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import Record, broker_record, broker_removed_record, broker_state_record
from tidalmq_core.static_mapping import is_physical_topic

from tidalmq_controller._data_loss import DataLossManager
from tidalmq_controller._errors import ControllerFenced, UnknownBroker, UnsupportedFeatureLevel
from tidalmq_controller._features import registration_refused
from tidalmq_controller._journal import Deposed, Journal
from tidalmq_controller._leadership import Leadership
from tidalmq_controller._membership import (
    BrokerLiveness,
    Floors,
    Heartbeat,
    HeartbeatReply,
    Membership,
)
from tidalmq_controller._open_waits import OpenWaits
from tidalmq_controller._publishing import BrokerChannel, MetadataPublisher
from tidalmq_controller._settings import ControllerSettings
from tidalmq_controller._static_topics import StaticTopicManager
from tidalmq_controller._topics import NewTopic, Topics

log = logging.getLogger(__name__)


class BrokerLifecycleHost(Protocol):
    """What the broker lifecycle reads and calls of the controller that hosts it (the
    controller is one; naming this instead of the Controller class keeps the import one-way)."""

    settings: ControllerSettings
    journal: Journal
    membership: Membership
    leadership: Leadership
    topics: Topics
    static: StaticTopicManager
    publisher: MetadataPublisher
    open_waits: OpenWaits
    data_loss: DataLossManager

    @property
    def image(self) -> ClusterMetadata: ...

    @property
    def active(self) -> bool: ...

    def require_active(self) -> None: ...

    def propose(self, records: list[Record]) -> int: ...

    async def commit(self, records: list[Record]) -> int: ...

    def placeable_brokers(self) -> list[int]: ...

    async def rebalance(
        self, *, reason: str = "rebalance", dry_run: bool = False, topics: list[str] | None = None
    ) -> Plan[TopicPartition]: ...

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None: ...

    def wake(self) -> None: ...

    def spawn(self, coro: Awaitable[Any]) -> None: ...


class BrokerLifecycle:
    def __init__(self, controller: BrokerLifecycleHost) -> None:
        self.c = controller
        self.failover_held = False  # hold_failover(): every broker is being stopped

    async def register_broker(self, info: BrokerInfo, channel: BrokerChannel | None) -> int:
        """A broker (re)joins; returns the committed version after its registration (it gets
        the metadata up to there by a push, or by fetching). A new incarnation of a known
        broker takes back its partitions with bumped epochs (fencing its previous
        incarnation), once that incarnation's lease has certainly expired. A broker that does not
        support a finalized feature level is refused (UnsupportedFeatureLevel, nothing written;
        it retries: _features.registration_refused)."""
        self.c.require_active()
        refused = registration_refused(self.c.image, info)
        if refused is not None:
            log.warning("broker %d not registered: %s", info.broker_id, refused)
            raise UnsupportedFeatureLevel(refused)
        now = time.monotonic()
        self.c.publisher.connect(info.broker_id, channel)
        previous = self.c.membership.get(info.broker_id)
        old = self.c.image.brokers.get(info.broker_id)
        restarted = old is not None and old.incarnation != info.incarnation
        not_before = now
        if (
            previous is not None
            and previous.incarnation != info.incarnation
            and not self.c.settings.embedded
        ):
            not_before = self.c.membership.lease_end(info.broker_id)
            # its moves too: the new incarnation has nothing open, which says nothing of the
            # one before (fenced, its lease not over, it no longer counts as fenced)
            if not_before > now:
                self.c.leadership.defer_moves_from(info.broker_id, not_before)
        granted = now
        if previous is not None and previous.incarnation == info.incarnation:
            granted = max(now, previous.last_grant)  # its lease may run longer (inherited)
        # A new incarnation of a draining broker drained and stopped without removing itself
        # (killed after its preStop hook, or a rolling restart): it holds nothing and joins
        # again. The same incarnation re-registering (a new controller) keeps draining.
        joined = old is None or old.state == "dead" or (old.state == "draining" and restarted)
        draining = old is not None and old.state == "draining" and not restarted
        info.state = "draining" if draining else "alive"
        self.c.membership.set(
            info.broker_id, BrokerLiveness(info.incarnation, now, granted, known=True, heard_at=now)
        )
        version = self.c.propose([broker_record(info)])
        joining = self.c.leadership.on_join(
            info.broker_id, old is None or restarted, not_before, now
        )
        version = max(version, self.c.propose(joining))
        if OFFSETS_TOPIC not in self.c.image.topics:
            _, created = self.c.topics.create(
                [NewTopic(OFFSETS_TOPIC, self.c.settings.offsets_topic_partitions, internal=True)]
            )
            version = max(version, self.c.propose(created))
        try:
            await self.c.journal.committed(version)
        except Deposed as exc:
            raise ControllerFenced(str(exc)) from exc
        self.c.emit(
            "BrokerRegistered",
            f"broker {info.broker_id} registered at {info.host}:{info.port}",
            {"broker": info.broker_id, "incarnation": info.incarnation},
        )
        self.c.wake()  # static topics spread their logic queues onto the new broker
        if joined and self.c.settings.auto_rebalance and len(self.c.placeable_brokers()) > 1:
            # record the fair-share moves before answering, so whoever waits for the broker
            # to join sees its partitions already on their way
            await self._rebalance_quietly(f"broker {info.broker_id} joined")
        self.c.wake()
        return self.c.journal.committed_version

    async def heartbeat(
        self,
        broker_id: int,
        incarnation: str,
        applied_version: int,
        open_partitions: dict[TopicPartition, int],
        high_watermarks: dict[TopicPartition, int] | None = None,
        floors: Floors | None = None,
    ) -> HeartbeatReply:
        """A heartbeat with everything the broker has open (in-process callers and tests);
        brokers over HTTP send changes only (`beat`)."""
        return self.beat(
            Heartbeat(
                broker_id,
                incarnation,
                applied_version,
                dict(open_partitions),
                full=True,
                hwm=dict(high_watermarks or {}),
                floors=dict(floors or {}),
            )
        )

    def beat(self, heartbeat: Heartbeat) -> HeartbeatReply:
        """Answer a heartbeat (from any thread)."""
        if not self.c.active:
            raise ControllerFenced("not the active controller (stopped, or replaced by another)")
        return self.c.membership.heartbeat(heartbeat)

    def partitions_reported(self, broker_id: int, reports: list[dict[str, Any]]) -> None:
        """Brokers' reports of partitions closed, opened and lost, many at a time, in order:
        a run of opens is looked at together (moves done, creations waited for) once."""
        opened: set[TopicPartition] = set()
        for r in reports:
            tp = TopicPartition(r["topic"], int(r["partition"]))
            epoch = int(r["epoch"])
            hwm = r.get("high_watermark")
            topic_id = r.get("topic_id")
            kind = r["kind"]
            if kind == "opened":
                self._opened(
                    broker_id,
                    tp,
                    epoch,
                    topic_id,
                    None if hwm is None else int(hwm),
                    bool(r.get("stored", True)),
                )
                opened.add(tp)
                continue
            if opened:
                self._observe_opened(broker_id, opened)
                opened = set()
            if kind == "closed":
                self.partition_closed(
                    broker_id,
                    tp,
                    epoch,
                    topic_id=topic_id,
                    high_watermark=None if hwm is None else int(hwm),
                )
            elif kind == "lost":
                self.c.spawn(
                    self.c.data_loss.partition_lost_data(
                        broker_id, tp, epoch, DataLoss.from_json(r["loss"])
                    )
                )
        if opened:
            self._observe_opened(broker_id, opened)

    def partition_closed(
        self,
        broker_id: int,
        tp: TopicPartition,
        epoch: int,
        *,
        topic_id: str | None = None,
        high_watermark: int | None = None,
    ) -> None:
        """The source closed the partition cleanly (the fast path of a move)."""
        if topic_id is not None and high_watermark is not None:
            self.c.leadership.report_floor(tp, topic_id, high_watermark)
        self.c.leadership.source_closed(broker_id, tp, epoch)
        live = self.c.membership.get(broker_id)
        if live is not None and live.open_partitions.get(tp) == epoch:
            del live.open_partitions[tp]
        if is_physical_topic(tp.topic):
            self.c.static.partition_closed(broker_id, tp)
        self.c.wake()

    def partition_opened(
        self,
        broker_id: int,
        tp: TopicPartition,
        epoch: int,
        *,
        topic_id: str | None = None,
        high_watermark: int | None = None,
        stored: bool = True,
    ) -> None:
        self._opened(broker_id, tp, epoch, topic_id, high_watermark, stored)
        self._observe_opened(broker_id, {tp})

    def _opened(
        self,
        broker_id: int,
        tp: TopicPartition,
        epoch: int,
        topic_id: str | None,
        high_watermark: int | None,
        stored: bool,
    ) -> None:
        if stored:  # from now on its data must exist (a new one's checkpoint comes with its data)
            self.c.leadership.report_opened(broker_id, tp, epoch, topic_id)
        if topic_id is not None and high_watermark:
            self.c.leadership.report_floor(tp, topic_id, high_watermark)
        live = self.c.membership.get(broker_id)
        if live is not None:
            live.open_partitions[tp] = epoch
        if is_physical_topic(tp.topic):
            self.c.static.partition_opened(broker_id, tp)

    def _observe_opened(self, broker_id: int, opened: set[TopicPartition]) -> None:
        """Partitions the broker reported open: the moves they finish, the creations waiting."""
        self.c.open_waits.observe(opened)
        self.c.leadership.observe({broker_id: opened}, time.time())
        self.c.wake()

    def _is_current(self, broker_id: int, incarnation: str | None) -> bool:
        """A request from an older incarnation of a broker (a pod deleted with grace period 0
        whose replacement already registered) must not touch the new one."""
        info = self.c.image.brokers.get(broker_id)
        return info is not None and (incarnation is None or info.incarnation == incarnation)

    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool:
        """Move every partition off a broker (scale-in, remove-broker, SIGTERM) and wait until
        it leads none. The broker takes no new partitions meanwhile."""
        self.c.require_active()
        info = self.c.image.brokers.get(broker_id)
        if info is None:
            raise UnknownBroker(f"broker {broker_id} is not registered")
        if not self._is_current(broker_id, incarnation):
            log.info("ignoring a drain from an old incarnation of broker %d", broker_id)
            return True
        if info.state != "draining":
            await self.c.commit([broker_state_record(broker_id, "draining")])
        self.c.emit(
            "BrokerDraining",
            f"moving every partition off broker {broker_id}",
            {"broker": broker_id},
        )
        await self.c.rebalance(reason=f"draining broker {broker_id}")
        self.c.wake()  # static topics remap the broker's logic queues (next tick)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.c.leadership.leads_anything(broker_id):
                return True
            await asyncio.sleep(0.05)
        return False

    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None:
        """Forget a broker that has stopped (after a drain). Partitions it still has are placed
        elsewhere: at once when the broker itself says it stopped (its incarnation given), else
        once its lease has certainly expired."""
        self.c.require_active()
        if broker_id not in self.c.image.brokers:
            return
        if not self._is_current(broker_id, incarnation):
            log.info("ignoring a removal from an old incarnation of broker %d", broker_id)
            return
        now = time.monotonic()
        not_before = now
        if incarnation is None and broker_id in self.c.membership:
            not_before = self.c.membership.lease_end(broker_id)
        records = [broker_removed_record(broker_id)]
        records += self.c.leadership.failover(
            [broker_id], defer_until=not_before, now=now, reason=f"broker {broker_id} removed"
        )
        if not_before > now:  # its moves too: it may still acknowledge
            self.c.leadership.defer_moves_from(broker_id, not_before)
        self.c.membership.forget(broker_id)
        self.c.publisher.disconnect(broker_id)
        await self.c.commit(records)
        self.c.emit("BrokerRemoved", f"broker {broker_id} removed", {"broker": broker_id})
        self.c.wake()

    def expect_brokers(self, broker_ids: Iterable[int], within_s: float) -> None:
        """Known brokers that are starting again right now (the local cluster starts its own
        processes after the controller): not declared dead, and so not failed over and then
        rebalanced, before `within_s` from now. Only the dead declaration waits: the leases
        of their earlier incarnations count as before."""
        until = time.monotonic() + within_s - self.c.settings.session_timeout_s
        with self.c.membership.lock:
            for broker_id in broker_ids:
                live = self.c.membership.get(broker_id)
                if live is not None:
                    live.last_heartbeat = max(live.last_heartbeat, until)

    def hold_failover(self) -> None:
        """The hosting process is stopping every broker at once (the local cluster's Ctrl-C):
        from now on no broker is declared dead for its silence. A broker that closed its
        partitions and exited first is not failed over onto the ones still closing; every
        broker stays registered as it was, so the next start finds the assignment unchanged
        (no dead broker, no moves). For the rest of this controller's life: it is stopping."""
        self.failover_held = True

    def has_heartbeated(self, broker_id: int) -> bool:
        """The broker's registration was answered and it heartbeats since: the moves of its
        join rebalance (recorded before that answer) are visible to whoever waits for it."""
        live = self.c.membership.get(broker_id)
        return live is not None and live.applied_version >= 0

    async def _rebalance_quietly(self, reason: str) -> None:
        try:
            await self.c.rebalance(reason=reason)
        except Exception:
            log.exception("automatic rebalance failed (%s)", reason)

    def fence_broker(self, broker_id: int, reason: str) -> None:
        """Stop renewing a broker's lease (it gives up its partitions and re-registers)."""
        if self.c.membership.fence(broker_id, time.monotonic()):
            log.warning("fencing broker %d: %s", broker_id, reason)
            self.c.emit("BrokerFenced", f"broker {broker_id}: {reason}", {"broker": broker_id})
