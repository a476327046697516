"""Explicit recovery from a data loss on Kubernetes: the annotation
`tidalmq.io/accept-data-loss` on a Topic (or StaticTopic).

Like Kafka's unclean leader election, never the default: a partition whose acknowledged data is
missing from the object store refuses to serve (KAFKA_STORAGE_ERROR) and its Topic is Degraded
(DataLost) until someone accepts the loss. The annotation's value is `"true"` (every lost
partition of the topic) or a list of partitions, `"0,3,7"` or `"0-5,9"` (for a StaticTopic:
logic queues, whose lost physical queues are accepted). The operator calls the controller's
`accept_data_loss`: each accepted partition continues at the end the metadata knows was
acknowledged (offsets are never reused, so consumers' committed offsets and idempotent producers
stay valid), and the annotation is removed, so it is one-shot. The Topic's `DataLossAccepted`
Event (from the publisher, runtime.announce_losses) records the offsets given up.

A value that cannot be applied (not a partition list, a partition the topic does not have, a
store that belongs to another cluster) is left in place and reported: a warning Event (once per
value) and the Error condition (reason InvalidAnnotation or DataLossNotAccepted); fixing or
removing the annotation clears it. A valid list naming no lost partition removes the annotation
with a Normal Event (NothingToAccept).

Registered by importing this module from `handlers.py`.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from tidalmq_core.static_mapping import physical_topic_name

from tidalmq_operator.availability import naming
from tidalmq_operator.kube import NotFound
from tidalmq_operator.runtime import ACCEPT_ANNOTATION, OperatorRuntime
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)


class InvalidValue(ValueError):
    """The annotation's value is not "true" nor a partition list."""


def parse_partitions(value: str, count: int, noun: str = "partition") -> list[int] | None:
    """None for "true" (every lost one), else the partitions named ("0,3,7", "0-5, 9")."""
    text = value.strip()
    if text.lower() == "true":
        return None
    if not text:
        raise InvalidValue(f'empty: use "true" or a list of {noun}s such as "0,3,7"')
    out: set[int] = set()
    for piece in text.split(","):
        piece = piece.strip()
        try:
            if "-" in piece:
                low, high = (int(x) for x in piece.split("-", 1))
                if low > high:
                    raise InvalidValue(f"{piece!r}: an empty range")
                out.update(range(low, high + 1))
            else:
                out.add(int(piece))
        except ValueError as exc:
            if isinstance(exc, InvalidValue):
                raise
            raise InvalidValue(
                f'{piece!r} is not a {noun} number: use "true" or a list such as "0,3,7"'
            ) from exc
    outside = sorted(i for i in out if not 0 <= i < count)
    if outside:
        raise InvalidValue(f"the topic has no {naming(outside, noun)} (it has {count})")
    return sorted(out)


class Target:
    """What one annotated resource is: its Kafka topic and how its numbers map to the
    controller's partitions."""

    def __init__(self, rt: OperatorRuntime, plural: str, resource: str, wish: Any) -> None:
        self.rt, self.plural, self.resource, self.wish = rt, plural, resource, wish
        self.static = plural == "statictopics"
        self.noun = "logic queue" if self.static else "partition"

    @property
    def kind(self) -> str:
        return "StaticTopic" if self.static else "Topic"

    def count(self) -> int:
        meta = self.rt.require_controller().metadata
        if self.static:
            st = meta.static_topics.get(self.wish.kafka_name)
            return st.total_queues if st is not None else 0
        topic = meta.topics.get(self.wish.kafka_name)
        return len(topic.partitions) if topic is not None else 0

    def controller_call(self, chosen: list[int] | None) -> tuple[str, list[int] | None]:
        """(the controller's topic, its partitions) for the annotation's choice."""
        if not self.static:
            return self.wish.kafka_name, chosen
        physical = physical_topic_name(self.wish.kafka_name)
        if chosen is None:
            return physical, None
        st = self.rt.require_controller().metadata.static_topics[self.wish.kafka_name]
        view = st.view()
        return physical, sorted({item.queue for q in chosen for item in view.items(q)})


