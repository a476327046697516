"""The operator's running state: the controller (while this replica is the active peer), and the
status of every resource, derived from the controller's metadata and move tracker.

Status is level-based: each publish recomputes what each resource's status should be from the
latest snapshot and patches only what changed, so a missed update is repaired by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge
from tidalmq_controller import (
    Controller,
    ControllerFenced,
    ControllerServer,
    ControllerSettings,
    MetadataLost,
    MoveStatus,
    ObjectStoreMetadataLog,
    UnsupportedFinalizedLevel,
    parse_bootstrap,
)
from tidalmq_controller.hosting import delete_topic_data, open_object_store
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry
from tidalmq_core.records import MetadataDelta

from tidalmq_operator.availability import (
    DATA_LOST,
    SEVERITY,
    STORE_LOST,
    Problem,
    brokers_not_alive,
    naming,
    partition_problem,
    row_fields,
    verdict,
)
from tidalmq_operator.kube import Kube, NotFound
from tidalmq_operator.progress import (
    now_iso,
    reassignment_row,
    steps_to_emit,
    summary,
)
from tidalmq_operator.settings import OperatorSettings
from tidalmq_operator.store import ClusterStateLog

log = logging.getLogger(__name__)

FULL_PUBLISH_S = 30.0
METADATA_LOST = Gauge(
    "tidalmq_operator_metadata_lost",
    "1 while the metadata log the ClusterState points to is missing from its store (the "
    "controller does not start)",
)
# A Topic's status lists every partition up to this many; a larger topic lists the partitions
# that are not served or are moving (up to this many) and counts the rest per broker, so the
# resource stays far below etcd's limits whatever the partition count.
MAX_STATUS_ROWS = 1000

LOST_PARTITIONS = Gauge(
    "tidalmq_operator_lost_partitions",
    "Partitions (logic queues of static topics) whose acknowledged data a broker found missing "
    "from the object store, by Topic or StaticTopic resource, until the loss is accepted",
    ["kind", "resource", "topic"],
)
# One series per resource and reason, 1 for the reason of the resource's Degraded condition and
# 0 for the others (kube-state-metrics' style for conditions, e.g. kube_pod_status_phase): a
# resource that is not Degraded shows 0 rather than nothing, and the reasons are a fixed set
# (availability.SEVERITY), so a resource has four series.
DEGRADED = Gauge(
    "tidalmq_operator_degraded",
    "1 while a Topic or StaticTopic resource has the condition Degraded with this reason, else "
    "0 (one series per resource and reason: StoreLost, DataLost, BrokerNotAlive, Leaderless)",
    ["kind", "resource", "reason"],
)
ACCEPT_ANNOTATION = "tidalmq.io/accept-data-loss"


# the CRDs allow a condition's message 32 KiB; a longer one fails the whole status update
MAX_CONDITION_MESSAGE = 4096


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int | None
) -> dict[str, Any]:
    if len(message) > MAX_CONDITION_MESSAGE:
        suffix = " ... (truncated)"
        message = message[: MAX_CONDITION_MESSAGE - len(suffix)] + suffix
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_iso(),
        "observedGeneration": generation,
    }


def merge_conditions(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep lastTransitionTime when a condition's status did not change."""
    previous = {c.get("type"): c for c in old or []}
    out = []
    for c in new:
        before = previous.get(c["type"])
        if before is not None and before.get("status") == c["status"]:
            c = {
                **c,
                "lastTransitionTime": before.get("lastTransitionTime", c["lastTransitionTime"]),
            }
        out.append(c)
    return out


@dataclass(slots=True)
class TopicWish:
    resource: str  # the Topic resource's name
    kafka_name: str
    partitions: int
    generation: int | None
    error: tuple[str, str] | None = None  # (reason, message) of a spec the controller refused
    uid: str | None = None
    # (reason, message) of a tidalmq.io/accept-data-loss annotation that could not be applied
    annotation_error: tuple[str, str] | None = None


