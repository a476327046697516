"""The controller: the single writer of cluster metadata, split by concern.

Each concern has its manager, which owns its state and turns decisions into metadata records
(tidalmq_core.records): membership and leases (_membership.py), brokers registering, reporting,
draining, leaving and being fenced (_broker_lifecycle.py), topics and configs (_topics.py),
partitions and moves (_leadership.py), data loss and the store's identity (_data_loss.py),
producer ids (here: one counter), static topics (_static_topics.py); requests waiting for new
partitions to open are _open_waits.py's. This class only sequences: it validates a request with the manager
that owns it, proposes the records to the journal (_journal.py: applied to the image at once,
appended with everything else decided meanwhile as one batch), waits for the commit before it
answers, and hands committed batches to the publisher (_publishing.py), which sends each broker
the batches after the version it holds (a snapshot only when it is too far behind).

Moves follow the move protocol (docs/control-plane.md): the target is recorded (queued: the source still serves); the move's
wave asks the source to close (leader none); the source closes cleanly and reports it at the
move's epoch; the target is elected with epoch + 1 and opens the partition. A source that does
not close within the election timeout (from the durable start of the close; only one this
controller has heard from, docs/control-plane.md "A controller restart") is fenced: its lease
is not renewed, and the target is elected once that lease has certainly expired, its open
bumping the epoch in object storage and recovering the source's unindexed WAL objects. A target
that does not open within the open timeout hands the partition on the same way. A broker that
stops heartbeating is declared dead after the session timeout (longer than the lease plus a
clock margin) and its partitions are opened elsewhere.

Why the election timeout fences the whole source broker, not one partition: bumping the
partition's epoch in object storage fences checkpoint writes only. A stale owner still appends to
its own WAL objects and acknowledges producers while its lease is valid, and those records would
be lost (see the stream-storage note). A broker's lease covers all its partitions, so the only
way to stop it acknowledging one partition against its will is to let the whole lease run out.

Liveness never waits behind the rest: heartbeats are answered by `membership` on the liveness
thread (_rpc_server.py); the event loop here runs bounded steps (a wave starts at most
`max_moves_per_step` moves) and never walks the cluster: the indexes of `leadership` are kept
from the records' deltas.

Controller changes: a controller starts by appending a record of its new epoch, which fails if
another appended first; a deposed controller learns it from its next append or from the role
check (is the next version of the log still free?) within a heartbeat interval, and grants no
lease once its role was not confirmed within the role window. Partitions without a leader are
elected level-based: a restarted controller elects them once the leases its predecessor may have
granted have run out (the restart guard).

This module owns: the controller's lifecycle (start, stop), its loop (`_step`: one bounded round
of decisions per wake-up), the role check, and the admin requests that are one validation and
one commit (topics, configs, SCRAM credentials, ACLs, producer ids, reassignments, rebalance);
its public methods for brokers and data loss delegate to their managers. Must not touch: a
manager's state directly (ask the manager), or the metadata other than through the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import Counter
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_core.acls import AclBinding, AclBindingFilter
from tidalmq_core.balance import Move, Plan
from tidalmq_core.metadata import (
    SUPPORTED_FEATURES,
    TRANSACTION_VERSION,
    TXN_STATE_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    new_cluster_id,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import (
    InvalidPlan,
    NoReassignmentInProgress,
    Phase,
    PlanEntry,
    adding_removing,
    validate_plan,
)
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    broker_state_record,
    cluster_record,
    epoch_record,
    feature_record,
    marker_record,
    producer_ids_record,
)

from tidalmq_controller import _acls as acls
from tidalmq_controller import _features as features
from tidalmq_controller import _scram_credentials as scram_credentials
from tidalmq_controller import gc_policy
from tidalmq_controller._broker_lifecycle import BrokerLifecycle
from tidalmq_controller._data_loss import AcceptedLoss, DataLossManager
from tidalmq_controller._errors import (
    ControllerError,
    ControllerFenced,
    ForeignStore,
    InvalidReplicaAssignment,
    NoBrokers,
    TopicAlreadyExists,
    UnknownBroker,
    UnknownTopic,
    UnsupportedFinalizedLevel,
)
from tidalmq_controller._journal import Deposed, Journal
from tidalmq_controller._leadership import Leadership
from tidalmq_controller._log import Batch, LogConflict, MetadataLog
from tidalmq_controller._membership import (
    BrokerLiveness,
    Floors,
    Heartbeat,
    HeartbeatReply,
    Membership,
)
from tidalmq_controller._moves import MoveStatus, MoveTracker
from tidalmq_controller._open_waits import OpenWaits
from tidalmq_controller._publishing import BrokerChannel, MetadataPublisher
from tidalmq_controller._scoped import scoped_records
from tidalmq_controller._settings import ControllerSettings
from tidalmq_controller._static_topics import StaticTopicManager
from tidalmq_controller._topics import NewTopic, TopicResult, Topics

__all__ = [
    "AcceptedLoss",
    "BrokerChannel",
    "BrokerLiveness",
    "Controller",
    "ControllerError",
    "ControllerFenced",
    "ControllerSettings",
    "ForeignStore",
    "HeartbeatReply",
    "InvalidReplicaAssignment",
    "NewTopic",
    "NoBrokers",
    "TopicAlreadyExists",
    "TopicResult",
    "UnknownBroker",
    "UnknownTopic",
]

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000
# A DeleteTopics' records go in batches of at most this many partitions (delete_topics)
DELETE_PARTITIONS_PER_BATCH = 5000


def deletion_batches(groups: list[tuple[int, list[Record]]], limit: int) -> list[list[Record]]:
    """Topics' deletion records (partition count, records per topic) in batches of at most
    `limit` partitions; a topic's records stay together, a topic over the limit alone."""
    batches: list[list[Record]] = []
    current: list[Record] = []
    size = 0
    for partitions, records in groups:
        if current and size + partitions > limit:
            batches.append(current)
            current, size = [], 0
        current.extend(records)
        size += partitions
    if current:
        batches.append(current)
    return batches


