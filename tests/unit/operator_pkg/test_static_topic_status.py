"""A StaticTopic's status (tidalmq_operator.static_topics.static_topic_status_of) from the
controller's metadata: in the middle of a remap, when the mapping copies are at two epochs, the
status says so (Reconciling/Ready CopiesDisagree) instead of failing, and once every copy is
at the new epoch it is Ready again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tidalmq_controller import Controller, ControllerSettings
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.static_mapping import complete, initial_mapping, physical_topic_name, switch_new
from tidalmq_operator.static_topics import StaticTopicWish, static_topic_status_of

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)


@pytest.fixture
async def controller() -> AsyncIterator[Controller]:
    c = Controller(MemoryMetadataLog(), SETTINGS)
    await c.start()
    yield c
    await c.stop()


def conditions(status: dict[str, Any]) -> dict[str, tuple[bool, str, str]]:
    return {
        c["type"]: (c["status"] == "True", c["reason"], c["message"]) for c in status["conditions"]
    }


async def test_copies_at_two_epochs_mid_remap_are_reported_then_ready(controller) -> None:  # type: ignore[no-untyped-def]
    c = controller
    placement = [0, 1, 2]
    phys_name = physical_topic_name("events")

    def create(m: ClusterMetadata) -> None:  # what the manager's create commits
        m.static_topics["events"] = initial_mapping(
            "events", 3, placement, brokers=None, now_ms=1, copy_brokers=placement
        )
        for name, kind in ((phys_name, "physical"), ("events", "static")):
            m.topics[name] = TopicInfo(
                name,
                str(uuid.uuid4()),
                [PartitionState(b, 0, [b]) for b in placement],
                {},
                internal=kind == "physical",
                kind=kind,
            )

    await c.update(create)
    wish = StaticTopicWish("events", "events", 3, generation=2)
    status = static_topic_status_of(c, wish)
    assert conditions(status)["Ready"][0] and status["epoch"] == 0

    def c1(m: ClusterMetadata) -> None:  # an availability remap's "switch new": broker 1's copy
        phys = m.topics[phys_name]  # moves to epoch 1, the others are still at 0
        phys.partitions[0].leader = NO_LEADER
        phys.partitions.append(PartitionState(1, 0, [1]))
        switch_new(
            m.static_topics["events"],
            0,
            1,
            len(phys.partitions) - 1,
            known_end=11,
            now_ms=2,
            target_epoch=1,
        )
        c.static.sync_view(m, "events")

    await c.update(c1)
    assert not c.static.describe("events")["consistent"]
    status = static_topic_status_of(c, wish)  # raised AttributeError here (the timer then paused)
    seen = conditions(status)
    assert seen["Reconciling"][:2] == (True, "CopiesDisagree")
    assert seen["Ready"][:2] == (False, "CopiesDisagree")
    assert "epoch" in seen["Ready"][2] and seen["Ready"][2] == seen["Reconciling"][2]
    assert not seen["Degraded"][0] and not seen["Error"][0]
    queue0 = status["queues"][0]
    assert (queue0["broker"], queue0["gen"], queue0["items"]) == (1, 1, 2)
    assert c.metadata.topics["events"].partitions[0].leader == 1  # writable on the new broker

    def c3(m: ClusterMetadata) -> None:  # old queue closed at 11, every copy rewritten at 1
        complete(
            m.static_topics["events"],
            ends={0: (11, 3)},
            targets={},
            allocate=no_queue,
            now_ms=3,
            target_epoch=1,
            copy_brokers=placement,
        )
        c.static.sync_view(m, "events")

    def no_queue(q: int, broker: int) -> int:
        raise AssertionError(f"an availability remap allocates no queue at the end ({q}, {broker})")

    await c.update(c3)
    status = static_topic_status_of(c, wish)
    assert conditions(status)["Ready"][:2] == (True, "Serving") and status["epoch"] == 1
    assert conditions(status)["Reconciling"][:2] == (False, "Settled")
