"""Kopf handlers: thin, typed, level-based. Each turns a resource's spec into controller calls
and leaves status to the runtime's publisher (which derives it from the controller's metadata).

- ClusterState: a daemon runs the controller while this replica is the active peer.
- Topic: create / grow / reconfigure / delete (finalizer: the data in object storage goes too).
- PartitionReassignment: start the moves, cancel on `cancel: true`; progress in status + Events.
- User: SCRAM or TLS credentials, their Secret and ACLs (user_handlers.py).
- Broker pods: Events for joins, drains and disappearances (the controller itself rebalances on
  registration and fails over on lease expiry).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf
from tidalmq_controller import NewTopic, TopicResult
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, PlanEntry, validate_plan

from tidalmq_operator import (  # noqa: F401  (registers their handlers)
    recovery,
    static_topics,
    user_handlers,
)
from tidalmq_operator.generated import (
    TERMINAL,
    Step,
    moves_to_submit,
    next_step,
    plan_entries,
    plan_status,
    plan_summary,
    with_condition,
)
from tidalmq_operator.kube import NotFound
from tidalmq_operator.models import (
    GenerateSpec,
    ReassignmentSpec,
    SpecError,
    TopicSpec,
    parse,
)
from tidalmq_operator.planning import PlannerFailed, PlannerJob, cleanup, run_name, run_planner
from tidalmq_operator.progress import now_iso
from tidalmq_operator.runtime import (
    ControllerInactive,
    OperatorRuntime,
    ReassignmentRun,
    TopicWish,
    condition,
)
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

RETRY_S = 2.0
PLURAL = "partitionreassignments"


def runtime_of(memo: Any) -> OperatorRuntime:
    runtime: OperatorRuntime = memo["runtime"]
    return runtime


# ---------------------------------------------------------------------------- controller
@kopf.daemon(
    GROUP,
    VERSION,
    "clusterstates",
    cancellation_timeout=30.0,
    when=lambda name, memo, **_: name == runtime_of(memo).settings.cluster_state_name,
)
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
        rt.topics[name] = TopicWish(
            name, spec.get("topicName") or name, 0, generation, ("InvalidSpec", str(exc))
        )
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    previous = rt.topics.get(name)
    wish = TopicWish(
        name,
        kafka_name,
        topic.partitions,
        generation,
        uid=meta.get("uid"),
        annotation_error=previous.annotation_error if previous else None,
    )
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
            wish.error = (
                "PartitionsCannotShrink",
                f"spec.partitions {topic.partitions} < {current}: Kafka topics can only "
                "grow; create a new topic to have fewer partitions",
            )
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
    rt.forget("topics", name)
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
async def start_reassignment(
    spec: Any, name: str, meta: Any, status: Any, memo: Any, patch: Any, **_: Any
) -> None:
    rt = runtime_of(memo)
    phase = (status or {}).get("phase")
    if phase in TERMINAL:
        return
    try:
        plan = parse(ReassignmentSpec, spec)
    except SpecError as exc:
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = [_failed(str(exc), meta)]
        raise kopf.PermanentError(str(exc)) from exc
    if plan.cancel:
        # created cancelled, or cancelled before this handler got to submit it: nothing is
        # submitted (and moves already submitted before an operator restart are rolled back)
        try:
            await cancel_reassignment_of(rt, name)
        except ControllerInactive as exc:
            raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
        return
    if plan.generate is not None and plan.partitions is None:
        try:
            await reconcile_generated(rt, name)
        except ControllerInactive as exc:
            raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
        return
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
    async with rt.resource_lock(name):
        if phase == "Running":
            # an operator restart: the moves are in the metadata already (or done); just watch
            body = {"metadata": dict(meta), "spec": dict(spec), "status": dict(status or {})}
            _track(rt, name, body)
            return
        submitted = time.time()
        try:
            await submit_moves(controller, entries)
        except InvalidPlan as exc:
            patch.status["phase"] = "Failed"
            patch.status["conditions"] = [_failed(str(exc), meta)]
            raise kopf.PermanentError(f"refused: {exc}") from exc
        # Running is written here, before the publisher tracks the run, so that it never
        # overwrites a status the publisher already wrote (Kopf patches after the handler)
        await rt.kube.patch_status(
            PLURAL,
            name,
            {
                "phase": "Running",
                "progress": f"0/{len(entries)}",
                "startTime": now_iso(submitted),
                "observedGeneration": meta.get("generation"),
            },
        )
        rt.reassignments[name] = _run_of(name, meta, entries, submitted, status)
    await rt.kube.event(_ref(name, meta.get("uid")), "Started", f"moving {len(entries)} partitions")


def _running(status: Any, **_: Any) -> bool:
    return (status or {}).get("phase") == "Running"


@kopf.timer(GROUP, VERSION, PLURAL, interval=2.0, initial_delay=2.0, when=_running)
async def adopt_running_reassignment(
    spec: Any, name: str, meta: Any, status: Any, memo: Any, **_: Any
) -> None:
    """Level-based tracking: a Running reassignment that this replica does not track is taken
    over from its spec (or generated plan) and status. It happens when an operator stopped right
    after a create handler had submitted the moves and Kopf had recorded that handler as done:
    the next operator then runs only the remaining handlers, and nothing would ever publish the
    moves' progress. The moves themselves are in the controller's metadata already (a Running
    phase is written only after they were submitted), so nothing is submitted again."""
    rt = runtime_of(memo)
    if name in rt.reassignments or rt.controller is None:
        return
    plan = parse(ReassignmentSpec, spec)
    if plan.generate is not None and plan.partitions is None:
        await reconcile_generated(rt, name)  # its WATCH step
        return
    async with rt.resource_lock(name):
        body = {"metadata": dict(meta), "spec": dict(spec), "status": dict(status or {})}
        if name not in rt.reassignments:
            _track(rt, name, body)
            log.info(
                "PartitionReassignment %s: tracking its moves (taken over from an earlier "
                "operator)",
                name,
            )


@kopf.on.field(GROUP, VERSION, "partitionreassignments", field="spec.cancel")
async def cancel_reassignment(new: Any, name: str, memo: Any, **_: Any) -> None:
    if not new:
        return
    try:
        await cancel_reassignment_of(runtime_of(memo), name)
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc


async def cancel_reassignment_of(rt: OperatorRuntime, name: str) -> None:
    """`spec.cancel: true`, decided from the resource as it is now (level-based: the create or
    resume handler and the spec.cancel handler both come here, in any order, any number of
    times). Before its moves were submitted, nothing is moved: the resource ends Cancelled at
    once. While Running, the moves of this plan still in flight roll back to their source
    brokers (moves already done stay done), and the publisher reports each partition's outcome,
    ending Cancelled (or Completed, truthfully, if every move had finished first)."""
    try:
        body = await rt.kube.get(PLURAL, name)
    except NotFound:
        return
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase in TERMINAL:
        return
    spec = parse(ReassignmentSpec, body.get("spec") or {})
    if spec.generate is not None and spec.partitions is None and phase != "Running":
        await reconcile_generated(rt, name)  # before any move: stop the planner, end Cancelled
        return
    async with rt.resource_lock(name):
        body = await rt.kube.get(PLURAL, name)  # again, under the lock: the phase may have moved
        status = body.get("status") or {}
        if status.get("phase") in TERMINAL:
            return
        meta = body.get("metadata") or {}
        if status.get("phase") != "Running":
            await _cancel_unsubmitted(rt, name, body, spec)
            return
        controller = rt.require_controller()
        run = _track(rt, name, body)
        run.cancel_requested = True
        # spec.cancel bumped metadata.generation: the conditions published from now on
        # describe this spec (observedGeneration)
        run.generation = meta.get("generation", run.generation)
        ours = [e for e in run.entries if _moving_to(controller, e)]
        if ours:
            await controller.alter_reassignments([PlanEntry(e.tp, None) for e in ours])
        log.info("PartitionReassignment %s: cancelled %d moves in flight", name, len(ours))
        await rt.kube.event(
            _ref(name, meta.get("uid")),
            "Cancelling",
            f"rolling back {len(ours)} moves in flight; moves already done stay",
        )


def _moving_to(controller: Any, entry: PlanEntry) -> bool:
    """The partition is moving to this entry's target (this plan's move, not someone else's)."""
    topic = controller.metadata.topics.get(entry.tp.topic)
    if topic is None or entry.tp.partition >= len(topic.partitions):
        return False
    part = topic.partitions[entry.tp.partition]
    return bool(part.moving and (part.target_replicas or [None])[0] == entry.target)


