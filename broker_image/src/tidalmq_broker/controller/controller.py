"""The controller: the single writer of cluster metadata.

It owns topics, partition leadership and epochs, broker membership and leases, producer-id
allocation and partition moves. Every change is committed to the MetadataStore first (fenced by
the store's version token, so a deposed controller cannot overwrite its successor), then pushed
as a full snapshot to every broker; brokers reconcile the partitions they lead against the
snapshot, and their heartbeats report what they actually have open, so a lost push or a lost
report is repaired by the next heartbeat (level-based, as the operator needs).

Moves follow seed 000: record the target without electing (leader = none), the source closes
cleanly and reports it (at the move's epoch), the target is elected with epoch + 1 and opens the
meta stream. A source that does not close within the election timeout (counted from the move's
start in the metadata) is fenced: the controller stops renewing its lease, waits until that
lease has certainly expired (so it can no longer acknowledge a write), and elects the target,
whose open bumps the epoch in object storage and recovers the source's unindexed WAL objects. A
target that does not open within the open timeout hands the partition on the same way. A broker
that stops heartbeating is declared dead after the session timeout (longer than the lease plus a
clock margin) and its partitions are opened elsewhere.

Why the election timeout fences the whole source broker, not one partition: bumping the
partition's epoch in object storage fences checkpoint writes only. A stale owner still appends to
its own WAL objects and acknowledges producers while its lease is valid, and those records would
be lost (see the stream-storage note). A broker's lease covers all its partitions (the storage
engine checks one lease at acknowledgement), so the only way to stop it acknowledging one
partition against its will is to let the whole lease run out. A per-partition fence needs
per-(partition, epoch) grants in the heartbeat answer and a per-partition check in the engine
before each acknowledgement.

Leases and controller changes: a lease is granted only while the store confirmed within the
role window that we are still the controller, so a deposed controller stops vouching for brokers
within that window even if it has nothing to write. Partitions without a leader are elected
level-based (not only from in-memory deferrals): a restarted controller elects them once the
leases its predecessor may have granted have run out (the restart guard).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter, Gauge
from tidalmq_core.balance import Plan, balance_counts, place_orphans
from tidalmq_core.metadata import (
    INTERNAL_TOPICS,
    NO_LEADER,
    OFFSETS_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    PartitionState,
    TopicInfo,
    new_cluster_id,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.placement import place_partitions
from tidalmq_core.reassignment import (
    InvalidPlan,
    NoReassignmentInProgress,
    Phase,
    PlanEntry,
    adding_removing,
    begin_move,
    cancel_move,
    current_assignment,
    elect_target,
    validate_plan,
)
from tidalmq_core.static_mapping import is_physical_topic, physical_topic_name
from tidalmq_core.topics import (
    InvalidPartitions,
    validate_broker_config_scope,
    validate_broker_configs,
    validate_configs,
    validate_partition_count,
    validate_topic_name,
)

from tidalmq_broker.controller.moves import MoveStatus, MoveTracker
from tidalmq_broker.controller.store import MetadataStore, StaleMetadata
from tidalmq_broker.storage.api import StorageError
from tidalmq_broker.storage.identity import (
    MISSING,
    identity_problem,
    read_identity,
    write_identity,
)
from tidalmq_broker.storage.objectstore.base import ObjectStore

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000

LOST_PARTITIONS = Gauge(
    "tidalmq_controller_lost_partitions",
    "Partitions whose data a broker found missing and whose loss nobody accepted yet",
)
BROKERS_DECLARED_DEAD = Counter(
    "tidalmq_controller_brokers_declared_dead_total",
    "Brokers the controller declared dead (session timed out, or killed) and failed over",
)
STORE_LOST = Gauge(
    "tidalmq_controller_store_lost",
    "1 while the object store's identity marker is missing or names another cluster",
)


class ControllerError(Exception):
    """Base of the controller's refusals; the API layer maps each to a Kafka error code."""


class TopicAlreadyExists(ControllerError):
    """TOPIC_ALREADY_EXISTS"""


class UnknownTopic(ControllerError):
    """UNKNOWN_TOPIC_OR_PARTITION / UNKNOWN_TOPIC_ID"""


class NoBrokers(ControllerError):
    """INVALID_REPLICATION_FACTOR (no live broker to place on)"""


class ControllerFenced(ControllerError):
    """NOT_CONTROLLER: another controller committed a newer version of the metadata."""


class InvalidReplicaAssignment(ControllerError):
    """INVALID_REPLICA_ASSIGNMENT: an explicit placement names a broker that cannot take it."""


class UnknownBroker(ControllerError):
    """BROKER_ID_NOT_REGISTERED"""


class ForeignStore(ControllerError):
    """The object store belongs to another cluster: accepting a data loss would write into it.
    The fix is to point the cluster at its own store."""


@dataclass(frozen=True, slots=True)
class AcceptedLoss:
    """One partition whose data loss was accepted: it continues at `continues_at`."""

    partition: int
    continues_at: int
    loss: DataLoss | None  # None: not reported lost yet (the whole store was wiped)

    @property
    def given_up(self) -> int:
        return 0 if self.loss is None else self.loss.missing_offsets


class BrokerChannel(Protocol):
    """How the controller reaches one broker."""

    async def push_metadata(self, snapshot: ClusterMetadata) -> None: ...


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    heartbeat_interval_s: float = 1.0
    lease_s: float = 4.0  # a broker acknowledges writes only this long after a heartbeat it sent
    session_timeout_s: float = 6.0  # silent this long: dead (must exceed lease + clock margin)
    clock_margin_s: float = 0.5
    election_timeout_s: float = 10.0  # a source that has not closed by then is fenced
    # an elected broker that has not opened its partition by then hands it on (back to the
    # move's source if it is live, else to the least loaded live broker); generous, because
    # opening after a broker died replays that broker's WAL objects
    open_timeout_s: float = 30.0
    auto_rebalance: bool = True  # fair share to joining brokers
    # the controller shares its process with its only broker: a broker's new incarnation means
    # the old one is gone with the old process, so its partitions need not wait for a lease
    embedded: bool = False
    offsets_topic_partitions: int = 16
    tick_s: float = 0.05
    # how often the object store's identity marker is read (a wiped or foreign store is noticed)
    identity_check_interval_s: float = 5.0
    # the brokers' acknowledged high watermarks are committed as end-offset floors this often
    # (and with every other commit, and at a clean stop)
    floor_commit_interval_s: float = 10.0

    @property
    def role_window_s(self) -> float:
        """A lease is granted only while the controller confirmed its role in the metadata store
        (a read showing its own controller epoch, or a commit) within this window. A deposed
        controller that has not noticed yet therefore grants nothing later than this after its
        successor's first commit, which bounds every lease it handed out (see `start`). Several
        heartbeats long (the store is re-read every heartbeat interval), and no shorter than a
        lease, so a slow store read does not interrupt the brokers' leases."""
        return max(3 * self.heartbeat_interval_s, self.lease_s)

    def __post_init__(self) -> None:
        if self.session_timeout_s <= self.lease_s + self.clock_margin_s:
            raise ValueError(
                f"session timeout {self.session_timeout_s}s must exceed the lease "
                f"{self.lease_s}s plus the clock margin {self.clock_margin_s}s, or a broker "
                "declared dead could still acknowledge writes"
            )


@dataclass(slots=True)
class NewTopic:
    name: str
    num_partitions: int
    configs: dict[str, str | None] = field(default_factory=dict)
    internal: bool = False
    # the broker of each partition when the client places them (kafka-topics
    # --replica-assignment); None: the controller places them (partition i on broker i mod n)
    assignment: list[int] | None = None


@dataclass(slots=True)
class TopicResult:
    name: str
    error: Exception | None = None
    topic_id: str | None = None
    num_partitions: int = -1
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class BrokerLiveness:
    incarnation: str
    last_heartbeat: float  # monotonic
    last_grant: float  # monotonic time of the last lease granted
    applied_version: int = -1
    open_partitions: dict[TopicPartition, int] = field(default_factory=dict)
    fenced_at: float | None = None
    # high watermarks of the static topics' physical queues it has open (heartbeats)
    high_watermarks: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(slots=True)
class HeartbeatReply:
    lease_s: float
    metadata_version: int
    controller_epoch: int
    fenced: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "lease_s": self.lease_s,
            "metadata_version": self.metadata_version,
            "controller_epoch": self.controller_epoch,
            "fenced": self.fenced,
            "reason": self.reason,
        }


