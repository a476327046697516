"""Dynamic broker configs through the controller: committed to the metadata store, pushed to the
brokers, per broker or cluster-wide, incremental or replacing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, ObjectStoreMetadataLog
from tidalmq_core.metadata import BrokerInfo
from tidalmq_core.topics import InvalidConfig

from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker

RATE = "leader.replication.throttled.rate"
FOLLOWER = "follower.replication.throttled.rate"
SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SETTINGS) as c:
        yield c


async def test_set_delete_and_replace(controller: Controller, tmp_path: Path) -> None:
    broker = FakeBroker(controller, 1)
    await controller.register_broker(BrokerInfo(1, "127.0.0.1", 9001), broker)

    assert (
        await controller.alter_broker_configs(
            "1", {RATE: "1000", FOLLOWER: "2000"}, incremental=True, validate_only=False
        )
        is None
    )
    assert controller.metadata.broker_configs == {"1": {RATE: "1000", FOLLOWER: "2000"}}
    # pushed to the brokers (in the background, as every committed batch)
    for _ in range(500):
        if broker.image.broker_configs:
            break
        await asyncio.sleep(0.01)
    assert broker.image.broker_configs == {"1": {RATE: "1000", FOLLOWER: "2000"}}

    await controller.alter_broker_configs("1", {RATE: None}, incremental=True, validate_only=False)
    assert controller.metadata.broker_configs == {"1": {FOLLOWER: "2000"}}
    # AlterConfigs (not incremental) replaces the scope's whole set
    await controller.alter_broker_configs("1", {RATE: "5"}, incremental=False, validate_only=False)
    assert controller.metadata.broker_configs == {"1": {RATE: "5"}}
    await controller.alter_broker_configs(
        "", {FOLLOWER: "7"}, incremental=True, validate_only=False
    )
    assert controller.metadata.broker_configs == {"1": {RATE: "5"}, "": {FOLLOWER: "7"}}
    # deleting the last config of a scope drops the scope
    await controller.alter_broker_configs("1", {RATE: None}, incremental=True, validate_only=False)
    assert controller.metadata.broker_configs == {"": {FOLLOWER: "7"}}

    # committed to the store: a new controller on the same store sees them
    again = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), SETTINGS)
    await again.start()
    try:
        assert again.metadata.broker_configs == {"": {FOLLOWER: "7"}}
    finally:
        await again.stop()


async def test_validate_only_and_errors_change_nothing(controller: Controller) -> None:
    version = controller.metadata.version
    assert (
        await controller.alter_broker_configs(
            "2", {RATE: "1"}, incremental=True, validate_only=True
        )
        is None
    )
    bad_value = await controller.alter_broker_configs(
        "2", {RATE: "x"}, incremental=True, validate_only=False
    )
    unknown = await controller.alter_broker_configs(
        "2", {"log.retention.ms": "1"}, incremental=True, validate_only=False
    )
    bad_scope = await controller.alter_broker_configs(
        "broker-2", {RATE: "1"}, incremental=True, validate_only=False
    )
    assert all(isinstance(e, InvalidConfig) for e in (bad_value, unknown, bad_scope))
    assert controller.metadata.broker_configs == {}
    assert controller.metadata.version == version