async def _cancel_unsubmitted(
    rt: OperatorRuntime, name: str, body: dict[str, Any], spec: ReassignmentSpec
) -> None:
    meta = body.get("metadata") or {}
    gen = meta.get("generation")
    try:
        entries = spec.entries()
    except SpecError:
        entries = []
    message = "cancelled before any move was submitted: nothing was moved"
    rows = [
        {
            "topic": e.tp.topic,
            "partition": e.tp.partition,
            "target": e.target,
            "phase": "Cancelled",
            "message": "never submitted",
        }
        for e in entries
    ]
    await _set_status(
        rt,
        name,
        body,
        condition("Complete", True, "Cancelled", message, gen),
        phase="Cancelled",
        progress=f"0/{len(entries)}",
        partitions=rows,
        completionTime=now_iso(),
        observedGeneration=gen,
    )
    await rt.kube.event(_ref(name, meta.get("uid")), "Cancelled", message)
    log.info("PartitionReassignment %s: %s", name, message)


def _track(rt: OperatorRuntime, name: str, body: dict[str, Any]) -> ReassignmentRun:
    """The tracking of a Running reassignment's moves (created from its spec or generated plan
    and its status if this replica does not track it yet). Call with the resource lock held."""
    run = rt.reassignments.get(name)
    if run is not None:
        return run
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    spec = parse(ReassignmentSpec, body.get("spec") or {})
    generated = spec.generate is not None and spec.partitions is None
    entries = plan_entries(status.get("plan")) if generated else spec.entries()
    submitted = (
        _parse_time(status.get("startTime"))
        or _parse_time(meta.get("creationTimestamp"))
        or time.time()
    )
    planned = [c for c in status.get("conditions", []) if c.get("type") == "Planned"]
    run = _run_of(name, meta, entries, submitted, status, planned if generated else None)
    run.cancel_requested = spec.cancel
    rt.reassignments[name] = run
    return run


