"""Kopf handlers: thin, typed, level-based. Each turns a resource's spec into controller calls
and leaves status to the runtime's publisher (which derives it from the controller's metadata).

- ClusterState: a daemon runs the controller while this replica is the active peer.
- Topic: create / grow / reconfigure / delete (finalizer: the data in object storage goes too).
- PartitionReassignment: start the moves, cancel on `cancel: true`; progress in status + Events.
- Broker pods: Events for joins, drains and disappearances (the controller itself rebalances on
  registration and fails over on lease expiry).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf
from tidalmq_broker.controller.controller import NewTopic, TopicResult
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, PlanEntry, validate_plan

from tidalmq_operator import static_topics  # noqa: F401  (registers the StaticTopic handlers)
from tidalmq_operator.models import (
    ReassignmentSpec,
    SpecError,
    TopicSpec,
    parse,
)
from tidalmq_operator.runtime import ControllerInactive, OperatorRuntime, ReassignmentRun, TopicWish
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

RETRY_S = 2.0


def runtime_of(memo: Any) -> OperatorRuntime:
    return memo["runtime"]


# ---------------------------------------------------------------------------- controller
@kopf.daemon(GROUP, VERSION, "clusterstates", cancellation_timeout=30.0,
             when=lambda name, memo, **_: name == runtime_of(memo).settings.cluster_state_name)  # fmt: skip
async def controller_daemon(stopped: Any, memo: Any, **_: Any) -> None:
    """Kopf stops daemons while peering pauses this replica: the controller runs on one
    replica at a time, and the controller epoch fences any overlap."""
    await runtime_of(memo).run_controller(stopped)


# ---------------------------------------------------------------------------- topics
def _result_error(result: TopicResult) -> tuple[str, str] | None:
    if result.error is None:
        return None
    return type(result.error).__name__, str(result.error)


@kopf.on.resume(GROUP, VERSION, "topics")
@kopf.on.create(GROUP, VERSION, "topics")
@kopf.on.update(GROUP, VERSION, "topics", field="spec")
async def reconcile_topic(spec: Any, name: str, meta: Any, memo: Any, **_: Any) -> None:
    rt = runtime_of(memo)
    generation = meta.get("generation")
    try:
        topic = parse(TopicSpec, spec)
        kafka_name = topic.kafka_name(name)
        configs = topic.validated_configs()
    except (SpecError, ValueError) as exc:
        rt.topics[name] = TopicWish(name, spec.get("topicName") or name, 0, generation,
                                    ("InvalidSpec", str(exc)))  # fmt: skip
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    wish = TopicWish(name, kafka_name, topic.partitions, generation)
    owner = next(
        (w for w in rt.topics.values() if w.kafka_name == kafka_name and w.resource != name), None
    )
    if owner is not None:
        wish.error = (
            "TopicManagedElsewhere",
            f"topic {kafka_name!r} belongs to Topic {owner.resource}",
        )
        rt.topics[name] = wish
        raise kopf.PermanentError(wish.error[1])
    rt.topics[name] = wish
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    existing = controller.metadata.topics.get(kafka_name)
    if existing is None:
        (result,) = await controller.create_topics(
            [NewTopic(kafka_name, topic.partitions, dict(configs))]
        )
        wish.error = _result_error(result)
    else:
        current = len(existing.partitions)
        if topic.partitions < current:
            wish.error = ("PartitionsCannotShrink",
                          f"spec.partitions {topic.partitions} < {current}: Kafka topics can only "
                          "grow; create a new topic to have fewer partitions")  # fmt: skip
        else:
            wish.error = None
            if topic.partitions > current:
                result = await controller.create_partitions(kafka_name, topic.partitions)
                wish.error = _result_error(result)
            if wish.error is None and configs != existing.configs:
                result = await controller.alter_topic_configs(
                    kafka_name, dict(configs), incremental=False, validate_only=False
                )
                wish.error = _result_error(result)
    await rt.publish()
    if wish.error is not None:
        raise kopf.PermanentError(f"{wish.error[0]}: {wish.error[1]}")


@kopf.on.delete(GROUP, VERSION, "topics")
async def delete_topic(spec: Any, name: str, memo: Any, **_: Any) -> None:
    """The finalizer: the topic leaves the cluster and its data leaves object storage."""
    rt = runtime_of(memo)
    wish = rt.topics.pop(name, None)
    kafka_name = wish.kafka_name if wish else (spec.get("topicName") or name)
    if wish is not None and wish.error and wish.error[0] == "TopicManagedElsewhere":
        return  # never delete a topic another Topic resource owns
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    if kafka_name in controller.metadata.topics:
        (result,) = await controller.delete_topics([kafka_name])
        if result.error is not None:
            raise kopf.TemporaryError(f"delete failed: {result.error}", delay=RETRY_S)
    # wait until the controller deleted the stored data (brokers closed the partitions)
    if any(n == kafka_name for n, _ in controller.metadata.pending_deletions):
        raise kopf.TemporaryError("waiting for the topic's data to be deleted", delay=1.0)


# ---------------------------------------------------------------------------- reassignments
@kopf.on.resume(GROUP, VERSION, "partitionreassignments")
@kopf.on.create(GROUP, VERSION, "partitionreassignments")
async def start_reassignment(spec: Any, name: str, meta: Any, status: Any, memo: Any,
                             patch: Any, **_: Any) -> None:  # fmt: skip
    rt = runtime_of(memo)
    phase = (status or {}).get("phase")
    if phase in ("Completed", "Cancelled", "Failed"):
        return
    try:
        plan = parse(ReassignmentSpec, spec)
    except SpecError as exc:
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = [_failed(str(exc), meta)]
        raise kopf.PermanentError(str(exc)) from exc
    if plan.generate is not None and plan.partitions is None:
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = [_failed("generated plans need the planner (not available in this version)", meta)]  # fmt: skip
        raise kopf.PermanentError("spec.generate is not supported by this operator version")
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    try:
        entries = plan.entries()
        validate_plan(entries, controller.metadata)
    except (SpecError, InvalidPlan) as exc:
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = [_failed(str(exc), meta)]
        raise kopf.PermanentError(str(exc)) from exc
    submitted = time.time()
    if phase == "Running":
        # an operator restart: the moves are in the metadata already (or done); just watch
        started = (status or {}).get("startTime")
        submitted = _parse_time(started) or submitted
    else:
        errors = await controller.alter_reassignments(entries)
        bad = {str(tp): str(err) for tp, err in errors.items() if err is not None}
        if bad:
            patch.status["phase"] = "Failed"
            patch.status["conditions"] = [
                _failed("; ".join(f"{k}: {v}" for k, v in bad.items()), meta)
            ]
            raise kopf.PermanentError(f"refused: {bad}")
    run = ReassignmentRun(name, entries, submitted, meta.get("generation"), uid=meta.get("uid"))
    for row in (status or {}).get("partitions", []):  # what an earlier operator already saw
        run.phases[TopicPartition(row["topic"], int(row["partition"]))] = row.get(
            "phase", "Pending"
        )
    rt.reassignments[name] = run
    patch.status["phase"] = "Running"
    patch.status["progress"] = f"0/{len(entries)}"
    kopf.info({"apiVersion": f"{GROUP}/{VERSION}", "kind": "PartitionReassignment",
               "metadata": {"name": name, "namespace": meta.get("namespace"), "uid": meta.get("uid")}},
              reason="Started", message=f"moving {len(entries)} partitions")  # fmt: skip


@kopf.on.field(GROUP, VERSION, "partitionreassignments", field="spec.cancel")
async def cancel_reassignment(new: Any, name: str, spec: Any, memo: Any, **_: Any) -> None:
    if not new:
        return
    rt = runtime_of(memo)
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    plan = parse(ReassignmentSpec, spec)
    moving = {tp for tp, *_ in controller.list_reassignments()}
    entries = [PlanEntry(e.tp, None) for e in plan.entries() if e.tp in moving]
    if entries:
        await controller.alter_reassignments(entries)
    log.info("PartitionReassignment %s: cancelled %d moves in flight", name, len(entries))


@kopf.on.delete(GROUP, VERSION, "partitionreassignments", optional=True)
async def forget_reassignment(name: str, memo: Any, **_: Any) -> None:
    runtime_of(memo).reassignments.pop(name, None)


# ---------------------------------------------------------------------------- broker pods
def _is_broker(labels: Any, memo: Any, **_: Any) -> bool:
    wanted = runtime_of(memo).settings.selector_dict()
    return all(labels.get(k) == v for k, v in wanted.items())


@kopf.on.event("", "v1", "pods", when=_is_broker)
async def broker_pod_event(
    event: Any, name: str, meta: Any, memo: Any, body: Any, **_: Any
) -> None:
    rt = runtime_of(memo)
    kind = event.get("type")
    if kind == "DELETED":
        involved = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(meta)}
        await rt.kube.event(involved, "BrokerGone",
                            "broker pod deleted; if it did not drain, its partitions move "
                            "elsewhere once its lease expires")  # fmt: skip
    elif meta.get("deletionTimestamp"):
        log.info("broker pod %s terminating: it drains through its preStop hook", name)


def _failed(message: str, meta: Any) -> dict[str, Any]:
    from tidalmq_operator.runtime import condition

    return condition("Complete", False, "Failed", message, meta.get("generation"))


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    import datetime

    try:
        return (
            datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
            .replace(tzinfo=datetime.UTC)
            .timestamp()
        )
    except ValueError:
        return None
