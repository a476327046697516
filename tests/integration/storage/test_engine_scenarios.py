"""Scenarios of the stream engine, each against the local-directory store and a real S3 server."""

from __future__ import annotations

import asyncio
import time

import pytest
from tidalmq_broker.storage.api import (
    ObjectStoreUnavailable,
    OffsetOutOfRange,
    PartitionConfig,
    PartitionFenced,
)
from tidalmq_broker.storage.health import probe_key
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import Cluster
from tests.support.storage_helpers import batch, batches_of, payload, read_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

TP = TopicPartition("orders", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-000000000001"
CFG = PartitionConfig()


async def count_objects(cluster: Cluster, prefix: str) -> int:
    store = cluster.inspector()
    try:
        return len(await store.list(prefix))
    finally:
        await store.close()


async def test_append_read_round_trip(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    sent = [batch(3, tag=b"b%d" % i) for i in range(40)]
    results = [await log.append(b) for b in sent]
    assert [r.base_offset for r in results] == [3 * i for i in range(40)]
    assert log.high_watermark == 120
    got = await read_all(log)
    assert [(base, last) for base, last, _ in got] == [(3 * i, 3 * i + 2) for i in range(40)]
    assert [tail[4:] for _, _, tail in got] == [payload(b)[4:] for b in sent]
    # a read from the middle of a batch starts at that batch; at the high watermark it is empty
    middle = await log.read(4, 1 << 20)
    assert batches_of(middle.records)[0][0] == 3
    end = await log.read(120, 1 << 20)
    assert end.records == b"" and end.high_watermark == 120
    with pytest.raises(OffsetOutOfRange):
        await log.read(121, 100)


async def test_many_partitions_share_one_flush_object(cluster: Cluster) -> None:
    engine = await cluster.engine(1, flush_interval_ms=200)
    logs = [
        await engine.open_partition(TopicPartition("fanout", i), TOPIC_ID, 1, CFG)
        for i in range(20)
    ]
    store = cluster.stores[0]
    before = store.wal_puts()
    results = await asyncio.gather(*(log.append(batch(2)) for log in logs))
    assert all(r.base_offset == 0 for r in results)
    assert store.wal_puts() - before == 1
    assert all(log.high_watermark == 2 for log in logs)


async def test_appends_complete_only_after_the_wal_object_is_durable(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    store = cluster.stores[0]
    store.gate = asyncio.Event()
    task = asyncio.create_task(log.append(batch(1)))
    await asyncio.sleep(0.3)
    assert not task.done(), "acknowledged before its WAL object was written"
    assert log.high_watermark == 0
    assert (await log.read(0, 1000)).records == b""
    store.gate.set()
    result = await asyncio.wait_for(task, 10)
    assert result.base_offset == 0 and log.high_watermark == 1


@pytest.mark.parametrize("mode", ["before", "after"])
async def test_failed_flush_fails_appends_and_never_reuses_acknowledged_offsets(
    cluster: Cluster, mode: str
) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    ok = await log.append(batch(2, tag=b"first"))
    store = cluster.stores[0]
    store.mode = mode  # "after": the object lands but the writer is told it failed
    store.fail_put = lambda key: key.startswith("wal/")
    results = await asyncio.gather(
        *(log.append(batch(1, tag=b"doomed%d" % i)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, ObjectStoreUnavailable) for r in results), results
    assert log.high_watermark == 2
    store.fail_put = None
    # the partition rolls back behind a checkpoint, then takes appends again
    for _ in range(100):
        try:
            again = await log.append(batch(1, tag=b"second"))
            break
        except ObjectStoreUnavailable:
            await asyncio.sleep(0.05)
    else:
        pytest.fail("partition never recovered from the failed flush")
    assert again.base_offset == ok.last_offset + 1 == 2
    third = await log.append(batch(1, tag=b"third"))
    expected = [b"first", b"second", b"third"]
    tails = [tail for _, _, tail in await read_all(log)]
    assert [any(t in tail for t in expected) for tail in tails] == [True] * 3
    # a crash now and a replay elsewhere must give exactly the acknowledged data
    await engine.abandon()
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    assert log2.high_watermark == third.last_offset + 1 == 4
    got = await read_all(log2)
    assert [b"first" in got[0][2], b"second" in got[1][2], b"third" in got[2][2]] == [True] * 3
    assert not any(b"doomed" in tail for _, _, tail in got)


async def test_clean_close_then_open_by_another_broker_reads_one_object(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    sent = [batch(2, tag=b"c%d" % i) for i in range(30)]
    for b in sent:
        await log1.append(b)
    await engine1.close_partition(TP)
    assert engine1.get(TP) is None
    engine2 = await cluster.engine(2)
    store2 = cluster.stores[1]
    store2.reset()
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    # a clean handover reads the checkpoint and writes nothing until its first data
    assert store2.ops["get"] == 1 and store2.ops["list"] == 0 and store2.ops["put"] == 0
    assert log2.high_watermark == 60
    got = await read_all(log2)
    assert [tail[4:] for _, _, tail in got] == [payload(b)[4:] for b in sent]
    key = engine2.checkpoint_key(TP, TOPIC_ID)
    loaded = await engine2.checkpoints.load(key)
    assert loaded is not None and loaded[0].leader_epoch == 1, "nothing written by the reads"
    assert (await log2.append(batch(1))).base_offset == 60
    # the new epoch was stored before that data (If-Match on the checkpoint it read)
    loaded = await engine2.checkpoints.load(key)
    assert loaded is not None and loaded[0].leader_epoch == 2 and loaded[0].owner_broker == "2"


async def test_a_clean_handover_fences_an_earlier_owner_that_writes_first(cluster: Cluster) -> None:
    """The new leader's checkpoint is written with its first data, with If-Match on the one it
    read: if anyone wrote the checkpoint in between, that first write fails (fenced), and
    nothing of it is acknowledged."""
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(2))
    await engine1.close_partition(TP)
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    engine3 = await cluster.engine(3)
    log3 = await engine3.open_partition(TP, TOPIC_ID, 3, CFG)  # a later leader that writes first
    assert (await log3.append(batch(1))).base_offset == 2
    # the flush holding it fails (retriable for the producer), and the partition is fenced
    with pytest.raises((PartitionFenced, ObjectStoreUnavailable)):
        await log2.append(batch(1))
    with pytest.raises(PartitionFenced):
        await log2.append(batch(1))
    assert log3.high_watermark == 3
    assert len(await read_all(log3)) == 2


async def test_a_partition_moved_on_without_a_write_is_closed_without_one(
    cluster: Cluster,
) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(3))
    await engine1.close_partition(TP)
    engine2 = await cluster.engine(2)
    await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    store2 = cluster.stores[1]
    store2.reset()
    await engine2.close_partition(TP)
    assert store2.ops["put"] == 0, "nothing changed since the clean checkpoint it opened"
    engine3 = await cluster.engine(3)
    log3 = await engine3.open_partition(TP, TOPIC_ID, 3, CFG)
    assert log3.high_watermark == 3
    assert (await log3.append(batch(1))).base_offset == 3


async def test_unclean_stop_recovers_every_acknowledged_append_and_producer_state(
    cluster: Cluster,
) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    pid, epoch = 4242, 3
    acked = []
    for seq in range(0, 40, 2):
        r = await log1.append(batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=seq))
        acked.append(r)
    await log1.commit_checkpoint()  # part of it in the checkpoint, part only in the WAL
    for seq in range(40, 60, 2):
        acked.append(
            await log1.append(batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=seq))
        )
    last = acked[-1]
    await engine1.abandon()  # kill -9: no flush of checkpoints, no clean flag

    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    assert log2.high_watermark == last.last_offset + 1 == 60
    got = await read_all(log2)
    assert [(b, last) for b, last, _ in got] == [(r.base_offset, r.last_offset) for r in acked]
    # the producer retries its last batch: recognised, original offsets, nothing written
    retry = await log2.append(batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=58))
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (58, 59)
    assert log2.high_watermark == 60
    nxt = await log2.append(batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=60))
    assert nxt.base_offset == 60 and not nxt.duplicate
    # and once more: crash the second broker too, a third one still has it all
    await engine2.abandon()
    engine3 = await cluster.engine(3)
    log3 = await engine3.open_partition(TP, TOPIC_ID, 3, CFG)
    assert log3.high_watermark == 62
    again = await log3.append(batch(2, producer_id=pid, producer_epoch=epoch, base_sequence=60))
    assert again.duplicate and again.base_offset == 60