@kopf.on.delete(GROUP, VERSION, "partitionreassignments", optional=True)
async def forget_reassignment(name: str, meta: Any, spec: Any, memo: Any, **_: Any) -> None:
    rt = runtime_of(memo)
    rt.reassignments.pop(name, None)
    if spec.get("generate") is not None:
        await stop_planner(rt, name, meta.get("uid"))


@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.approved")
@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.autoApprove")
async def approve_reassignment(new: Any, name: str, spec: Any, memo: Any, **_: Any) -> None:
    """An approval (or autoApprove) of a generated plan: its moves start once it is planned."""
    if not new or spec.get("generate") is None:
        return
    try:
        await reconcile_generated(runtime_of(memo), name)
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc


# ---------------------------------------------------------------------------- shared by both
async def submit_moves(controller: Any, entries: list[PlanEntry]) -> None:
    """Check a plan against the current metadata and start its moves (those not already done
    or under way: a resubmission starts nothing twice); InvalidPlan lists every refusal."""
    validate_plan(entries, controller.metadata)
    todo = moves_to_submit(entries, controller.metadata)
    errors = await controller.alter_reassignments(todo) if todo else {}
    bad = {str(tp): str(err) for tp, err in errors.items() if err is not None}
    if bad:
        raise InvalidPlan("; ".join(f"{k}: {v}" for k, v in bad.items()))


