"""The operator's running state: the controller (while this replica is the active peer), and the
status of every resource, derived from the controller's metadata and move tracker.

Status is level-based: each publish recomputes what each resource's status should be from the
latest snapshot and patches only what changed, so a missed update is repaired by the next one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tidalmq_broker.controller.controller import Controller, ControllerSettings
from tidalmq_broker.controller.moves import MoveStatus
from tidalmq_broker.controller.rpc import ControllerServer
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.topic_data import delete_topic_data
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry

from tidalmq_operator.kube import Kube, NotFound
from tidalmq_operator.progress import (
    now_iso,
    reassignment_row,
    steps_to_emit,
    summary,
)
from tidalmq_operator.settings import OperatorSettings
from tidalmq_operator.store import ClusterStateStore

log = logging.getLogger(__name__)


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int | None
) -> dict[str, Any]:
    return {"type": kind, "status": "True" if status else "False", "reason": reason,
            "message": message, "lastTransitionTime": now_iso(), "observedGeneration": generation}  # fmt: skip


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
        self._publish_lock = asyncio.Lock()
        self.active = asyncio.Event()

    # ------------------------------------------------------------------ controller role
    async def run_controller(self, stopped: Any) -> None:
        """Run the controller until `stopped` (Kopf stops daemons when this replica is paused
        by peering). Starting bumps the controller epoch in the ClusterState, so a previous
        controller elsewhere is fenced on its next write."""
        s = self.settings
        store = open_object_store(s.storage_url) if s.storage_url else None
        controller = Controller(
            ClusterStateStore(self.kube, s.cluster_state_name),
            ControllerSettings(
                heartbeat_interval_s=s.heartbeat_interval_s, lease_s=s.lease_s,
                session_timeout_s=s.session_timeout_s, election_timeout_s=s.election_timeout_s,
                offsets_topic_partitions=s.offsets_topic_partitions,
            ),
            topic_data_deleter=functools.partial(delete_topic_data, store) if store else None,
            object_store=store,
        )  # fmt: skip
        await controller.start()
        controller.add_event_sink(self._on_controller_event)
        server = ControllerServer(controller)
        await server.start(s.controller_host, s.controller_port)
        self.controller, self.server = controller, server
        self.active.set()
        await self._label_self(True)
        log.info("controller active; brokers reach it on port %d", server.port)
        try:
            while not stopped:
                await self.publish()
                await asyncio.sleep(s.status_interval_s)
        finally:
            self.active.clear()
            await self._label_self(False)
            self.controller = None
            await server.stop()
            await controller.stop()
            log.info("controller stopped on this replica")

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
        warning = reason in ("BrokerDead", "BrokerFenced")
        involved = {"apiVersion": "tidalmq.io/v1alpha1", "kind": "ClusterState",
                    "metadata": {"name": self.settings.cluster_state_name}}  # fmt: skip
        task = asyncio.create_task(
            self.kube.event(involved, reason, message, warning=warning, at=time.time())
        )
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def publish(self) -> None:
        controller = self.controller
        if controller is None:
            return
        async with self._publish_lock:
            meta = controller.metadata
            for wish in list(self.topics.values()):
                await self._patch("topics", wish.resource, self._topic_status(meta, wish))
            active, recent = controller.move_statuses()
            for run in list(self.reassignments.values()):
                if run.finished:
                    continue
                status = await self._reassignment_status(run, active, recent, meta)
                await self._patch("partitionreassignments", run.resource, status)

    async def _patch(self, plural: str, name: str, status: dict[str, Any]) -> None:
        key = (plural, name)
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

    def _topic_status(self, meta: ClusterMetadata, wish: TopicWish) -> dict[str, Any]:
        topic = meta.topics.get(wish.kafka_name)
        status: dict[str, Any] = {"observedGeneration": wish.generation}
        conditions = []
        if wish.error is not None:
            reason, message = wish.error
            conditions.append(condition("Error", True, reason, message, wish.generation))
        if topic is None:
            conditions.append(condition("Ready", False, wish.error[0] if wish.error else "Creating",
                                        "the topic does not exist yet", wish.generation))  # fmt: skip
            status["conditions"] = conditions
            return status
        parts = [
            {"partition": i, "broker": p.leader if p.leader != NO_LEADER else None,
             "epoch": p.leader_epoch, "moving": p.moving}
            for i, p in enumerate(topic.partitions)
        ]  # fmt: skip
        status.update(topicId=topic.topic_id, partitionCount=len(parts), partitions=parts)
        leaderless = sum(1 for p in topic.partitions if p.leader == NO_LEADER)
        moving = sum(1 for p in topic.partitions if p.moving)
        if wish.error is None:
            conditions.append(condition("Error", False, "None", "", wish.generation))
        if leaderless or moving:
            conditions.append(condition("Reconciling", True, "PartitionsMoving",
                                        f"{moving} moving, {leaderless} without a leader", wish.generation))  # fmt: skip
        else:
            conditions.append(condition("Reconciling", False, "Settled", "", wish.generation))
        ready = wish.error is None and not leaderless and len(parts) == wish.partitions
        reason = "Serving" if ready else (wish.error[0] if wish.error else "PartitionsMoving")
        message = (f"{len(parts)} partitions served" if ready
                   else (wish.error[1] if wish.error else f"{leaderless} partitions without a leader"))  # fmt: skip
        conditions.append(condition("Ready", ready, reason, message, wish.generation))
        status["conditions"] = conditions
        return status

    async def _reassignment_status(
        self, run: ReassignmentRun, active: list[MoveStatus], recent: list[MoveStatus],
        meta: ClusterMetadata,
    ) -> dict[str, Any]:  # fmt: skip
        """The status of one tracked reassignment (rows and Events: progress.py's rules)."""
        by_tp_active = {m.tp: m for m in active}
        by_tp_recent: dict[TopicPartition, MoveStatus] = {}
        for m in recent:
            if m.started >= run.submitted - 0.5:
                by_tp_recent[m.tp] = m
        rows = []
        for entry in run.entries:
            m = by_tp_active.get(entry.tp) or by_tp_recent.get(entry.tp)
            topic = meta.topics.get(entry.tp.topic)
            part = (topic.partitions[entry.tp.partition]
                    if topic is not None and entry.tp.partition < len(topic.partitions) else None)  # fmt: skip
            row = reassignment_row(entry, m, run.rows.get(entry.tp), part,
                                   cancel_requested=run.cancel_requested)  # fmt: skip
            run.rows[entry.tp] = row
            for step in steps_to_emit(m, row["phase"], run.emitted.get(entry.tp), str(entry.tp)):
                await self._event(run, f"Partition{step.phase}", step.message, at=step.at,
                                  warning=step.phase == Phase.FAILED.value)  # fmt: skip
                run.emitted[entry.tp] = step.phase
            rows.append(row)
        overall, finished, account = summary(rows)
        done = sum(1 for r in rows if r["phase"] == Phase.DONE.value)
        status: dict[str, Any] = {
            "phase": overall, "progress": f"{done}/{len(rows)}", "partitions": rows,
            "observedGeneration": run.generation, "startTime": now_iso(run.submitted),
            "conditions": [*run.conditions, condition("Complete", finished, overall, account, run.generation)],
        }  # fmt: skip
        if finished:
            status["completionTime"] = now_iso()
            run.finished = True
            await self._event(run, overall, account, warning=overall == "Failed")
        return status

    async def _event(self, run: ReassignmentRun, reason: str, message: str, *,
                     at: float | None = None, warning: bool = False) -> None:  # fmt: skip
        involved = {"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
                    "metadata": {"name": run.resource, "uid": run.uid}}  # fmt: skip
        await self.kube.event(involved, reason, message, at=at, warning=warning)


class ControllerInactive(Exception):
    """This replica is not the active controller (yet); handlers retry."""
