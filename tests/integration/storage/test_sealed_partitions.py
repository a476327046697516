"""Sealed partitions (static topics' closed physical queues): sealing after a clean close or a
crash, compacting them, reading them with no broker owning them, and the producer-state
Double-Read-Check. Against the local-directory store and a real S3 server."""

from __future__ import annotations

import pytest
from tidalmq_broker.storage import keys
from tidalmq_broker.storage.api import PartitionConfig, PartitionFenced
from tidalmq_broker.storage.checkpoint import CheckpointStore
from tidalmq_broker.storage.producer_state import BatchMeta, ProducerEntry
from tidalmq_broker.storage.sealed import (
    ClosedPartitionReader,
    compact_sealed,
    is_sealed,
    seal_partition,
)
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import Cluster
from tests.support.client_batches import client_batch
from tests.support.storage_helpers import batch, batches_of, payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

OLD = TopicPartition("__sq.orders", 0)
NEW = TopicPartition("__sq.orders", 1)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-0000000000aa"
CFG = PartitionConfig()


async def read_everything(reader: ClosedPartitionReader, max_bytes: int = 3000) -> list[bytes]:
    out = []
    offset = 0
    while True:
        data = await reader.read(offset, max_bytes)
        if not data:
            return out
        for base, last, tail in batches_of(data):
            assert base <= offset <= last or base > offset
            out.append(tail)
            offset = last + 1


