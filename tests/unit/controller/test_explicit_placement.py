"""Topics and partitions placed by the client (kafka-topics --replica-assignment): one broker per
partition, each a live broker; otherwise the controller's round robin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_controller import (
    Batch,
    Controller,
    ControllerSettings,
    InvalidReplicaAssignment,
    NewTopic,
)
from tidalmq_core.metadata import BrokerInfo

from tests.support.controllers import running_controller

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)


class Quiet:
    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        return -1


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SETTINGS) as c:
        for b in (1, 2, 3):
            await c.register_broker(BrokerInfo(b, "127.0.0.1", 9000 + b), Quiet())
        yield c


def owners(controller: Controller, topic: str) -> list[int]:
    return [p.replicas[0] for p in controller.metadata.topics[topic].partitions]


def leaders(controller: Controller, topic: str) -> list[int]:
    return [p.leader for p in controller.metadata.topics[topic].partitions]


async def test_create_and_grow_where_the_client_says(controller: Controller) -> None:
    (r,) = await controller.create_topics([NewTopic("placed", 3, assignment=[3, 3, 1])])
    assert r.error is None and r.num_partitions == 3
    assert owners(controller, "placed") == leaders(controller, "placed") == [3, 3, 1]
    r = await controller.create_partitions("placed", 5, assignment=[2, 2])
    assert r.error is None
    assert owners(controller, "placed") == [3, 3, 1, 2, 2]
    # without an assignment the round robin continues
    await controller.create_partitions("placed", 6)
    assert len(owners(controller, "placed")) == 6


async def test_bad_assignments_change_nothing(controller: Controller) -> None:
    (dead,) = await controller.create_topics([NewTopic("t", 2, assignment=[1, 9])])
    assert isinstance(dead.error, InvalidReplicaAssignment) and "[9]" in str(dead.error)
    (short,) = await controller.create_topics([NewTopic("t", 3, assignment=[1, 2])])
    assert isinstance(short.error, InvalidReplicaAssignment)
    assert "t" not in controller.metadata.topics
    await controller.create_topics([NewTopic("t", 1)])
    grow = await controller.create_partitions("t", 3, assignment=[2])
    assert isinstance(grow.error, InvalidReplicaAssignment)
    assert len(controller.metadata.topics["t"].partitions) == 1