BROKERS_DECLARED_DEAD = Counter(
    "tidalmq_controller_brokers_declared_dead_total",
    "Brokers the controller declared dead (session timed out, or killed) and failed over",
)


class Controller:
    def __init__(
        self,
        log_store: MetadataLog,
        settings: ControllerSettings | None = None,
        *,
        offsets_topic_partitions: int | None = None,
        topic_data_deleter: Callable[[str, str], Awaitable[int]] | None = None,
        object_store: ObjectStore | None = None,
    ) -> None:
        s = settings or ControllerSettings()
        if offsets_topic_partitions is not None:
            s = ControllerSettings(
                **{**_settings_dict(s), "offsets_topic_partitions": offsets_topic_partitions}
            )
        self.settings = s
        self.log_store = log_store
        self.journal = Journal(log_store, snapshot_min_bytes=s.snapshot_min_bytes)
        self.journal.on_deposed = self._deposed
        self._object_store = object_store
        self.topic_data_deleter = topic_data_deleter
        self.membership = Membership(
            lease_s=s.lease_s,
            clock_margin_s=s.clock_margin_s,
            role_window_s=s.role_window_s,
            state_of=self._broker_state,
            version=lambda: self.journal.committed_version,
            epoch=lambda: self.journal.epoch,
        )
        self.leadership = Leadership(self)
        self.topics = Topics(self)
        self.journal.add_applied_hook(self.leadership.on_applied)
        self.journal.add_applied_hook(self.topics.on_applied)
        self.journal.add_applied_hook(self._gc_changed)  # last: after the managers' indexes
        self.journal.add_listener(self._on_commit)
        self.static = StaticTopicManager(self, object_store)
        self.data_loss = DataLossManager(
            object_store,
            s,
            self.journal,
            self.leadership,
            commit=self.commit,
            emit=self._emit,
            wake=self.wake,
            spawn=self.spawn,
            active=lambda: self._active,
        )
        self.publisher = MetadataPublisher(self.journal)
        self.open_waits = OpenWaits(lambda: self.image, self.leadership, self.membership)
        self.brokers = BrokerLifecycle(self)
        self._producer_ids: tuple[int, int] = (0, 0)  # [next, end) of the reserved block
        # topics of DeleteTopics requests whose batches are still being committed
        self._topics_being_deleted: set[str] = set()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._role_task: asyncio.Task[None] | None = None
        self._identity_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = False  # False before start, after stop, and once deposed
        self._replaced = False
        self._events: list[Callable[[str, str, dict[str, Any]], None]] = []
        self._commit_listeners: list[Callable[[ClusterMetadata, MetadataDelta], None]] = []
        self._started_at = 0.0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load the metadata log (or create the cluster) and claim the controller role with a
        new epoch: any older controller's next append fails."""
        self._loop = asyncio.get_running_loop()
        try:
            loaded = await self.log_store.load()
        except Exception as exc:
            log.error("could not load the metadata log: %s", exc)
            raise
        new = loaded.empty
        image = self.journal.load(
            loaded, ClusterMetadata(cluster_id=loaded.cluster_id or new_cluster_id())
        )
        if new:
            log.info("creating new cluster %s", image.cluster_id)
        self.leadership.rebuild()
        gc_policy.changed(sum(len(t.partitions) for t in image.topics.values()))  # all loaded
        refused = features.start_refused(image)
        if refused is not None:  # before the claim: the controller that leads now stays
            raise UnsupportedFinalizedLevel(refused)
        marker = await self.data_loss.first_identity_check(image, new)
        epoch = image.controller_epoch + 1
        try:
            await self.log_store.claim(epoch)
        except LogConflict as exc:
            raise ControllerFenced(f"another controller claimed the log: {exc}") from exc
        self.journal.start(epoch)
        records: list[Record] = [cluster_record(image.cluster_id)] if new else []
        # the claim registers the levels this controller supports (_features.py)
        records.append(epoch_record(epoch, self.settings.controller_id, SUPPORTED_FEATURES))
        if marker and not image.store_marker:
            records.append(marker_record(True))
        # a level set at start wins at every start; unset, the metadata's level stays (1 for a
        # new cluster; UpdateFeatures changes it, _features.py)
        tv = self.settings.transaction_version
        if tv is not None and image.feature_level(TRANSACTION_VERSION) != tv:
            log.info("finalizing feature %s at level %d", TRANSACTION_VERSION, tv)
            records.append(feature_record(TRANSACTION_VERSION, tv))
        try:
            await self.journal.commit(records)
        except Deposed as exc:
            raise ControllerFenced(f"another controller appended first: {exc}") from exc
        if not loaded.stored_snapshot:
            await self.journal.write_snapshot()  # a new cluster, or the earlier single document
        now = time.monotonic()
        self._started_at = now
        self._active = True
        self.membership.active = True
        self.membership.confirm_role(now)
        # Our predecessor granted its last lease before it noticed our epoch, so at most one
        # role window from now (a deposed controller only learns it from the log). Brokers
        # known from before are treated as granted then and get one session from then to
        # heartbeat to us; what they have open is unknown until they tell us (resync).
        inherited = now + self.settings.role_window_s
        self.leadership.restart_guard = (
            inherited + self.settings.lease_s + self.settings.clock_margin_s
        )
        for broker_id, info in self.image.brokers.items():
            if info.state != "dead":
                self.membership.set(
                    broker_id, BrokerLiveness(info.incarnation, inherited, inherited, known=False)
                )
        self.leadership.resume()
        self.membership.on_report = self.wake_threadsafe
        log.info(
            "controller active for cluster %s: controller epoch %d, metadata version %d, "
            "%d moves in flight",
            image.cluster_id,
            epoch,
            self.journal.committed_version,
            len(self.leadership.moves.active()),
        )
        self._loop_task = asyncio.create_task(self._run(), name="controller loop")
        self._role_task = asyncio.create_task(self._role_loop(), name="controller role check")
        if self._object_store is not None:
            self._identity_task = asyncio.create_task(
                self.data_loss.identity_loop(), name="store identity"
            )

    async def stop(self) -> None:
        if self._active and not self.journal.deposed:
            records = self.leadership.reports_due(time.monotonic(), force=True)
            if records:
                with contextlib.suppress(Exception):  # a clean stop keeps the latest floors
                    await asyncio.wait_for(self.journal.commit(records), 5)
        self._active = False  # no lease is granted from now on
        self.membership.active = False
        for task in (self._identity_task, self._role_task):
            if task is not None:
                task.cancel()
        await self.static.stop()
        self.topics.stop()
        self.publisher.stop()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        await self.journal.stop()
        # its objects hold each other (the managers and the controller): only a collection can
        # free them, and none walks what is frozen (gc_policy.py)
        gc_policy.controller_stopped()

    @property
    def image(self) -> ClusterMetadata:
        if self.journal.image is None:
            raise RuntimeError("controller not started")
        return self.journal.image

    @property
    def metadata(self) -> ClusterMetadata:
        """The image: every committed change, and what was decided and is being committed."""
        return self.image

    def snapshot(self) -> ClusterMetadata:
        """A copy of the image (O(cluster): for tools and tests, never on a hot path)."""
        return self.image.copy()

    @property
    def moves(self) -> MoveTracker:
        return self.leadership.moves

    def add_event_sink(self, sink: Callable[[str, str, dict[str, Any]], None]) -> None:
        """Called as (reason, message, fields) for each notable step (Kubernetes Events)."""
        self._events.append(sink)

    def add_commit_listener(
        self, listener: Callable[[ClusterMetadata, MetadataDelta], None]
    ) -> None:
        """Called with the image and what each committed batch changed (the operator)."""
        self._commit_listeners.append(listener)

    def _broker_state(self, broker_id: int) -> str | None:
        image = self.journal.image
        info = image.brokers.get(broker_id) if image is not None else None
        return None if info is None else info.state

    def placeable_brokers(self) -> list[int]:
        return sorted(b for b, info in self.image.brokers.items() if info.state == "alive")

    @property
    def active(self) -> bool:
        """The active controller: started, not stopped, not deposed."""
        return self._active

    def require_active(self) -> None:
        if not self._active:
            raise ControllerFenced("not the active controller (stopped, or replaced by another)")

    async def commit(self, records: list[Record]) -> int:
        """Propose records and wait until they are durable."""
        if not records:
            return self.journal.committed_version
        try:
            return await self.journal.commit(records)
        except Deposed as exc:
            raise ControllerFenced(str(exc)) from exc

    def propose(self, records: list[Record]) -> int:
        if not records:
            return self.journal.committed_version
        try:
            return self.journal.propose(records)
        except Deposed as exc:
            raise ControllerFenced(str(exc)) from exc

    # ---------------------------------------------------------------- brokers: _broker_lifecycle.py
    async def register_broker(self, info: BrokerInfo, channel: BrokerChannel | None) -> int:
        """A broker (re)joins; returns the committed version after its registration."""
        return await self.brokers.register_broker(info, channel)

    async def heartbeat(
        self,
        broker_id: int,
        incarnation: str,
        applied_version: int,
        open_partitions: dict[TopicPartition, int],
        high_watermarks: dict[TopicPartition, int] | None = None,
        floors: Floors | None = None,
    ) -> HeartbeatReply:
        """A heartbeat with everything the broker has open (in-process callers and tests)."""
        return await self.brokers.heartbeat(
            broker_id, incarnation, applied_version, open_partitions, high_watermarks, floors
        )

    def beat(self, heartbeat: Heartbeat) -> HeartbeatReply:
        """Answer a heartbeat (from any thread)."""
        return self.brokers.beat(heartbeat)

    def partitions_reported(self, broker_id: int, reports: list[dict[str, Any]]) -> None:
        """Brokers' reports of partitions closed, opened and lost, many at a time, in order."""
        self.brokers.partitions_reported(broker_id, reports)

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
        self.brokers.partition_closed(
            broker_id, tp, epoch, topic_id=topic_id, high_watermark=high_watermark
        )

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
        self.brokers.partition_opened(
            broker_id, tp, epoch, topic_id=topic_id, high_watermark=high_watermark, stored=stored
        )

    async def drain_broker(
        self, broker_id: int, *, timeout_s: float = 60.0, incarnation: str | None = None
    ) -> bool:
        """Move every partition off a broker and wait until it leads none."""
        return await self.brokers.drain_broker(
            broker_id, timeout_s=timeout_s, incarnation=incarnation
        )

    async def remove_broker(self, broker_id: int, *, incarnation: str | None = None) -> None:
        """Forget a broker that has stopped (after a drain)."""
        await self.brokers.remove_broker(broker_id, incarnation=incarnation)

    def expect_brokers(self, broker_ids: Iterable[int], within_s: float) -> None:
        """Known brokers starting again right now: not declared dead before `within_s`."""
        self.brokers.expect_brokers(broker_ids, within_s)

    def hold_failover(self) -> None:
        """The hosting process is stopping every broker at once: none is declared dead."""
        self.brokers.hold_failover()

    def has_heartbeated(self, broker_id: int) -> bool:
        return self.brokers.has_heartbeated(broker_id)

    def fence_broker(self, broker_id: int, reason: str) -> None:
        """Stop renewing a broker's lease (it gives up its partitions and re-registers)."""
        self.brokers.fence_broker(broker_id, reason)

    # ---------------------------------------------------------------- data loss ([O2]): _data_loss.py
    @property
    def store_problem(self) -> str | None:
        """Why the object store must not be used (its identity marker is missing, or names
        another cluster), or None."""
        return self.data_loss.store_problem

    def lost_partitions(self, topic: str | None = None) -> dict[TopicPartition, DataLoss]:
        """Partitions whose data a broker found missing, not accepted yet."""
        return self.data_loss.lost_partitions(topic)

    async def partition_lost_data(
        self, broker_id: int, tp: TopicPartition, epoch: int, loss: DataLoss
    ) -> None:
        """A broker found the partition's data missing (recorded until the loss is accepted)."""
        await self.data_loss.partition_lost_data(broker_id, tp, epoch, loss)

    async def accept_data_loss(self, topic: str, partitions: list[int] | None = None) -> list[int]:
        """Each lost partition of the topic (those of `partitions`; all when None) continues at
        its end-offset floor; returns the partitions recovered."""
        return await self.data_loss.accept_data_loss(topic, partitions)

    async def accept_data_loss_detailed(
        self, topic: str, partitions: list[int] | None = None
    ) -> list[AcceptedLoss]:
        return await self.data_loss.accept_data_loss_detailed(topic, partitions)

    async def check_identity(self) -> str | None:
        """Read the store's identity marker and compare it with the metadata; returns (and
        records) the problem, None when the store is ours."""
        return await self.data_loss.check_identity()

    # ---------------------------------------------------------------- topics
    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False, wait_s: float = 0.0
    ) -> list[TopicResult]:
        """Create topics. With wait_s > 0, return once every new partition is open on its
        broker (or after wait_s): a client that produces right after creating gets no
        LEADER_NOT_AVAILABLE."""
        self.require_active()
        results, records = self.topics.create(list(topics))
        if validate_only or not records:
            return results
        await self.commit(records)
        created = [r.name for r in results if r.error is None]
        await self.open_waits.wait(created, wait_s)
        return results

    async def delete_topics(self, names: Iterable[str]) -> list[TopicResult]:
        """Delete topics, in batches of at most DELETE_PARTITIONS_PER_BATCH partitions (one
        topic each at least) committed one after the other: applying a deletion frees its
        partitions' objects by reference counting in one go, the GIL held, and one batch for
        50,000 partitions held the event loop and the liveness thread 0.3-1.1 s."""
        self.require_active()
        results, groups, doomed = self.topics.delete(list(names), self._topics_being_deleted)
        if groups:
            self._topics_being_deleted.update(doomed)
            try:
                for batch in deletion_batches(groups, DELETE_PARTITIONS_PER_BATCH):
                    await self.commit(batch)
            finally:
                self._topics_being_deleted.difference_update(doomed)
            for name in doomed:
                self.static.forget(name)
                for status in self.leadership.moves.active():
                    if status.topic == name:
                        self.leadership.moves.mark(status.tp, Phase.FAILED, "topic deleted")
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
        self.require_active()
        result, records = self.topics.grow(name, total, assignment)
        if not validate_only and records:
            await self.commit(records)
        return result

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult:
        """Set (value) or delete (None) config overrides. Non-incremental replaces all."""
        self.require_active()
        result, records = self.topics.alter_configs(name, changes, incremental=incremental)
        if not validate_only and records:
            await self.commit(records)
        return result

    async def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> Exception | None:
        """Set (value) or delete (None) dynamic broker configs of one broker (its id as a
        string) or of the cluster default (""). Non-incremental replaces the scope's configs."""
        self.require_active()
        try:
            records = self.topics.alter_broker_configs(scope, changes, incremental=incremental)
        except ValueError as exc:
            return exc
        if not validate_only:
            await self.commit(records)
        return None

    # ---------------------------------------------------------------- SCRAM credentials
    async def alter_scram_credentials(
        self,
        deletions: list[scram_credentials.ScramDeletion],
        upsertions: list[scram_credentials.ScramUpsertion],
    ) -> tuple[list[scram_credentials.ScramAlterResult], int]:
        """AlterUserScramCredentials (scram_credentials.py): the results and the version that
        holds the changes once committed."""
        self.require_active()
        results, records = scram_credentials.alter(self.image, deletions, upsertions)
        return results, await self.commit(records)

    async def bootstrap_scram_credentials(
        self, users: list[scram_credentials.BootstrapUser]
    ) -> list[str]:
        """Create the bootstrap users that lack their credential; returns `user:MECHANISM` of
        those created."""
        self.require_active()
        records = scram_credentials.bootstrap(self.image, users)
        await self.commit(records)
        return [f"{r['user']}:{r['mech']}" for r in records]

    # ---------------------------------------------------------------- ACLs
    async def create_acls(
        self, bindings: list[AclBinding]
    ) -> tuple[list[acls.AclCreateResult], int]:
        """CreateAcls (_acls.py): one result per binding and the version that holds the new
        ones once committed. Raises ControllerError for a request over Kafka's record limit."""
        self.require_active()
        try:
            results, records = acls.create(self.image, bindings)
        except acls.TooManyAcls as exc:
            raise ControllerError(str(exc)) from exc
        return results, await self.commit(records)

    async def delete_acls(
        self, filters: list[AclBindingFilter]
    ) -> tuple[list[acls.AclDeleteResult], int]:
        """DeleteAcls (_acls.py): one result per filter (the bindings it matched) and the
        version without them once committed."""
        self.require_active()
        try:
            results, records = acls.delete(self.image, filters)
        except acls.TooManyAcls as exc:
            raise ControllerError(str(exc)) from exc
        return results, await self.commit(records)

    # ---------------------------------------------------------------- features
    async def update_features(
        self, updates: list[features.FeatureUpdate], *, validate_only: bool = False
    ) -> tuple[str | None, int]:
        """UpdateFeatures (_features.py): (why the request is refused, or None; the version
        that holds the new levels once committed). All or nothing, as Kafka's."""
        self.require_active()
        refused, records = features.update(self.image, updates)
        if refused is not None or validate_only:
            return refused, self.journal.committed_version
        for r in records:
            log.info("finalizing feature %s at level %d (UpdateFeatures)", r["name"], r["level"])
        return None, await self.commit(records)

    async def register_controller(
        self, controller_id: str, supported_features: dict[str, tuple[int, int]]
    ) -> tuple[int, bool]:
        """A standby controller registers the feature levels it supports (_features.py,
        `register_controller`); UpdateFeatures counts them from then on. Returns the version
        that holds the registration and whether it was written (nothing is written when it is
        registered with these ranges already: a standby asks again each interval at O(1))."""
        self.require_active()
        refused, records = features.register_controller(
            self.image, self.settings.controller_id, controller_id, supported_features
        )
        if refused is not None:
            raise ControllerError(refused)
        if records:
            log.info(
                "controller %s registered, supporting %s", controller_id, records[0]["sf"] or "none"
            )
        return await self.commit(records), bool(records)

    async def forget_controller(self, controller_id: str) -> int:
        """Forget a controller id gone for good (_features.py, `forget_controller`)."""
        self.require_active()
        refused, records = features.forget_controller(
            self.image, self.settings.controller_id, controller_id
        )
        if refused is not None:
            raise ControllerError(refused)
        log.info("controller %s forgotten: its feature levels no longer count", controller_id)
        return await self.commit(records)

    def registered_controllers(self) -> dict[str, dict[str, tuple[int, int]]]:
        """The controllers whose supported levels UpdateFeatures counts, by id."""
        return {cid: dict(r) for cid, r in sorted(self.image.controllers.items())}

    # ---------------------------------------------------------------- producer ids
    async def ensure_transaction_state_topic(self, wait_s: float = 0.0) -> None:
        """Create `__transaction_state` if it does not exist (Kafka creates it on the first
        FindCoordinator or InitProducerId naming a transactional id). Clients cannot create,
        delete or alter it: it is internal."""
        self.require_active()
        if TXN_STATE_TOPIC in self.image.topics:
            return
        _, created = self.topics.create(
            [NewTopic(TXN_STATE_TOPIC, self.settings.transaction_state_partitions, internal=True)]
        )
        if created:
            await self.commit(created)
            await self.open_waits.wait([TXN_STATE_TOPIC], wait_s)

    async def allocate_producer_id(self) -> int:
        """A cluster-unique producer id. Blocks of ids are reserved in the metadata so no id
        is handed out twice across controller restarts."""
        self.require_active()
        nxt, end = self._producer_ids
        if nxt >= end:
            start = self.image.next_producer_id
            self._producer_ids = (start, start + PRODUCER_ID_BLOCK)  # claimed before the await
            await self.commit([producer_ids_record(start + PRODUCER_ID_BLOCK)])
            nxt, end = self._producer_ids
        self._producer_ids = (nxt + 1, end)
        return nxt

    # ---------------------------------------------------------------- reassignment
    async def alter_reassignments(
        self, entries: list[PlanEntry]
    ) -> dict[TopicPartition, Exception | None]:
        """Start (target set) or cancel (target None) moves. Per-partition errors, as Kafka's
        AlterPartitionReassignments reports them; a plan naming an unknown topic, partition or
        broker changes nothing for that entry."""
        self.require_active()
        results: dict[TopicPartition, Exception | None] = {}
        meta = self.image
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
                        raise InvalidPlan(f"{entry.tp}: broker {entry.target} is {broker.state}")
                part = meta.topics[entry.tp.topic].partitions[entry.tp.partition]
                if entry.target is None and not part.moving:
                    raise NoReassignmentInProgress(f"{entry.tp} is not being reassigned")
                results[entry.tp] = None
                valid.append(entry)
            except (InvalidPlan, NoReassignmentInProgress) as exc:
                results[entry.tp] = exc
        if valid:
            now_ms = int(time.time() * 1000)
            await self.commit(self.leadership.queue(valid, reason="requested", now_ms=now_ms))
            self._wake.set()
        return results

    def list_reassignments(
        self, tps: Iterable[TopicPartition] | None = None
    ) -> list[tuple[TopicPartition, list[int], list[int], list[int]]]:
        wanted = set(tps) if tps is not None else None
        out = []
        for tp in sorted(
            self.leadership.moving if wanted is None else wanted & self.leadership.moving
        ):
            part = self.leadership.partition(tp)
            if part is not None and part.moving:
                out.append((tp, *adding_removing(part)))
        return out

    async def rebalance(
        self, *, reason: str = "rebalance", dry_run: bool = False, topics: list[str] | None = None
    ) -> Plan[TopicPartition]:
        """Minimal-move count balance over the live (not draining) brokers."""
        self.require_active()
        if not self.placeable_brokers():
            raise NoBrokers("no live broker to balance onto")
        plan = await self.leadership.rebalance_plan(topics)
        if dry_run or not plan.moves:
            return plan
        await self._queue_in_slices(plan, reason)
        log.info("%s: moving %d partitions", reason, len(plan.moves))
        self._emit(
            "Rebalancing",
            f"{reason}: moving {len(plan.moves)} partitions",
            {"moves": len(plan.moves)},
        )
        self._wake.set()
        return plan

    async def _queue_in_slices(self, plan: Plan[TopicPartition], reason: str) -> None:
        """Queue a plan's moves `max_moves_per_step` at a time, yielding to the event loop
        between slices (a join's fair share at 50,000 partitions is 10,000 moves: queued at
        once, that was one slice of the loop of 100-300 ms). Each slice queues only the moves
        still to make (the partition moved or failed over since the plan was computed: left
        out). Returns once every slice is durable; the moves queued first may start
        meanwhile."""
        moves = plan.moves
        step = max(1, self.settings.max_moves_per_step)
        version = self.journal.committed_version
        queued: list[Move[TopicPartition]] = []
        for start in range(0, len(moves), step):
            if start:
                await asyncio.sleep(0)
                self.require_active()
            chunk = self.leadership.still_planned(moves[start : start + step])
            entries = [PlanEntry(m.partition, m.target) for m in chunk]
            records = self.leadership.queue(entries, reason=reason, now_ms=int(time.time() * 1000))
            version = max(version, self.propose(records))
            queued += chunk
            self._wake.set()
        plan.moves = queued
        try:
            await self.journal.committed(version)
        except Deposed as exc:
            raise ControllerFenced(str(exc)) from exc

    def leaders_per_broker(self) -> dict[int, int]:
        """Partitions each broker leads (NO_LEADER: none), without a walk of the cluster."""
        return self.leadership.leaders_per_broker()

    def move_counts(self) -> tuple[int, int]:
        """(reassignments in flight: the partitions ListPartitionReassignments lists, failed
        over partitions whose new broker has not reported them open yet), without a walk of
        the cluster."""
        moving = self.leadership.moving
        opening = sum(1 for m in self.leadership.moves.active() if m.tp not in moving)
        return len(moving), opening

    def move_statuses(self) -> tuple[list[MoveStatus], list[MoveStatus]]:
        return self.leadership.moves.active(), self.leadership.moves.recent()

    def broker_liveness(self) -> dict[int, BrokerLiveness]:
        return self.membership.snapshot()

    # ---------------------------------------------------------------- the loop
    def wake(self) -> None:
        self._wake.set()

    def wake_threadsafe(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            if asyncio.get_running_loop() is loop:
                self._wake.set()
                return
        except RuntimeError:
            pass
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._wake.set)

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
            try:
                await self._step()
                # one step per slice of the event loop: a set wake (more to do at once) makes
                # Event.wait return without yielding, and steps would run back to back
                await asyncio.sleep(0)
            except ControllerFenced:
                if not self._active:
                    log.error("controller fenced by a newer controller; stopping")
                    return
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("controller step failed")
                await asyncio.sleep(0.5)

    async def _step(self) -> None:
        """One bounded round of decisions; everything decided goes into one batch."""
        now = time.monotonic()
        wall = time.time()
        lead = self.leadership
        records: list[Record] = []
        # 0. what the heartbeats reported since the last step
        opened: dict[int, set[TopicPartition]] = {}
        for broker_id, reports in self.membership.drain_inboxes().items():
            now_open, _, floors = self.membership.apply_reports(broker_id, reports)
            if now_open:
                opened[broker_id] = now_open
            for tp, (topic_id, hwm) in floors.items():
                lead.report_floor(tp, topic_id, hwm)
            live = self.membership.get(broker_id)
            if live is not None:
                self.publisher.holds(broker_id, live.applied_version)
        if opened:
            lead.observe(opened, wall)
        # 1. failover: brokers silent past the session timeout (none while every broker is
        # being stopped: hold_failover)
        dead = [
            b
            for b in self.membership.silent(now, self.settings.session_timeout_s)
            if self._broker_state(b) not in (None, "dead") and not self.brokers.failover_held
        ]
        if dead:
            for b in dead:
                log.warning("broker %d is dead (session timed out); moving its partitions", b)
                BROKERS_DECLARED_DEAD.inc()
                self._emit("BrokerDead", f"broker {b}: session timed out", {"broker": b})
                records.append(broker_state_record(b, "dead"))
                self.membership.forget(b)
            self.propose(records)
            records = lead.failover(dead, defer_until=0.0, now=now, reason="session timed out")
        # 2. elections of moves whose source closed (or is fenced, or gone)
        elect, fence = lead.releases(now, wall)
        for broker_id in fence:
            if self.membership.fence(broker_id, now):
                log.warning(
                    "broker %d did not close a moving partition within %.1fs: fencing it",
                    broker_id,
                    self.settings.election_timeout_s,
                )
                self._emit(
                    "BrokerFenced",
                    f"broker {broker_id} did not close in time",
                    {"broker": broker_id},
                )
        # 3. partitions without a leader, once no earlier owner can hold a lease on them. At
        # most max_moves_per_step elections a step: the rest stay closing (or leaderless and
        # due) and the next step, at once, takes them
        due = lead.due_elections(now)
        budget = max(1, self.settings.max_moves_per_step)
        if len(elect) + len(due) > budget:
            elect = elect[:budget]
            due = due[: budget - len(elect)]
            self._wake.set()
        if elect or due:
            records += lead.elections(elect, due, wall)
        # 4. elected brokers that did not open their partition in time
        stuck = lead.stuck_openings(wall)
        if stuck:
            records += lead.hand_on(stuck, int(wall * 1000))
        # 5. the next wave of queued moves
        records += lead.start_wave(int(wall * 1000))
        # 6. first openings (from now on their data must exist) and acknowledged ends
        records += lead.reports_due(now, force=bool(records), limit=budget)
        if lead.reports_pending():
            self._wake.set()
        if records:
            self.propose(records)
        lead.check_openings()
        if self.data_loss.store_problem is not None:
            return  # a wiped or foreign store: nothing below may write into it
        # 7. static topics: remaps, repairs, cleanup (each runs as its own task)
        self.static.tick()
        # 8. data of deleted topics, once no broker has their partitions open
        self.topics.clean()

    # ---------------------------------------------------------------- the role
    async def _role_loop(self) -> None:
        """Every heartbeat interval, confirm in the log that we are still the controller (a
        deposed controller learns it only from the log, and must stop granting leases even
        when it has nothing to write)."""
        while self._active:
            await asyncio.sleep(self.settings.heartbeat_interval_s)
            await self.check_role()

    async def check_role(self) -> None:
        started = time.monotonic()
        if self.journal.last_commit_at > started - self.settings.heartbeat_interval_s:
            self.membership.confirm_role(self.journal.last_commit_at)
            return
        version = self.journal.next_version
        if self.journal.writes(version):
            return  # a batch of ours is on its way to that version: its append checks the log
        try:
            mine = await self.log_store.confirm(self.journal.epoch, version)
        except Exception as exc:
            log.warning("could not confirm the controller role in the metadata log: %s", exc)
            return
        if mine:
            self.membership.confirm_role(started)
        elif not self.journal.writes(version):  # not our own append landing meanwhile
            self.journal.depose(
                f"version {version} of the metadata log was appended by another controller"
            )

    def _deposed(self, why: str) -> None:
        if self._active:
            log.error("another controller took over (%s): granting no more leases", why)
            self._emit("ControllerDeposed", f"another controller took over: {why}", {})
        self._active = False
        self.membership.active = False
        self._replaced = True
        self._wake.set()

    # ---------------------------------------------------------------- publishing
    def _gc_changed(self, delta: MetadataDelta) -> None:
        """The partitions a proposal changed, for the garbage collection policy (gc_policy.py):
        each changed partition, and every partition of a created, grown or changed topic."""
        if gc_policy.installed() is None:
            return
        topics = self.image.topics
        changed = len(delta.partitions)
        for name in delta.topics:
            topic = topics.get(name)
            if topic is not None:
                changed += len(topic.partitions)
        gc_policy.changed(changed)

    def _on_commit(self, batch: Batch, delta: MetadataDelta) -> None:
        self.membership.confirm_role(self.journal.last_commit_at)
        self.publisher.publish()
        if delta.partitions or delta.topics or delta.removed_topics:
            self.data_loss.count_lost()
        for listener in self._commit_listeners:
            try:
                listener(self.image, delta)
            except Exception:
                log.exception("metadata commit listener failed")

    def update_for(self, version: int) -> tuple[int, bytes | None, list[Batch]]:
        """What a broker at `version` needs: (base, snapshot or None, batches)."""
        return self.publisher.update_for(version)

    # ---------------------------------------------------------------- for static topics
    async def update(self, mutate: Callable[[ClusterMetadata], object]) -> int:
        """Commit a change written as a function of the image (it may touch topics and static
        topics only; nothing is committed if it raises); returns the committed version."""
        records = scoped_records(self.image, mutate)
        return await self.commit(records)

    def known_high_watermarks(self) -> dict[TopicPartition, int]:
        """Physical queues' high watermarks as the brokers last reported them."""
        out: dict[TopicPartition, int] = {}
        for _, live in self.membership.items():
            out.update(live.high_watermarks)
        return out

    def deferred(self, tp: TopicPartition) -> bool:
        """The controller itself elects this partition later (an earlier owner's lease)."""
        return self.leadership.deferred(tp)

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        self._emit(reason, message, fields)

    def _emit(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        for sink in self._events:
            try:
                sink(reason, message, fields)
            except Exception:
                log.exception("event sink failed")

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


def _settings_dict(s: ControllerSettings) -> dict[str, Any]:
    return {f: getattr(s, f) for f in ControllerSettings.__dataclass_fields__}


def leader_of(meta: ClusterMetadata, topic: str, partition: int) -> int:
    info = meta.topics.get(topic)
    if info is None or partition >= len(info.partitions):
        return -1
    return info.partitions[partition].leader