async def test_seal_after_a_clean_close_fences_and_reads_everything(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(OLD, TOPIC_ID, 3, CFG)
    sent = [batch(2, tag=b"c%d" % i) for i in range(60)]
    for b in sent:
        await log.append(b)
    await engine.close_partition(OLD)
    store = cluster.inspector()
    try:
        sealed = await seal_partition(store, OLD, TOPIC_ID)
        assert not sealed.recovered and sealed.end_offset == 120
        assert sealed.checkpoint.leader_epoch == 4 and is_sealed(sealed.checkpoint)
        assert sealed.time_of_end > 0
        again = await seal_partition(store, OLD, TOPIC_ID)  # idempotent
        assert again.checkpoint.leader_epoch == 4
        reader = ClosedPartitionReader(store, OLD, TOPIC_ID, read_ahead_bytes=8000)
        got = await read_everything(reader)
        assert [t[4:] for t in got] == [payload(b)[4:] for b in sent]
        # its old owner can never take it back at its epoch
        with pytest.raises(PartitionFenced):
            await engine.open_partition(OLD, TOPIC_ID, 3, CFG)
    finally:
        await store.close()


async def test_seal_after_a_crash_recovers_every_acknowledged_batch(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(OLD, TOPIC_ID, 1, CFG)
    await log.commit_checkpoint(force=True)  # a checkpoint early on, then only WAL objects
    sent = [batch(1, tag=b"u%d" % i) for i in range(25)]
    for b in sent:
        await log.append(b)
    await engine.abandon()  # kill -9: no clean checkpoint
    store = cluster.inspector()
    try:
        sealed = await seal_partition(store, OLD, TOPIC_ID)
        assert sealed.recovered and sealed.end_offset == 25
        reader = ClosedPartitionReader(store, OLD, TOPIC_ID)
        assert [t[4:] for t in await read_everything(reader)] == [payload(b)[4:] for b in sent]
    finally:
        await store.close()


async def test_sealing_a_partition_that_was_never_opened_gives_an_empty_log(
    cluster: Cluster,
) -> None:
    store = cluster.inspector()
    try:
        sealed = await seal_partition(store, NEW, TOPIC_ID, min_epoch=2)
        assert sealed.end_offset == 0 and sealed.checkpoint.leader_epoch == 2
        assert await ClosedPartitionReader(store, NEW, TOPIC_ID).read(0, 100) == b""
    finally:
        await store.close()


async def test_compacting_a_sealed_partition_keeps_its_data(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(OLD, TOPIC_ID, 1, CFG)
    sent = [batch(3, tag=b"k%d" % i, timestamp_ms=1000 + i) for i in range(40)]
    for b in sent:
        await log.append(b)
    await engine.close_partition(OLD)
    store = cluster.inspector()
    try:
        await seal_partition(store, OLD, TOPIC_ID)
        assert await compact_sealed(store, OLD, TOPIC_ID, granule_bytes=2000) == 1
        loaded = await CheckpointStore(store).load(keys.checkpoint_key(OLD, TOPIC_ID))
        assert loaded is not None
        cp = loaded[0]
        assert is_sealed(cp) and not any(e.in_wal for e in cp.index) and len(cp.index) > 1
        assert await compact_sealed(store, OLD, TOPIC_ID) == 0  # nothing left to do
        reader = ClosedPartitionReader(store, OLD, TOPIC_ID)
        assert [t[4:] for t in await read_everything(reader)] == [payload(b)[4:] for b in sent]
        found = await reader.offset_for_timestamp(1020)
        assert found is not None and found.offset == 60 and found.timestamp == 1020
        assert await reader.offset_for_timestamp(5000) is None
    finally:
        await store.close()


async def test_a_sealed_partition_finds_timestamps_per_record(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(OLD, TOPIC_ID, 1, CFG)
    await log.append(client_batch([1000 + 10 * i for i in range(5)], compression=4))  # zstd
    await engine.close_partition(OLD)
    store = cluster.inspector()
    try:
        await seal_partition(store, OLD, TOPIC_ID)
        reader = ClosedPartitionReader(store, OLD, TOPIC_ID)
        found = await reader.offset_for_timestamp(1015)
        assert found is not None and (found.offset, found.timestamp) == (2, 1020)
    finally:
        await store.close()


async def test_sequential_reads_of_a_sealed_partition_read_ahead(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(OLD, TOPIC_ID, 1, CFG)
    for i in range(50):
        await log.append(batch(1, value_size=400, tag=b"r%d" % i))
    await engine.close_partition(OLD)
    store = cluster.stores[0]
    await seal_partition(store, OLD, TOPIC_ID)
    reader = ClosedPartitionReader(store, OLD, TOPIC_ID, read_ahead_bytes=64 * 1024)
    await reader.load()
    store.reset()
    got = await read_everything(reader, max_bytes=600)  # one batch per read
    assert len(got) == 50
    # 50 reads of one WAL range each: read-ahead fetched the later ranges in parallel with
    # the first ones, and no range was fetched twice
    assert store.ops["ranged_get"] <= 51, store.ops
    assert store.ops["bytes_read"] < 50 * 500, store.ops


async def test_producer_state_double_read_check(cluster: Cluster) -> None:
    """The new physical queue does not know the producer; it adopts the state the sealed one
    kept, so a retry of a batch written there is a duplicate and the next batch continues."""
    engine = await cluster.engine(1)
    old = await engine.open_partition(OLD, TOPIC_ID, 1, CFG)
    for seq in range(0, 10, 2):
        await old.append(batch(2, producer_id=77, producer_epoch=0, base_sequence=seq))
    await engine.close_partition(OLD)
    store = cluster.inspector()
    try:
        await seal_partition(store, OLD, TOPIC_ID)
        previous = ClosedPartitionReader(store, OLD, TOPIC_ID)
        await previous.load()
        entry = previous.producers().producers[77]
        new = await engine.open_partition(NEW, TOPIC_ID, 0, CFG)
        assert new.producer_entry(77) is None
        # the old queue's offsets 0-9 become -10..-1 here (logic offsets continue at 10)
        shift = -10
        translated = ProducerEntry(entry.epoch, last_seen_ms=entry.last_seen_ms)
        for b in entry.batches:
            translated.batches.append(
                BatchMeta(b.first_seq, b.last_seq, b.base_offset + shift, b.last_offset + shift)
            )
        assert new.adopt_producer(77, translated) and not new.adopt_producer(77, translated)
        retry = await new.append(batch(2, producer_id=77, producer_epoch=0, base_sequence=8))
        assert retry.duplicate and (retry.base_offset, retry.last_offset) == (-2, -1)
        nxt = await new.append(batch(2, producer_id=77, producer_epoch=0, base_sequence=10))
        assert not nxt.duplicate and nxt.base_offset == 0 and new.high_watermark == 2
    finally:
        await store.close()
