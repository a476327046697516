"""Kopf handlers for StaticTopic resources: fixed logic queues over physical queues.

- create / resume / spec update: create the static topic through the controller, or apply the
  changed spec: `brokers` (logic queues leave brokers outside the set and spread over it),
  `remap` (each entry pins a logic queue to a broker, switched in its `mode`), `configs`.
  `totalQueues` never changes: a different value (larger or smaller) is admitted by the CRD
  and refused here with the condition Error/TotalQueuesImmutable; the topic keeps its queues,
  and setting the value back clears the error. The CRD deliberately has no transition rule for
  it (as for a Topic's shrinking partitions): a CEL rule would reject the update at admission,
  so the clear condition on the resource would never be produced.
- a timer publishes status from the controller's metadata: the topic-wide epoch, each logic
  queue's broker, gen, item count and leader item's logic offset, the whole mapping, and the
  conditions Ready, Reconciling (a remap or repair in progress, or copies that disagree) and Error.
- delete (finalizer): the static topic and its physical queues' data go.

Registered by importing this module from `handlers.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import kopf
from tidalmq_controller import StaticTopicError
from tidalmq_core.static_mapping import MappingError, TotalQueuesFixed, physical_topic_name

from tidalmq_operator.availability import (
    BROKER_NOT_ALIVE,
    DATA_LOST,
    Problem,
    broker_state,
    row_fields,
    verdict,
)
from tidalmq_operator.models import SpecError, StaticTopicSpec, config_text, parse
from tidalmq_operator.runtime import (
    Availability,
    ControllerInactive,
    OperatorRuntime,
    condition,
    set_gauges,
)
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

PLURAL = "statictopics"
RETRY_S = 2.0


@dataclass(slots=True)
class StaticTopicWish:
    resource: str
    kafka_name: str
    total_queues: int
    generation: int | None
    error: tuple[str, str] | None = None
    uid: str | None = None
    annotation_error: tuple[str, str] | None = None


def _runtime(memo: Any) -> OperatorRuntime:
    runtime: OperatorRuntime = memo["runtime"]
    return runtime


def _wishes(memo: Any) -> dict[str, StaticTopicWish]:
    if "static_topics" not in memo:
        memo["static_topics"] = {}
    wishes: dict[str, StaticTopicWish] = memo["static_topics"]
    return wishes


def _pins(spec: StaticTopicSpec) -> dict[int, tuple[int, str]]:
    pins: dict[int, tuple[int, str]] = {}
    for r in spec.remap:
        if r.queue in pins:
            raise SpecError(f"spec.remap names logic queue {r.queue} twice")
        pins[r.queue] = (r.broker, r.mode)
    return pins


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile_static_topic(spec: Any, name: str, meta: Any, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    wishes = _wishes(memo)
    generation = meta.get("generation")
    kafka_name = spec.get("topicName") or name
    previous = wishes.get(name)
    wish = StaticTopicWish(
        name,
        kafka_name,
        int(spec.get("totalQueues") or 0),
        generation,
        uid=meta.get("uid"),
        annotation_error=previous.annotation_error if previous else None,
    )
    wishes[name] = wish
    try:
        parsed: StaticTopicSpec = parse(StaticTopicSpec, spec)
        pins = _pins(parsed)
    except SpecError as exc:
        wish.error = ("InvalidSpec", str(exc))
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    configs: dict[str, str | None] = {k: config_text(v) for k, v in parsed.configs.items()}
    manager = controller.static
    try:
        if kafka_name not in controller.metadata.static_topics:
            if kafka_name in controller.metadata.topics:
                raise StaticTopicError(f"a topic named {kafka_name!r} exists and is not static")
            await manager.create(
                kafka_name, parsed.total_queues, brokers=parsed.brokers, configs=configs
            )
        await manager.update(
            kafka_name,
            total_queues=parsed.total_queues,
            brokers=parsed.brokers,
            configs=configs,
            pins=pins,
        )
        wish.error = None
    except TotalQueuesFixed as exc:
        wish.error = ("TotalQueuesImmutable", str(exc))
    except (StaticTopicError, MappingError, ValueError) as exc:
        wish.error = (type(exc).__name__, str(exc))
    except Exception as exc:  # the controller refused (unknown broker, no brokers...)
        wish.error = (type(exc).__name__, str(exc))
    await publish_static_topic(rt, wish)
    if wish.error is not None:
        raise kopf.PermanentError(f"{wish.error[0]}: {wish.error[1]}")


# backoff: a failed publish (the apiserver refusing a patch under load) is retried within
# seconds, not after Kopf's default minute with the status frozen meanwhile
@kopf.timer(GROUP, VERSION, PLURAL, interval=1.0, initial_delay=1.0, backoff=RETRY_S)
async def static_topic_status(name: str, memo: Any, **_: Any) -> None:
    wish = _wishes(memo).get(name)
    if wish is not None:
        await publish_static_topic(_runtime(memo), wish)


async def publish_static_topic(rt: OperatorRuntime, wish: StaticTopicWish) -> None:
    controller = rt.controller
    if controller is None:
        return
    status = static_topic_status_of(controller, wish, rt)
    await rt.watch_losses(PLURAL, wish.resource, "logic queue")
    await rt._patch(PLURAL, wish.resource, status)
    await rt.announce_losses(
        PLURAL, wish.resource, wish.uid, wish.kafka_name, status, "logic queue"
    )


def queue_problems(rt: OperatorRuntime, name: str, av: Availability) -> dict[int, Problem]:
    """The logic queues of a static topic that are not served: a lost physical queue among its
    items (the data of that logic-offset range is gone), or the Kafka view's partition (led by
    the broker of its writable physical queue) on a broker that is not alive, or leaderless."""
    meta = av.meta
    st = meta.static_topics.get(name)
    if st is None:
        return {}
    view = st.view()
    phys = meta.topics.get(physical_topic_name(name))
    served = rt.problems_of(name, av)  # the Kafka view's partitions: one per logic queue
    out = {}
    for q in range(st.total_queues):
        lost = []
        for item in view.items(q):
            if phys is not None and item.queue < len(phys.partitions):
                loss = getattr(phys.partitions[item.queue], "lost", None)
                if loss is not None:
                    lost.append(loss)
        if lost:
            out[q] = Problem(
                q,
                DATA_LOST,
                lost[0].broker,
                "; ".join(sorted({x.reason for x in lost})),
                sum(x.missing_offsets for x in lost),
                max(x.expected_end for x in lost),
                min(x.found_end for x in lost),
            )
            continue
        writable = view.leader(q)
        why = broker_state(meta, av.not_alive, writable.broker) if writable is not None else None
        if writable is not None and why is not None and not writable.sealed:
            out[q] = Problem(q, BROKER_NOT_ALIVE, writable.broker, why)
            continue
        problem = served.get(q)
        if problem is not None:
            out[q] = problem
    return out


def static_topic_status_of(
    controller: Any, wish: StaticTopicWish, rt: OperatorRuntime | None = None
) -> dict[str, Any]:
    gen = wish.generation
    status: dict[str, Any] = {"observedGeneration": gen}
    conditions = []
    if wish.error is not None:
        conditions.append(condition("Error", True, wish.error[0], wish.error[1], gen))
    elif wish.annotation_error is not None:
        reason, message = wish.annotation_error
        conditions.append(condition("Error", True, reason, message, gen))
    else:
        conditions.append(condition("Error", False, "None", "", gen))
    if wish.kafka_name not in controller.metadata.static_topics:
        reason = wish.error[0] if wish.error else "Creating"
        conditions.append(
            condition("Ready", False, reason, "the static topic does not exist yet", gen)
        )
        status["conditions"] = conditions
        return status
    d = controller.static.describe(wish.kafka_name)
    av = rt.availability() if rt is not None else None
    unserved = queue_problems(rt, wish.kafka_name, av) if rt is not None and av is not None else {}
    store_problem = av.store_problem if av is not None else None
    status["epoch"] = d["epoch"]
    status["queues"] = [
        {
            **{k: q[k] for k in ("queue", "broker", "gen", "items", "logicOffset")},
            **row_fields(unserved.get(q["queue"]), store_problem),
        }
        for q in d["queues"]
    ]
    status["mapping"] = d["mapping"]
    leaderless = [q["queue"] for q in d["queues"] if q["leader"] < 0]
    disagreement = "; ".join(d["problems"] + d["ignored"])  # what the copies' epoch check says
    if not d["consistent"]:
        conditions.append(condition("Reconciling", True, "CopiesDisagree", disagreement, gen))
    elif d["busy"] or leaderless:
        conditions.append(
            condition(
                "Reconciling",
                True,
                "Remapping",
                f"logic queues without a leader: {leaderless}",
                gen,
            )
        )
    else:
        conditions.append(condition("Reconciling", False, "Settled", "", gen))
    v = verdict(unserved.values(), store_problem, "logic queue")
    conditions.append(
        condition("Degraded", v.degraded, v.reason if v.degraded else "AllServed", v.message, gen)
    )
    ready = d["consistent"] and not leaderless and not v.degraded
    if ready:
        reason, message = "Serving", f"{d['totalQueues']} logic queues served, epoch {d['epoch']}"
    elif v.degraded:
        reason, message = v.reason, v.message
    elif not d["consistent"]:
        reason, message = "CopiesDisagree", disagreement
    else:
        reason, message = "Remapping", f"logic queues without a leader: {leaderless}"
    conditions.append(condition("Ready", ready, reason, message, gen))
    status["conditions"] = conditions
    set_gauges(
        "StaticTopic",
        wish.resource,
        wish.kafka_name,
        unserved.values(),
        v.reason if v.degraded else None,
    )
    return status


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete_static_topic(spec: Any, name: str, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    wish = _wishes(memo).pop(name, None)
    rt.forget(PLURAL, name)
    kafka_name = wish.kafka_name if wish else (spec.get("topicName") or name)
    try:
        controller = rt.require_controller()
    except ControllerInactive as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    if kafka_name in controller.metadata.static_topics:
        (result,) = await controller.delete_topics([kafka_name])
        if result.error is not None:
            raise kopf.TemporaryError(f"delete failed: {result.error}", delay=RETRY_S)
    physical = physical_topic_name(kafka_name)
    if any(n == physical for n, _ in controller.metadata.pending_deletions):
        raise kopf.TemporaryError("waiting for the physical queues' data to be deleted", delay=1.0)
