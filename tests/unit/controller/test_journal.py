"""The journal (tidalmq_controller/_journal.py): group commit, retries, deposition, snapshots.

Proposals are applied to the image at once and share the next batch while an append is in
flight; an append that fails for any reason but a conflict is retried as the same bytes at the
same version while callers wait; a conflict deposes the journal; a snapshot is written once the
batches since the last one reach its size (at least the minimum), and reads back as the image."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from tidalmq_controller import _journal as journal_module
from tidalmq_controller._journal import Deposed, Journal
from tidalmq_controller._log import Batch, LoadedLog, MemoryMetadataLog
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    apply_batch,
    cluster_record,
    epoch_record,
    partition_record,
    producer_ids_record,
    topic_record,
)


class RecordingLog(MemoryMetadataLog):
    """The in-memory log, with every append attempt recorded and an optional gate that holds
    appends in flight until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[tuple[int, bytes]] = []
        self.gate: asyncio.Event | None = None
        self.snapshot_writes: list[int] = []  # versions, in order (trim drops old snapshots)

    async def write_snapshot(self, version: int, data: bytes) -> None:
        self.snapshot_writes.append(version)
        await super().write_snapshot(version, data)

    async def append(self, batch: Batch) -> None:
        self.attempts.append((batch.version, batch.data))
        if self.gate is not None:
            await self.gate.wait()
        await super().append(batch)


def topic(name: str, partitions: int) -> TopicInfo:
    return TopicInfo(
        name, f"id-{name}", [PartitionState(i % 3, 0, [i % 3]) for i in range(partitions)]
    )


def leader(tp: TopicPartition, broker: int, epoch: int) -> Record:
    return partition_record(tp, leader=broker, leader_epoch=epoch)


TP = TopicPartition("t", 0)


@pytest.fixture
async def log() -> RecordingLog:
    return RecordingLog()


@pytest.fixture
async def journal(log: RecordingLog) -> AsyncIterator[Journal]:
    j = Journal(log, retry_max_s=0.1)
    j.load(LoadedLog(), ClusterMetadata(cluster_id="c"))
    j.start(1)
    yield j
    await j.stop()


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


async def snapshot_settled(j: Journal) -> None:
    """Until the snapshot the last commit started (if any) is stored."""
    task = j._snapshotting
    if task is not None:
        await task


async def test_proposals_made_during_an_append_share_the_next_batch(
    log: RecordingLog, journal: Journal
) -> None:
    log.gate = asyncio.Event()
    applied: list[MetadataDelta] = []
    committed: list[tuple[int, MetadataDelta]] = []
    journal.add_applied_hook(applied.append)
    journal.add_listener(lambda batch, delta: committed.append((batch.version, delta)))
    assert journal.propose([topic_record(topic("t", 2))]) == 1
    await until(lambda: len(log.attempts) == 1)  # batch 1 is in flight
    assert journal.next_version == 2
    assert journal.propose([leader(TP, 2, 1)]) == 2
    assert journal.propose([producer_ids_record(5000)]) == 2
    # applied at once, before anything is durable: later decisions see them
    assert journal.image is not None and journal.image.topics["t"].partitions[0].leader == 2
    assert journal.image.version == 2 and journal.committed_version == 0
    assert len(applied) == 3 and applied[1].partitions == {TP}
    waiters = [asyncio.create_task(journal.committed(v)) for v in (1, 2)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters), "nothing is answered before it is durable"
    log.gate.set()
    await asyncio.gather(*waiters)
    assert [v for v, _ in log.attempts] == [1, 2], "two appends for three proposals"
    assert log.batches[2].records == [leader(TP, 2, 1), producer_ids_record(5000)]
    assert journal.committed_version == 2
    assert [v for v, _ in committed] == [1, 2]
    assert committed[1][1].partitions == {TP} and committed[1][1].other


async def test_a_failed_append_is_retried_as_the_same_batch_while_callers_wait(
    log: RecordingLog, journal: Journal
) -> None:
    log.fail_appends = 2
    waiter = asyncio.create_task(journal.commit([leader(TP, 1, 1)]))
    await until(lambda: len(log.attempts) == 1)
    assert not waiter.done()
    assert journal.propose([epoch_record(1)]) == 2, "new proposals wait in the next batch"
    assert await waiter == 1
    first = log.attempts[0]
    assert log.attempts[:3] == [first, first, first], "same version, same bytes"
    assert log.batches[1].data == first[1]
    await journal.committed(2)
    assert [v for v, _ in log.attempts[3:]] == [2]


async def test_a_conflict_deposes_the_journal(log: RecordingLog) -> None:
    log.batches[1] = Batch(1, 9, [epoch_record(9)])  # a successor appended version 1 first
    log.gate = asyncio.Event()
    j = Journal(log)
    j.load(LoadedLog(), ClusterMetadata(cluster_id="c"))
    reasons: list[str] = []
    j.on_deposed = reasons.append
    j.start(1)
    try:
        first = asyncio.create_task(j.commit([epoch_record(1)]))
        await until(lambda: len(log.attempts) == 1)
        second = asyncio.create_task(j.commit([leader(TP, 1, 1)]))  # joins batch 2
        await asyncio.sleep(0)
        log.gate.set()
        for waiter in (first, second):
            with pytest.raises(Deposed):
                await waiter
        assert j.deposed and len(reasons) == 1
        with pytest.raises(Deposed):
            j.propose([epoch_record(1)])
        with pytest.raises(Deposed):
            await j.committed(1)
        assert log.batches[1].epoch == 9 and 2 not in log.batches
        assert len(log.attempts) == 1, "no retry after a conflict"
    finally:
        await j.stop()


