"""Kopf handlers for StaticTopic resources (seed 002): fixed logic queues over physical queues.

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
from tidalmq_broker.static_topics.manager import StaticTopicError
from tidalmq_core.static_mapping import MappingError, TotalQueuesFixed, physical_topic_name

from tidalmq_operator.models import SpecError, StaticTopicSpec, parse
from tidalmq_operator.runtime import ControllerInactive, OperatorRuntime, condition
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


def _runtime(memo: Any) -> OperatorRuntime:
    return memo["runtime"]


def _wishes(memo: Any) -> dict[str, StaticTopicWish]:
    if "static_topics" not in memo:
        memo["static_topics"] = {}
    return memo["static_topics"]


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
    wish = StaticTopicWish(name, kafka_name, int(spec.get("totalQueues") or 0), generation)
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
    configs: dict[str, str | None] = {k: str(v) for k, v in parsed.configs.items()}
    manager = controller.static
    try:
        if kafka_name not in controller.metadata.static_topics:
            if kafka_name in controller.metadata.topics:
                raise StaticTopicError(f"a topic named {kafka_name!r} exists and is not static")
            await manager.create(kafka_name, parsed.total_queues, brokers=parsed.brokers,
                                 configs=configs)  # fmt: skip
        await manager.update(kafka_name, total_queues=parsed.total_queues,
                             brokers=parsed.brokers, configs=configs, pins=pins)  # fmt: skip
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


@kopf.timer(GROUP, VERSION, PLURAL, interval=1.0, initial_delay=1.0)
async def static_topic_status(name: str, memo: Any, **_: Any) -> None:
    wish = _wishes(memo).get(name)
    if wish is not None:
        await publish_static_topic(_runtime(memo), wish)


async def publish_static_topic(rt: OperatorRuntime, wish: StaticTopicWish) -> None:
    controller = rt.controller
    if controller is None:
        return
    await rt._patch(PLURAL, wish.resource, static_topic_status_of(controller, wish))


def static_topic_status_of(controller: Any, wish: StaticTopicWish) -> dict[str, Any]:
    gen = wish.generation
    status: dict[str, Any] = {"observedGeneration": gen}
    conditions = []
    if wish.error is not None:
        conditions.append(condition("Error", True, wish.error[0], wish.error[1], gen))
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
    status["epoch"] = d["epoch"]
    status["queues"] = [
        {k: q[k] for k in ("queue", "broker", "gen", "items", "logicOffset")} for q in d["queues"]
    ]
    status["mapping"] = d["mapping"]
    leaderless = [q["queue"] for q in d["queues"] if q["leader"] < 0]
    if not d["consistent"]:
        problems = "; ".join(d["problems"] + d["ignored"])
        conditions.append(condition("Reconciling", True, "CopiesDisagree", problems, gen))
    elif d["busy"] or leaderless:
        conditions.append(condition("Reconciling", True, "Remapping",
                                    f"logic queues without a leader: {leaderless}", gen))  # fmt: skip
    else:
        conditions.append(condition("Reconciling", False, "Settled", "", gen))
    ready = d["consistent"] and not leaderless
    message = (f"{d['totalQueues']} logic queues served, epoch {d['epoch']}" if ready
               else f"logic queues without a leader: {leaderless}")  # fmt: skip
    conditions.append(condition("Ready", ready, "Serving" if ready else "Remapping", message, gen))
    status["conditions"] = conditions
    return status


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete_static_topic(spec: Any, name: str, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    wish = _wishes(memo).pop(name, None)
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