class Controller:
    def __init__(
        self,
        store: MetadataStore,
        settings: ControllerSettings | None = None,
        *,
        offsets_topic_partitions: int | None = None,
        topic_data_deleter: Callable[[str, str], Awaitable[int]] | None = None,
        object_store: ObjectStore | None = None,
    ) -> None:
        from tidalmq_broker.static_topics.manager import StaticTopicManager

        self._store = store
        self._object_store = object_store
        self._delete_topic_data = topic_data_deleter
        s = settings or ControllerSettings()
        if offsets_topic_partitions is not None:
            s = ControllerSettings(
                **{**_settings_dict(s), "offsets_topic_partitions": offsets_topic_partitions}
            )
        self.settings = s
        self._meta: ClusterMetadata | None = None
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._channels: dict[int, BrokerChannel] = {}
        self._liveness: dict[int, BrokerLiveness] = {}
        self._listeners: list[Callable[[ClusterMetadata], Awaitable[None]]] = []
        self._producer_ids: tuple[int, int] = (0, 0)  # [next, end) of the reserved block
        self.moves = MoveTracker()
        self._move_versions: dict[TopicPartition, int] = {}  # version that recorded the move
        self._closed_reports: set[TopicPartition] = set()
        self._deferred: dict[TopicPartition, float] = {}  # re-elect not before (monotonic)
        # No partition without a leader is elected before this (monotonic): after a restart we
        # do not know which earlier owner may still hold a lease from our predecessor
        self._restart_guard = 0.0
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._push_lock = asyncio.Lock()
        self._started_at = 0.0
        self._active = False  # False before start, after stop, and once deposed
        self._replaced = False
        self._role_confirmed_at = float("-inf")  # monotonic start of the last confirmation
        self._role_check: asyncio.Task[None] | None = None
        self._role_checked_at = float("-inf")
        self._events: list[Callable[[str, str, dict[str, Any]], None]] = []
        self._pending_push: dict[int, ClusterMetadata] = {}
        self._cleaning: asyncio.Task[None] | None = None
        self._pushers: dict[int, asyncio.Task[None]] = {}
        # static topics (seed 002): their logic queues move by remapping, not by moves
        self.static = StaticTopicManager(self, object_store)
        # data-loss detection ([O2]): the store's identity verdict, and what the brokers
        # reported since the last commit: (topic id, high watermark) to raise floors from, and
        # (topic id, epoch) of partitions opened (created; an accepted loss done)
        self._store_problem: str | None = None
        self._identity_task: asyncio.Task[None] | None = None
        self._floor_reports: dict[TopicPartition, tuple[str, int]] = {}
        self._opened_reports: dict[TopicPartition, tuple[str | None, int]] = {}
        self._floors_committed_at = 0.0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load the metadata (or create the cluster) and claim the controller role by bumping
        the controller epoch: any older controller's next write fails."""
        async with self._lock:
            meta, token = await self._store.load()
            new = meta is None
            if meta is None:
                meta = ClusterMetadata(cluster_id=new_cluster_id())
                log.info("creating new cluster %s", meta.cluster_id)
            self._meta, self._token = meta, token
            marker = await self._first_identity_check(meta, new)

            def claim(m: ClusterMetadata) -> None:
                m.controller_epoch += 1
                m.store_marker = m.store_marker or marker

            await self._commit_locked(claim)
            now = time.monotonic()
            self._started_at = now
            self._active = True
            # Our predecessor granted its last lease before it noticed this commit, so at most
            # one role window from now (it may not have stopped: a deposed controller only
            # learns it from the store). Brokers known from before are treated as granted
            # then and get one session from then to heartbeat to us.
            inherited = now + self.settings.role_window_s
            self._restart_guard = inherited + self.settings.lease_s + self.settings.clock_margin_s
            for broker_id, info in self.metadata.brokers.items():
                if info.state != "dead":
                    self._liveness[broker_id] = BrokerLiveness(
                        info.incarnation, inherited, inherited
                    )
            for tp, part in _moving(self.metadata):
                source = part.original_replicas[0] if part.original_replicas else None
                status = self.moves.begin(tp, source, part.target_replicas[0])  # type: ignore[index]
                status.reason = "resumed after controller restart"
                if part.move_started_ms is not None:  # the election timeout does not start over
                    status.started = part.move_started_ms / 1000
                self._move_versions[tp] = self.metadata.version
        log.info(
            "controller active for cluster %s: controller epoch %d, metadata version %d, "
            "%d moves in flight",
            self.metadata.cluster_id, self.metadata.controller_epoch, self.metadata.version,
            len(self.moves.active()),
        )  # fmt: skip
        self._loop_task = asyncio.create_task(self._run(), name="controller loop")
        if self._object_store is not None:
            self._identity_task = asyncio.create_task(self._identity_loop(), name="store identity")

    async def stop(self) -> None:
        if self._active and (self._floor_reports or self._opened_reports):
            with contextlib.suppress(Exception):  # a clean stop keeps the latest floors
                async with self._lock:
                    await self._commit_locked(lambda m: None)
        self._active = False  # no lease is granted from now on
        if self._identity_task is not None:
            self._identity_task.cancel()
        if self._role_check is not None:
            self._role_check.cancel()
        await self.static.stop()
        for pusher in self._pushers.values():
            pusher.cancel()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    @property
    def metadata(self) -> ClusterMetadata:
        if self._meta is None:
            raise RuntimeError("controller not started")
        return self._meta

    def snapshot(self) -> ClusterMetadata:
        return self.metadata.copy()

    def add_listener(self, listener: Callable[[ClusterMetadata], Awaitable[None]]) -> None:
        """Called with each committed snapshot (the operator mirrors status from it)."""
        self._listeners.append(listener)

    def add_event_sink(self, sink: Callable[[str, str, dict[str, Any]], None]) -> None:
        """Called as (reason, message, fields) for each notable step (Kubernetes Events)."""
        self._events.append(sink)

    # ---------------------------------------------------------------- brokers
    async def register_broker(self, info: BrokerInfo, channel: BrokerChannel) -> ClusterMetadata:
        """A broker (re)joins. A new incarnation of a known broker takes back its partitions
        with bumped epochs (fencing its previous incarnation), but only once the previous
        incarnation's lease has certainly expired."""
        now = time.monotonic()
        self._channels[info.broker_id] = channel
        previous = self._liveness.get(info.broker_id)
        not_before = now
        if (
            previous is not None
            and previous.incarnation != info.incarnation
            and not self.settings.embedded
        ):
            not_before = previous.last_grant + self.settings.lease_s + self.settings.clock_margin_s
        granted = now
        if previous is not None and previous.incarnation == info.incarnation:
            granted = max(now, previous.last_grant)  # its lease may run longer (inherited)
        self._liveness[info.broker_id] = BrokerLiveness(info.incarnation, now, granted)
        joined = False

        def mutate(meta: ClusterMetadata) -> None:
            nonlocal joined
            old = meta.brokers.get(info.broker_id)
            restarted = old is not None and old.incarnation != info.incarnation
            # A new incarnation of a draining broker drained and stopped without removing
            # itself (killed after its preStop hook, or a rolling restart): it holds nothing and
            # joins again. The same incarnation re-registering (a new controller) keeps draining.
            joined = old is None or old.state == "dead" or (old.state == "draining" and restarted)
            draining = old is not None and old.state == "draining" and not restarted
            info.state = "draining" if draining else "alive"
            meta.brokers[info.broker_id] = info
            for name, topic in meta.topics.items():
                if topic.kind == "static":
                    continue  # the Kafka view of a static topic: derived by self.static
                for index, part in enumerate(topic.partitions):
                    tp = TopicPartition(name, index)
                    mine = part.replicas == [info.broker_id]
                    if part.moving or (topic.pinned and part.leader == NO_LEADER):
                        continue  # a sealed physical queue is never opened again
                    if mine and (old is None or old.incarnation != info.incarnation):
                        if not_before <= now:
                            part.leader = info.broker_id
                            part.leader_epoch += 1
                        else:
                            part.leader = NO_LEADER
                            self._deferred[tp] = not_before
                    elif not part.replicas:
                        part.replicas = [info.broker_id]
                        part.leader = info.broker_id
                        part.leader_epoch += 1

        async with self._lock:
            await self._commit_locked(mutate)
            if OFFSETS_TOPIC not in self.metadata.topics:
                await self._create_topics_locked(
                    [
                        NewTopic(
                            OFFSETS_TOPIC, self.settings.offsets_topic_partitions, internal=True
                        )
                    ],
                    validate_only=False,
                )
            snapshot = self.snapshot()
        self._emit("BrokerRegistered", f"broker {info.broker_id} registered at {info.host}:{info.port}",
                   {"broker": info.broker_id, "incarnation": info.incarnation})  # fmt: skip
        await self._push(snapshot)
        self._wake.set()  # static topics spread their logic queues onto the new broker
        if joined and self.settings.auto_rebalance and len(snapshot.live_brokers()) > 1:
            # record the fair-share moves before answering, so whoever waits for the broker
            # to join sees its partitions already on their way
            await self._rebalance_quietly(f"broker {info.broker_id} joined")
            snapshot = self.snapshot()
        self._wake.set()
        return snapshot

    async def heartbeat(
        self,
        broker_id: int,
        incarnation: str,
        applied_version: int,
        open_partitions: dict[TopicPartition, int],
        high_watermarks: dict[TopicPartition, int] | None = None,
        floors: dict[TopicPartition, tuple[str, int]] | None = None,
    ) -> HeartbeatReply:
        """`floors`: (topic id, high watermark) of the partitions whose high watermark changed
        since the last heartbeat this broker got an answer to; they raise the end-offset
        floors (committed every floor_commit_interval_s)."""
        if not self._active:
            raise ControllerFenced("not the active controller (stopped, or replaced by another)")
        now = time.monotonic()
        live = self._liveness.get(broker_id)
        info = self.metadata.brokers.get(broker_id)
        if live is None or info is None or info.state == "dead" or live.incarnation != incarnation:
            return HeartbeatReply(0.0, self.metadata.version, self.metadata.controller_epoch, True,
                                  "not registered (or declared dead): register again")  # fmt: skip
        live.last_heartbeat = now
        live.applied_version = applied_version
        live.open_partitions = open_partitions
        if high_watermarks is not None:
            live.high_watermarks = high_watermarks
        for tp, (topic_id, hwm) in (floors or {}).items():
            self._report_floor(tp, topic_id, hwm)
        if live.fenced_at is not None:
            return HeartbeatReply(0.0, self.metadata.version, self.metadata.controller_epoch, True,
                                  "fenced: a partition did not close in time")  # fmt: skip
        if now - self._role_confirmed_at > self.settings.role_window_s:
            # the store has not confirmed recently that we are still the controller: a
            # successor may be running, so renew nothing. The answer is what is left of the
            # last grant (counted from the broker's send time it ends no later than that)
            left = max(0.0, live.last_grant + self.settings.lease_s - now)
            return HeartbeatReply(left, self.metadata.version, self.metadata.controller_epoch,
                                  False, "controller role not confirmed recently: lease not renewed")  # fmt: skip
        live.last_grant = max(live.last_grant, now)  # an inherited grant may run longer
        self._wake.set()
        return HeartbeatReply(
            self.settings.lease_s, self.metadata.version, self.metadata.controller_epoch
        )

    def partition_closed(
        self,
        broker_id: int,
        tp: TopicPartition,
        epoch: int,
        *,
        topic_id: str | None = None,
        high_watermark: int | None = None,
    ) -> None:
        """Fast path of seed 000 step 5: the source closed the partition cleanly. Only a close
        at the epoch the move started from counts: a moving partition keeps its epoch until the
        election, and every election or cancel bumps it, so a report of an older epoch is a
        late one from an earlier close (the source may have it open again since)."""
        if topic_id is not None and high_watermark is not None:
            self._report_floor(tp, topic_id, high_watermark)
        part = self._partition(tp)
        if (
            part is not None
            and part.moving
            and part.original_replicas == [broker_id]
            and epoch == part.leader_epoch
        ):
            self._closed_reports.add(tp)
            self._wake.set()
        elif part is not None and part.moving and epoch < part.leader_epoch:
            log.info("ignoring a late closed report of %s at epoch %d (now %d) from broker %d",
                     tp, epoch, part.leader_epoch, broker_id)  # fmt: skip
        if is_physical_topic(tp.topic):
            self.static.partition_closed(broker_id, tp)

    def partition_opened(
        self,
        broker_id: int,
        tp: TopicPartition,
        epoch: int,
        *,
        topic_id: str | None = None,
        high_watermark: int | None = None,
    ) -> None:
        part = self._partition(tp)
        if (
            part is not None
            and part.leader == broker_id
            and epoch == part.leader_epoch
            and (not part.created or part.accepted_from is not None)
        ):
            self._opened_reports[tp] = (topic_id, epoch)
            self._wake.set()  # committed on the next step: from now on it must exist
        if topic_id is not None and high_watermark is not None:
            self._report_floor(tp, topic_id, high_watermark)
        live = self._liveness.get(broker_id)
        if live is not None:
            live.open_partitions[tp] = epoch
        self._observe_opened(tp, broker_id, epoch)
        if is_physical_topic(tp.topic):
            self.static.partition_opened(broker_id, tp)

    # ---------------------------------------------------------------- data loss ([O2])
    @property
    def store_problem(self) -> str | None:
        """Why the object store must not be used (its identity marker is missing, or names
        another cluster), or None."""
        return self._store_problem

    def lost_partitions(self, topic: str | None = None) -> dict[TopicPartition, DataLoss]:
        """Partitions whose data a broker found missing, not accepted yet."""
        return self.metadata.lost_partitions(topic)

    async def partition_lost_data(
        self, broker_id: int, tp: TopicPartition, epoch: int, loss: DataLoss
    ) -> None:
        """A broker found the partition's data missing. Recorded (the partition stays where it
        is: moving it would not bring the data back) until someone accepts the loss."""
        async with self._lock:
            part = self._partition(tp)
            if part is None or part.leader != broker_id or part.leader_epoch != epoch:
                log.info("ignoring a stale data-loss report of %s at epoch %d from broker %d",
                         tp, epoch, broker_id)  # fmt: skip
                return
            if part.lost is not None:
                return  # known

            def mutate(m: ClusterMetadata) -> None:
                m.topics[tp.topic].partitions[tp.partition].lost = loss

            await self._commit_locked(mutate)
            snapshot = self.snapshot()
        log.warning(
            "%s: DATA LOST (broker %d: %s): acknowledged up to offset %d, the store holds up to "
            "%d, %d offsets missing; `tidalmq recover --accept-data-loss %s` continues without them",
            tp, broker_id, loss.reason, loss.expected_end, loss.found_end, loss.missing_offsets,
            tp.topic,
        )  # fmt: skip
        self._emit(
            "DataLost",
            f"{tp}: data lost ({loss.reason}): expected offsets up to {loss.expected_end}, found "
            f"{loss.found_end}, {loss.missing_offsets} missing",
            {"topic": tp.topic, "partition": tp.partition, "expected_end": loss.expected_end,
             "found_end": loss.found_end, "missing_offsets": loss.missing_offsets,
             "broker": broker_id, "warning": True},
        )  # fmt: skip
        await self._push(snapshot)

    async def accept_data_loss(self, topic: str, partitions: list[int] | None = None) -> list[int]:
        """Like Kafka's unclean leader election, and explicit only: each lost partition of the
        topic (those of `partitions`; all when None) continues at its end-offset floor (never
        reusing an offset, so committed offsets and idempotent producers stay valid). Returns
        the partitions recovered."""
        return [a.partition for a in await self.accept_data_loss_detailed(topic, partitions)]

    async def accept_data_loss_detailed(
        self, topic: str, partitions: list[int] | None = None
    ) -> list[AcceptedLoss]:
        async with self._lock:
            info = self.metadata.topics.get(topic)
            if info is None:
                raise UnknownTopic(f"topic {topic} does not exist")
            problem = self._store_problem
            rewrite_marker = problem is not None
            if problem is not None and problem != MISSING:
                raise ForeignStore(
                    f"{problem}: point the cluster at its own object store (accepting a data "
                    "loss would write into another cluster's store)"
                )
            wanted = None if partitions is None else set(partitions)
            chosen: list[AcceptedLoss] = []
            for i, part in enumerate(info.partitions):
                if wanted is not None and i not in wanted:
                    continue
                # with the marker gone the whole store was wiped: every created partition is
                # lost, whether its broker could report it yet or not
                if part.lost is None and not (rewrite_marker and part.created):
                    continue
                start = part.end_offset_floor
                if part.lost is not None:
                    start = max(start, part.lost.expected_end, part.lost.found_end)
                chosen.append(AcceptedLoss(i, start, part.lost))
            if not chosen:
                return []
            if rewrite_marker:
                assert self._object_store is not None
                await write_identity(self._object_store, self.metadata.cluster_id, replace=True)
                log.warning("rewrote the object store's identity marker for cluster %s",
                            self.metadata.cluster_id)  # fmt: skip

            def mutate(m: ClusterMetadata) -> None:
                for a in chosen:
                    part = m.topics[topic].partitions[a.partition]
                    part.lost = None
                    part.accepted_from = a.continues_at
                    part.end_offset_floor = max(part.end_offset_floor, a.continues_at)
                    if not part.moving:
                        part.leader_epoch += 1  # its broker opens it again
                if rewrite_marker:
                    m.store_marker = True

            await self._commit_locked(mutate)
            snapshot = self.snapshot()
        if rewrite_marker:
            self._set_store_problem(None)
        for a in chosen:
            tp = TopicPartition(topic, a.partition)
            log.warning("%s: data loss accepted: continues at offset %d (%d offsets given up)",
                        tp, a.continues_at, a.given_up)  # fmt: skip
            self._emit(
                "DataLossAccepted",
                f"{tp}: data loss accepted; continues at offset {a.continues_at}, "
                f"{a.given_up} offsets given up",
                {"topic": topic, "partition": a.partition, "continues_at": a.continues_at,
                 "given_up": a.given_up, "warning": True},
            )  # fmt: skip
        await self._push(snapshot)
        self._wake.set()
        return chosen

    def _report_floor(self, tp: TopicPartition, topic_id: str, high_watermark: int) -> None:
        """An acknowledged (durable) end of a partition: raise its floor at the next commit."""
        topic = self.metadata.topics.get(tp.topic)
        if topic is None or topic.topic_id != topic_id or tp.partition >= len(topic.partitions):
            return  # a deleted (maybe re-created) topic's late report
        part = topic.partitions[tp.partition]
        pending = self._floor_reports.get(tp)
        if high_watermark > part.end_offset_floor and (
            pending is None or high_watermark > pending[1]
        ):
            self._floor_reports[tp] = (topic_id, high_watermark)

    def _apply_reports(self, meta: ClusterMetadata) -> None:
        """Fold the pending floor and opened reports into a metadata copy being committed."""
        for tp, (topic_id, hwm) in self._floor_reports.items():
            topic = meta.topics.get(tp.topic)
            if (
                topic is not None
                and topic.topic_id == topic_id
                and tp.partition < len(topic.partitions)
            ):
                part = topic.partitions[tp.partition]
                part.end_offset_floor = max(part.end_offset_floor, hwm)
        for tp, (topic_id, epoch) in self._opened_reports.items():
            topic = meta.topics.get(tp.topic)
            if topic is None or tp.partition >= len(topic.partitions):
                continue
            if topic_id is not None and topic.topic_id != topic_id:
                continue
            part = topic.partitions[tp.partition]
            if part.leader_epoch == epoch:
                part.created = True
                part.accepted_from = None

    async def _first_identity_check(self, meta: ClusterMetadata, new: bool) -> bool:
        """At start: write the store's identity marker for a new cluster (or, once, for one
        whose metadata predates the marker), else read it. True when the store holds our
        marker (the metadata then records `store_marker`)."""
        if self._object_store is None:
            return False
        try:
            if new or not meta.store_marker:
                found = await write_identity(self._object_store, meta.cluster_id)
            else:
                found = await read_identity(self._object_store)
        except (StorageError, OSError) as exc:
            log.warning("could not check the object store's identity marker (%s); "
                        "checking again in %.0fs", exc, self.settings.identity_check_interval_s)  # fmt: skip
            return meta.store_marker
        self._set_store_problem(identity_problem(found, meta.cluster_id, meta.store_marker))
        return found is not None and found.cluster_id == meta.cluster_id

    async def _identity_loop(self) -> None:
        while self._active:
            await asyncio.sleep(self.settings.identity_check_interval_s)
            try:
                await self.check_identity()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("object store identity check failed: %s", exc)

    async def check_identity(self) -> str | None:
        """Read the store's identity marker and compare it with the metadata; returns (and
        records) the problem, None when the store is ours."""
        if self._object_store is None or not self._active:
            return self._store_problem
        meta = self.metadata
        try:
            found = await read_identity(self._object_store)
        except (StorageError, OSError) as exc:
            log.debug("identity check: store unavailable: %s", exc)
            return self._store_problem  # an unreachable store is not a wiped one
        if found is None and not meta.store_marker:  # an upgrade whose first write failed
            found = await write_identity(self._object_store, meta.cluster_id)
            if found.cluster_id == meta.cluster_id:
                async with self._lock:
                    await self._commit_locked(lambda m: setattr(m, "store_marker", True))
        problem = identity_problem(found, meta.cluster_id, self.metadata.store_marker)
        self._set_store_problem(problem)
        return problem

    def _set_store_problem(self, problem: str | None) -> None:
        if problem == self._store_problem:
            return
        self._store_problem = problem
        STORE_LOST.set(0 if problem is None else 1)
        if problem is not None:
            log.warning("OBJECT STORE LOST: %s; nothing is written into it", problem)
            self._emit("StoreLost", f"object store lost: {problem}",
                       {"reason": problem, "warning": True})  # fmt: skip
        else:
            log.warning("object store identity verified again")
            self._emit("StoreRecovered", "object store identity verified again", {})

    def _is_current(self, broker_id: int, incarnation: str | None) -> bool:
        """A request from an older incarnation of a broker (a pod deleted with grace period 0
        whose replacement already registered) must not touch the new one."""
        info = self.metadata.brokers.get(broker_id)
        return info is not None and (incarnation is None or info.incarnation == incarnation)

    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool:
        """Move every partition off a broker (scale-in, remove-broker, SIGTERM) and wait until
        it leads none. The broker takes no new partitions meanwhile."""
        async with self._lock:
            info = self.metadata.brokers.get(broker_id)
            if info is None:
                raise UnknownBroker(f"broker {broker_id} is not registered")
            if not self._is_current(broker_id, incarnation):
                log.info("ignoring a drain from an old incarnation of broker %d", broker_id)
                return True
            await self._commit_locked(lambda m: setattr(m.brokers[broker_id], "state", "draining"))
            snapshot = self.snapshot()
        await self._push(snapshot)
        self._emit("BrokerDraining", f"moving every partition off broker {broker_id}",
                   {"broker": broker_id})  # fmt: skip
        await self.rebalance(reason=f"draining broker {broker_id}")
        self._wake.set()  # static topics remap the broker's logic queues (next tick)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._led_by(broker_id):
                return True
            await asyncio.sleep(0.05)
        return False

    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None:
        """Forget a broker that has stopped (after a drain). Partitions it still has are placed
        elsewhere: at once when the broker itself says it stopped (its incarnation given), else
        once its lease has certainly expired."""
        async with self._lock:
            if broker_id not in self.metadata.brokers:
                return
            if not self._is_current(broker_id, incarnation):
                log.info("ignoring a removal from an old incarnation of broker %d", broker_id)
                return
            live = self._liveness.get(broker_id)
            not_before = time.monotonic()
            if incarnation is None and live is not None:
                not_before = live.last_grant + self.settings.lease_s + self.settings.clock_margin_s

            def mutate(meta: ClusterMetadata) -> None:
                meta.brokers.pop(broker_id, None)

            await self._commit_locked(mutate)
            if not_before > time.monotonic():  # its moves too: it may still acknowledge
                for tp, part in _moving(self.metadata):
                    if part.original_replicas == [broker_id]:
                        self._deferred[tp] = max(self._deferred.get(tp, 0.0), not_before)
            self._liveness.pop(broker_id, None)
            self._channels.pop(broker_id, None)
            await self._failover_locked(
                [broker_id], reason=f"broker {broker_id} removed", not_before=not_before,
                announce=False,
            )  # fmt: skip
            snapshot = self.snapshot()
        self._emit("BrokerRemoved", f"broker {broker_id} removed", {"broker": broker_id})
        await self._push(snapshot)

    # ---------------------------------------------------------------- topics
    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[TopicResult]:
        """Create topics. With wait_s > 0, return once every new partition is open on its
        broker (or after wait_s): a client that produces right after creating gets no
        LEADER_NOT_AVAILABLE."""
        async with self._lock:
            results = await self._create_topics_locked(list(topics), validate_only=validate_only)
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
            created = [r.name for r in results if r.error is None]
            await self._wait_open(created, wait_s)
        return results

    async def _wait_open(self, topics: list[str], wait_s: float, first_partition: int = 0) -> bool:
        """Until the leaders of these topics' partitions report them open at their epoch."""
        deadline = time.monotonic() + wait_s
        while True:
            pending = 0
            for name in topics:
                topic = self.metadata.topics.get(name)
                if topic is None:
                    continue
                for i, part in enumerate(topic.partitions[first_partition:], first_partition):
                    live = self._liveness.get(part.leader)
                    opened = live.open_partitions.get(TopicPartition(name, i)) if live else None
                    if opened != part.leader_epoch:
                        pending += 1
            if not pending:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def _create_topics_locked(
        self, topics: list[NewTopic], *, validate_only: bool
    ) -> list[TopicResult]:
        meta = self.metadata
        results: list[TopicResult] = []
        accepted: list[tuple[NewTopic, dict[str, str], str]] = []
        seen: set[str] = set()
        for new in topics:
            try:
                validate_topic_name(new.name)
                if (
                    new.name in INTERNAL_TOPICS or is_physical_topic(new.name)
                ) and not new.internal:
                    raise TopicAlreadyExists(f"topic {new.name!r} is internal")
                if new.name in meta.topics or new.name in seen:
                    raise TopicAlreadyExists(f"topic {new.name!r} already exists")
                validate_partition_count(new.num_partitions)
                configs = validate_configs(new.configs)
                if not self._placeable_brokers(meta):
                    raise NoBrokers("no live broker to place the partitions on")
                if new.assignment is not None:
                    self._check_assignment(meta, new.assignment, new.num_partitions)
            except (ValueError, ControllerError) as exc:
                results.append(TopicResult(new.name, error=exc))
                continue
            seen.add(new.name)
            topic_id = str(uuid.uuid4())
            accepted.append((new, configs, topic_id))
            full = TopicInfo(new.name, topic_id, [], configs).effective_configs()
            results.append(TopicResult(new.name, None, topic_id, new.num_partitions, full))
        if accepted and not validate_only:

            def mutate(m: ClusterMetadata) -> None:
                brokers = self._placeable_brokers(m)
                for new, configs, topic_id in accepted:
                    owners = (
                        list(new.assignment)
                        if new.assignment is not None
                        else place_partitions(brokers, new.num_partitions)
                    )
                    m.topics[new.name] = TopicInfo(
                        name=new.name,
                        topic_id=topic_id,
                        partitions=[PartitionState(b, 0, [b]) for b in owners],
                        configs=configs,
                        internal=new.internal,
                    )

            await self._commit_locked(mutate)
        return results

    async def delete_topics(self, names: Iterable[str]) -> list[TopicResult]:
        async with self._lock:
            meta = self.metadata
            results: list[TopicResult] = []
            doomed: list[str] = []
            for name in names:
                topic = meta.topics.get(name)
                if topic is None:
                    results.append(
                        TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
                    )
                elif topic.internal:
                    results.append(
                        TopicResult(name, ControllerError(f"topic {name!r} is internal"))
                    )
                else:
                    doomed.append(name)
                    results.append(TopicResult(name, None, topic.topic_id))
            if doomed:

                def mutate(m: ClusterMetadata) -> None:
                    for n in doomed:
                        topic = m.topics.pop(n)
                        if topic.kind == "static":  # its data is in its physical topic
                            m.static_topics.pop(n, None)
                            topic = m.topics.pop(physical_topic_name(n), topic)
                        m.pending_deletions.append((topic.name, topic.topic_id))

                await self._commit_locked(mutate)
                for name in doomed:
                    self.static.forget(name)
                    for tp in [tp for tp in self._move_versions if tp.topic == name]:
                        self._move_versions.pop(tp, None)
                        self.moves.mark(tp, Phase.FAILED, "topic deleted")
            snapshot = self.snapshot()
        await self._push(snapshot)
        return results

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignment: list[int] | None = None,
    ) -> TopicResult:
        """Grow a topic to `total` partitions; `assignment` names the broker of each new one."""
        async with self._lock:
            topic = self.metadata.topics.get(name)
            if topic is None:
                return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
            current = len(topic.partitions)
            try:
                if topic.pinned:
                    raise InvalidPartitions(
                        f"{name!r} is a static topic: its {current} logic queues are fixed"
                    )
                validate_partition_count(total)
                if total <= current:
                    raise InvalidPartitions(
                        f"topic {name!r} has {current} partitions; the count can only grow "
                        f"(asked for {total})"
                    )
                if not self._placeable_brokers(self.metadata):
                    raise NoBrokers("no live broker to place the partitions on")
                if assignment is not None:
                    self._check_assignment(self.metadata, assignment, total - current)
            except (ValueError, ControllerError) as exc:
                return TopicResult(name, exc)
            if not validate_only:

                def mutate(m: ClusterMetadata) -> None:
                    owners = (
                        list(assignment)
                        if assignment is not None
                        else place_partitions(
                            self._placeable_brokers(m), total - current, first_partition=current
                        )
                    )
                    m.topics[name].partitions.extend(PartitionState(b, 0, [b]) for b in owners)

                await self._commit_locked(mutate)
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
        return TopicResult(name, None, topic.topic_id, total)

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult:
        """Set (value) or delete (None) config overrides. Non-incremental replaces all."""
        async with self._lock:
            topic = self.metadata.topics.get(name)
            if topic is None:
                return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
            merged: dict[str, str | None] = dict(topic.configs) if incremental else {}
            merged.update(changes)
            try:
                configs = validate_configs(merged)
            except ValueError as exc:
                return TopicResult(name, exc)
            if not validate_only:

                def mutate(m: ClusterMetadata) -> None:
                    m.topics[name].configs = configs
                    if m.topics[name].kind == "static":  # its physical queues follow
                        m.topics[physical_topic_name(name)].configs = dict(configs)

                await self._commit_locked(mutate)
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
        return TopicResult(name, None, topic.topic_id, len(topic.partitions))

    async def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> Exception | None:
        """Set (value) or delete (None) dynamic broker configs of one broker (its id as a
        string) or of the cluster default (""). Non-incremental replaces the scope's configs."""
        async with self._lock:
            try:
                validate_broker_config_scope(scope)
                merged: dict[str, str | None] = (
                    dict(self.metadata.broker_configs.get(scope, {})) if incremental else {}
                )
                merged.update(changes)
                configs = validate_broker_configs(merged)
            except ValueError as exc:
                return exc
            if validate_only:
                return None

            def mutate(m: ClusterMetadata) -> None:
                if configs:
                    m.broker_configs[scope] = configs
                else:
                    m.broker_configs.pop(scope, None)

            await self._commit_locked(mutate)
            snapshot = self.snapshot()
        await self._push(snapshot)
        return None

    # ---------------------------------------------------------------- producer ids
    async def allocate_producer_id(self) -> int:
        """A cluster-unique producer id. Blocks of ids are reserved in the metadata so no id
        is handed out twice across controller restarts."""
        async with self._lock:
            nxt, end = self._producer_ids
            if nxt >= end:
                start = self.metadata.next_producer_id

                def mutate(m: ClusterMetadata) -> None:
                    m.next_producer_id = start + PRODUCER_ID_BLOCK

                await self._commit_locked(mutate)
                nxt, end = start, start + PRODUCER_ID_BLOCK
            self._producer_ids = (nxt + 1, end)
            return nxt

    # ---------------------------------------------------------------- reassignment
    async def alter_reassignments(
        self, entries: list[PlanEntry]
    ) -> dict[TopicPartition, Exception | None]:
        """Start (target set) or cancel (target None) moves. Per-partition errors, as Kafka's
        AlterPartitionReassignments reports them; a plan naming an unknown topic, partition or
        broker changes nothing for that entry."""
        results: dict[TopicPartition, Exception | None] = {}
        async with self._lock:
            meta = self.metadata
            valid: list[PlanEntry] = []
            for entry in entries:
                try:
                    validate_plan([entry], meta)
                    if meta.topics[entry.tp.topic].pinned:
                        raise InvalidPlan(
                            f"{entry.tp}: a static topic's queues move by remapping "
                            "(`tidalmq static-topic remap`), not by reassignment"
                        )
                    if entry.target is not None:
                        broker = meta.brokers[entry.target]
                        if broker.state != "alive":
                            raise InvalidPlan(
                                f"{entry.tp}: broker {entry.target} is {broker.state}"
                            )
                    part = meta.topics[entry.tp.topic].partitions[entry.tp.partition]
                    if entry.target is None and not part.moving:
                        raise NoReassignmentInProgress(f"{entry.tp} is not being reassigned")
                    results[entry.tp] = None
                    valid.append(entry)
                except (InvalidPlan, NoReassignmentInProgress) as exc:
                    results[entry.tp] = exc
            if valid:
                await self._apply_moves_locked(valid, reason="requested")
            snapshot = self.snapshot()
        if valid:
            await self._push(snapshot)
            self._wake.set()
        return results

    def list_reassignments(
        self, tps: Iterable[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]:
        wanted = set(tps) if tps is not None else None
        out = []
        for tp, part in _moving(self.metadata):
            if wanted is None or tp in wanted:
                out.append((tp, *adding_removing(part)))
        return out

    async def rebalance(
        self, *, reason: str = "rebalance", dry_run: bool = False, topics: list[str] | None = None
    ) -> Plan:
        """Minimal-move count balance over the live (not draining) brokers."""
        async with self._lock:
            meta = self.metadata
            brokers = self._placeable_brokers(meta)
            if not brokers:
                raise NoBrokers("no live broker to balance onto")
            movable = {
                tp: b
                for tp, b in current_assignment(meta, topics).items()
                if not meta.topics[tp.topic].pinned
            }
            plan = balance_counts(movable, brokers)
            if dry_run or not plan.moves:
                return plan
            entries = [PlanEntry(m.partition, m.target) for m in plan.moves]  # type: ignore[arg-type]
            await self._apply_moves_locked(entries, reason=reason)
            snapshot = self.snapshot()
        log.info("%s: moving %d partitions", reason, len(plan.moves))
        self._emit("Rebalancing", f"{reason}: moving {len(plan.moves)} partitions",
                   {"moves": len(plan.moves)})  # fmt: skip
        await self._push(snapshot)
        self._wake.set()
        return plan

    async def _apply_moves_locked(self, entries: list[PlanEntry], *, reason: str) -> None:
        now_ms = int(time.time() * 1000)
        started: list[tuple[TopicPartition, int | None, int]] = []
        cancelled: list[TopicPartition] = []

        def mutate(meta: ClusterMetadata) -> None:
            for entry in entries:
                part = meta.topics[entry.tp.topic].partitions[entry.tp.partition]
                if entry.target is None:
                    cancel_move(part)
                    cancelled.append(entry.tp)
                    continue
                source = (
                    part.original_replicas[0]
                    if part.moving and part.original_replicas
                    else (part.replicas[0] if part.replicas else None)
                )
                if begin_move(part, entry.target, now_ms):
                    if part.moving:
                        started.append((entry.tp, source, entry.target))
                    else:
                        cancelled.append(entry.tp)  # re-targeted to where it came from

        await self._commit_locked(mutate)
        version = self.metadata.version
        for tp, source, target in started:
            existing = self.moves.get(tp)
            if existing is not None:
                existing.target = target
            else:
                self.moves.begin(tp, source, target).reason = reason
            self._move_versions[tp] = version
            self._closed_reports.discard(tp)
        for tp in cancelled:
            self._move_versions.pop(tp, None)
            self._closed_reports.discard(tp)
            status = self.moves.get(tp)
            if status is not None:
                part = self._partition(tp)
                status.epoch = part.leader_epoch if part else None
                self.moves.mark(
                    tp, Phase.CANCELLED, "cancelled: rolled back to the original broker"
                )
                self._emit("ReassignmentCancelled", f"{tp} rolled back to broker {status.source}",
                           {"partition": str(tp)})  # fmt: skip

    # ---------------------------------------------------------------- the loop
    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
            # arrives as the event is set, and stop() then waits for this loop forever
            try:
                async with asyncio.timeout(self.settings.tick_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if not self._active:
                if self._replaced:
                    log.error("controller replaced by a newer controller; stopping")
                return
            self._schedule_role_check()
            try:
                await self._step()
            except ControllerFenced as exc:
                await self._check_role()  # a conflict that was not a successor: carry on
                if self._active:
                    log.warning("metadata commit refused (%s); retrying", exc)
                    await asyncio.sleep(0.5)
                    continue
                log.error("controller fenced by a newer controller; stopping")
                return
            except Exception:
                log.exception("controller step failed")
                await asyncio.sleep(0.5)

    async def _step(self) -> None:
        now = time.monotonic()
        changed = False
        async with self._lock:
            meta = self.metadata
            # 1. failover: brokers silent past the session timeout
            dead = [
                b
                for b, live in self._liveness.items()
                if meta.brokers.get(b) is not None
                and meta.brokers[b].state != "dead"
                and now - live.last_heartbeat > self.settings.session_timeout_s
            ]
            if dead:
                await self._failover_locked(dead, reason="session timed out")
                changed = True
            # 2. elections of moves whose source has closed (or is fenced/dead)
            elect: list[TopicPartition] = []
            fence: set[int] = set()
            for tp, part in _moving(self.metadata):
                ready, fence_source = self._source_released(tp, part, now)
                if ready:
                    elect.append(tp)
                elif fence_source is not None:
                    fence.add(fence_source)
            for broker_id in fence:
                live = self._liveness.get(broker_id)
                if live is not None and live.fenced_at is None:
                    live.fenced_at = now
                    log.warning(
                        "broker %d did not close a moving partition within %.1fs: fencing it",
                        broker_id, self.settings.election_timeout_s,
                    )  # fmt: skip
                    self._emit("BrokerFenced", f"broker {broker_id} did not close in time",
                               {"broker": broker_id})  # fmt: skip
            # 3. partitions without a leader, once no earlier owner can hold a lease on them
            due = self._due_elections(now)
            if elect or due:
                await self._elect_locked(elect, due)
                changed = True
            # 4. elected brokers that did not open their partition in time
            stuck = self._stuck_openings()
            if stuck:
                await self._hand_on_locked(stuck)
                changed = True
            # 5. partitions opened for the first time (from now on their data must exist), and
            # the acknowledged ends the brokers reported (at most every floor_commit_interval_s)
            floors_due = self._floor_reports and (
                now - self._floors_committed_at >= self.settings.floor_commit_interval_s
            )
            if not changed and (self._opened_reports or floors_due):
                await self._commit_locked(lambda m: None)
            snapshot = self.snapshot() if changed else None
        if snapshot is not None:
            await self._push(snapshot)
        if self._store_problem is not None:
            return  # a wiped or foreign store: nothing below may write into it
        # 5. static topics: remaps, repairs, cleanup (each runs as its own task)
        self.static.tick()
        # 6. data of deleted topics, once no broker has their partitions open
        if self.metadata.pending_deletions and (self._cleaning is None or self._cleaning.done()):
            self._cleaning = asyncio.create_task(self._clean_deleted_topics(), name="topic cleanup")
        # 7. targets that report their partition open: the move is done
        for status in self.moves.active():
            if status.phase is Phase.OPENING and status.epoch is not None:
                live = self._liveness.get(status.target)
                if live is not None and live.open_partitions.get(status.tp) == status.epoch:
                    self._observe_opened(status.tp, status.target, status.epoch)

    def _stuck_openings(self) -> list[tuple[MoveStatus, int]]:
        """(move, broker to hand the partition to) for targets elected more than the open
        timeout ago that still do not report the partition open at their epoch."""
        out: list[tuple[MoveStatus, int]] = []
        now = time.time()
        for status in self.moves.active():
            if status.phase is not Phase.OPENING or status.elected is None:
                continue
            if now - status.elected <= self.settings.open_timeout_s:
                continue
            topic = self.metadata.topics.get(status.topic)
            part = self._partition(status.tp)
            if topic is None or topic.pinned or part is None or part.moving:
                continue
            if part.leader != status.target or part.leader_epoch != status.epoch:
                continue
            live = self._liveness.get(status.target)
            if live is not None and live.open_partitions.get(status.tp) == status.epoch:
                continue  # opened: the done check below records it
            candidates = set(self._placeable_brokers(self.metadata)) - {status.target}
            if not candidates:
                continue
            if status.source in candidates:
                out.append((status, status.source))  # type: ignore[arg-type]
                continue
            counts: dict[int | None, int] = {}
            for b in current_assignment(self.metadata).values():
                counts[b] = counts.get(b, 0) + 1
            out.append((status, min(candidates, key=lambda b: (counts.get(b, 0), b))))
        return out

    async def _hand_on_locked(self, stuck: list[tuple[MoveStatus, int]]) -> None:
        """Move each partition off the broker that did not open it, with the usual flow: that
        broker stops wanting it, its heartbeat shows it does not have it open (or it closes it,
        or the election timeout fences it), then the new broker is elected with epoch + 1.
        Electing another broker at once would not be safe: the stuck one may finish opening
        and acknowledge writes on its valid lease."""
        entries = [PlanEntry(status.tp, new) for status, new in stuck]
        for status, new in stuck:
            log.warning(
                "%s: broker %d did not open it within %.0fs (epoch %s); handing it to broker %d",
                status.tp, status.target, self.settings.open_timeout_s, status.epoch, new,
            )  # fmt: skip
            self._emit("PartitionNotOpened",
                       f"{status.tp}: broker {status.target} did not open it in time; "
                       f"moving it to broker {new}",
                       {"partition": str(status.tp), "broker": status.target})  # fmt: skip
        old_targets = {status.tp: status.target for status, _ in stuck}
        await self._apply_moves_locked(entries, reason="open timed out")
        for tp, old_target in old_targets.items():
            status = self.moves.get(tp)
            part = self._partition(tp)
            if status is not None and part is not None and part.moving:
                status.source = old_target
                self.moves.mark(
                    tp, Phase.CLOSING,
                    f"broker {old_target} did not open it within "
                    f"{self.settings.open_timeout_s:.0f}s; moving it to broker {status.target}",
                )  # fmt: skip

    def _schedule_role_check(self) -> None:
        """Re-read the store every heartbeat interval to confirm we are still the controller
        (a deposed controller learns it only from the store, and must stop granting leases
        even when it has nothing to write)."""
        now = time.monotonic()
        if now - self._role_checked_at < self.settings.heartbeat_interval_s:
            return
        if self._role_check is not None and not self._role_check.done():
            return
        self._role_checked_at = now
        self._role_check = asyncio.create_task(self._check_role(), name="controller role check")

    async def _check_role(self) -> None:
        started = time.monotonic()
        try:
            meta, _ = await self._store.load()
        except Exception as exc:
            log.warning("could not confirm the controller role in the metadata store: %s", exc)
            return
        mine = self.metadata.controller_epoch
        if meta is not None and meta.controller_epoch == mine:
            self._role_confirmed_at = max(self._role_confirmed_at, started)
        elif meta is not None and meta.controller_epoch > mine:
            self._deposed(f"the store holds controller epoch {meta.controller_epoch}")
        else:
            log.warning("the metadata store does not hold our controller epoch %d", mine)

    def _deposed(self, why: str) -> None:
        if self._active:
            log.error("another controller took over (%s): granting no more leases", why)
            self._emit("ControllerDeposed", f"another controller took over: {why}", {})
        self._active = False
        self._replaced = True
        self._wake.set()

    def _source_released(
        self, tp: TopicPartition, part: PartitionState, now: float
    ) -> tuple[bool, int | None]:
        """(may elect now, broker to fence) for a moving partition."""
        if tp in self._closed_reports:
            return True, None  # the source closed it at the move's epoch: it acknowledges no more
        if now < self._not_before(tp):
            # an earlier owner may still hold a lease on it (the source not having it open
            # says nothing about an older incarnation, or a removed broker)
            return False, None
        source = part.original_replicas[0] if part.original_replicas else None
        info = self.metadata.brokers.get(source) if source is not None else None
        if source is None or info is None or info.state == "dead":
            return True, None
        live = self._liveness.get(source)
        if live is None:
            return True, None
        if live.fenced_at is not None:
            expired = live.last_grant + self.settings.lease_s + self.settings.clock_margin_s
            return now >= expired, None
        recorded = self._move_versions.get(tp, self.metadata.version)
        if live.applied_version >= recorded and tp not in live.open_partitions:
            return True, None
        status = self.moves.get(tp)
        if part.move_started_ms is not None:  # durable: a restarted controller keeps counting
            started = part.move_started_ms / 1000
        else:
            started = status.started if status is not None else time.time()
        if time.time() - started > self.settings.election_timeout_s:
            return False, source
        return False, None

    def _not_before(self, tp: TopicPartition) -> float:
        """When a partition may get a new leader without waiting for anyone: once every earlier
        owner's lease has certainly run out (a deferral we recorded, and after a restart the
        leases our predecessor may have granted)."""
        return max(self._deferred.get(tp, 0.0), self._restart_guard)

    def _due_elections(self, now: float) -> list[TopicPartition]:
        """Partitions without a leader that are not moving, to elect now. Level-based: the
        deferrals we recorded, and every other such partition (left over by a predecessor, or
        by a failover that found no live broker) once the restart guard has passed. Static
        topics' physical queues only by deferral: a sealed one has no leader on purpose."""
        if now < self._restart_guard:
            return []
        due = [tp for tp, t in self._deferred.items() if now >= t]
        if not self._placeable_brokers(self.metadata):
            return due
        for name, topic in self.metadata.topics.items():
            if topic.pinned:
                continue
            for i, part in enumerate(topic.partitions):
                if part.leader == NO_LEADER and not part.moving:
                    tp = TopicPartition(name, i)
                    if tp not in self._deferred:
                        due.append(tp)
        return due

    async def _elect_locked(self, elect: list[TopicPartition], due: list[TopicPartition]) -> None:
        elected: list[tuple[TopicPartition, int, int]] = []
        live_brokers = set(self._placeable_brokers(self.metadata))

        def mutate(meta: ClusterMetadata) -> None:
            for tp in elect:
                topic = meta.topics.get(tp.topic)
                if topic is None or tp.partition >= len(topic.partitions):
                    continue
                part = topic.partitions[tp.partition]
                if not part.moving:
                    continue
                target = part.target_replicas[0] if part.target_replicas else None
                if target not in live_brokers:
                    # the target went away: go back home if possible, else anywhere
                    home = part.original_replicas[0] if part.original_replicas else None
                    if home in live_brokers:
                        cancel_move(part)
                        continue
                    if not live_brokers:
                        continue
                    part.target_replicas = [min(live_brokers)]
                target = elect_target(part)
                elected.append((tp, target, part.leader_epoch))
            homes = self._homes_for(meta, due, live_brokers)
            for tp in due:
                topic = meta.topics.get(tp.topic)
                if topic is None or tp.partition >= len(topic.partitions):
                    continue
                part = topic.partitions[tp.partition]
                if part.leader != NO_LEADER or part.moving:
                    continue
                owner = part.replicas[0] if part.replicas else None
                if not topic.pinned and owner not in live_brokers:
                    owner = homes.get(tp)  # its broker is gone or draining: place it anew
                if owner is not None:
                    part.replicas = [owner]
                    part.leader = owner
                    part.leader_epoch += 1

        await self._commit_locked(mutate)
        for tp in due:
            self._deferred.pop(tp, None)
        for tp, target, epoch in elected:
            self._closed_reports.discard(tp)
            self._move_versions.pop(tp, None)
            status = self.moves.get(tp)
            if status is not None:
                self.moves.mark(tp, Phase.ELECTING)
                status.target = target
                status.epoch = epoch
                self.moves.mark(tp, Phase.OPENING)
            self._emit("PartitionElected", f"{tp} elected on broker {target} at epoch {epoch}",
                       {"partition": str(tp), "broker": target, "epoch": epoch})  # fmt: skip
        # moves cancelled because their target vanished
        for tp in elect:
            part = self._partition(tp)
            status = self.moves.get(tp)
            if (
                part is not None
                and not part.moving
                and status is not None
                and status.phase is Phase.CLOSING
            ):
                self.moves.mark(tp, Phase.CANCELLED, "target broker went away")

    @staticmethod
    def _homes_for(
        meta: ClusterMetadata, due: list[TopicPartition], live: set[int]
    ) -> dict[TopicPartition, int]:
        """Live brokers for the due partitions whose broker is not live (fewest moves)."""
        assignment: dict[TopicPartition, int | None] = {
            tp: b for tp, b in current_assignment(meta).items() if not meta.topics[tp.topic].pinned
        }
        orphans = [tp for tp in due if tp in assignment and assignment[tp] not in live]
        if not orphans or not live:
            return {}
        for tp in orphans:
            assignment[tp] = None
        homes = place_orphans(assignment, sorted(live))
        return {tp: homes[tp] for tp in orphans}

    async def _failover_locked(
        self, dead: list[int], *, reason: str, not_before: float = 0.0, announce: bool = True
    ) -> None:
        """Declare brokers dead and open their partitions elsewhere (epoch + 1: the new owner
        fences them in object storage and recovers their unindexed WAL objects). With
        `not_before` in the future the new owners are recorded now and elected then."""
        dead_set = set(dead)
        defer = not_before > time.monotonic()
        for b in dead:
            if announce:
                log.warning("broker %d is dead (%s); moving its partitions", b, reason)
                BROKERS_DECLARED_DEAD.inc()
                self._emit("BrokerDead", f"broker {b}: {reason}", {"broker": b})
        moved: list[tuple[TopicPartition, int]] = []

        def mutate(meta: ClusterMetadata) -> None:
            for b in dead:
                if b in meta.brokers:
                    meta.brokers[b].state = "dead"
            live = self._placeable_brokers(meta)
            assignment: dict[TopicPartition, int | None] = {}
            for name, topic in meta.topics.items():
                if topic.pinned:
                    continue  # static topics: self.static remaps their logic queues
                for i, part in enumerate(topic.partitions):
                    if part.moving:
                        continue  # the election step handles moves (dead source: elect now)
                    owner = part.replicas[0] if part.replicas else None
                    assignment[TopicPartition(name, i)] = owner
            orphans = {tp: b for tp, b in assignment.items() if b in dead_set or b is None}
            if not orphans:
                return
            if not live:
                for tp in orphans:
                    part = meta.topics[tp.topic].partitions[tp.partition]
                    part.leader = NO_LEADER
                return
            homes = place_orphans(assignment, live)
            for tp, target in homes.items():
                part = meta.topics[tp.topic].partitions[tp.partition]
                part.replicas = [target]
                if defer:
                    part.leader = NO_LEADER  # elected once the old owner's lease has expired
                    self._deferred[tp] = not_before
                else:
                    part.leader = target
                    part.leader_epoch += 1
                moved.append((tp, target))

        await self._commit_locked(mutate)
        for b in dead:
            self._liveness.pop(b, None)
        for tp, target in moved:
            status = self.moves.begin(tp, None, target)
            status.reason = reason
            part = self._partition(tp)
            status.epoch = part.leader_epoch if part else None
            self.moves.mark(tp, Phase.OPENING)

    async def _clean_deleted_topics(self) -> None:
        """Delete the stored data of deleted topics once every live broker has reported (in a
        heartbeat that reflects the deletion) that none of their partitions is open."""
        pending = list(self.metadata.pending_deletions)
        version = self.metadata.version
        for name, topic_id in pending:
            current = self.metadata.topics.get(name)
            still_open = any(
                tp.topic == name and (current is None or live.applied_version < version)
                for live in self._liveness.values()
                for tp in live.open_partitions
            )
            behind = any(live.applied_version < version for live in self._liveness.values())
            if still_open or behind:
                continue
            if self._delete_topic_data is not None:
                try:
                    count = await self._delete_topic_data(name, topic_id)
                    log.info("deleted the data of topic %s (%s): %d objects", name, topic_id, count)
                except Exception as exc:
                    log.warning("deleting the data of topic %s failed, will retry: %s", name, exc)
                    continue
            async with self._lock:
                await self._commit_locked(
                    lambda m, entry=(name, topic_id): (
                        m.pending_deletions.remove(entry) if entry in m.pending_deletions else None
                    )
                )
            self._emit("TopicDataDeleted", f"data of topic {name} deleted", {"topic": name})

    def _observe_opened(self, tp: TopicPartition, broker_id: int, epoch: int) -> None:
        status = self.moves.get(tp)
        if status is None or status.phase is not Phase.OPENING:
            return
        if status.target == broker_id and status.epoch == epoch:
            self.moves.mark(tp, Phase.DONE)
            log.info(
                "%s now served by broker %d (unavailable %.0f ms)",
                tp, broker_id, (status.unavailable_s or 0) * 1000,
            )  # fmt: skip

    async def _rebalance_quietly(self, reason: str) -> None:
        try:
            await self.rebalance(reason=reason)
        except Exception:
            log.exception("automatic rebalance failed (%s)", reason)

    # ---------------------------------------------------------------- internals
    def _check_assignment(self, meta: ClusterMetadata, owners: list[int], count: int) -> None:
        if len(owners) != count:
            raise InvalidReplicaAssignment(
                f"the assignment places {len(owners)} partitions, expected {count}"
            )
        live = set(self._placeable_brokers(meta))
        unknown = sorted(set(owners) - live)
        if unknown:
            raise InvalidReplicaAssignment(
                f"broker(s) {unknown} in the replica assignment are not live brokers "
                f"(live: {sorted(live)})"
            )

    def expect_brokers(self, broker_ids: Iterable[int], within_s: float) -> None:
        """Known brokers that are starting again right now (the local cluster starts its own
        processes after the controller): not declared dead, and so not failed over and then
        rebalanced, before `within_s` from now. Only the dead declaration waits: the leases
        of their earlier incarnations count as before."""
        until = time.monotonic() + within_s - self.settings.session_timeout_s
        for broker_id in broker_ids:
            live = self._liveness.get(broker_id)
            if live is not None:
                live.last_heartbeat = max(live.last_heartbeat, until)

    def has_heartbeated(self, broker_id: int) -> bool:
        """The broker's registration was answered and it heartbeats since: the moves of its
        join rebalance (recorded before that answer) are visible to whoever waits for it."""
        live = self._liveness.get(broker_id)
        return live is not None and live.applied_version >= 0

    def _placeable_brokers(self, meta: ClusterMetadata) -> list[int]:
        return sorted(b for b, info in meta.brokers.items() if info.state == "alive")

    def _partition(self, tp: TopicPartition) -> PartitionState | None:
        topic = self.metadata.topics.get(tp.topic)
        if topic is None or tp.partition >= len(topic.partitions):
            return None
        return topic.partitions[tp.partition]

    def _led_by(self, broker_id: int) -> list[TopicPartition]:
        out = []
        for tp, part in _all_partitions(self.metadata):
            if part.leader == broker_id or (part.moving and part.original_replicas == [broker_id]):
                out.append(tp)
        live = self._liveness.get(broker_id)
        if live is not None:
            out.extend(tp for tp in live.open_partitions if tp not in out)
        return out

    def move_statuses(self) -> tuple[list[MoveStatus], list[MoveStatus]]:
        return self.moves.active(), self.moves.recent()

    def broker_liveness(self) -> dict[int, BrokerLiveness]:
        return dict(self._liveness)

    # ---------------------------------------------------------------- for static topics
    async def update(self, mutate: Callable[[ClusterMetadata], object]) -> int:
        """Commit one change (applied to a copy; nothing is committed if `mutate` raises),
        push it, and return the new metadata version."""
        async with self._lock:
            await self._commit_locked(mutate)
            snapshot = self.snapshot()
        await self._push(snapshot)
        return snapshot.version

    def fence_broker(self, broker_id: int, reason: str) -> None:
        """Stop renewing a broker's lease (it gives up its partitions and re-registers)."""
        live = self._liveness.get(broker_id)
        if live is not None and live.fenced_at is None:
            live.fenced_at = time.monotonic()
            log.warning("fencing broker %d: %s", broker_id, reason)
            self._emit("BrokerFenced", f"broker {broker_id}: {reason}", {"broker": broker_id})

    def known_high_watermarks(self) -> dict[TopicPartition, int]:
        """Physical queues' high watermarks as the brokers last reported them."""
        out: dict[TopicPartition, int] = {}
        for live in self._liveness.values():
            out.update(live.high_watermarks)
        return out

    def deferred(self, tp: TopicPartition) -> bool:
        """The controller itself elects this partition later (an earlier owner's lease)."""
        return tp in self._deferred or time.monotonic() < self._restart_guard

    def wake(self) -> None:
        self._wake.set()

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        self._emit(reason, message, fields)

    async def _commit_locked(self, mutate: Callable[[ClusterMetadata], object]) -> None:
        new = self.metadata.copy()
        mutate(new)
        # every commit carries the floors and openings reported since the last one
        floors, opened = dict(self._floor_reports), dict(self._opened_reports)
        self._apply_reports(new)
        new.version += 1
        started = time.monotonic()
        try:
            token = await self._store.save(new, self._token)
        except StaleMetadata as exc:
            self._role_checked_at = float("-inf")  # look at the store now: are we deposed?
            self._wake.set()
            raise ControllerFenced(str(exc)) from exc
        self._meta, self._token = new, token
        self._role_confirmed_at = max(self._role_confirmed_at, started)
        for tp, value in floors.items():
            if self._floor_reports.get(tp) == value:
                del self._floor_reports[tp]
        for tp, seen in opened.items():
            if self._opened_reports.get(tp) == seen:
                del self._opened_reports[tp]
        self._floors_committed_at = time.monotonic()
        LOST_PARTITIONS.set(sum(
            1 for t in new.topics.values() for p in t.partitions if p.lost is not None
        ))  # fmt: skip

    async def _push(self, snapshot: ClusterMetadata) -> None:
        """Send the snapshot to every broker without waiting for slow ones: one pusher per
        broker always sends the newest snapshot (older ones are skipped), and heartbeats
        repair anything a push missed."""
        for broker_id in list(self._channels):
            self._pending_push[broker_id] = snapshot
            pusher = self._pushers.get(broker_id)
            if pusher is None or pusher.done():
                self._pushers[broker_id] = asyncio.create_task(
                    self._pusher(broker_id), name=f"push to broker {broker_id}"
                )
        for listener in self._listeners:
            try:
                await listener(snapshot)
            except Exception:
                log.exception("metadata listener failed")

    async def _pusher(self, broker_id: int) -> None:
        while True:
            snapshot = self._pending_push.pop(broker_id, None)
            channel = self._channels.get(broker_id)
            if snapshot is None or channel is None:
                return
            try:
                await asyncio.wait_for(channel.push_metadata(snapshot), 5)
            except Exception as exc:
                log.debug(
                    "metadata v%d push to broker %d failed: %s", snapshot.version, broker_id, exc
                )

    def _emit(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        for sink in self._events:
            try:
                sink(reason, message, fields)
            except Exception:
                log.exception("event sink failed")


def _all_partitions(meta: ClusterMetadata) -> Iterable[tuple[TopicPartition, PartitionState]]:
    for name, topic in meta.topics.items():
        for i, part in enumerate(topic.partitions):
            yield TopicPartition(name, i), part


def _moving(meta: ClusterMetadata) -> list[tuple[TopicPartition, PartitionState]]:
    return [(tp, p) for tp, p in _all_partitions(meta) if p.moving]


def _settings_dict(s: ControllerSettings) -> dict[str, Any]:
    return {f: getattr(s, f) for f in ControllerSettings.__dataclass_fields__}


def leader_of(meta: ClusterMetadata, topic: str, partition: int) -> int:
    info = meta.topics.get(topic)
    if info is None or partition >= len(info.partitions):
        return NO_LEADER
    return info.partitions[partition].leader
