"""What each broker leads, by a walk of the whole metadata: the reference the controller's
index-based count (Controller.leaders_per_broker) is checked against."""

from __future__ import annotations

from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.static_mapping import PHYSICAL_PREFIX


def walked_leaders(meta: ClusterMetadata) -> dict[int, int]:
    led: dict[int, int] = {}
    for topic in meta.topics.values():
        if topic.kind == "static":
            continue
        wanted = None
        if topic.kind == "physical":
            state = meta.static_topics.get(topic.name[len(PHYSICAL_PREFIX) :])
            wanted = state.view().writable() if state is not None else set()
        for i, part in enumerate(topic.partitions):
            if wanted is None or i in wanted:
                led[part.leader] = led.get(part.leader, 0) + 1
    return {b: n for b, n in led.items() if n}