async def apply_annotation(
    rt: OperatorRuntime, target: Target, value: str, uid: str | None
) -> None:
    """One attempt (the timer calls it every second while the annotation is there)."""
    wish = target.wish
    ref = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": target.kind,
        "metadata": {"name": target.resource, "uid": uid},
    }
    controller = rt.controller
    if controller is None or wish.kafka_name not in (
        controller.metadata.static_topics if target.static else controller.metadata.topics
    ):
        return  # not active here, or the topic does not exist yet: the next tick tries again
    try:
        chosen = parse_partitions(value, target.count(), target.noun)
    except InvalidValue as exc:
        await _refuse(
            rt,
            target,
            ref,
            value,
            "InvalidAnnotation",
            f'{ACCEPT_ANNOTATION}="{value}" ignored: {exc}',
        )
        return
    topic, partitions = target.controller_call(chosen)
    accept = getattr(controller, "accept_data_loss", None)
    if accept is None:
        await _refuse(
            rt,
            target,
            ref,
            value,
            "DataLossNotAccepted",
            f'{ACCEPT_ANNOTATION}="{value}" not applied: this controller cannot accept data loss',
        )
        return
    if partitions == []:
        recovered: list[int] = []
    else:
        try:
            recovered = await accept(topic, partitions)
        except Exception as exc:  # a foreign store, the topic gone...
            await _refuse(
                rt,
                target,
                ref,
                value,
                "DataLossNotAccepted",
                f'{ACCEPT_ANNOTATION}="{value}" not applied: {exc}',
            )
            return
    wish.annotation_error = None
    await rt.kube.remove_annotation(target.plural, target.resource, ACCEPT_ANNOTATION)
    if recovered:
        log.warning(
            "%s %s: data loss accepted for %s of %s (annotation %s=%r)",
            target.kind,
            target.resource,
            naming(recovered),
            topic,
            ACCEPT_ANNOTATION,
            value,
        )
        if not target.static:  # the DataLossAccepted Event now (static topics: their timer)
            await rt.publish()
    else:
        which = "" if chosen is None else f" among {naming(chosen, target.noun)}"
        await rt.kube.event(
            ref,
            "NothingToAccept",
            f'{ACCEPT_ANNOTATION}="{value}": no lost {target.noun}{which}; annotation removed',
        )


async def _refuse(
    rt: OperatorRuntime, target: Target, ref: dict[str, Any], value: str, reason: str, message: str
) -> None:
    """Keep the annotation, say why in the Error condition and (once per value and reason)
    in a warning Event."""
    before = target.wish.annotation_error
    target.wish.annotation_error = (reason, message)
    if before != (reason, message):
        log.warning("%s %s: %s", target.kind, target.resource, message)
        await rt.kube.event(ref, reason, message, warning=True)


async def _on_timer(plural: str, name: str, meta: Any, memo: Any) -> None:
    rt: OperatorRuntime = memo["runtime"]
    wishes = rt.topics if plural == "topics" else memo.get("static_topics", {})
    wish = wishes.get(name)
    value = (meta.get("annotations") or {}).get(ACCEPT_ANNOTATION)
    if wish is None or value is None:
        return
    try:
        await apply_annotation(rt, Target(rt, plural, name, wish), str(value), meta.get("uid"))
    except NotFound:
        return


@kopf.timer(GROUP, VERSION, "topics", interval=1.0, annotations={ACCEPT_ANNOTATION: kopf.PRESENT})
async def accept_topic_data_loss(name: str, meta: Any, memo: Any, **_: Any) -> None:
    await _on_timer("topics", name, meta, memo)


@kopf.timer(
    GROUP, VERSION, "statictopics", interval=1.0, annotations={ACCEPT_ANNOTATION: kopf.PRESENT}
)
async def accept_static_topic_data_loss(name: str, meta: Any, memo: Any, **_: Any) -> None:
    await _on_timer("statictopics", name, meta, memo)


@kopf.on.event(GROUP, VERSION, "topics")
async def topic_annotations(name: str, meta: Any, memo: Any, **_: Any) -> None:
    _clear_when_removed(memo["runtime"].topics.get(name), meta)


@kopf.on.event(GROUP, VERSION, "statictopics")
async def static_topic_annotations(name: str, meta: Any, memo: Any, **_: Any) -> None:
    _clear_when_removed(memo.get("static_topics", {}).get(name), meta)


def _clear_when_removed(wish: Any, meta: Any) -> None:
    """The annotation was removed or changed by hand: a refusal of the old value goes."""
    if wish is None or wish.annotation_error is None:
        return
    value = (meta.get("annotations") or {}).get(ACCEPT_ANNOTATION)
    if value is None or f'="{value}"' not in wish.annotation_error[1]:
        wish.annotation_error = None
