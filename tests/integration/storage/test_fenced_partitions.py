"""A partition the engine loses to another owner's checkpoint, seen from the broker's partition
manager: it is let go of (hooks, heartbeat) and looked at again, so that a late write by an
earlier owner does not leave the partition unserved while the metadata still names this broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import pytest
from tidalmq_broker import partitions
from tidalmq_broker.partitions import PartitionManager, Wish
from tidalmq_broker.storage.api import ObjectStoreUnavailable, PartitionConfig, PartitionFenced
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import ObjectStore
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import TEST_CONFIG, Cluster
from tests.support.storage_helpers import FaultyStore, batch
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

TP = TopicPartition("orders", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-0000000000f1"
CFG = PartitionConfig()


async def managed_broker(
    backend: Callable[[], ObjectStore], broker_id: int, store: FaultyStore | None = None
) -> tuple[ObjectStreamEngine, PartitionManager, list[tuple[TopicPartition, bool]]]:
    """An engine with the broker's partition manager on it, wired as the broker wires them."""
    manager: list[PartitionManager] = []

    async def on_fenced(tp: TopicPartition) -> None:
        await manager[0].fenced(tp)

    engine = ObjectStreamEngine(
        store or backend(), broker_id, TEST_CONFIG, on_fenced=on_fenced, owns_store=True
    )
    await engine.start()
    pm = PartitionManager(engine, broker_id)
    manager.append(pm)
    hooked: list[tuple[TopicPartition, bool]] = []

    async def hook(tp: TopicPartition, log: object) -> None:
        hooked.append((tp, log is not None))

    pm.add_hook(hook)
    return engine, pm, hooked


wait_for = partial(eventually, timeout_s=10.0, poll_s=0.05)  # this module's default wait


async def test_late_write_by_an_earlier_owner_is_followed_by_a_reopen(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "FENCED_RETRY_S", 0.1)
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(2))
    await engine1.close_partition(TP)  # clean: the next owner writes its epoch with its data

    engine2, pm, hooked = await managed_broker(cluster.backend, 2)
    try:
        pm._adopt(TP, Wish(TOPIC_ID, 2, CFG))
        await wait_for(lambda: engine2.get(TP) is not None)
        first = engine2.get(TP)
        assert first is not None and first.leader_epoch == 2
        # an owner of the earlier epoch writes the checkpoint before our first data does
        engine3 = await cluster.engine(3)
        late = await engine3.open_partition(TP, TOPIC_ID, 1, CFG)
        assert (await late.append(batch(1))).base_offset == 2
        await engine3.close_partition(TP)
        with pytest.raises((PartitionFenced, ObjectStoreUnavailable)):
            await first.append(batch(1))  # our first write loses: nothing acknowledged
        assert (TP, False) in hooked, "the services holding its state let go of it"
        # ... and the partition is opened again at the wished epoch, over what was written
        await wait_for(lambda: engine2.get(TP) is not None and engine2.get(TP) is not first)
        again = engine2.get(TP)
        assert again is not None and again.leader_epoch == 2 and again.high_watermark == 3
        assert (await again.append(batch(1))).base_offset == 3
        assert pm.open_changes()[TP] == 2
    finally:
        await pm.stop()
        await engine2.stop()


async def test_a_newer_owner_keeps_it_until_newer_metadata(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "FENCED_RETRY_S", 0.1)
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(2))
    await engine1.close_partition(TP)

    engine2, pm, _ = await managed_broker(cluster.backend, 2)
    try:
        pm._adopt(TP, Wish(TOPIC_ID, 2, CFG))
        await wait_for(lambda: engine2.get(TP) is not None)
        first = engine2.get(TP)
        assert first is not None
        engine3 = await cluster.engine(3)
        newer = await engine3.open_partition(TP, TOPIC_ID, 3, CFG)
        assert (await newer.append(batch(1))).base_offset == 2
        with pytest.raises((PartitionFenced, ObjectStoreUnavailable)):
            await first.append(batch(1))
        await asyncio.sleep(0.5)  # the retry came and was refused: the checkpoint is newer
        assert engine2.get(TP) is None
        assert pm.open_changes()[TP] is None, "the controller hears it is not open here"
        # newer metadata hands it to this broker at a newer epoch: opened, with the data
        await engine3.close_partition(TP)
        pm._adopt(TP, Wish(TOPIC_ID, 4, CFG))
        await wait_for(lambda: engine2.get(TP) is not None)
        log = engine2.get(TP)
        assert log is not None and log.leader_epoch == 4 and log.high_watermark == 3
    finally:
        await pm.stop()
        await engine2.stop()


async def test_an_open_whose_checkpoint_write_races_an_earlier_owners_close_is_retried(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier owner is still up (its checkpoint unclean) and closes cleanly while the new
    owner recovers: the new owner's checkpoint write loses (If-Match), and its open is tried
    again, from the clean checkpoint, instead of waiting for metadata that never comes."""
    monkeypatch.setattr(partitions, "FENCED_RETRY_S", 0.1)
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(2))
    await log1.commit_checkpoint()  # unclean: its owner is still serving it

    store = FaultyStore(cluster.backend())
    store.gate = asyncio.Event()
    store.gate_match = lambda key: key.startswith("partitions/") and "checkpoint" in key
    engine2, pm, _ = await managed_broker(cluster.backend, 2, store)
    try:
        pm._adopt(TP, Wish(TOPIC_ID, 2, CFG))
        await asyncio.sleep(0.5)  # its open read the unclean checkpoint; its write is held
        assert engine2.get(TP) is None
        assert (await log1.append(batch(1))).base_offset == 2
        await engine1.close_partition(TP)  # the earlier owner's clean close lands first
        store.gate.set()
        await wait_for(lambda: engine2.get(TP) is not None)
        log = engine2.get(TP)
        assert log is not None and log.leader_epoch == 2 and log.high_watermark == 3
        assert (await log.append(batch(1))).base_offset == 3
    finally:
        await pm.stop()
        await engine2.stop()