@dataclass(slots=True)
class Availability:
    """What the publisher knows at one moment about which brokers serve and about the store."""

    meta: ClusterMetadata
    not_alive: dict[int, str]  # broker id -> why it does not serve
    store_problem: str | None
    now: float  # monotonic


@dataclass(slots=True)
class LossWatch:
    """What a resource's Events have announced: its lost partitions (or logic queues) and the
    store's problem. Restored from the resource's status after an operator restart, so a loss
    is announced once per detection, not once per operator."""

    lost: dict[int, Problem]
    store_problem: str | None


@dataclass(slots=True)
class ReassignmentRun:
    resource: str
    entries: list[PlanEntry]
    submitted: float
    generation: int | None
    uid: str | None = None
    # each partition's status row as last published (or as an earlier operator left it)
    rows: dict[TopicPartition, dict[str, Any]] = field(default_factory=dict)
    # each partition's last step announced by an Event
    emitted: dict[TopicPartition, str] = field(default_factory=dict)
    finished: bool = False
    conditions: list[dict[str, Any]] = field(default_factory=list)  # kept in status (Planned)
    cancel_requested: bool = False  # spec.cancel: moves no longer in flight count as rolled back
    # partitions this operator saw elected on their target (by an earlier controller: not
    # tracked by this one) and not open yet: their unavailability is measured when they open
    unopened: set[TopicPartition] = field(default_factory=set)