async def test_stop_fails_the_waiters(log: RecordingLog, journal: Journal) -> None:
    log.gate = asyncio.Event()
    waiter = asyncio.create_task(journal.commit([epoch_record(1)]))
    await until(lambda: len(log.attempts) == 1)
    await journal.stop()
    with pytest.raises(Deposed):
        await waiter


async def test_committed_refuses_a_version_never_proposed(journal: Journal) -> None:
    with pytest.raises(RuntimeError):
        await journal.committed(3)
    await journal.committed(0)  # committed already (nothing): returns


async def test_a_snapshot_is_due_when_the_batches_since_reach_its_size(log: RecordingLog) -> None:
    """Snapshot bytes per record byte stay at most one: the next snapshot is written once the
    batches since the last reach that snapshot's size (the minimum being smaller here)."""
    base = ClusterMetadata(cluster_id="c", version=1)
    base.topics["t"] = topic("t", 60)
    data = snapshots.encode_bytes(base)
    log.snapshots[1] = data
    j = Journal(log, snapshot_min_bytes=1)
    j.load(await log.load(), ClusterMetadata(cluster_id="c"))
    j.start(2)
    try:
        size, since, expected = len(data), 0, []
        for i in range(120):
            v = await j.commit([leader(TopicPartition("t", i % 60), i % 3, i)])
            await snapshot_settled(j)
            since += len(log.batches[v].data)
            if since >= size:
                expected.append(v)
                size, since = len(log.snapshots[v]), 0
        assert len(expected) >= 2, "the test must cross the threshold more than once"
        assert log.snapshot_writes == expected
        assert j.snapshot_version == expected[-1]
    finally:
        await j.stop()


async def test_the_minimum_applies_while_snapshots_are_small(log: RecordingLog) -> None:
    j = Journal(log, snapshot_min_bytes=3000)
    j.load(LoadedLog(), ClusterMetadata(cluster_id="c"))
    j.start(1)
    try:
        await j.commit([cluster_record("c"), epoch_record(1), topic_record(topic("t", 3))])
        await j.write_snapshot()  # as a controller does for a new cluster: small
        assert len(log.snapshots[1]) < 3000
        since = 0
        while since < 3000:
            assert log.snapshot_writes == [1], f"snapshot after {since} bytes (min 3000)"
            v = await j.commit([leader(TP, since % 3, since)])
            await snapshot_settled(j)
            since += len(log.batches[v].data)
        assert log.snapshot_writes == [1, v]
    finally:
        await j.stop()


async def test_batches_since(log: RecordingLog, monkeypatch: pytest.MonkeyPatch) -> None:
    meta = ClusterMetadata(cluster_id="c", version=5)
    meta.topics["t"] = topic("t", 1)
    log.snapshots[5] = snapshots.encode_bytes(meta)
    for v in (6, 7, 8):
        await log.append(Batch(v, 1, [leader(TP, v % 3, v)]))
    j = Journal(log)
    image = j.load(await log.load(), ClusterMetadata(cluster_id="other"))
    assert image.version == 8 and image.topics["t"].partitions[0].leader_epoch == 8
    assert j.committed_version == 8 and j.snapshot_version == 5
    assert [b.version for b in j.batches_since(5) or []] == [6, 7, 8]
    assert [b.version for b in j.batches_since(7) or []] == [8]
    assert j.batches_since(8) == [] and j.batches_since(9) == []
    assert j.batches_since(4) is None, "older than what is kept: send the snapshot"
    monkeypatch.setattr(journal_module, "RING_MIN_BATCHES", 2)
    j.start(2)
    try:
        for i in range(3):
            await j.commit([leader(TP, i, 10 + i)])  # 9, 10, 11
        assert await j.write_snapshot() == 11
        assert j.batches_since(5) is None, "the snapshot covers them and they were dropped"
        assert [b.version for b in j.batches_since(9) or []] == [10, 11]
        assert j.batches_since(8) is None
    finally:
        await j.stop()


async def test_a_written_snapshot_reads_back_as_the_image(log: RecordingLog) -> None:
    j = Journal(log)
    j.load(LoadedLog(), ClusterMetadata(cluster_id="c"))
    j.start(1)
    try:
        await j.commit([cluster_record("c"), epoch_record(1), topic_record(topic("t", 4))])
        assert await j.write_snapshot() == 1  # from nothing: a new cluster
        for i in range(5):
            j.propose([leader(TopicPartition("t", i % 4), i % 3, i + 1)])
        await j.commit([producer_ids_record(7000), topic_record(topic("u", 2))])
        await j.commit([leader(TopicPartition("u", 1), 2, 5)])
        version = await j.write_snapshot()  # from the previous snapshot and the batches since
        assert version == j.committed_version == 3
        assert j.image is not None
        assert snapshots.decode(log.snapshots[version]) == j.image
        assert j.snapshot_bytes == log.snapshots[version]
        assert await j.write_snapshot() == version, "nothing new: no new snapshot"
        # and the log loads to the same image
        loaded = await log.load()
        assert loaded.snapshot_version == version and loaded.image() == j.image
    finally:
        await j.stop()


async def test_a_loaded_log_is_the_image_the_batches_build(log: RecordingLog) -> None:
    meta = ClusterMetadata(cluster_id="")
    records = [[cluster_record("c"), topic_record(topic("t", 2))], [leader(TP, 1, 4)]]
    for v, recs in enumerate(records, 1):
        await log.append(Batch(v, 1, recs))
        apply_batch(meta, recs, v)
    log.snapshots[1] = snapshots.roll(None, [(1, records[0])], ClusterMetadata(cluster_id=""))
    j = Journal(log)
    assert j.load(await log.load(), ClusterMetadata(cluster_id="x")) == meta
    assert j.next_version == 3
