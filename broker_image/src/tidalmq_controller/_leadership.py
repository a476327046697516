"""Partitions and moves: leaders and epochs, moves in waves, elections, failover, data loss.

It owns the controller's indexes of the image (which broker holds which partitions, which
partitions move, which have no leader, which lost data), kept up to date from the deltas of
the records as they are applied, so every decision costs O(what changed) or O(what it moves),
never a walk over the cluster.

Moves (the move protocol with Kafka's bookkeeping) run in waves: `queue` records targets (the sources
keep serving); `tick` starts queued moves while each broker has fewer than
`max_moves_per_broker` moves in flight as source or target, all the moves it starts in one
step going into one batch; sources close them, the controller elects the targets in one batch
per step, targets open them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from itertools import islice
from typing import Any, Protocol

from tidalmq_core.balance import Move, Plan, balance_counts
from tidalmq_core.deadlines import DeadlineQueue
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, DataLoss, PartitionState
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import (
    Phase,
    PlanEntry,
    cancel_changes,
    closing,
    closing_changes,
    elect_changes,
    queue_changes,
)
from tidalmq_core.records import MetadataDelta, Record, floors_record, partition_record
from tidalmq_core.static_mapping import PHYSICAL_PREFIX

from tidalmq_controller._journal import Journal
from tidalmq_controller._membership import Membership
from tidalmq_controller._moves import MoveStatus, MoveTracker, Outcome, Release, SourceView
from tidalmq_controller._settings import ControllerSettings


class LeadershipHost(Protocol):
    """What leadership reads and calls of the controller that hosts it (the controller is one;
    naming this instead of the Controller class keeps _controller.py -> _leadership.py one-way)."""

    settings: ControllerSettings
    journal: Journal
    membership: Membership

    @property
    def image(self) -> ClusterMetadata: ...

    def placeable_brokers(self) -> list[int]: ...

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None: ...


# partitions `rebalance_plan` copies per slice of the event loop (a few ms of CPU)
ASSIGNMENT_SLICE = 10_000

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, controller: LeadershipHost) -> None:
        self.c = controller
        self.moves = MoveTracker()
        self._owner: dict[TopicPartition, int | None] = {}  # replicas[0] (target if moving)
        self.by_broker: dict[int | None, set[TopicPartition]] = {}
        self.moving: set[TopicPartition] = set()
        self.leaderless: set[TopicPartition] = set()
        self.lost: set[TopicPartition] = set()
        self._queued: dict[TopicPartition, None] = {}  # moves waiting for their wave, in order
        # opening past the open timeout, not handed on yet (see stuck_openings)
        self._overdue_openings: dict[TopicPartition, MoveStatus] = {}
        self._deferred: DeadlineQueue[TopicPartition] = DeadlineQueue()  # elect not before
        # leaderless partitions to look at in the next election step: those that became
        # leaderless (or stopped moving without a leader) and the last step's due ones
        self._to_elect: set[TopicPartition] = set()
        # reported since the last commit: (topic id, high watermark) to raise floors from
        self._floor_reports: dict[TopicPartition, tuple[str, int]] = {}
        self._floors_committed_at = time.monotonic()  # the first floors wait an interval too
        self._created_reports: dict[TopicPartition, tuple[str | None, int]] = {}
        self.restart_guard = 0.0

    # ------------------------------------------------------------------ indexes
    def on_applied(self, delta: MetadataDelta) -> None:
        """Keep the indexes in step with the image (called after each proposal is applied)."""
        meta = self.c.image
        for name, info in delta.removed_topics.items():
            for i in range(len(info.partitions)):
                self._unindex(TopicPartition(name, i))
        walked: dict[str, int] = {}  # a changed topic's partitions, walked in place
        for name in delta.topics:
            topic = meta.topics.get(name)
            if topic is None:
                continue
            walked[name] = len(topic.partitions)
            index, pinned, kind = self._index, topic.pinned, topic.kind
            for i, part in enumerate(topic.partitions):
                index(TopicPartition(name, i), part, pinned, kind)
        for tp in delta.partitions:
            if tp.partition < walked.get(tp.topic, 0):
                continue
            topic = meta.topics.get(tp.topic)
            if topic is None or tp.partition >= len(topic.partitions):
                self._unindex(tp)
                continue
            self._index(tp, topic.partitions[tp.partition], topic.pinned, topic.kind)

    def _index(self, tp: TopicPartition, part: PartitionState, pinned: bool, kind: str) -> None:
        if kind == "static":
            self._unindex(tp)  # a static topic's Kafka view: its physical queues are indexed
            return
        replicas = part.target_replicas or part.replicas
        owner = replicas[0] if replicas else None
        old = self._owner.get(tp, -2)
        if old != owner:
            if old != -2:
                self.by_broker.get(old, set()).discard(tp)
            self._owner[tp] = owner
            self.by_broker.setdefault(owner, set()).add(tp)
        if part.moving:
            self.moving.add(tp)
        else:
            self.moving.discard(tp)
            self._queued.pop(tp, None)
        if part.leader == NO_LEADER and not pinned:
            self.leaderless.add(tp)
            self._to_elect.add(tp)
        else:
            self.leaderless.discard(tp)
            if self.moves.count(Phase.OPENING):
                self._follow_opening(tp, part)
        if part.lost is not None:
            self.lost.add(tp)
        else:
            self.lost.discard(tp)

    def _follow_opening(self, tp: TopicPartition, part: PartitionState) -> None:
        """An opening move whose partition got a leader at a later epoch than the move's, by
        another record than the move's election: a new incarnation of the target took it back
        (`on_join`: epoch + 1, so the incarnation elected first cannot write), or it was
        elected again after waiting for a lease. On the target, the move waits for an open
        at the new epoch; elsewhere, the move's target lost it. Without this the move waited
        for an open at its own epoch that can never come: never done, never handed on
        (`stuck_openings` hands on only what its target leads at the move's epoch), and in
        flight on its target for good, which stopped every later wave on that broker."""
        status = self.moves.opening(tp)
        if status is None or status.epoch is None or part.leader_epoch <= status.epoch:
            return
        if part.moving:
            return  # a new move of it (it begins its own record)
        if part.leader == status.target:
            log.info(
                "%s: broker %d elected again at epoch %d (the move elected it at %d): "
                "the move waits for it to open at %d",
                tp,
                status.target,
                part.leader_epoch,
                status.epoch,
                part.leader_epoch,
            )
            self.moves.reelected(status, part.leader_epoch)
            return
        why = (
            f"broker {part.leader} leads it at epoch {part.leader_epoch}: target broker "
            f"{status.target} lost it before it opened the partition"
        )
        self.moves.mark(tp, Phase.FAILED, why, outcome=Outcome.TARGET_LOST)
        self.c.emit("PartitionTargetLost", f"{tp}: {why}", {"partition": str(tp)})

    def _unindex(self, tp: TopicPartition) -> None:
        old = self._owner.pop(tp, -2)
        if old != -2:
            self.by_broker.get(old, set()).discard(tp)
        self.moving.discard(tp)
        self.leaderless.discard(tp)
        self.lost.discard(tp)
        self._queued.pop(tp, None)
        self._deferred.cancel(tp)
        self._to_elect.discard(tp)
        self._floor_reports.pop(tp, None)
        self._created_reports.pop(tp, None)

    def rebuild(self) -> None:
        """Index the whole image (at start: the one walk over the cluster), without the
        per-partition bookkeeping of `_index` (nothing to remove from)."""
        meta = self.c.image
        owner = self._owner
        by_broker = self.by_broker
        for name, topic in meta.topics.items():
            if topic.kind == "static":
                continue
            pinned = topic.pinned
            for i, part in enumerate(topic.partitions):
                tp = TopicPartition(name, i)
                replicas = part.target_replicas or part.replicas
                b = replicas[0] if replicas else None
                owner[tp] = b
                held = by_broker.get(b)
                if held is None:
                    held = by_broker[b] = set()
                held.add(tp)
                if part.target_replicas is not None:
                    self.moving.add(tp)
                if part.leader == NO_LEADER and not pinned:
                    self.leaderless.add(tp)
                if part.lost is not None:
                    self.lost.add(tp)
        self._to_elect |= self.leaderless

    def counts(self) -> dict[int | None, int]:
        return {b: len(s) for b, s in self.by_broker.items() if s}

    def leaders_per_broker(self) -> dict[int, int]:
        """How many partitions each broker leads, NO_LEADER for those without a leader, from
        the indexes: O(brokers + leaderless partitions + static topics' physical queues), not
        O(partitions). A static topic's Kafka view is not counted, and of its physical queues
        only the writable ones (its sealed queues have no leader on purpose)."""
        meta = self.c.image
        out: dict[int, int] = {
            b: len(held) for b, held in self.by_broker.items() if b is not None and held
        }
        for tp in self.leaderless:
            owner = self._owner.get(tp)
            if owner is not None:
                out[owner] -= 1
            out[NO_LEADER] = out.get(NO_LEADER, 0) + 1
        for name, state in meta.static_topics.items():
            physical = meta.topics.get(PHYSICAL_PREFIX + name)
            if physical is None:
                continue
            writable = state.view().writable()
            for i, part in enumerate(physical.partitions):
                tp = TopicPartition(physical.name, i)
                owner = self._owner.get(tp)
                if owner is not None:  # indexed as any partition: counted above
                    out[owner] -= 1
                if tp in self.leaderless:
                    out[NO_LEADER] -= 1
                if i in writable:
                    out[part.leader] = out.get(part.leader, 0) + 1
        return {b: n for b, n in out.items() if n}

    def partition(self, tp: TopicPartition) -> PartitionState | None:
        topic = self.c.image.topics.get(tp.topic)
        if topic is None or tp.partition >= len(topic.partitions):
            return None
        return topic.partitions[tp.partition]

    def led_by(self, broker_id: int) -> list[TopicPartition]:
        """What the broker leads, is asked to close, or still reports open."""
        out = {tp for tp in self.by_broker.get(broker_id, ()) if self._leads(tp, broker_id)}
        for tp in self.moving:
            part = self.partition(tp)
            if part is not None and part.original_replicas == [broker_id]:
                out.add(tp)
        live = self.c.membership.get(broker_id)
        if live is not None:
            out.update(live.open_partitions)
        return sorted(out)

    def leads_anything(self, broker_id: int) -> bool:
        """Whether `led_by(broker_id)` has anything, stopping at the first partition found: a
        drain asks every 50 ms until it is done, and building and sorting the whole list held
        the event loop 100-230 ms a time at 500,000 partitions."""
        live = self.c.membership.get(broker_id)
        if live is not None and live.open_partitions:
            return True
        if any(self._leads(tp, broker_id) for tp in self.by_broker.get(broker_id, ())):
            return True
        for tp in self.moving:
            part = self.partition(tp)
            if part is not None and part.original_replicas == [broker_id]:
                return True
        return False

    def _leads(self, tp: TopicPartition, broker_id: int) -> bool:
        part = self.partition(tp)
        return part is not None and part.leader == broker_id

    # ------------------------------------------------------------------ start
    def resume(self) -> None:
        """After loading: the moves in flight and queued, from the metadata."""
        for tp in sorted(self.moving):
            part = self.partition(tp)
            if part is None or part.target_replicas is None:
                continue
            source = part.original_replicas[0] if part.original_replicas else None
            if closing(part):
                status = self.moves.begin(tp, source, part.target_replicas[0], Phase.CLOSING)
                status.reason = "resumed after controller restart"
                if part.move_started_ms is not None:  # the election timeout does not start over
                    status.started = part.move_started_ms / 1000
                status.recorded_version = self.c.image.version
            else:
                status = self.moves.begin(tp, source, part.target_replicas[0], Phase.PENDING)
                status.reason = "queued before controller restart"
                self._queued[tp] = None

    # ------------------------------------------------------------------ moves: requests
    def queue(self, entries: Iterable[PlanEntry], *, reason: str, now_ms: int) -> list[Record]:
        """Records that queue (target set) or cancel (target None) moves. A queued move whose
        brokers have room (fewer than `max_moves_per_broker` moves in flight) starts at once,
        in the same record; the others wait for their wave. Entries must be valid."""
        meta = self.c.image
        cap = self.c.settings.max_moves_per_broker
        version = self.c.journal.next_version
        records: list[Record] = []
        for entry in entries:
            topic = meta.topics[entry.tp.topic]
            part = topic.partitions[entry.tp.partition]
            if entry.target is None:
                records.append(partition_record(entry.tp, **cancel_changes(part)))
                self._cancelled(entry.tp, part)
                continue
            changes = queue_changes(part, entry.target)
            if changes is None:
                continue
            if "target_replicas" in changes and changes["target_replicas"] is None:
                records.append(partition_record(entry.tp, **changes))
                self._cancelled(entry.tp, part)  # retargeted to where it came from
                continue
            status = self.moves.get(entry.tp)
            if status is not None and part.moving:
                self.moves.retarget(entry.tp, entry.target)
                status.reason = reason
                records.append(partition_record(entry.tp, **changes))
                continue
            source = part.replicas[0] if part.replicas else None
            status = self.moves.begin(entry.tp, source, entry.target, Phase.PENDING)
            status.reason = reason
            if self.moves.inflight_on(source) < cap and self.moves.inflight_on(entry.target) < cap:
                changes.update(closing_changes(now_ms))
                self.moves.mark(entry.tp, Phase.CLOSING, at=now_ms / 1000)
                status.recorded_version = version
            else:
                self._queued[entry.tp] = None
            records.append(partition_record(entry.tp, **changes))
        return records

    def _cancelled(self, tp: TopicPartition, part: PartitionState) -> None:
        self._queued.pop(tp, None)
        status = self.moves.get(tp)
        if status is None:
            return
        status.epoch = part.leader_epoch + (1 if part.leader == NO_LEADER else 0)
        self.moves.mark(tp, Phase.CANCELLED, "cancelled: rolled back to the original broker")
        self.c.emit(
            "ReassignmentCancelled",
            f"{tp} rolled back to broker {status.source}",
            {"partition": str(tp)},
        )

    def current_assignment(
        self, topics: list[str] | None = None
    ) -> dict[TopicPartition, int | None]:
        """Partition -> broker (a move's target counts) of the movable partitions."""
        meta = self.c.image
        assignment: dict[TopicPartition, int | None] = {}
        if topics is None:
            for b, tps in self.by_broker.items():
                for tp in tps:
                    if not meta.topics[tp.topic].pinned:
                        assignment[tp] = b
            return assignment
        for name in topics:
            topic = meta.topics.get(name)
            if topic is None or topic.pinned:
                continue
            for i in range(len(topic.partitions)):
                tp = TopicPartition(name, i)
                assignment[tp] = self._owner.get(tp)
        return assignment

    async def _assignment_in_slices(self) -> dict[TopicPartition, int | None]:
        """`current_assignment()` of the whole cluster, copied ASSIGNMENT_SLICE partitions per
        slice of the event loop (500,000 partitions in one go held the loop for 100-200 ms).
        A partition that moves meanwhile may be copied where it was: the plan's moves are
        checked against where their partition is (`still_planned`) before they are queued."""
        meta = self.c.image
        assignment: dict[TopicPartition, int | None] = {}
        copied = 0
        for b, tps in list(self.by_broker.items()):
            for tp in list(tps):
                topic = meta.topics.get(tp.topic)
                if topic is not None and not topic.pinned:
                    assignment[tp] = b
                copied += 1
                if copied % ASSIGNMENT_SLICE == 0:
                    await asyncio.sleep(0)
        return assignment

    async def rebalance_plan(self, topics: list[str] | None = None) -> Plan[TopicPartition]:
        """Minimal-move count balance over the live (not draining) brokers, computed in a
        worker thread; moves whose partition changed meanwhile are left out."""
        brokers = self.c.placeable_brokers()
        if topics is None:
            assignment = await self._assignment_in_slices()
        else:
            assignment = self.current_assignment(topics)
        plan = await asyncio.to_thread(balance_counts, assignment, brokers)
        kept: list[Move[TopicPartition]] = []
        for start in range(0, len(plan.moves), ASSIGNMENT_SLICE):
            if start:
                await asyncio.sleep(0)
            kept += self.still_planned(plan.moves[start : start + ASSIGNMENT_SLICE])
        plan.moves = kept
        return plan

    def still_planned(self, moves: list[Move[TopicPartition]]) -> list[Move[TopicPartition]]:
        """The planned moves still to make: the partition is where the plan found it (its
        broker, or a move's target), and the target takes partitions."""
        live = set(self.c.placeable_brokers())
        return [m for m in moves if self._owner.get(m.partition) == m.source and m.target in live]

    # ------------------------------------------------------------------ moves: the waves
    def start_wave(self, now_ms: int) -> list[Record]:
        """Start queued moves while their brokers have room; records of the closes."""
        cap = self.c.settings.max_moves_per_broker
        if not self._queued:
            return []
        records: list[Record] = []
        version = self.c.journal.next_version
        started: list[TopicPartition] = []
        for tp in self._queued:
            status = self.moves.get(tp)
            part = self.partition(tp)
            if status is None or part is None or not part.moving:
                started.append(tp)  # stale entry: dropped below
                continue
            if (
                self.moves.inflight_on(status.source) >= cap
                or self.moves.inflight_on(status.target) >= cap
            ):
                continue
            records.append(partition_record(tp, **closing_changes(now_ms)))
            self.moves.mark(tp, Phase.CLOSING, at=now_ms / 1000)
            status.recorded_version = version
            status.closed_reported = False
            started.append(tp)
            if len(records) >= self.c.settings.max_moves_per_step:
                break
        for tp in started:
            self._queued.pop(tp, None)
        return records

    def source_closed(self, broker_id: int, tp: TopicPartition, epoch: int) -> None:
        """The source reported it closed: only a close at the epoch the move started from
        counts (every election or cancel bumps the epoch: an older report is a late one)."""
        part = self.partition(tp)
        status = self.moves.get(tp)
        if part is None or status is None or not closing(part):
            return
        if part.original_replicas == [broker_id] and epoch == part.leader_epoch:
            status.closed_reported = True
        elif epoch < part.leader_epoch:
            log.info(
                "ignoring a late closed report of %s at epoch %d (now %d) from broker %d",
                tp,
                epoch,
                part.leader_epoch,
                broker_id,
            )

    def releases(self, now: float, wall: float) -> tuple[list[TopicPartition], set[int]]:
        """Closing moves whose target may be elected now, and sources to fence."""
        elect: list[TopicPartition] = []
        fence: set[int] = set()
        timeout = self.c.settings.election_timeout_s
        for status in self.moves.in_phase(Phase.CLOSING):
            tp = status.tp
            decision = status.release(
                now, wall, self._source_view(status.source, tp, now), self.not_before(tp), timeout
            )
            if decision is Release.ELECT:
                elect.append(tp)
            elif decision is Release.FENCE and status.source is not None:
                fence.add(status.source)
        return elect, fence

    def _source_view(self, source: int | None, tp: TopicPartition, now: float) -> SourceView | None:
        if source is None:
            return None
        info = self.c.image.brokers.get(source)
        live = self.c.membership.get(source)
        if info is None or info.state == "dead" or live is None:
            return None
        return SourceView(
            registered=True,
            known=live.known,
            has_it_open=tp in live.open_partitions,
            applied_version=live.applied_version,
            fenced=live.fenced_at is not None,
            lease_end=self.c.membership.lease_end(source),
            heard_s=None if live.heard_at is None else now - live.heard_at,
        )

    def not_before(self, tp: TopicPartition) -> float:
        """When a partition may get a new leader without waiting for anyone: once every earlier
        owner's lease has certainly run out."""
        return max(self._deferred.deadline(tp) or 0.0, self.restart_guard)

    def elections(
        self, elect: list[TopicPartition], due: list[TopicPartition], wall: float
    ) -> list[Record]:
        """Records electing the released moves' targets and the due leaderless partitions."""
        records: list[Record] = []
        live = set(self.c.placeable_brokers())
        for tp in elect:
            part = self.partition(tp)
            status = self.moves.get(tp)
            if part is None or not part.moving or part.target_replicas is None:
                continue
            target = part.target_replicas[0]
            if target not in live:
                home = part.original_replicas[0] if part.original_replicas else None
                if home in live:  # the target went away: back home
                    records.append(partition_record(tp, **cancel_changes(part)))
                    why = f"target broker {target} went away: rolled back to broker {home}"
                    if status is not None:
                        self.moves.mark(
                            tp, Phase.CANCELLED, why, at=wall, outcome=Outcome.TARGET_LOST
                        )
                    self.c.emit("PartitionTargetLost", f"{tp}: {why}", {"partition": str(tp)})
                    continue
                if not live:
                    continue
                lost, target = target, min(live, key=lambda b: (len(self.by_broker.get(b, ())), b))
                # neither target nor source is there: the move goes on to another broker in
                # place (the same record); the attempt on the lost target is counted
                why = (
                    f"target broker {lost} and source broker {home} went away: "
                    f"moving it to broker {target}"
                )
                self.moves.attempt_ended(Outcome.TARGET_LOST)
                if status is not None:
                    status.reason = why
                self.c.emit("PartitionTargetLost", f"{tp}: {why}", {"partition": str(tp)})
            changes = elect_changes(part, target)
            records.append(partition_record(tp, **changes))
            # elect_changes' leader_epoch is an int (its dict holds fields of several types)
            epoch = int(changes["leader_epoch"])  # type: ignore[call-overload]
            if status is not None:
                self.moves.mark(tp, Phase.ELECTING, at=wall)
                self.moves.retarget(tp, target)
                status.epoch = epoch
                self.moves.mark(tp, Phase.OPENING, at=wall)
        homes = self._homes_for(due, live)
        for tp in due:
            self._deferred.cancel(tp)
            topic = self.c.image.topics.get(tp.topic)
            part = self.partition(tp)
            if topic is None or part is None or part.leader != NO_LEADER or part.moving:
                continue
            owner = part.replicas[0] if part.replicas else None
            if not topic.pinned and owner not in live:
                owner = homes.get(tp)  # its broker is gone or draining: place it anew
            if owner is not None:
                records.append(
                    partition_record(
                        tp, replicas=[owner], leader=owner, leader_epoch=part.leader_epoch + 1
                    )
                )
        if elect:
            self.c.emit(
                "PartitionsElected",
                f"{len(elect)} partitions elected on their targets",
                {"count": len(elect)},
            )
        return records

    def due_elections(self, now: float) -> list[TopicPartition]:
        """Partitions without a leader that are not moving, to elect now: the deferrals whose
        time came, and (after the restart guard) every other such partition. O(due): the
        deferrals come off a heap, the others from what became leaderless since the last step
        plus the last step's due ones (one not elected, e.g. with no broker to take it, is
        looked at again)."""
        if now < self.restart_guard:
            return []
        due = dict.fromkeys(self._deferred.pop_due(now))
        self._to_elect.update(due)
        if self.c.placeable_brokers():
            for tp in self._to_elect:
                if tp in self.leaderless and tp not in self._deferred and tp not in self.moving:
                    due[tp] = None
            self._to_elect = set(due)
        return list(due)

    def _homes_for(self, due: list[TopicPartition], live: set[int]) -> dict[TopicPartition, int]:
        """Live brokers for the due partitions whose broker is not live (fewest moves)."""
        orphans = [tp for tp in due if self._owner.get(tp) not in live]
        if not orphans or not live:
            return {}
        return self._place(orphans, live)

    def _place(self, orphans: list[TopicPartition], live: set[int]) -> dict[TopicPartition, int]:
        """Homes on the least loaded live brokers (then where the orphan's topic has fewest
        partitions), without moving anything else: O(orphans + their topics' partitions)."""
        counts = {b: len(self.by_broker.get(b, ())) for b in live}
        topics = {tp.topic for tp in orphans}
        per_topic: dict[int, dict[str, int]] = {b: dict.fromkeys(topics, 0) for b in live}
        for name in topics:
            topic = self.c.image.topics.get(name)
            for i in range(len(topic.partitions) if topic is not None else 0):
                b = self._owner.get(TopicPartition(name, i))
                if b in per_topic:
                    per_topic[b][name] += 1
        order = sorted(live)
        out: dict[TopicPartition, int] = {}
        for tp in sorted(orphans, key=lambda t: (t.topic, t.partition)):
            target = min(order, key=lambda b: (counts[b], per_topic[b][tp.topic], b))
            counts[target] += 1
            per_topic[target][tp.topic] += 1
            out[tp] = target
        return out

    def observe(self, opened: dict[int, set[TopicPartition]], wall: float) -> None:
        """Targets that report their partition open at the elected epoch: the move is done."""
        if not self.moves.count(Phase.OPENING):
            return  # e.g. a creation's thousands of opens
        for broker_id, tps in opened.items():
            for tp in tps:
                status = self.moves.get(tp)
                if status is None or status.phase is not Phase.OPENING:
                    continue
                if status.target == broker_id and self.c.membership.is_open(
                    broker_id, tp, status.epoch
                ):
                    self.moves.mark(tp, Phase.DONE, at=wall)

    def check_openings(self) -> None:
        """Moves whose target already had the partition open when elected (or whose report
        came before the election was committed): each move once, as it enters Opening; a
        report that comes later finishes it through `observe`."""
        for status in self.moves.take_new_openings():
            if status.epoch is not None and self.c.membership.is_open(
                status.target, status.tp, status.epoch
            ):
                self.moves.mark(status.tp, Phase.DONE)

    def stuck_openings(self, wall: float) -> list[tuple[MoveStatus, int]]:
        """(move, broker to hand the partition to) for targets elected more than the open
        timeout ago that still do not report the partition open at their epoch. The moves
        come due from a heap by election time; one that is overdue but cannot be handed on yet
        (no other broker, the partition changed meanwhile) is looked at again every tick while
        it stays opening: O(moves due or overdue), not O(moves)."""
        out: list[tuple[MoveStatus, int]] = []
        timeout = self.c.settings.open_timeout_s
        for status in self.moves.openings_elected_before(wall - timeout):
            self._overdue_openings[status.tp] = status
        for tp, status in list(self._overdue_openings.items()):
            if self.moves.get(tp) is not status or status.phase is not Phase.OPENING:
                del self._overdue_openings[tp]  # opened, handed on, cancelled or gone
                continue
            if status.elected is None or wall - status.elected <= timeout:
                continue
            topic = self.c.image.topics.get(status.topic)
            part = self.partition(status.tp)
            if topic is None or topic.pinned or part is None or part.moving:
                continue
            if part.leader != status.target or part.leader_epoch != status.epoch:
                continue
            if self.c.membership.is_open(status.target, status.tp, status.epoch):
                continue
            candidates = set(self.c.placeable_brokers()) - {status.target}
            if not candidates:
                continue
            if status.source in candidates:
                out.append((status, status.source))
                continue
            out.append((status, min(candidates, key=lambda b: (len(self.by_broker.get(b, ())), b))))
        return out

    def hand_on(self, stuck: list[tuple[MoveStatus, int]], now_ms: int) -> list[Record]:
        """Move each partition off the broker that did not open it, with the usual flow (that
        broker closes it, or its lease runs out, before the next one is elected)."""
        records: list[Record] = []
        timeout = self.c.settings.open_timeout_s
        for status, new in stuck:
            tp, old_target = status.tp, status.target
            part = self.partition(tp)
            if part is None:
                continue
            log.warning(
                "%s: broker %d did not open it within %.0fs (epoch %s); handing it to broker %d",
                tp,
                old_target,
                timeout,
                status.epoch,
                new,
            )
            self.c.emit(
                "PartitionNotOpened",
                f"{tp}: broker {old_target} did not open it in time; moving it to broker {new}",
                {"partition": str(tp), "broker": old_target},
            )
            changes = {
                "original_replicas": [old_target],
                "target_replicas": [new],
                **closing_changes(now_ms),
            }
            records.append(partition_record(tp, **changes))
            moved = self.moves.begin(
                tp, old_target, new, Phase.CLOSING, replaces=Outcome.RETARGETED
            )
            moved.reason = (
                f"broker {old_target} did not open it within {timeout:g}s; "
                f"moving it to broker {new}"
            )
            moved.recorded_version = self.c.journal.next_version
        return records

    # ------------------------------------------------------------------ brokers
    def on_join(
        self, broker_id: int, new_incarnation: bool, not_before: float, now: float
    ) -> list[Record]:
        """A broker (re)joins. A new incarnation takes back the partitions assigned to it with
        bumped epochs (fencing its previous incarnation), once that incarnation's lease has
        certainly expired."""
        if not new_incarnation:
            return []
        records: list[Record] = []
        for tp in sorted(self.by_broker.get(broker_id, ())):
            topic = self.c.image.topics.get(tp.topic)
            part = self.partition(tp)
            if topic is None or part is None or part.moving or topic.kind == "static":
                continue
            if topic.pinned and part.leader == NO_LEADER:
                continue  # a sealed physical queue is never opened again
            if part.replicas != [broker_id]:
                continue
            if not_before <= now:
                records.append(
                    partition_record(tp, leader=broker_id, leader_epoch=part.leader_epoch + 1)
                )
            else:
                records.append(partition_record(tp, leader=NO_LEADER))
                self._deferred.schedule(tp, not_before)
        return records

    def failover(
        self, dead: list[int], *, defer_until: float, now: float, reason: str
    ) -> list[Record]:
        """Records opening the dead brokers' partitions elsewhere (epoch + 1: the new owner
        fences them in object storage and recovers their unindexed WAL objects). With
        `defer_until` in the future the new owners are recorded now and elected then."""
        live = set(self.c.placeable_brokers()) - set(dead)
        orphans: list[TopicPartition] = []
        for b in dead:
            for tp in self.by_broker.get(b, ()):
                topic = self.c.image.topics.get(tp.topic)
                part = self.partition(tp)
                if topic is None or part is None or topic.pinned or part.moving:
                    continue  # static topics remap; moves are handled by the election step
                orphans.append(tp)
                status = self.moves.get(tp)
                if status is not None and status.phase is Phase.OPENING and status.target == b:
                    # elected there and not open yet: the move ends with its target gone (the
                    # partition is opened elsewhere below, as a failover of its own)
                    why = f"target broker {b} went away before it opened the partition ({reason})"
                    self.moves.mark(tp, Phase.FAILED, why, outcome=Outcome.TARGET_LOST)
                    self.c.emit("PartitionTargetLost", f"{tp}: {why}", {"partition": str(tp)})
        # queued moves whose source died: start them (the release step elects at once)
        for tp in list(self._queued):
            part = self.partition(tp)
            if part is not None and part.original_replicas and part.original_replicas[0] in dead:
                status = self.moves.get(tp)
                self._queued.pop(tp, None)
                if status is not None:
                    self.moves.mark(tp, Phase.CLOSING)
                    status.recorded_version = self.c.journal.next_version
        records: list[Record] = []
        if not orphans:
            return records
        if not live:
            for tp in orphans:
                records.append(partition_record(tp, leader=NO_LEADER))
            return records
        homes = self._place(orphans, live)
        defer = defer_until > now
        for tp, target in homes.items():
            part = self.partition(tp)
            assert part is not None
            if defer:
                records.append(partition_record(tp, replicas=[target], leader=NO_LEADER))
                self._deferred.schedule(tp, defer_until)
            else:
                records.append(
                    partition_record(
                        tp, replicas=[target], leader=target, leader_epoch=part.leader_epoch + 1
                    )
                )
                status = self.moves.begin(tp, None, target, Phase.OPENING)
                status.reason = reason
                status.epoch = part.leader_epoch + 1
                status.elected = time.time()
                self.moves.opening_since(status)
        return records

    def defer_moves_from(self, broker_id: int, until: float) -> None:
        """A removed broker may still acknowledge until `until`: its moves wait for that."""
        for tp in self.moving:
            part = self.partition(tp)
            if part is not None and part.original_replicas == [broker_id]:
                self._deferred.schedule(tp, max(self._deferred.deadline(tp) or 0.0, until))

    def deferred(self, tp: TopicPartition) -> bool:
        return tp in self._deferred or time.monotonic() < self.restart_guard

    # ------------------------------------------------------------------ floors and losses
    def report_floor(self, tp: TopicPartition, topic_id: str, high_watermark: int) -> None:
        """An acknowledged (durable) end of a partition: raise its floor at the next commit."""
        part = self.partition(tp)
        topic = self.c.image.topics.get(tp.topic)
        if part is None or topic is None or topic.topic_id != topic_id:
            return  # a deleted (maybe re-created) topic's late report
        pending = self._floor_reports.get(tp)
        if high_watermark > part.end_offset_floor and (
            pending is None or high_watermark > pending[1]
        ):
            self._floor_reports[tp] = (topic_id, high_watermark)

    def report_opened(
        self, broker_id: int, tp: TopicPartition, epoch: int, topic_id: str | None
    ) -> None:
        """The leader opened the partition at its epoch: from now on its data must exist (and
        an accepted loss is done)."""
        part = self.partition(tp)
        if (
            part is not None
            and part.leader == broker_id
            and epoch == part.leader_epoch
            and (not part.created or part.accepted_from is not None)
        ):
            self._created_reports[tp] = (topic_id, epoch)

    def reports_pending(self) -> bool:
        """Partitions opened for the first time whose record waits for the next step."""
        return bool(self._created_reports)

    def reports_due(
        self, now: float, force: bool = False, limit: int | None = None
    ) -> list[Record]:
        """Records of the floors (at most every floor_commit_interval_s, or with other
        records) and of the partitions opened for the first time (at most `limit` of them:
        the others wait for the next step)."""
        records: list[Record] = []
        for tp, (topic_id, epoch) in list(islice(self._created_reports.items(), limit)):
            topic = self.c.image.topics.get(tp.topic)
            part = self.partition(tp)
            del self._created_reports[tp]
            if (
                topic is None
                or part is None
                or (topic_id is not None and topic.topic_id != topic_id)
            ):
                continue
            if part.leader_epoch == epoch and (not part.created or part.accepted_from is not None):
                records.append(partition_record(tp, created=True, accepted_from=None))
        interval = self.c.settings.floor_commit_interval_s
        if self._floor_reports and (
            force or records or now - self._floors_committed_at >= interval
        ):
            by_topic: dict[tuple[str, str], dict[int, int]] = {}
            for tp, (topic_id, hwm) in self._floor_reports.items():
                by_topic.setdefault((tp.topic, topic_id), {})[tp.partition] = hwm
            self._floor_reports.clear()
            records.extend(
                floors_record(name, topic_id, floors)
                for (name, topic_id), floors in sorted(by_topic.items())
            )
            self._floors_committed_at = now
        return records

    def lost_records(self, tp: TopicPartition, loss: DataLoss) -> list[Record]:
        return [partition_record(tp, lost=loss)]

    def inflight_summary(self) -> dict[str, int]:
        return {
            "queued": len(self._queued),
            "closing": self.moves.count(Phase.CLOSING),
            "opening": self.moves.count(Phase.OPENING),
        }
