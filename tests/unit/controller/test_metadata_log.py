"""The metadata log (tidalmq_controller/_log.py): both implementations, the object store one on a
real local-directory store, through one parametrized fixture. A version is appended once
(another controller's batch there is a LogConflict, our own retried batch is not); loading reads
the newest snapshot and the batches after it, and refuses a log with a hole; trimming keeps two
snapshots; the single document of the earlier design is read as the first snapshot and dropped
once a real snapshot exists."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tidalmq_broker.storage.objectstore.base import ObjectNotFound
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings
from tidalmq_controller._log import (
    Batch,
    LoadedLog,
    LogConflict,
    MemoryMetadataLog,
    MetadataLost,
    ObjectStoreMetadataLog,
)
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import (
    Record,
    apply_batch,
    cluster_record,
    epoch_record,
    partition_record,
    topic_record,
)

# no broker here and no timeout under test: sessions and an election timeout that a loaded
# machine never runs into
PATIENT = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=5.0,
    clock_margin_s=0.05,
    election_timeout_s=3.0,
    auto_rebalance=False,
    offsets_topic_partitions=2,
    tick_s=0.01,
)


@dataclass
class Subject:
    """A log under test and a look at what it stores."""

    log: ObjectStoreMetadataLog | MemoryMetadataLog
    store: LocalDirObjectStore | None = None

    async def batch_versions(self) -> list[int]:
        if isinstance(self.log, MemoryMetadataLog):
            return sorted(self.log.batches)
        assert self.store is not None
        return [int(o.key.rsplit("/", 1)[1]) for o in await self.store.list("cluster/log/")]

    async def snapshot_versions(self) -> list[int]:
        if isinstance(self.log, MemoryMetadataLog):
            return sorted(self.log.snapshots)
        assert self.store is not None
        return [int(o.key.rsplit("/", 1)[1]) for o in await self.store.list("cluster/snapshots/")]

    async def lose_batch(self, version: int) -> None:
        if isinstance(self.log, MemoryMetadataLog):
            del self.log.batches[version]
        else:
            assert self.store is not None
            await self.store.delete([f"cluster/log/{version:020d}"])


@pytest.fixture(params=["objectstore", "memory"])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    if request.param == "memory":
        yield Subject(MemoryMetadataLog())
        return
    store = LocalDirObjectStore(tmp_path / "objects")
    yield Subject(ObjectStoreMetadataLog(store), store)
    await store.close()


TP = TopicPartition("t", 0)


def records_of(version: int) -> list[Record]:
    """Batch `version` of a small log: a cluster and a topic, then one leader change each."""
    if version == 1:
        topic = TopicInfo("t", "id-t", [PartitionState(0, 0, [0]), PartitionState(1, 0, [1])])
        return [cluster_record("c"), epoch_record(1), topic_record(topic)]
    return [partition_record(TP, leader=version % 3, leader_epoch=version)]


def batch(version: int) -> Batch:
    return Batch(version, 1, records_of(version))


def image_after(version: int) -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="")
    for v in range(1, version + 1):
        apply_batch(meta, records_of(v), v)
    return meta


async def append_all(log: ObjectStoreMetadataLog | MemoryMetadataLog, last: int) -> None:
    for v in range(1, last + 1):
        await log.append(batch(v))


async def test_an_empty_log_loads_empty(subject: Subject) -> None:
    loaded = await subject.log.load()
    assert loaded.empty and loaded.head == 0 and loaded.image() is None
    assert not loaded.stored_snapshot


async def test_appended_batches_load_in_order(subject: Subject) -> None:
    await append_all(subject.log, 12)  # past 9: keys sort by version, not as text
    loaded = await subject.log.load()
    assert [b.version for b in loaded.batches] == list(range(1, 13))
    assert loaded.head == 12
    assert loaded.batches[4].records == records_of(5) and loaded.batches[4].epoch == 1


async def test_another_controllers_batch_at_our_version_is_a_conflict(subject: Subject) -> None:
    mine = Batch(1, 2, [epoch_record(2)])
    await subject.log.append(Batch(1, 3, [epoch_record(3)]))  # a successor appended first
    with pytest.raises(LogConflict):
        await subject.log.append(mine)
    loaded = await subject.log.load()
    assert [b.epoch for b in loaded.batches] == [3], "the winner's batch stays"


async def test_our_own_batch_appended_again_is_not_a_conflict(subject: Subject) -> None:
    """An append whose answer was lost is retried with the same bytes: that is success."""
    first = batch(1)
    await subject.log.append(first)
    await subject.log.append(Batch(first.version, first.epoch, first.records, first.data))
    assert await subject.batch_versions() == [1]
    # the same records encoded at another moment are other bytes: not ours
    other = Batch(1, 1, records_of(1), first.data.replace(b'"ts":', b'"ts":1'))
    with pytest.raises(LogConflict):
        await subject.log.append(other)


async def test_confirm_says_whether_the_next_version_is_still_free(subject: Subject) -> None:
    await append_all(subject.log, 2)
    assert await subject.log.confirm(1, 3)
    await subject.log.append(Batch(3, 2, [epoch_record(2)]))
    assert not await subject.log.confirm(1, 3)


async def test_load_is_the_newest_snapshot_and_the_batches_after_it(subject: Subject) -> None:
    await append_all(subject.log, 6)
    await subject.log.write_snapshot(2, snapshots.encode_bytes(image_after(2)))
    await subject.log.write_snapshot(4, snapshots.encode_bytes(image_after(4)))
    loaded = await subject.log.load()
    assert loaded.stored_snapshot and loaded.snapshot_version == 4
    assert loaded.snapshot == snapshots.encode_bytes(image_after(4))
    assert [b.version for b in loaded.batches] == [5, 6]
    assert loaded.head == 6
    assert loaded.image() == image_after(6)


async def test_a_hole_in_the_batches_is_lost_metadata(subject: Subject) -> None:
    await append_all(subject.log, 5)
    await subject.log.write_snapshot(1, snapshots.encode_bytes(image_after(1)))
    await subject.lose_batch(3)
    with pytest.raises(MetadataLost):
        await subject.log.load()


async def test_a_log_without_a_snapshot_loads_from_its_batches(subject: Subject) -> None:
    """A controller that stopped (or whose store failed) between the first commit of a new
    cluster and its first snapshot leaves batches and no snapshot: they are the image."""
    await append_all(subject.log, 3)
    loaded = await subject.log.load()
    assert not loaded.empty and loaded.snapshot is None
    assert loaded.image() == image_after(3)


async def test_trim_keeps_two_snapshots_and_the_batches_after_the_older(subject: Subject) -> None:
    await append_all(subject.log, 8)
    await subject.log.write_snapshot(2, snapshots.encode_bytes(image_after(2)))
    await subject.log.trim()
    assert await subject.batch_versions() == list(range(1, 9)), "one snapshot: keep every batch"
    await subject.log.write_snapshot(4, snapshots.encode_bytes(image_after(4)))
    await subject.log.write_snapshot(6, snapshots.encode_bytes(image_after(6)))
    await subject.log.trim()
    assert await subject.snapshot_versions() == [4, 6]
    assert await subject.batch_versions() == [5, 6, 7, 8]
    loaded = await subject.log.load()
    assert loaded.snapshot_version == 6 and loaded.image() == image_after(8)


async def test_a_snapshot_written_again_keeps_its_first_content(subject: Subject) -> None:
    first = snapshots.encode_bytes(image_after(2))
    await subject.log.write_snapshot(2, first)
    await subject.log.write_snapshot(2, snapshots.encode_bytes(image_after(1)))
    assert (await subject.log.load()).snapshot == first


# ------------------------------------------------------------------ the object store's own
async def test_batches_are_objects_created_only_if_absent(tmp_path: Path) -> None:
    """Two controllers on one store: the one that appends a version second is deposed."""
    store = LocalDirObjectStore(tmp_path / "objects")
    first, second = ObjectStoreMetadataLog(store), ObjectStoreMetadataLog(store)
    mine = batch(1)
    await first.append(mine)
    assert await store.get("cluster/log/00000000000000000001") == mine.data, "stored as encoded"
    with pytest.raises(LogConflict):
        await second.append(Batch(1, 2, [epoch_record(2)]))
    assert not await second.confirm(2, 1) and await second.confirm(2, 2)


def legacy_document(version: int) -> bytes:
    meta = image_after(1)
    meta.version = version
    meta.controller_epoch = 4
    return json.dumps(meta.to_json()).encode()


async def test_the_earlier_single_document_is_read_as_a_snapshot(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path / "objects")
    log = ObjectStoreMetadataLog(store)
    await store.put("cluster/metadata.json", legacy_document(17))
    loaded = await log.load()
    assert loaded.snapshot_version == 17 and loaded.head == 17
    assert not loaded.stored_snapshot, "the controller must write a real snapshot"
    image = loaded.image()
    assert image is not None and image.version == 17 and image.controller_epoch == 4
    assert image.topics == image_after(1).topics
    await log.append(Batch(18, 5, [partition_record(TP, leader=1, leader_epoch=9)]))
    loaded = await log.load()
    assert [b.version for b in loaded.batches] == [18]
    image = loaded.image()
    assert image is not None and image.topics["t"].partitions[0].leader_epoch == 9
    await log.trim()  # no snapshot yet: the document is all there is
    assert await store.get("cluster/metadata.json")
    await log.write_snapshot(18, snapshots.encode_bytes(image))
    await log.trim()
    with pytest.raises(ObjectNotFound):
        await store.get("cluster/metadata.json")
    loaded = await log.load()
    assert loaded.stored_snapshot and loaded.snapshot_version == 18 and loaded.image() == image


async def test_a_controller_on_the_earlier_document_continues_it(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path / "objects")
    await store.put("cluster/metadata.json", legacy_document(17))
    c = Controller(ObjectStoreMetadataLog(store), PATIENT)
    await c.start()
    try:
        assert c.image.cluster_id == "c" and c.image.controller_epoch == 5
        assert c.journal.committed_version == 18
        assert "t" in c.image.topics
        with pytest.raises(ObjectNotFound):
            await store.get("cluster/metadata.json")
        loaded = await ObjectStoreMetadataLog(store).load()
        assert loaded.stored_snapshot and loaded.image() == c.image
    finally:
        await c.stop()


async def test_a_controller_whose_first_snapshot_failed_keeps_its_cluster() -> None:
    """The store failed right after a new cluster's first commit (its first snapshot not
    written): the next controller must continue that cluster, not start another one."""
    log = MemoryMetadataLog()
    original = log.write_snapshot

    async def failing(version: int, data: bytes) -> None:
        raise OSError("store unavailable (injected)")

    log.write_snapshot = failing  # type: ignore[method-assign]
    first = Controller(log, PATIENT)
    with pytest.raises(OSError):
        await first.start()
    cluster_id = first.image.cluster_id
    await first.stop()
    assert sorted(log.batches) == [1] and not log.snapshots
    log.write_snapshot = original  # type: ignore[method-assign]
    second = Controller(log, PATIENT)
    await second.start()
    try:
        assert second.image.cluster_id == cluster_id
        assert second.image.controller_epoch == 2
        loaded = await log.load()
        assert loaded.stored_snapshot and loaded.image() == second.image
    finally:
        await second.stop()


def test_loaded_log_head_and_image_without_batches() -> None:
    meta = image_after(2)
    loaded = LoadedLog(snapshot=snapshots.encode_bytes(meta), snapshot_version=2)
    assert loaded.head == 2 and not loaded.empty and loaded.image() == meta
    assert dataclasses.replace(loaded, batches=[batch(3)]).head == 3
