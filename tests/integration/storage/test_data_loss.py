"""A lost store is detected, never served as empty ([O2]), on both backends: a created
partition whose checkpoint is gone, a checkpoint that ends below the durable floor, an object
the index names but the store lost, and a store whose identity marker vanished. Accepting the
loss continues the partition at its floor, never at 0."""

from __future__ import annotations

import json

import pytest
from tidalmq_broker.storage.api import (
    PartitionConfig,
    PartitionDataLost,
    StorageError,
    StoreLost,
)
from tidalmq_broker.storage.identity import IDENTITY_KEY, MISSING
from tidalmq_broker.storage.keys import checkpoint_key, partition_prefix
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import Cluster
from tests.support.storage_helpers import batch, read_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

TP = TopicPartition("orders", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-00000000d10s"
CFG = PartitionConfig()


async def delete_prefix(cluster: Cluster, prefix: str) -> int:
    store = cluster.inspector()
    try:
        keys = [o.key for o in await store.list(prefix)]
        if keys:
            await store.delete(keys)
        return len(keys)
    finally:
        await store.close()


async def exists(cluster: Cluster, key: str) -> bool:
    store = cluster.inspector()
    try:
        return any(o.key == key for o in await store.list(key))
    finally:
        await store.close()


async def write_and_close(cluster: Cluster, records: int, broker: int = 1) -> None:
    engine = await cluster.engine(broker)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    for _ in range(records // 10):
        await log.append(batch(10))
    assert log.high_watermark == records
    await engine.close_partition(TP)


async def test_a_created_partition_without_checkpoint_is_lost_not_new(cluster: Cluster) -> None:
    await write_and_close(cluster, 300)
    assert await delete_prefix(cluster, "partitions/") > 0
    await delete_prefix(cluster, "wal/")
    engine = await cluster.engine(2)
    with pytest.raises(PartitionDataLost) as lost:
        await engine.open_partition(TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=300)
    assert (lost.value.expected_end, lost.value.found_end) == (300, 0)
    assert lost.value.reason == "checkpoint missing"
    assert isinstance(lost.value, StorageError)  # KAFKA_STORAGE_ERROR in the APIs
    assert engine.get(TP) is None
    assert not await exists(cluster, checkpoint_key(TP, TOPIC_ID)), "created a fresh checkpoint"
    # a partition never opened before is still created as new
    fresh = await engine.open_partition(TopicPartition("orders", 1), TOPIC_ID, 0, CFG)
    assert fresh.high_watermark == 0


async def test_a_checkpoint_short_of_the_floor_is_lost(cluster: Cluster) -> None:
    await write_and_close(cluster, 100)
    engine = await cluster.engine(2)
    with pytest.raises(PartitionDataLost) as lost:
        await engine.open_partition(TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=250)
    assert (lost.value.expected_end, lost.value.found_end) == (250, 100)
    assert "checkpoint ends at 100, expected at least 250" in str(lost.value)
    # the floor met exactly opens as usual
    log = await engine.open_partition(TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=100)
    assert log.high_watermark == 100


async def test_an_accepted_loss_continues_at_the_floor(cluster: Cluster) -> None:
    await write_and_close(cluster, 300)
    await delete_prefix(cluster, "partitions/")
    engine = await cluster.engine(2)
    log = await engine.open_partition(
        TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=300, accepted_from=300
    )
    assert (log.log_start_offset, log.high_watermark) == (300, 300)
    result = await log.append(batch(5))
    assert result.base_offset == 300  # never 0: offsets are not reused
    assert [(b, last) for b, last, _ in await read_all(log, 300)] == [(300, 304)]
    await engine.close_partition(TP)

    # a checkpoint present but short is advanced to the accepted offset
    short = TopicPartition("orders", 7)
    e3 = await cluster.engine(3)
    log = await e3.open_partition(short, TOPIC_ID, 1, CFG)
    await log.append(batch(20))
    await e3.close_partition(short)
    log = await e3.open_partition(
        short, TOPIC_ID, 2, CFG, created=True, end_offset_floor=500, accepted_from=500
    )
    assert (log.log_start_offset, log.high_watermark) == (500, 500)
    assert (await log.append(batch(1))).base_offset == 500


async def test_a_segment_missing_on_read_is_a_storage_error_never_empty(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    for _ in range(10):
        await log.append(batch(10))
    assert await engine.compact_partition(engine.get(TP), force=True) >= 1  # type: ignore[arg-type]
    await engine.close_partition(TP)
    assert await delete_prefix(cluster, partition_prefix(TP, TOPIC_ID) + "segments/") >= 1

    log = await engine.open_partition(TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=100)
    assert log.high_watermark == 100
    with pytest.raises(StorageError, match="missing from the store"):
        await log.read(0, 1 << 20)
    with pytest.raises(StorageError):
        await log.read(55, 1 << 20)


async def test_a_wal_object_missing_on_read_is_a_storage_error(cluster: Cluster) -> None:
    await write_and_close(cluster, 50)  # the clean checkpoint's index names WAL objects
    assert await delete_prefix(cluster, "wal/") >= 1
    engine = await cluster.engine(2)
    log = await engine.open_partition(TP, TOPIC_ID, 2, CFG, created=True, end_offset_floor=50)
    with pytest.raises(StorageError, match="missing from the store"):
        await log.read(0, 1 << 20)


async def test_a_store_without_its_identity_marker_serves_nothing(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    inspector = cluster.inspector()
    try:
        await inspector.put(IDENTITY_KEY, json.dumps({"cluster_id": "c1"}).encode())
        engine.expect_identity("c1", True)
        log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
        await log.append(batch(10))

        await inspector.delete([IDENTITY_KEY])  # wiped under a running broker
        assert await engine.check_identity() == MISSING
        assert engine.store_problem == MISSING
        with pytest.raises(StoreLost):
            await log.append(batch(1))
        with pytest.raises(StoreLost):
            await log.read(0, 1000)
        assert engine.get(TP) is None
        with pytest.raises(StoreLost):
            await engine.open_partition(TP, TOPIC_ID, 1, CFG)

        # another cluster's marker: still nothing
        await inspector.put(IDENTITY_KEY, json.dumps({"cluster_id": "c2"}).encode())
        assert "belongs to cluster c2, not c1" in (await engine.check_identity() or "")

        await inspector.put(IDENTITY_KEY, json.dumps({"cluster_id": "c1"}).encode())
        assert await engine.check_identity() is None
        log = await engine.open_partition(TP, TOPIC_ID, 1, CFG, created=True, end_offset_floor=10)
        assert log.high_watermark == 10  # re-opened through the usual checks
    finally:
        await inspector.close()


async def test_metadata_older_than_the_marker_does_not_stop_the_store(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    engine.expect_identity("c1", False)  # an upgrade: the controller writes the marker soon
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    assert (await log.append(batch(1))).base_offset == 0
    assert engine.store_problem is None