def _run_of(
    name: str,
    meta: Any,
    entries: list[PlanEntry],
    submitted: float,
    status: Any,
    conditions: list[dict[str, Any]] | None = None,
) -> ReassignmentRun:
    """The progress tracking of submitted moves (the runtime's publisher writes status)."""
    run = ReassignmentRun(
        name,
        entries,
        submitted,
        meta.get("generation"),
        uid=meta.get("uid"),
        conditions=list(conditions or []),
    )
    for row in (status or {}).get("partitions", []):  # what an earlier operator already reported
        tp = TopicPartition(row["topic"], int(row["partition"]))
        run.rows[tp] = dict(row)
        run.emitted[tp] = row.get("phase", "Pending")
    return run


# ---------------------------------------------------------------------------- generated plans
def _ref(name: str, uid: str | None) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PartitionReassignment",
        "metadata": {"name": name, "uid": uid},
    }


def planner_job(
    rt: OperatorRuntime, name: str, uid: str | None, generate: GenerateSpec | None
) -> PlannerJob:
    """The planner run of a resource. Its name depends on the resource only (uid, no clock), so
    a restarted operator finds (attaches to) the driver pod of its earlier launch."""
    s = rt.settings
    return PlannerJob.from_settings(
        name=run_name(name, uid or "", when=0.0),
        namespace=s.namespace,
        image=s.spark_image,
        service_account=s.spark_service_account,
        prometheus_url=s.prometheus_url,
        bootstrap_servers=s.bootstrap_servers or None,
        security_protocol=s.kafka_security_protocol,
        client_user_secret=s.planner_user_secret,
        broker_ca_secret=s.broker_ca_secret,
        generate=generate,
        resource_name=name,
        spark_submit=s.spark_submit,
    )


def _planner_unconfigured(rt: OperatorRuntime) -> str | None:
    s = rt.settings
    missing = [
        env
        for env, value in (
            ("TIDALMQ_SPARK_IMAGE", s.spark_image),
            ("TIDALMQ_SPARK_SERVICE_ACCOUNT", s.spark_service_account),
            ("TIDALMQ_PROMETHEUS_URL", s.prometheus_url),
        )
        if not value
    ]
    if not missing:
        return None
    return (
        f"the planner is not configured ({', '.join(missing)} unset; the chart sets them with "
        "spark.enabled and operator.prometheusUrl)"
    )


async def stop_planner(rt: OperatorRuntime, name: str, uid: str | None) -> None:
    """Stop the planner run of a resource: its task here and its driver pod (and result)."""
    task = rt.planners.pop(name, None)
    if task is not None and not task.done() and task is not asyncio.current_task():
        task.cancel()
        await asyncio.wait([task], timeout=30)
    await cleanup(planner_job(rt, name, uid, None), rt.kube.core)


async def _set_status(
    rt: OperatorRuntime,
    name: str,
    current: dict[str, Any],
    *new_conditions: dict[str, Any],
    **fields: Any,
) -> None:
    conditions = (current.get("status") or {}).get("conditions")
    for c in new_conditions:
        conditions = with_condition(conditions, c)
    body = dict(fields)
    if new_conditions:
        body["conditions"] = conditions
    await rt.kube.patch_status(PLURAL, name, body)