class OperatorRuntime:
    def __init__(self, settings: OperatorSettings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self.controller: Controller | None = None
        self.server: ControllerServer | None = None
        self.topics: dict[str, TopicWish] = {}  # by resource name
        self.reassignments: dict[str, ReassignmentRun] = {}  # by resource name
        # planner runs of generated PartitionReassignments (handlers.py), by resource name
        self.planners: dict[str, asyncio.Task[None]] = {}
        self._resource_locks: dict[str, asyncio.Lock] = {}
        self._last_status: dict[tuple[str, str], Any] = {}
        self._patch_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._publish_lock = asyncio.Lock()
        self.active = asyncio.Event()
        # monotonic time since which a partition (topic, index) has had no leader
        self._leaderless_since: dict[tuple[str, int], float] = {}
        self._loss_watch: dict[tuple[str, str], LossWatch] = {}  # by (plural, resource)
        self.leaderless_grace_s = settings.leaderless_grace_s
        self.metadata_log: ClusterStateLog | None = None
        self._state_columns: tuple[int, int, int] | None = None
        # publishing costs O(what changed): topics named by committed batches since the last
        # publish, topics still settling (leaderless or moving partitions: their grace and
        # progress count), resources whose spec changed; everything when broker liveness or the
        # store changed, and every FULL_PUBLISH_S whatever happened (level-based repair)
        self._dirty: set[str] = set()
        self._settling: set[str] = set()
        self._stamps: dict[str, tuple[Any, ...]] = {}
        self._availability_key: tuple[Any, ...] | None = None
        self._full_at = float("-inf")

    # ------------------------------------------------------------------ controller role
    async def run_controller(self, stopped: Any) -> None:
        """Run the controller until `stopped` (Kopf stops daemons when this replica is paused
        by peering). Starting bumps the controller epoch in the ClusterState, so a previous
        controller elsewhere is fenced on its next write."""
        s = self.settings
        store = open_object_store(s.storage_url) if s.storage_url else None
        if not (s.metadata_url or s.storage_url):
            raise RuntimeError(
                "the controller keeps its metadata log in object storage: set "
                "TIDALMQ_STORAGE_URL (or TIDALMQ_METADATA_URL)"
            )
        metadata = open_object_store(s.metadata_url) if s.metadata_url else store
        assert metadata is not None
        self.metadata_log = ClusterStateLog(
            self.kube, s.cluster_state_name, ObjectStoreMetadataLog(metadata)
        )
        controller = Controller(
            self.metadata_log,
            ControllerSettings(
                heartbeat_interval_s=s.heartbeat_interval_s,
                lease_s=s.lease_s,
                session_timeout_s=s.session_timeout_s,
                election_timeout_s=s.election_timeout_s,
                offsets_topic_partitions=s.offsets_topic_partitions,
                transaction_state_partitions=s.transaction_state_partitions,
                transaction_version=s.transaction_version,
                controller_id=s.controller_id,
                max_moves_per_broker=s.max_moves_per_broker,
            ),
            topic_data_deleter=functools.partial(delete_topic_data, store) if store else None,
            object_store=store,
        )
        while True:
            try:
                await controller.start()
                break
            except MetadataLost as exc:
                # a wiped or replaced store: never start an empty cluster on it; say so, and
                # look again (the right store may come back) until this replica is stopped
                await self._metadata_lost(str(exc))
            except ControllerFenced:
                raise  # another replica holds the role: Kopf runs the daemon again later
            except UnsupportedFinalizedLevel as exc:
                # a newer build finalized a level this one lacks: it claims nothing (the log
                # stays as it is) and says so, in one line, until this replica is stopped
                await self._metadata_lost(str(exc), reason="UnsupportedFeatureLevel")
            except Exception as exc:
                # the store unreachable, its bucket missing, ...: the same, with its reason
                await self._metadata_lost(
                    f"the metadata log could not be read: {type(exc).__name__}: {exc}",
                    reason="MetadataUnavailable",
                )
            # each of the three (not MetadataLost alone: it once looked again at once, a
            # condition write and an Event every few milliseconds for as long as it lasted)
            if await self._stopped_within(stopped, s.metadata_retry_s):
                return
        METADATA_LOST.set(0)
        if s.scram_bootstrap or s.scram_bootstrap_file:  # the first users (admin), if absent
            try:
                users = parse_bootstrap(s.scram_bootstrap, s.scram_bootstrap_file)
            except ValueError as exc:  # said loudly, but the cluster keeps its controller
                log.error("SCRAM bootstrap users not created: %s", exc)
                users = []
            created = await controller.bootstrap_scram_credentials(users)
            if created:
                log.info("SCRAM credentials bootstrapped: %s", ", ".join(created))
        await self.metadata_log.condition("Ready", True, "Active", "controller active")
        controller.add_event_sink(self._on_controller_event)
        controller.add_commit_listener(self._on_commit)
        self._full_at = float("-inf")
        # both checked at start (main.py)
        server = ControllerServer(controller, s.control_auth(), s.control_tls())
        await server.start(s.controller_host, s.controller_port)
        self.controller, self.server = controller, server
        self.active.set()
        await self._label_self(True)
        log.info("controller active; brokers reach it on port %d", server.port)
        try:
            while not stopped:
                try:
                    await self.publish()
                except Exception:  # the API server, most likely: the next publish repairs it
                    log.exception("status publish failed")
                await asyncio.sleep(s.status_interval_s)
            await self._last_publish(controller)
        finally:
            self.active.clear()
            await self._label_self(False)
            self.controller = None
            await server.stop()
            await controller.stop()
            log.info("controller stopped on this replica")

    @staticmethod
    async def _stopped_within(stopped: Any, seconds: float) -> bool:
        """Whether Kopf's `stopped` flag is set within `seconds` (looked at every 0.5 s)."""
        deadline = time.monotonic() + seconds
        while not stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.5, left))
        return True

    async def _metadata_lost(self, why: str, reason: str = "MetadataLost") -> None:
        log.error(
            "%s: %s; the controller does not start (looking again in %gs)",
            reason,
            why,
            self.settings.metadata_retry_s,
        )
        METADATA_LOST.set(1 if reason == "MetadataLost" else 0)
        assert self.metadata_log is not None
        await self.metadata_log.condition("Ready", False, reason, why)
        involved = {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "ClusterState",
            "metadata": {"name": self.settings.cluster_state_name},
        }
        try:
            await self.kube.event(involved, reason, why, warning=True, at=time.time())
        except Exception as exc:
            log.debug("MetadataLost Event not posted: %s", exc)

    async def _last_publish(self, controller: Controller, wait_s: float = 5.0) -> None:
        """Before a graceful stop: let the moves past their election open (a next controller
        would not track them: only moves still recorded as moving in the metadata are resumed,
        so their figures would be lost), then publish once more, so that every move finished
        here keeps its unavailableMs in status."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not [m for m in controller.moves.active() if m.phase is Phase.OPENING]:
                break
            await asyncio.sleep(0.05)
        try:
            await self.publish()
        except Exception:
            log.exception("last status publish failed")

    async def _label_self(self, active: bool) -> None:
        """The controller Service selects the pod labelled tidalmq.io/controller=active."""
        if not self.settings.pod_name:
            return
        try:
            await self.kube.label_pod(
                self.settings.pod_name, "tidalmq.io/controller", "active" if active else None
            )
        except Exception as exc:
            log.warning("could not label pod %s: %s", self.settings.pod_name, exc)

    def resource_lock(self, name: str) -> asyncio.Lock:
        """Serializes the decisions about one PartitionReassignment (handlers and its planner
        task), so a plan is never submitted twice."""
        return self._resource_locks.setdefault(name, asyncio.Lock())

    def require_controller(self) -> Controller:
        if self.controller is None:
            raise ControllerInactive("the controller is not active on this replica yet")
        return self.controller

    # ------------------------------------------------------------------ publishing
    def _on_controller_event(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        warning = reason in ("BrokerDead", "BrokerFenced") or bool(fields.get("warning"))
        involved = {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "ClusterState",
            "metadata": {"name": self.settings.cluster_state_name},
        }
        task = asyncio.create_task(
            self.kube.event(involved, reason, message, warning=warning, at=time.time())
        )
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _on_commit(self, meta: ClusterMetadata, delta: MetadataDelta) -> None:
        """What a committed batch changed: those topics' status is published next."""
        self._dirty.update(delta.topics)
        self._dirty.update(delta.removed_topics)
        self._dirty.update({tp.topic for tp in delta.partitions})

    async def publish(self) -> None:
        controller = self.controller
        if controller is None:
            return
        async with self._publish_lock:
            meta = controller.metadata
            columns = (meta.version, len(meta.live_brokers()), len(meta.topics))
            if self.metadata_log is not None and columns != self._state_columns:
                self._state_columns = columns
                await self.metadata_log.status(meta)
            av = self.availability()
            now = time.monotonic()
            key = (
                tuple(sorted(av.not_alive.items())) if av else (),
                av.store_problem if av else None,
            )
            full = key != self._availability_key or now - self._full_at >= FULL_PUBLISH_S
            if full:
                self._availability_key, self._full_at = key, now
            dirty, self._dirty = self._dirty, set()
            for wish in list(self.topics.values()):
                stamp = (
                    wish.kafka_name,
                    wish.partitions,
                    wish.generation,
                    wish.error,
                    wish.annotation_error,
                )
                name = wish.kafka_name
                if not (
                    full
                    or name in dirty
                    or name in self._settling
                    or self._stamps.get(wish.resource) != stamp
                ):
                    continue
                self._stamps[wish.resource] = stamp
                status = self._topic_status(meta, wish, av)
                if any(
                    c["type"] == "Reconciling" and c["status"] == "True"
                    for c in status.get("conditions", [])
                ):
                    self._settling.add(name)
                else:
                    self._settling.discard(name)
                await self.watch_losses("topics", wish.resource, "partition")
                await self._patch("topics", wish.resource, status)
                await self.announce_losses(
                    "topics", wish.resource, wish.uid, wish.kafka_name, status, "partition"
                )
            active, recent = controller.move_statuses()
            for run in list(self.reassignments.values()):
                if run.finished:
                    continue
                status = await self._reassignment_status(run, active, recent, meta)
                await self._patch("partitionreassignments", run.resource, status)

    async def _patch(self, plural: str, name: str, status: dict[str, Any]) -> None:
        # one publish at a time per resource: the status timer and a reconcile handler publish
        # concurrently, and an older status patched last would stay (the cache of the last
        # status would say the newer one is there)
        key = (plural, name)
        lock = self._patch_locks.get(key)
        if lock is None:
            lock = self._patch_locks[key] = asyncio.Lock()
        async with lock:
            await self._patch_locked(key, plural, name, status)

    async def _patch_locked(
        self, key: tuple[str, str], plural: str, name: str, status: dict[str, Any]
    ) -> None:
        comparable = {k: v for k, v in status.items() if k != "conditions"}
        comparable["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in status.get("conditions", [])
        ]
        if self._last_status.get(key) == comparable:
            return
        try:
            current = await self.kube.get(plural, name)
        except NotFound:
            return
        status["conditions"] = merge_conditions(
            (current.get("status") or {}).get("conditions", []), status.get("conditions", [])
        )
        await self.kube.patch_status(plural, name, status)
        self._last_status[key] = comparable

    # ------------------------------------------------------------------ availability
    def availability(self) -> Availability | None:
        controller = self.controller
        if controller is None:
            return None
        now = time.monotonic()
        beats = {b: live.last_heartbeat for b, live in controller.broker_liveness().items()}
        s = controller.settings
        not_alive = brokers_not_alive(controller.metadata, beats, now, s.lease_s + s.clock_margin_s)
        problem = getattr(controller, "store_problem", None)
        return Availability(controller.metadata, not_alive, problem or None, now)

    def leaderless_for(self, topic: str, index: int, leaderless: bool, now: float) -> float | None:
        """Seconds the partition has had no leader as far as this operator saw (None: it has
        one)."""
        key = (topic, index)
        if not leaderless:
            self._leaderless_since.pop(key, None)
            return None
        return now - self._leaderless_since.setdefault(key, now)

    def problems_of(self, topic: str, av: Availability) -> dict[int, Problem]:
        """The partitions of a topic that are not served (availability.py's rules)."""
        info = av.meta.topics.get(topic)
        out: dict[int, Problem] = {}
        if info is None:
            return out
        for i, part in enumerate(info.partitions):
            waited = self.leaderless_for(topic, i, part.leader == NO_LEADER, av.now)
            problem = partition_problem(
                i, part, av.meta, av.not_alive, waited, self.leaderless_grace_s
            )
            if problem is not None:
                out[i] = problem
        return out

    def _topic_status(
        self, meta: ClusterMetadata, wish: TopicWish, av: Availability | None = None
    ) -> dict[str, Any]:
        topic = meta.topics.get(wish.kafka_name)
        gen = wish.generation
        status: dict[str, Any] = {"observedGeneration": gen}
        conditions = []
        if wish.error is not None:
            reason, message = wish.error
            conditions.append(condition("Error", True, reason, message, gen))
        elif wish.annotation_error is not None:
            reason, message = wish.annotation_error
            conditions.append(condition("Error", True, reason, message, gen))
        if topic is None:
            conditions.append(
                condition(
                    "Ready",
                    False,
                    wish.error[0] if wish.error else "Creating",
                    "the topic does not exist yet",
                    gen,
                )
            )
            status["conditions"] = conditions
            return status
        problems = self.problems_of(wish.kafka_name, av) if av is not None else {}
        store_problem = av.store_problem if av is not None else None
        count = len(topic.partitions)
        listed = (
            range(count)
            if count <= MAX_STATUS_ROWS
            else sorted(
                {
                    *problems,
                    *(
                        i
                        for i, p in enumerate(topic.partitions)
                        if p.moving or p.leader == NO_LEADER
                    ),
                }
            )[:MAX_STATUS_ROWS]
        )
        parts = []
        for i in listed:
            p = topic.partitions[i]
            parts.append(
                {
                    "partition": i,
                    "broker": p.leader if p.leader != NO_LEADER else None,
                    "epoch": p.leader_epoch,
                    "moving": p.moving,
                    **row_fields(problems.get(i), store_problem),
                }
            )
        status.update(topicId=topic.topic_id, partitionCount=count, partitions=parts)
        leaderless = sum(1 for p in topic.partitions if p.leader == NO_LEADER)
        moving = sum(1 for p in topic.partitions if p.moving)
        if count > MAX_STATUS_ROWS:
            by_broker: dict[str, int] = {}
            for p in topic.partitions:
                key = str(p.leader) if p.leader != NO_LEADER else "none"
                by_broker[key] = by_broker.get(key, 0) + 1
            status["partitionsByBroker"] = by_broker
            status["partitionsListed"] = "not served or moving"
        if wish.error is None and wish.annotation_error is None:
            conditions.append(condition("Error", False, "None", "", gen))
        if leaderless or moving:
            conditions.append(
                condition(
                    "Reconciling",
                    True,
                    "PartitionsMoving",
                    f"{moving} moving, {leaderless} without a leader",
                    gen,
                )
            )
        else:
            conditions.append(condition("Reconciling", False, "Settled", "", gen))
        v = verdict(problems.values(), store_problem)
        conditions.append(
            condition(
                "Degraded", v.degraded, v.reason if v.degraded else "AllServed", v.message, gen
            )
        )
        ready = (
            wish.error is None and not v.degraded and not leaderless and count == wish.partitions
        )
        if ready:
            reason, message = "Serving", f"{count} partitions served"
        elif wish.error is not None:
            reason, message = wish.error
        elif v.degraded:
            reason, message = v.reason, v.message
        else:
            reason, message = "PartitionsMoving", f"{leaderless} partitions without a leader"
        conditions.append(condition("Ready", ready, reason, message, gen))
        status["conditions"] = conditions
        set_gauges(
            "Topic",
            wish.resource,
            wish.kafka_name,
            problems.values(),
            v.reason if v.degraded else None,
        )
        return status

    async def announce_losses(
        self,
        plural: str,
        resource: str,
        uid: str | None,
        topic: str,
        status: dict[str, Any],
        noun: str,
    ) -> None:
        """Events on the resource for what its status now says compared with what was
        announced: `DataLost` (warning) once per newly lost partition, `DataLossAccepted`
        (warning: offsets were given up) when a lost one serves again, `StoreLost` (warning)
        and `StoreRecovered` when the store's problem comes and goes."""
        watch = await self.watch_losses(plural, resource, noun)
        if watch is None:
            return
        lost = lost_in(status, noun)
        store_problem = store_problem_in(status)
        kind = "Topic" if plural == "topics" else "StaticTopic"
        ref = {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": resource, "uid": uid},
        }
        new = {i: p for i, p in lost.items() if i not in watch.lost}
        if new:
            missing = sum(p.missing_offsets for p in new.values())
            detail = "; ".join(
                f"{noun} {p.partition}: offsets {p.found_end} to {(p.expected_end or 0) - 1} "
                f"missing ({p.missing_offsets}; {p.why or 'data missing'})"
                for p in sorted(new.values(), key=lambda p: p.partition)[:20]
            )
            message = (
                f"{topic}: data lost in {naming(new, noun)}, {missing} acknowledged offsets "
                f"missing: {detail}. The {noun}s refuse to serve until the loss is accepted "
                f"(annotate {kind} {resource} with {ACCEPT_ANNOTATION}=true)"
            )
            await self.kube.event(ref, DATA_LOST, message, warning=True)
        # served again: a row without the loss (not a row gone with its topic)
        rows = status.get("partitions" if noun == "partition" else "queues") or []
        shown = {int(r.get("partition", r.get("queue", -1))) for r in rows}
        gone = {i: p for i, p in watch.lost.items() if i not in lost and i in shown}
        if gone:
            given_up = sum(p.missing_offsets for p in gone.values())
            detail = "; ".join(
                f"{noun} {p.partition}: offsets {p.found_end} to {(p.expected_end or 0) - 1} "
                f"given up, continues at {p.expected_end}"
                for p in sorted(gone.values(), key=lambda p: p.partition)[:20]
            )
            message = (
                f"{topic}: loss accepted for {naming(gone, noun)}, {given_up} offsets given "
                f"up: {detail}"
            )
            await self.kube.event(ref, "DataLossAccepted", message, warning=True)
        if store_problem and not watch.store_problem:
            await self.kube.event(ref, STORE_LOST, f"{topic}: {store_problem}", warning=True)
        elif watch.store_problem and not store_problem:
            await self.kube.event(
                ref, "StoreRecovered", f"{topic}: the object store is this cluster's again"
            )
        watch.lost = {**{i: p for i, p in watch.lost.items() if i not in shown}, **lost}
        watch.store_problem = store_problem

    async def watch_losses(self, plural: str, resource: str, noun: str) -> LossWatch | None:
        """What was announced for the resource; the first time (after an operator start),
        from its status as the earlier operator left it: call before publishing a status."""
        key = (plural, resource)
        watch = self._loss_watch.get(key)
        if watch is not None:
            return watch
        try:
            current = await self.kube.get(plural, resource)
        except NotFound:
            return None
        status = current.get("status") or {}
        watch = self._loss_watch[key] = LossWatch(lost_in(status, noun), store_problem_in(status))
        return watch

    def forget(self, plural: str, resource: str) -> None:
        """A resource was deleted: drop what was announced for it and its gauges."""
        self._loss_watch.pop((plural, resource), None)
        self._last_status.pop((plural, resource), None)
        self._patch_locks.pop((plural, resource), None)
        kind = "Topic" if plural == "topics" else "StaticTopic"
        clear_gauges(kind, resource)

    def _reports_open(self, broker: int, tp: TopicPartition, epoch: int) -> bool:
        controller = self.controller
        live = controller.broker_liveness().get(broker) if controller is not None else None
        return live is not None and live.open_partitions.get(tp) == epoch

    async def _reassignment_status(
        self,
        run: ReassignmentRun,
        active: list[MoveStatus],
        recent: list[MoveStatus],
        meta: ClusterMetadata,
    ) -> dict[str, Any]:
        """The status of one tracked reassignment (rows and Events: progress.py's rules)."""
        # a failover's opening (no source: its broker died) is not a move of this
        # reassignment; a move whose target died while opening ended Failed (target_lost)
        # just before it, and that is what its row shows
        by_tp_active = {m.tp: m for m in active if m.source is not None}
        by_tp_recent: dict[TopicPartition, MoveStatus] = {}
        for move in recent:
            if move.source is not None and move.started >= run.submitted - 0.5:
                by_tp_recent[move.tp] = move
        rows = []
        for entry in run.entries:
            m = by_tp_active.get(entry.tp) or by_tp_recent.get(entry.tp)
            topic = meta.topics.get(entry.tp.topic)
            part = (
                topic.partitions[entry.tp.partition]
                if topic is not None and entry.tp.partition < len(topic.partitions)
                else None
            )
            opened = None
            if m is None and part is not None and part.leader == entry.target:
                opened = self._reports_open(entry.target, entry.tp, part.leader_epoch)
            row = reassignment_row(
                entry,
                m,
                run.rows.get(entry.tp),
                part,
                cancel_requested=run.cancel_requested,
                opened=opened,
                seen_unopened=entry.tp in run.unopened,
                now=time.time(),
            )
            if opened is False:
                run.unopened.add(entry.tp)
            run.rows[entry.tp] = row
            for step in steps_to_emit(m, row["phase"], run.emitted.get(entry.tp), str(entry.tp)):
                await self._event(
                    run,
                    f"Partition{step.phase}",
                    step.message,
                    at=step.at,
                    warning=step.warning,
                )
                run.emitted[entry.tp] = step.phase
            rows.append(row)
        overall, finished, account = summary(rows)
        done = sum(1 for r in rows if r["phase"] == Phase.DONE.value)
        status: dict[str, Any] = {
            "phase": overall,
            "progress": f"{done}/{len(rows)}",
            "partitions": rows,
            "observedGeneration": run.generation,
            "startTime": now_iso(run.submitted),
            "conditions": [
                *run.conditions,
                condition("Complete", finished, overall, account, run.generation),
            ],
        }
        if finished:
            status["completionTime"] = now_iso()
            run.finished = True
            await self._event(run, overall, account, warning=overall == "Failed")
        return status

    async def _event(
        self,
        run: ReassignmentRun,
        reason: str,
        message: str,
        *,
        at: float | None = None,
        warning: bool = False,
    ) -> None:
        involved = {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "PartitionReassignment",
            "metadata": {"name": run.resource, "uid": run.uid},
        }
        await self.kube.event(involved, reason, message, at=at, warning=warning)


