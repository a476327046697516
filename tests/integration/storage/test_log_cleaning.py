"""The log cleaner of compacted topics in the engine (storage/log_cleaner.py), against the
local-directory store and a real S3 server: what a reader from the start sees after a pass, what
the next owner sees, and a pass that loses its partition halfway."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka.record.default_records import DefaultRecordBatch
from tidalmq_broker.protocol import records as rb
from tidalmq_broker.storage import keys
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_broker.storage.compaction import active_start
from tidalmq_broker.storage.log_cleaner import LogCleaner
from tidalmq_broker.storage.partition import Partition
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60, func_only=True)]

TP = TopicPartition("table", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-00000000c1ea"
COMPACT = PartitionConfig(
    cleanup_policy=frozenset({"compact"}), retention_ms=-1, segment_bytes=2048
)
DAY = 86_400_000

Row = tuple[int, bytes | None, bytes | None]


async def write_table(log: Partition) -> tuple[list[Row], set[int]]:
    """Keyed updates (5 keys, 40 batches), a deleted key, an aborted transaction and an
    idempotent producer; returns every data record written and the aborted offsets."""
    rows: list[Row] = []
    aborted: set[int] = set()

    async def put(records: list[tuple[bytes, bytes | None]], **kw: int) -> int:
        data = rb.build_batch(records, timestamp_ms=int(time.time() * 1000), **kw)
        base = (await log.append(data)).base_offset
        rows.extend((base + i, k, v) for i, (k, v) in enumerate(records))
        return base

    for i in range(40):
        await put(
            [(b"k%d" % (i % 5), b"v%d-%s" % (i, b"x" * 60)), (b"k%d" % ((i + 2) % 5), b"w%d" % i)]
        )
        if i == 20:
            await put([(b"k1", None)])  # a tombstone (k1 comes back later)
            await put([(b"gone", b"1")])
            await put([(b"gone", None)])  # deleted for good
        if i == 25:
            base = await put(
                [(b"k0", b"aborted"), (b"txn", b"aborted")],
                producer_id=100,
                producer_epoch=0,
                base_sequence=0,
                attributes=rb.TRANSACTIONAL_FLAG,
            )
            aborted.update({base, base + 1})
            await log.write_txn_marker(100, 0, commit=False, coordinator_epoch=0)
        if i % 10 == 3:
            await put(
                [(b"k3", b"idem%d" % i)], producer_id=200, producer_epoch=0, base_sequence=i // 10
            )
    return rows, aborted


async def read_rows(log: Partition) -> list[Row]:
    """Every data record from the log start, decoded by kafka-python as a consumer would."""
    out: list[Row] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        result = await log.read(offset, 1 << 20)
        assert result.records, f"empty read at {offset} below {log.high_watermark}"
        for h in rb.iter_complete_headers(result.records):
            data = bytes(result.records[h.position : h.position + h.size])
            batch = DefaultRecordBatch(data)
            assert batch.validate_crc()
            if not batch.is_control_batch:
                out.extend((r.offset, r.key, r.value) for r in batch if r.offset >= offset)
            offset = max(offset, h.last_offset + 1)
    return out


def expected_after(rows: list[Row], aborted: set[int], end: int, *, tombstones: bool) -> list[Row]:
    """Kafka's answer after one pass that mapped [0, end): below `end`, the latest value per
    key of the committed data (tombstones too until their horizon); from `end` on, all."""
    latest = {key: offset for offset, key, _ in rows if offset < end and offset not in aborted}
    return [
        (offset, key, value)
        for offset, key, value in rows
        if offset >= end
        or (offset not in aborted and latest[key] == offset and (value is not None or tombstones))
    ]


async def segment_objects(cluster: Cluster) -> set[str]:
    store = cluster.inspector()
    try:
        objects = await store.list(keys.partition_prefix(TP, TOPIC_ID))
        return {o.key for o in objects if "/segments/" in o.key}
    finally:
        await store.close()


async def test_a_reader_from_the_start_sees_the_latest_value_per_key_at_its_offset(
    cluster: Cluster,
) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, COMPACT)
    rows, aborted = await write_table(log1)
    assert await engine1.compact_partition(log1, force=True) > 1
    before = await read_rows(log1)
    assert before == rows  # nothing cleaned yet: every record, aborted ones included

    entries = log1.index.entries
    active = active_start(entries, 2048, now_ms=int(time.time() * 1000), merge_max_age_ms=-1)
    cleaner1 = LogCleaner(engine1)
    first = await cleaner1.clean(log1)
    assert first.groups_cleaned >= 1 and not first.raced and not first.map_full
    assert first.start == 0 and first.end == active
    assert first.stats.superseded > 0 and first.stats.aborted == 2
    got = await read_rows(log1)
    assert got == expected_after(rows, aborted, first.end, tombstones=True)
    assert any(value is None for _, _, value in got)  # tombstones stay until their horizon
    # offsets kept, with gaps; a read inside a gap starts at the next batch still there
    removed = next(o for o, _, _ in rows if o < first.end and o not in {r[0] for r in got})
    assert (await log1.read(removed, 1 << 20)).records
    # the replaced segments are gone from the store: every object is one the index names
    named = log1.index.keys() - log1.index.wal_keys()
    assert await segment_objects(cluster) == named
    # nothing new since: the next pass reads nothing
    assert (await cleaner1.clean(log1)).bytes_read == 0
    # the pass's progress is the partition's: another cleaner (a new owner's) starts there
    assert log1.cleaner_state["first_dirty"] == first.end
    horizon = log1.cleaner_state["horizon"]  # the kept tombstones' delete horizon
    assert 0 < horizon - time.time() * 1000 <= DAY
    assert (await LogCleaner(engine1).clean(log1)).bytes_read == 0
    assert await segment_objects(cluster) == named

    # the next owner opens the cleaned checkpoint, reads the same and goes on from the same
    # first dirty offset (kept in the checkpoint): it re-cleans nothing
    await engine1.close_partition(TP)
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, COMPACT)
    assert await read_rows(log2) == got
    assert log2.cleaner_state == {"first_dirty": first.end, "horizon": horizon}
    assert (await LogCleaner(engine2).clean(log2)).bytes_read == 0
    # two days later the tombstones are past their horizon: the round picks the partition
    # with nothing new in it, and its pass over the clean head drops the deleted keys
    later_ms = int(time.time() * 1000) + 2 * DAY
    assert engine2.cleaner.choose([log2], later_ms) == [log2]
    assert engine2.cleaner.choose([log2], horizon - 1) == []
    later = await LogCleaner(engine2).clean(log2, now_ms=later_ms)
    assert later.stats.tombstones_expired == 1  # "gone" (k1's was superseded by then)
    final = await read_rows(log2)
    assert final == expected_after(rows, aborted, first.end, tombstones=False)
    assert b"gone" not in {k for o, k, _ in final if o < first.end}
    # the aborted batch was producer 100's last: it stays as an empty header (its sequence
    # survives), so, as in Kafka, its transaction's marker and index entry stay with it
    (txn,) = log2.aborted_txns.entries
    assert txn.producer_id == 100 and min(aborted) == txn.first_offset
    kept = rb.read_header((await log2.read(txn.first_offset, 1 << 20)).records)
    assert (kept.base_offset, kept.record_count, kept.producer_id) == (txn.first_offset, 0, 100)
    assert cluster.fenced == []


async def test_a_pass_that_loses_its_partition_midway_commits_nothing(cluster: Cluster) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, COMPACT)
    rows, _ = await write_table(log1)
    await engine1.compact_partition(log1, force=True)
    objects = await segment_objects(cluster)
    store1 = cluster.stores[0]
    store1.gate = asyncio.Event()
    held: list[str] = []
    store1.gate_match = lambda key: "/segments/" in key and not held.append(key)
    cleaning = asyncio.create_task(LogCleaner(engine1).clean(log1))
    for _ in range(500):  # until the cleaned segment's PUT is held
        if held:
            break
        await asyncio.sleep(0.02)
    assert held and not cleaning.done()
    await engine1.close_partition(TP)  # moved: the clean checkpoint is written now
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, COMPACT)
    store1.gate.set()
    outcome = await asyncio.wait_for(cleaning, 20)
    assert outcome.raced and outcome.groups_cleaned == 0
    # the old owner's segment was deleted, its checkpoint never committed over the new one
    assert await segment_objects(cluster) == objects
    assert await read_rows(log2) == rows
    end = log2.high_watermark
    assert (await log2.append(rb.build_batch([(b"k0", b"after")]))).base_offset == end
    assert cluster.fenced == []


async def test_the_engines_compaction_pass_cleans_compacted_partitions_only(
    cluster: Cluster,
) -> None:
    engine = await cluster.engine(1, compaction_min_ranges=8)
    plain = TopicPartition("events", 0)
    logs = {
        TP: await engine.open_partition(TP, TOPIC_ID, 1, COMPACT),
        plain: await engine.open_partition(plain, TOPIC_ID, 1, PartitionConfig(segment_bytes=2048)),
    }
    for i in range(60):  # 60 updates of 3 keys, each in its own WAL range
        for log in logs.values():
            await log.append(rb.build_batch([(b"k%d" % (i % 3), b"v%d-%s" % (i, b"x" * 80))]))
    await engine.compact_all()  # WAL ranges into segments
    await engine.clean_all()  # a cleaner round
    assert all(log.index.wal_ranges() == 0 for log in logs.values())
    compacted, kept = await read_rows(logs[TP]), await read_rows(logs[plain])
    assert len(kept) == 60  # cleanup.policy=delete: untouched
    assert len(compacted) < 30 and compacted[-1] == kept[-1]  # superseded updates are gone
    assert {key for _, key, _ in compacted} == {b"k0", b"k1", b"k2"}


async def test_a_segment_the_cleaner_cannot_parse_leaves_the_partition_uncleaned(
    cluster: Cluster,
) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, COMPACT)
    await write_table(log)
    await engine.compact_partition(log, force=True)
    first = log.index[0]
    store = cluster.inspector()
    try:  # the first segment's bytes rot in the store
        size = len(await store.get(first.key))
        await store.put(first.key, [b"\0" * size])
    finally:
        await store.close()
    cleaner = LogCleaner(engine)
    outcome = await cleaner.clean(log)
    assert outcome.uncleanable and "magic" in outcome.uncleanable
    assert outcome.groups_cleaned == 0 and not cleaner.wanted(log)
    assert (await cleaner.clean(log)).bytes_read == 0  # not retried on every pass
    assert log.index.entries[0] == first and cluster.fenced == []


async def test_a_pass_raced_by_delete_records_drops_its_segment_and_keeps_the_log(
    cluster: Cluster,
) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, COMPACT)
    rows, _ = await write_table(log)
    await engine.compact_partition(log, force=True)
    objects = await segment_objects(cluster)
    store = cluster.stores[0]
    held: list[str] = []
    store.gate = asyncio.Event()
    store.gate_match = lambda key: "/segments/" in key and not held.append(key)
    cleaning = asyncio.create_task(LogCleaner(engine).clean(log))
    for _ in range(500):
        if held:
            break
        await asyncio.sleep(0.02)
    assert held
    start = log.index[1].base_offset  # inside the group being cleaned
    assert await log.delete_records_before(start) == start
    store.gate.set()
    outcome = await asyncio.wait_for(cleaning, 20)
    assert outcome.raced and outcome.groups_cleaned == 0
    assert held[0] not in await segment_objects(cluster)  # its new segment was deleted
    assert await segment_objects(cluster) <= objects
    assert await read_rows(log) == [r for r in rows if r[0] >= start]
    # the next pass starts over from the new log start
    again = await LogCleaner(engine).clean(log)
    assert again.start == start and again.groups_cleaned >= 1 and not again.raced


async def test_an_idempotent_retry_after_cleaning_is_answered_as_a_duplicate(
    cluster: Cluster,
) -> None:
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, COMPACT)
    sent = [
        rb.build_batch(
            [(b"k", b"v%d-%s" % (i, b"x" * 200))], producer_id=7, producer_epoch=0, base_sequence=i
        )
        for i in range(12)
    ]
    offsets = [(await log1.append(b)).base_offset for b in sent]
    await engine1.compact_partition(log1, force=True)
    assert (await LogCleaner(engine1).clean(log1)).stats.superseded > 0
    await engine1.close_partition(TP)
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, COMPACT)
    # the producer did not hear back about its last batch and sends it again
    assert (await log2.append(sent[-1])).base_offset == offsets[-1]
    assert log2.high_watermark == offsets[-1] + 1  # nothing written twice
    assert await read_rows(log2) == [(offsets[-1], b"k", b"v11-" + b"x" * 200)]


async def test_an_aborted_transaction_leaves_the_index_once_its_data_is_gone(
    cluster: Cluster,
) -> None:
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, COMPACT)
    txn = rb.TRANSACTIONAL_FLAG
    await log.append(
        rb.build_batch(
            [(b"a", b"no")], producer_id=5, producer_epoch=0, base_sequence=0, attributes=txn
        )
    )
    await log.write_txn_marker(5, 0, commit=False, coordinator_epoch=0)
    await log.append(
        rb.build_batch(
            [(b"a", b"yes")], producer_id=5, producer_epoch=0, base_sequence=1, attributes=txn
        )
    )
    await log.write_txn_marker(5, 0, commit=True, coordinator_epoch=0)
    for i in range(30):  # enough to close the segment that holds the transactions
        await log.append(rb.build_batch([(b"k%d" % (i % 3), b"x" * 200)]))
    await engine.compact_partition(log, force=True)
    assert len(log.aborted_txns) == 1
    first = await LogCleaner(engine).clean(log)  # the aborted data goes, its marker stays
    assert first.stats.aborted == 1 and len(log.aborted_txns) == 1
    # passes over the whole log again (a checkpoint without the cleaner's progress, as an
    # older broker wrote it; a later pass with new dirty data reads the clean head the same)
    log.set_cleaner_state({})
    second = await LogCleaner(engine).clean(log)  # no data left: the index entry goes
    assert second.groups_cleaned >= 1 and len(log.aborted_txns) == 0
    # the marker waits for its horizon, and nothing is rewritten meanwhile
    log.set_cleaner_state({})
    third = await LogCleaner(engine).clean(log)
    assert third.groups_cleaned == 0 and third.groups_skipped >= 1
    assert [v for _, k, v in await read_rows(log) if k == b"a"] == [b"yes"]


@pytest.mark.parametrize(
    ("policy", "deleted"), [({"compact"}, 0), ({"compact", "delete"}, 1), ({"delete"}, 1)]
)
async def test_retention_by_time_applies_only_to_a_policy_with_delete(
    cluster: Cluster, policy: set[str], deleted: int
) -> None:
    engine = await cluster.engine(1)
    config = PartitionConfig(cleanup_policy=frozenset(policy), retention_ms=3600_000)
    log = await engine.open_partition(TP, TOPIC_ID, 1, config)
    old = int(time.time() * 1000) - 2 * 3600_000
    for i in range(3):
        await log.append(rb.build_batch([(b"k%d" % i, b"old")], timestamp_ms=old))
    await engine.compact_partition(log, force=True)
    await log.append(rb.build_batch([(b"k0", b"new")], timestamp_ms=int(time.time() * 1000)))
    await engine.compact_partition(log, force=True)
    assert await engine.apply_retention(log) == deleted
    assert log.log_start_offset == (0 if deleted == 0 else 3)


async def test_a_pass_whose_lease_lapsed_commits_nothing(cluster: Cluster) -> None:
    """The lease lapses while the cleaned segment is uploaded: the swap is refused (a new
    owner may be opening the partition), the new object deleted, and the log unchanged."""
    engine = await cluster.engine(1)
    log = await engine.open_partition(TP, TOPIC_ID, 1, COMPACT)
    rows, _ = await write_table(log)
    await engine.compact_partition(log, force=True)
    objects = await segment_objects(cluster)
    index = list(log.index.entries)
    lease = {"ok": True}
    engine._lease_check = lambda: lease["ok"]  # the broker's controller lease, as it sees it
    store = cluster.stores[0]
    store.gate = asyncio.Event()
    held: list[str] = []
    store.gate_match = lambda key: "/segments/" in key and not held.append(key)
    cleaning = asyncio.create_task(LogCleaner(engine).clean(log))
    for _ in range(500):  # until the cleaned segment's PUT is held
        if held:
            break
        await asyncio.sleep(0.02)
    assert held and not cleaning.done()
    lease["ok"] = False
    store.gate.set()
    outcome = await asyncio.wait_for(cleaning, 20)
    assert outcome.raced and outcome.groups_cleaned == 0
    assert log.index.entries == index and log.cleaner_state == {}
    assert await segment_objects(cluster) == objects
    lease["ok"] = True
    assert await read_rows(log) == rows
    assert cluster.fenced == []


async def test_a_broker_killed_after_a_pass_leaves_the_next_owner_the_cleaned_log(
    cluster: Cluster,
) -> None:
    """kill -9 right after a pass: the swap was committed with the cleaned group, so the next
    owner (unclean open, WAL replay) reads the cleaned log and every acknowledged record's
    latest value, including what was appended after the pass and never checkpointed."""
    engine1 = await cluster.engine(1)
    log1 = await engine1.open_partition(TP, TOPIC_ID, 1, COMPACT)
    await write_table(log1)
    await engine1.compact_partition(log1, force=True)
    first = await LogCleaner(engine1).clean(log1)
    assert first.groups_cleaned >= 1
    cleaned = await read_rows(log1)
    tail = (await log1.append(rb.build_batch([(b"k2", b"acknowledged")]))).base_offset
    await engine1.abandon()  # kill -9: no close, no checkpoint since the append
    engine2 = await cluster.engine(2)
    log2 = await engine2.open_partition(TP, TOPIC_ID, 2, COMPACT)
    assert await read_rows(log2) == [*cleaned, (tail, b"k2", b"acknowledged")]
    # the pass's progress was in its last commit or is redone: never past what was cleaned
    assert log2.cleaner_state.get("first_dirty", 0) <= first.end
    again = await LogCleaner(engine2).clean(log2)
    assert not again.raced
    assert [r for r in await read_rows(log2) if r[0] < first.end] == [
        r for r in cleaned if r[0] < first.end
    ]
    assert cluster.fenced == []