async def reconcile_generated(rt: OperatorRuntime, name: str) -> None:
    """Take the next step of a generated PartitionReassignment (generated.next_step), decided
    from its current state; raises ControllerInactive when its moves need the controller."""
    async with rt.resource_lock(name):
        try:
            body = await rt.kube.get(PLURAL, name)
        except NotFound:
            return
        meta = body.get("metadata") or {}
        uid, gen = meta.get("uid"), meta.get("generation")
        spec = parse(ReassignmentSpec, body.get("spec") or {})
        status = body.get("status") or {}
        task = rt.planners.get(name)
        step = next_step(
            spec,
            status,
            planner_running=task is not None and not task.done(),
            tracked=name in rt.reassignments,
        )
        log.info("PartitionReassignment %s (generated): %s", name, step.value)
        ref = _ref(name, uid)
        plan = status.get("plan") or {}
        if step is Step.CANCEL:
            await stop_planner(rt, name, uid)
            message = "cancelled before any move: nothing was moved"
            await _set_status(
                rt,
                name,
                body,
                condition("Complete", True, "Cancelled", message, gen),
                phase="Cancelled",
                completionTime=now_iso(),
                observedGeneration=gen,
            )
            await rt.kube.event(ref, "Cancelled", message)
        elif step is Step.PLAN:
            problem = _planner_unconfigured(rt)
            if problem is not None:
                await _set_status(
                    rt,
                    name,
                    body,
                    condition("Planned", False, "PlannerFailed", problem, gen),
                    _failed(problem, meta),
                    phase="Failed",
                    observedGeneration=gen,
                )
                await rt.kube.event(ref, "PlannerFailed", problem, warning=True)
                return
            g = spec.generate or GenerateSpec()
            message = (
                f"planning from {g.window} of traffic history (step {g.step}, "
                f"threshold {g.threshold}{f', at most {g.max_moves} moves' if g.max_moves is not None else ''})"
            )
            await _set_status(
                rt,
                name,
                body,
                condition("Planned", False, "Planning", message, gen),
                condition("Complete", False, "Planning", "no plan yet", gen),
                phase="Planning",
                observedGeneration=gen,
            )
            await rt.kube.event(ref, "Planning", message)
            rt.planners[name] = asyncio.create_task(
                _planner_task(rt, name, uid, spec.generate, gen), name=f"planner-{name}"
            )
        elif step is Step.AWAIT_APPROVAL:
            if status.get("phase") != "AwaitingApproval":
                await _set_status(rt, name, body, phase="AwaitingApproval")
        elif step is Step.COMPLETE_EMPTY:
            message = f"already balanced: {plan_summary(plan)}; nothing to move"
            await _set_status(
                rt,
                name,
                body,
                condition("Complete", True, "AlreadyBalanced", message, gen),
                phase="Completed",
                progress="0/0",
                completionTime=now_iso(),
                observedGeneration=gen,
            )
            await rt.kube.event(ref, "AlreadyBalanced", message)
        elif step is Step.EXECUTE:
            controller = rt.require_controller()
            entries = plan_entries(plan)
            # stamped before the moves are recorded, as for hand-written plans: the publisher
            # takes a finished move as this plan's only if it started after this (less a
            # margin), and a commit slower than the margin left fast moves without figures
            submitted = time.time()
            try:
                await submit_moves(controller, entries)
            except InvalidPlan as exc:
                message = f"the plan does not fit the cluster now: {exc}"
                await _set_status(
                    rt,
                    name,
                    body,
                    _failed(message, meta),
                    phase="Failed",
                    completionTime=now_iso(),
                    observedGeneration=gen,
                )
                await rt.kube.event(ref, "Refused", message, warning=True)
                return
            planned = [c for c in status.get("conditions", []) if c.get("type") == "Planned"]
            rt.reassignments[name] = _run_of(name, meta, entries, submitted, status, planned)
            how = "spec.autoApprove" if spec.auto_approve and not spec.approved else "approved"
            await _set_status(
                rt,
                name,
                body,
                condition("Complete", False, "Running", f"0 of {len(entries)} moved", gen),
                phase="Running",
                progress=f"0/{len(entries)}",
                startTime=now_iso(submitted),
                observedGeneration=gen,
            )
            await rt.kube.event(ref, "Started", f"moving {len(entries)} partitions ({how})")
        elif step is Step.WATCH:
            _track(rt, name, body)


