"""`__transaction_state` is created by the controller on the first transactional request (not
with the cluster), with transaction.state.log.num.partitions partitions, once, and is internal:
clients cannot create, delete, grow or reconfigure it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_controller import (
    Controller,
    InternalTopic,
    NewTopic,
    TopicAlreadyExists,
)
from tidalmq_core.metadata import OFFSETS_TOPIC, TXN_STATE_TOPIC, BrokerInfo

from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker
from tests.unit.controller.test_acls import SETTINGS


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    settings = dataclasses.replace(SETTINGS, transaction_state_partitions=7)
    async with running_controller(tmp_path, settings) as c:
        yield c


async def test_created_on_demand_once_and_internal(controller: Controller) -> None:
    await controller.register_broker(BrokerInfo(1, "127.0.0.1", 9001), FakeBroker(controller, 1))
    for _ in range(500):
        if OFFSETS_TOPIC in controller.metadata.topics:
            break
        await asyncio.sleep(0.01)
    assert TXN_STATE_TOPIC not in controller.metadata.topics  # not until a producer needs it
    (refused,) = await controller.create_topics([NewTopic(TXN_STATE_TOPIC, 3)])
    assert isinstance(refused.error, TopicAlreadyExists) and "internal" in str(refused.error)
    await asyncio.gather(*(controller.ensure_transaction_state_topic() for _ in range(3)))
    topic = controller.metadata.topics[TXN_STATE_TOPIC]
    assert topic.internal and len(topic.partitions) == 7
    await controller.ensure_transaction_state_topic()  # exists: nothing changes
    assert controller.metadata.topics[TXN_STATE_TOPIC].topic_id == topic.topic_id
    assert isinstance((await controller.create_partitions(TXN_STATE_TOPIC, 9)).error, InternalTopic)
    (deleted,) = await controller.delete_topics([TXN_STATE_TOPIC])
    assert isinstance(deleted.error, InternalTopic)
    altered = await controller.alter_topic_configs(
        TXN_STATE_TOPIC, {"retention.ms": "1"}, incremental=True, validate_only=False
    )
    assert isinstance(altered.error, InternalTopic)