async def test_new_owner_fences_the_old_one(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    await log1.append(batch(1))
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    assert log2.high_watermark == 1
    await log1.append(batch(1))  # the WAL still takes it (leases cover this gap) ...
    with pytest.raises(PartitionFenced):  # ... but its checkpoint cannot win any more
        await log1.commit_checkpoint()
    assert engine1.get(TP) is None
    await asyncio.sleep(0)
    assert (1, TP) in cluster.fenced
    with pytest.raises(PartitionFenced):
        await log1.append(batch(1))
    # a stale epoch cannot take the partition back
    engine3 = await cluster.engine(3)
    with pytest.raises(PartitionFenced):
        await engine3.open_partition(TP, TOPIC_ID, 1, CFG)
    assert (await log2.append(batch(1))).base_offset == 1


async def test_lapsed_lease_refuses_acknowledgement(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    valid = [True]
    engine._lease_check = lambda: valid[0]
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    await log.append(batch(1))
    valid[0] = False
    with pytest.raises(PartitionFenced):
        await log.append(batch(1))


async def test_compaction_keeps_contents_and_removes_wal_objects(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    logs = [await engine.open_partition(TopicPartition("c", i), TOPIC_ID, 1, CFG) for i in range(3)]
    sent: dict[int, list[bytes]] = {i: [] for i in range(3)}
    for round_ in range(15):
        for i, log in enumerate(logs):
            b = batch(4, tag=b"r%d-p%d" % (round_, i))
            sent[i].append(b)
            await log.append(b)
    await engine.checkpoint_all()
    wal_before = await count_objects(cluster, "wal/")
    assert wal_before >= 15
    before = {i: await read_all(log) for i, log in enumerate(logs)}
    for log in logs:
        assert log.stats().wal_ranges >= 15
        assert await engine.compact_partition(log, force=True) >= 1
        assert log.stats().wal_ranges == 0
    await asyncio.sleep(0.2)  # refcount deletions run in the background
    assert await count_objects(cluster, "wal/") == 0
    # contents identical, read back cold from the segments by a fresh owner
    for log in logs:
        await engine.close_partition(log.tp)
    engine2 = await cluster.engine(2, cache_bytes=0)
    for i in range(3):
        log2 = await engine2.open_partition(TopicPartition("c", i), TOPIC_ID, 2, CFG)
        assert await read_all(log2) == before[i]
        assert [t[4:] for _, _, t in before[i]] == [payload(b)[4:] for b in sent[i]]


async def test_a_segment_is_the_wal_ranges_byte_for_byte(cluster: Cluster) -> None:
    """Compaction stores its sources as parts: cached chunks (several per WAL range when one
    flush held several appends) and ranges read back after the cache let them go. The segment
    is exactly those ranges one after the other, and the metric counts its size."""
    from prometheus_client import REGISTRY

    engine = await cluster.engine(72, cache_bytes=6000)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    for round_ in range(6):  # four appends gathered into one flush: one WAL range of 4 chunks
        await asyncio.gather(
            *(log.append(batch(1, value_size=300, tag=b"r%d-%d" % (round_, i))) for i in range(4))
        )
    sources = list(log.index.entries)
    assert len(sources) == 6 and all(e.in_wal for e in sources)
    inspector = cluster.inspector()
    try:
        expected = b"".join(
            [await inspector.get(e.key, e.position, e.end_position) for e in sources]
        )
        compacted = "tidalmq_storage_compacted_bytes_total"
        before = REGISTRY.get_sample_value(compacted, {"broker": "72"}) or 0.0
        store = cluster.stores[0]
        store.reset()
        assert await engine.compact_partition(log, force=True) == 1
        assert 0 < store.ops["ranged_get"] < len(sources)  # some from the cache, some not
        (segment,) = {e.key for e in log.index.entries}
        assert await inspector.get(segment) == expected
        assert REGISTRY.get_sample_value(compacted, {"broker": "72"}) == before + len(expected)
    finally:
        await inspector.close()


async def test_retention_by_time_deletes_whole_old_segments(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    config = PartitionConfig(retention_ms=3600_000)
    log = await engine.open_partition(TP, TOPIC_ID, 1, config)
    old = int(time.time() * 1000) - 2 * 3600_000
    for _ in range(5):
        await log.append(batch(2, timestamp_ms=old))
    await engine.compact_partition(log, force=True)
    for _ in range(5):
        await log.append(batch(2))
    await engine.compact_partition(log, force=True)
    assert await count_objects(cluster, "partitions/orders/") == 3  # checkpoint + 2 segments
    assert await engine.apply_retention(log) == 1
    assert log.log_start_offset == 10
    assert await count_objects(cluster, "partitions/orders/") == 2
    with pytest.raises(OffsetOutOfRange):
        await log.read(0, 1000)
    assert [b for b, _, _ in await read_all(log, 10)] == [10, 12, 14, 16, 18]
    # the new log start is durable
    await engine.close_partition(TP)
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, config)
    assert log2.log_start_offset == 10


async def test_retention_by_bytes_keeps_at_least_the_limit(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    one = len(batch(1, value_size=1000))
    config = PartitionConfig(retention_bytes=5 * one, segment_bytes=2 * one)
    log = await engine.open_partition(TP, TOPIC_ID, 1, config)
    for _ in range(12):
        await log.append(batch(1, value_size=1000))
    await engine.compact_partition(log, force=True)
    assert log.stats().segments == 6
    deleted = await engine.apply_retention(log)
    assert deleted == 3
    assert log.stats().size_bytes == 6 * one >= 5 * one
    assert log.log_start_offset == 6


async def test_delete_records_and_delete_partition(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, PartitionConfig(segment_bytes=400))
    for _ in range(10):
        await log.append(batch(1, value_size=200))
    await engine.compact_partition(log, force=True)
    assert await log.delete_records_before(4) == 4
    with pytest.raises(OffsetOutOfRange):
        await log.read(3, 1000)
    assert batches_of((await log.read(4, 1000)).records)[0][0] == 4
    with pytest.raises(OffsetOutOfRange):
        await log.delete_records_before(11)
    assert await log.delete_records_before(4) == 4  # not backwards, no error
    await engine.delete_partition(TP, TOPIC_ID)
    assert engine.get(TP) is None
    assert await count_objects(cluster, "partitions/") == 0
    # a re-created topic of the same name starts empty
    fresh = await engine.open_partition(TP, "another-topic-id", 1, CFG)
    assert fresh.high_watermark == 0


async def test_garbage_collection_keeps_an_idle_store_bounded(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1)
    logs = [
        await engine1.open_partition(TopicPartition("g", i), TOPIC_ID, 1, CFG) for i in range(4)
    ]
    for _ in range(10):
        await asyncio.gather(*(log.append(batch(1)) for log in logs))
    await engine1.abandon()  # a dead incarnation leaves WAL objects behind
    engine2 = await cluster.engine(2)
    logs2 = [
        await engine2.open_partition(TopicPartition("g", i), TOPIC_ID, 2, CFG) for i in range(4)
    ]
    assert all(log.high_watermark == 10 for log in logs2)
    counts = []
    for _ in range(4):  # idle upkeep cycles
        await engine2.checkpoint_all()
        for log in logs2:
            await engine2.compact_partition(log, force=True)
        await engine2.collect_garbage()
        await asyncio.sleep(0.1)
        counts.append(await count_objects(cluster, ""))
    assert await count_objects(cluster, "wal/") == 0
    assert counts[-1] == counts[-2] == 8  # 4 checkpoints + 4 segments
    for log in logs2:
        assert len(await read_all(log)) == 10


async def test_cold_reads_use_ranged_gets_with_read_ahead(cluster: Cluster) -> None:
    engine = await cluster.engine(
        1, cache_bytes=0, read_ahead_bytes=64 * 1024, index_granule_bytes=16 * 1024
    )
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    sent = [batch(1, value_size=1000, tag=b"cold%d" % i) for i in range(100)]
    for b in sent:
        await log.append(b)
    await engine.compact_partition(log, force=True)
    store = cluster.stores[0]
    store.reset()
    got = []
    offset = 0
    while offset < log.high_watermark:
        result = await log.read(offset, 2000)  # a small fetch size: about one batch per read
        for _base, last, tail in batches_of(result.records):
            got.append(tail)
            offset = last + 1
    assert [t[4:] for t in got] == [payload(b)[4:] for b in sent]
    # 100 KB read through ~64 KiB read-ahead windows: a handful of ranged GETs, not 100
    assert 1 <= store.ops["ranged_get"] <= 4, store.ops
    # a random read fetches only the index granule (here 16 KiB) holding what it needs
    store.reset()
    result = await log.read(3, 2000)
    assert batches_of(result.records)[0][0] == 3
    assert store.ops["ranged_get"] == 1 and store.ops["bytes_read"] <= 16 * 1024, store.ops


async def test_offset_for_timestamp_and_long_poll(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    for ts in (1000, 2000, 3000):
        await log.append(batch(2, timestamp_ms=ts))
    found = await log.offset_for_timestamp(1500)
    assert found is not None and (found.offset, found.timestamp) == (2, 2000)
    assert await log.offset_for_timestamp(5000) is None
    started = time.monotonic()
    await log.wait_for_data(6, 0.2)
    assert time.monotonic() - started >= 0.19
    waiter = asyncio.create_task(log.wait_for_data(6, 10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await log.append(batch(1))
    await asyncio.wait_for(waiter, 5)


async def test_bad_batches_get_the_right_errors(cluster: Cluster) -> None:
    from tidalmq_broker.storage.api import (
        CorruptRecord,
        InvalidProducerEpoch,
        InvalidRecord,
        OutOfOrderSequence,
        RecordTooLarge,
        UnknownProducerId,
        UnsupportedMessageFormat,
    )

    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, PartitionConfig(max_message_bytes=2000))
    good = bytearray(batch(1))
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecord):
        await log.append(bytes(corrupt))
    with pytest.raises(CorruptRecord):
        await log.append(bytes(good[:-3]))
    old_magic = bytearray(good)
    old_magic[16] = 1
    with pytest.raises(UnsupportedMessageFormat):
        await log.append(bytes(old_magic))
    with pytest.raises(RecordTooLarge):
        await log.append(batch(1, value_size=3000))
    from tidalmq_broker.protocol.records import CONTROL_FLAG, TRANSACTIONAL_FLAG, build_batch

    # a control batch (a transaction marker) is the broker's to write, never a client's
    marker = build_batch(
        [(b"k", b"v")],
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
    )
    with pytest.raises(InvalidRecord):
        await log.append(marker)
    with pytest.raises(UnknownProducerId):
        await log.append(batch(1, producer_id=9, producer_epoch=0, base_sequence=5))
    await log.append(batch(2, producer_id=9, producer_epoch=1, base_sequence=0))
    with pytest.raises(OutOfOrderSequence):
        await log.append(batch(1, producer_id=9, producer_epoch=1, base_sequence=3))
    with pytest.raises(InvalidProducerEpoch):
        await log.append(batch(1, producer_id=9, producer_epoch=0, base_sequence=2))
    assert log.high_watermark == 2  # nothing of the refused batches was written
    assert (
        await log.append(batch(1, producer_id=9, producer_epoch=1, base_sequence=2))
    ).base_offset == 2


async def test_log_append_time_topics_stamp_batches(cluster: Cluster) -> None:
    from tidalmq_broker.protocol.records import TIMESTAMP_TYPE_MASK, iter_headers

    engine = await cluster.engine(1)
    log = await engine.open_partition(
        TP, TOPIC_ID, 1, PartitionConfig(message_timestamp_type="LogAppendTime")
    )
    before = int(time.time() * 1000)
    result = await log.append(batch(2, timestamp_ms=5))
    assert result.log_append_time_ms >= before
    (h,) = list(iter_headers((await log.read(0, 10_000)).records, verify_crc=True))
    assert h.attributes & TIMESTAMP_TYPE_MASK and h.max_timestamp == result.log_append_time_ms


async def test_stop_flushes_in_flight_appends_and_fails_late_ones(cluster: Cluster) -> None:
    engine = await cluster.engine(1, flush_interval_ms=300)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    await log.append(batch(1))  # the next flush may start only 300 ms after this one
    pending = [asyncio.create_task(log.append(batch(1))) for _ in range(5)]
    await asyncio.sleep(0.01)
    await engine.stop()  # drains: flushes what is pending, then closes cleanly
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert [r.base_offset for r in results] == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
    from tidalmq_broker.storage.api import PartitionClosing

    with pytest.raises(PartitionClosing):
        await log.append(batch(1))
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    assert log2.high_watermark == 6


async def test_metrics_are_exported_per_broker(cluster: Cluster) -> None:
    from prometheus_client import REGISTRY

    engine = await cluster.engine(71)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    await log.append(batch(1))
    await log.read(0, 1000)

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"broker": "71", **labels}) or 0.0

    assert value("tidalmq_storage_wal_flushes_total", outcome="ok") >= 1
    assert value("tidalmq_storage_object_requests_total", op="put", outcome="ok") >= 2
    assert value("tidalmq_storage_cache_hit_bytes_total") > 0
    assert value("tidalmq_storage_partition_opens_total", kind="new") >= 1
    assert value("tidalmq_storage_open_partitions") == 1
    assert value("tidalmq_storage_wal_flush_seconds_count") >= 1


async def stored_versions(cluster: Cluster) -> dict[str, tuple[str, float]]:
    """Every object in the store, by key, with what names the version written: its etag and
    when it was written (an S3 etag is the content's hash, the same for the same bytes again)."""
    store = cluster.inspector()
    try:
        return {o.key: (o.etag, o.last_modified) for o in await store.list("")}
    finally:
        await store.close()


async def test_background_upkeep_leaves_an_idle_broker_with_a_constant_object_count(
    cluster: Cluster,
) -> None:
    engine = await cluster.engine(
        1,
        checkpoint_interval_s=0.1,
        compaction_interval_s=0.1,
        compaction_idle_s=0.3,
        garbage_sweep_interval_s=0.2,
        retention_check_interval_s=0.2,
        garbage_grace_s=1.0,  # the sweep may race a compaction commit; the grace covers it
        # an idle broker overwrites its one health object (probe_key) when it has PUT nothing for
        # this long; soon, so that it is there before the samples whatever the machine's load
        store_probe_interval_ms=500,
    )
    tps = [TopicPartition("idle", i) for i in range(3)]
    logs = [await engine.open_partition(tp, TOPIC_ID, 1, CFG) for tp in tps]
    for _ in range(10):
        await asyncio.gather(*(log.append(batch(1)) for log in logs))
    assert await count_objects(cluster, "wal/") >= 1
    checkpoints = {engine.checkpoint_key(tp, TOPIC_ID) for tp in tps}
    probe = probe_key("1")

    def settled(versions: dict[str, tuple[str, float]]) -> bool:
        """One checkpoint and one segment per partition, the probe's object, nothing else (no
        WAL, no segment a compaction has yet to delete), and no checkpoint left to commit."""
        segments = [k for k in versions if "/segments/" in k]
        return (
            set(versions) == checkpoints | {probe} | set(segments)
            and sorted(k.rsplit("/segments/", 1)[0] for k in segments)
            == sorted(k.rsplit("/", 1)[0] for k in checkpoints)
            and not any(engine.get(tp).dirty for tp in tps)  # type: ignore[union-attr]
        )

    versions = await stored_versions(cluster)
    for _ in range(150):  # polling the store: there is no event to wait for in another broker
        if settled(versions):
            break
        await asyncio.sleep(0.2)
        versions = await stored_versions(cluster)
    assert settled(versions), f"the idle broker never settled: {sorted(versions)}"
    # idle: no object appears or goes, and no checkpoint or segment is written again (only the
    # probe's one object is overwritten)
    data = {k: v for k, v in versions.items() if k != probe}
    samples = []
    for _ in range(5):
        await asyncio.sleep(0.3)
        samples.append(await stored_versions(cluster))
    names = [sorted(s) for s in samples]
    assert names == [sorted(versions)] * 5, f"objects came or went while idle: {names}"
    rewritten = [sorted(k for k in data if s.get(k) != data[k]) for s in samples]
    assert rewritten == [[]] * 5, f"objects written again while idle: {rewritten}"
    for log in logs:
        assert [b for b, _, _ in await read_all(log)] == list(range(10))


async def test_producer_state_survives_a_clean_move(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    for seq in range(5):
        await log1.append(batch(1, producer_id=77, producer_epoch=0, base_sequence=seq))
    await engine1.close_partition(TP)
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    retry = await log2.append(batch(1, producer_id=77, producer_epoch=0, base_sequence=4))
    assert retry.duplicate and retry.base_offset == 4
    from tidalmq_broker.storage.api import OutOfOrderSequence

    with pytest.raises(OutOfOrderSequence):
        await log2.append(batch(1, producer_id=77, producer_epoch=0, base_sequence=6))
    assert (
        await log2.append(batch(1, producer_id=77, producer_epoch=0, base_sequence=5))
    ).base_offset == 5


async def test_trickle_traffic_does_not_pile_up_tiny_segments(cluster: Cluster) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, CFG)
    for _ in range(6):
        await log.append(batch(1))
        await engine.compact_partition(log, force=True)
    await asyncio.sleep(0.1)
    assert log.stats().segments == 1
    assert await count_objects(cluster, "partitions/") == 2  # checkpoint + one segment
    assert [b for b, _, _ in await read_all(log)] == list(range(6))


async def test_crash_under_concurrent_load_loses_no_acknowledged_append(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1, flush_interval_ms=3)
    tps = [TopicPartition("load", i) for i in range(6)]
    logs = [await engine1.open_partition(tp, TOPIC_ID, 1, CFG) for tp in tps]
    acked: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(6)}
    stop = asyncio.Event()

    async def produce(i: int, worker: int) -> None:
        n = 0
        while not stop.is_set():
            tag = b"p%d-w%d-n%d-" % (i, worker, n)
            try:
                r = await logs[i].append(batch(1, tag=tag))
            except Exception:
                return
            acked[i].append((r.base_offset, tag))
            n += 1

    producers = [asyncio.create_task(produce(i, w)) for i in range(6) for w in range(3)]
    # load until enough is acknowledged (0.5 s at least): a fixed 0.5 s once saw no append
    # acknowledged at all on S3 in CI (the store slow for a moment), and tested nothing
    await asyncio.sleep(0.5)
    for _ in range(300):
        if sum(len(v) for v in acked.values()) > 30:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await engine1.abandon()  # mid-flight: some appends are in the WAL buffer or in a PUT
    await asyncio.gather(*producers)
    assert sum(len(v) for v in acked.values()) > 30
    engine2 = await cluster.engine(2)
    for i, tp in enumerate(tps):
        log2 = await engine2.open_partition(tp, TOPIC_ID, 2, CFG)
        got = {base: tail for base, _, tail in await read_all(log2)}
        assert sorted(got) == list(range(log2.high_watermark))  # contiguous
        for offset, tag in acked[i]:
            assert tag in got[offset], f"acknowledged {tag!r} at {offset} of {tp} is lost"


async def test_a_wal_pass_that_outlives_close_does_not_fence_the_next_owner(
    cluster: Cluster,
) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, CFG)
    for i in range(20):
        await log1.append(batch(2, tag=b"m%d" % i))
    store1 = cluster.stores[0]
    held: list[str] = []
    store1.gate = asyncio.Event()
    store1.gate_match = lambda key: "/segments/" in key and not held.append(key)
    compacting = asyncio.create_task(engine1.compact_partition(log1, force=True))
    for _ in range(500):  # until the segment's PUT is held
        if held:
            break
        await asyncio.sleep(0.02)
    assert held and not compacting.done()
    await engine1.close_partition(TP)  # moved away: the clean checkpoint is written now
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, CFG)
    store1.gate.set()
    await asyncio.gather(compacting, return_exceptions=True)
    # the new owner writes: its checkpoint's If-Match is on the clean one it opened
    assert (await log2.append(batch(1))).base_offset == 40
    assert cluster.fenced == []