class ControllerInactive(Exception):
    """This replica is not the active controller (yet); handlers retry."""


def lost_in(status: dict[str, Any], noun: str) -> dict[int, Problem]:
    """The lost partitions (or logic queues) a published status shows."""
    key = "partitions" if noun == "partition" else "queues"
    field_name = "partition" if noun == "partition" else "queue"
    out = {}
    for row in status.get(key) or []:
        if row.get("lost"):
            i = int(row[field_name])
            out[i] = Problem(
                i,
                DATA_LOST,
                missing_offsets=int(row.get("missingOffsets") or 0),
                expected_end=row.get("expectedEnd"),
                found_end=row.get("foundEnd"),
                why=str(row.get("lostReason") or ""),
            )
    return out


def store_problem_in(status: dict[str, Any]) -> str | None:
    for c in status.get("conditions") or []:
        if (
            c.get("type") == "Degraded"
            and c.get("status") == "True"
            and c.get("reason") == STORE_LOST
        ):
            return str(c.get("message") or STORE_LOST)
    return None


_GAUGED: dict[tuple[str, str], tuple[str, str | None]] = {}


def set_gauges(
    kind: str, resource: str, topic: str, problems: Iterable[Problem], reason: str | None
) -> None:
    """The operator's metrics of one resource: its lost partitions and its Degraded reason."""
    lost = sum(1 for p in problems if p.kind == DATA_LOST)
    before = _GAUGED.get((kind, resource))
    if before is not None and before != (topic, reason):
        clear_gauges(kind, resource)
    LOST_PARTITIONS.labels(kind, resource, topic).set(lost)
    for known in _reasons(reason):
        DEGRADED.labels(kind, resource, known).set(1 if known == reason else 0)
    _GAUGED[(kind, resource)] = (topic, reason)


def _reasons(reason: str | None) -> tuple[str, ...]:
    """The Degraded reasons a resource has a series of: every known one, and `reason`."""
    return SEVERITY if reason is None or reason in SEVERITY else (*SEVERITY, reason)


def clear_gauges(kind: str, resource: str) -> None:
    before = _GAUGED.pop((kind, resource), None)
    if before is None:
        return
    topic, reason = before
    with contextlib.suppress(KeyError):
        LOST_PARTITIONS.remove(kind, resource, topic)
    for known in _reasons(reason):
        with contextlib.suppress(KeyError):
            DEGRADED.remove(kind, resource, known)