async def _planner_task(
    rt: OperatorRuntime, name: str, uid: str | None, generate: GenerateSpec | None, gen: int | None
) -> None:
    """One planner run in the background: progress in status and Events, then the plan in
    status.plan (or Failed). Cancelled by spec.cancel or deletion (stop_planner cleans up) or
    by the operator's shutdown (the driver keeps running; a restarted operator attaches)."""
    job = planner_job(rt, name, uid, generate)
    ref = _ref(name, uid)
    s = rt.settings

    async def progress(phase: str, message: str) -> None:
        if phase in ("Planned", "Failed"):  # reported below, with the plan or PlannerFailed
            return
        await rt.kube.event(ref, f"Planner{phase}", message)
        try:
            current = await rt.kube.get(PLURAL, name)
        except NotFound:
            return
        await _set_status(rt, name, current, condition("Planned", False, phase, message, gen))

    try:
        outcome = await run_planner(
            job,
            rt.kube.core,
            progress=progress,
            keep=True,
            attach=True,
            timeout_s=s.planner_timeout_s,
            poll_s=s.planner_poll_s,
        )
    except PlannerFailed as exc:
        async with rt.resource_lock(name):
            if rt.planners.get(name) is asyncio.current_task():
                del rt.planners[name]
            await cleanup(job, rt.kube.core)
            try:
                current = await rt.kube.get(PLURAL, name)
            except NotFound:
                return
            message = f"the planner failed: {exc}"
            await _set_status(
                rt,
                name,
                current,
                condition("Planned", False, "PlannerFailed", str(exc), gen),
                condition("Complete", False, "Failed", message, gen),
                phase="Failed",
                completionTime=now_iso(),
            )
            await rt.kube.event(ref, "PlannerFailed", message, warning=True)
        return
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the API server, most likely: try again (attaching) shortly
        log.exception("PartitionReassignment %s: planner run interrupted", name)
        await rt.kube.event(ref, "PlannerRetry", f"planner run interrupted: {exc}", warning=True)
        if rt.planners.get(name) is asyncio.current_task():
            del rt.planners[name]
        await asyncio.sleep(10 * RETRY_S)
        await _reconcile_soon(rt, name)
        return
    async with rt.resource_lock(name):
        if rt.planners.get(name) is asyncio.current_task():
            del rt.planners[name]
        try:
            current = await rt.kube.get(PLURAL, name)
        except NotFound:
            await cleanup(job, rt.kube.core)
            return
        plan = plan_status(outcome.entries, outcome.summary, outcome.report)
        summary = plan_summary(plan)
        moves = len(plan["partitions"])
        await _set_status(
            rt,
            name,
            current,
            condition("Planned", True, "Planned", f"{summary} ({outcome.seconds:.0f} s)", gen),
            condition(
                "Complete",
                False,
                "AwaitingApproval",
                "waiting for spec.approved: true" if moves else "nothing to move",
                gen,
            ),
            plan=plan,
            phase="AwaitingApproval",
            progress=f"0/{moves}",
        )
        await rt.kube.event(ref, "Planned", summary)
        await cleanup(job, rt.kube.core)  # only now: a restart before the plan is stored attaches
    await _reconcile_soon(rt, name)


async def _reconcile_soon(rt: OperatorRuntime, name: str) -> None:
    """After the planner: approved or autoApprove plans start (once the controller runs)."""
    while True:
        try:
            await reconcile_generated(rt, name)
            return
        except ControllerInactive:
            await asyncio.sleep(RETRY_S)


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
        await rt.kube.event(
            involved,
            "BrokerGone",
            "broker pod deleted; if it did not drain, its partitions move "
            "elsewhere once its lease expires",
        )
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
