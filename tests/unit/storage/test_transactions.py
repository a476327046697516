"""The partition side of transactions (docs/transactions.md): producer state with ongoing
transactions, the aborted-transactions index, and on a real partition (local-directory store)
the last stable offset, read_committed reads, markers, fencing, and recovery after a kill -9."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.aborted_txns import AbortedTxns
from tidalmq_broker.storage.api import (
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTxnState,
    PartitionConfig,
    StorageConfig,
    TransactionCoordinatorFenced,
)
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.storage.partition import Partition
from tidalmq_broker.storage.producer_state import (
    ABORT_MARKER,
    COMMIT_MARKER,
    TRANSACTIONAL,
    BatchMeta,
    ProducerStateTable,
)
from tidalmq_core.model import TopicPartition

TP = TopicPartition("t", 0)
CONFIG = StorageConfig(flush_interval_ms=2, checkpoint_interval_s=3600)


# ------------------------------------------------------------------ producer state (pure)
def test_a_transactional_batch_starts_a_transaction_and_a_marker_ends_it() -> None:
    t = ProducerStateTable()
    assert t.apply_tuple((7, 0, 0, 2, 10, 12, TRANSACTIONAL)) is None
    assert t.apply_tuple((7, 0, 3, 3, 14, 14, TRANSACTIONAL)) is None  # same transaction
    assert t.producers[7].txn_first_offset == 10
    assert t.first_unstable_offset() == 10
    done = t.apply_tuple((7, 0, -1, -1, 15, 15, ABORT_MARKER, 4))
    assert done is not None and (done.first_offset, done.last_offset, done.aborted) == (
        10,
        15,
        True,
    )
    assert t.first_unstable_offset() is None
    assert t.producers[7].coordinator_epoch == 4
    # sequences continue across transactions of one epoch (TV1 producers)
    assert t.check(7, 0, 4, 4, transactional=True) is None
    # a marker of a transaction with no data here completes nothing
    assert t.apply_tuple((7, 0, -1, -1, 16, 16, COMMIT_MARKER, 4)) is None


def test_non_transactional_batch_during_a_transaction_is_refused() -> None:
    t = ProducerStateTable()
    t.apply(1, 0, BatchMeta(0, 0, 0, 0), transactional=True)
    with pytest.raises(InvalidTxnState):
        t.check(1, 0, 1, 1, transactional=False)
    assert t.check(1, 0, 1, 1, transactional=True) is None
    # a retry of the transactional batch itself is still a duplicate
    assert t.check(1, 0, 0, 0, transactional=False) == BatchMeta(0, 0, 0, 0)


def test_markers_fence_older_producer_and_coordinator_epochs() -> None:
    t = ProducerStateTable()
    t.apply(1, 3, BatchMeta(0, 0, 0, 0), transactional=True)
    with pytest.raises(InvalidProducerEpoch):
        t.check_marker(1, 2, 0)
    t.check_marker(1, 4, 0)  # a bumped epoch (the coordinator fenced the producer) is fine
    t.complete(1, 4, False, 5, 1)
    with pytest.raises(TransactionCoordinatorFenced):
        t.check_marker(1, 4, 4)
    with pytest.raises(InvalidProducerEpoch):  # the zombie's data after the abort
        t.check(1, 3, 1, 1, transactional=True)
    assert t.producers[1].epoch == 4 and not t.producers[1].batches


def test_transaction_state_survives_json_and_blocks_expiry() -> None:
    t = ProducerStateTable()
    t.apply(1, 0, BatchMeta(0, 0, 5, 5), now_ms=1, transactional=True)
    t.apply(2, 0, BatchMeta(0, 0, 6, 6), now_ms=1)
    t.complete(3, 0, True, 9, 7, now_ms=1)  # a marker for a producer with no data here
    clone = ProducerStateTable.from_json(t.to_json())
    clone.load_txn_json(t.txn_to_json())
    assert clone.describe() == t.describe()
    assert clone.first_unstable_offset() == 5
    # an idle producer expires, one in the middle of a transaction never does
    assert clone.expire(now_ms=10**12) == 2
    assert list(clone.producers) == [1]
    clone.truncate_from(5)  # a rollback past its start forgets the transaction
    assert clone.first_unstable_offset() is None


def test_aborted_index_overlap_and_log_start() -> None:
    idx = AbortedTxns()
    idx.add(1, 0, 4)
    idx.add(2, 3, 9)
    idx.add(1, 10, 12)
    assert idx.overlapping(0, 2) == [(1, 0)]
    assert idx.overlapping(5, 9) == [(2, 3)]  # started before, still open at 5
    assert idx.overlapping(4, 10) == [(1, 0), (2, 3), (1, 10)]
    assert idx.overlapping(13, 20) == []
    assert idx.drop_before(5) == 1
    assert AbortedTxns.from_json(idx.to_json()).overlapping(0, 100) == [(2, 3), (1, 10)]


def test_checkpoint_keeps_transactions_and_reads_older_ones() -> None:
    cp = Checkpoint(
        "t", "id", 0, 1, "b", "i", -1, transactions={"7": [3, 2]}, aborted_txns=[[8, 0, 2]]
    )
    back = Checkpoint.decode(cp.encode())
    assert back.transactions == {"7": [3, 2]} and back.aborted_txns == [[8, 0, 2]]
    older = cp.encode().replace(b',"transactions":{"7":[3,2]},"aborted_txns":[[8,0,2]]', b"")
    assert b"transactions" not in older
    assert Checkpoint.decode(older).transactions == {}


# ------------------------------------------------------------------ a real partition
def txn(pid: int, epoch: int, seq: int, n: int = 2, *, transactional: bool = True) -> bytes:
    return records.build_batch(
        [(b"k%d" % i, b"v-%d-%d" % (pid, seq + i)) for i in range(n)],
        timestamp_ms=1_700_000_000_000,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=records.TRANSACTIONAL_FLAG if transactional else 0,
    )


def batch_offsets(data: bytes) -> list[tuple[int, int, bool]]:
    return [(h.base_offset, h.last_offset, h.is_control) for h in records.iter_headers(data)]


async def engine(tmp_path: Path, made: list[ObjectStreamEngine], broker: int) -> ObjectStreamEngine:
    e = ObjectStreamEngine(LocalDirObjectStore(tmp_path / "objects"), broker, CONFIG)
    await e.start()
    made.append(e)
    return e


async def test_lso_read_committed_and_markers(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e = await engine(tmp_path, engines, 1)
    p = await e.open_partition(TP, "id", 1, PartitionConfig())
    assert isinstance(p, Partition)
    await p.append(txn(1, 0, 0))  # 0-1: producer 1's transaction starts
    await p.append(records.build_batch([(b"k", b"plain")]))  # 2
    assert (p.high_watermark, p.last_stable_offset) == (3, 0)
    uncommitted = await p.read(0, 1 << 20)
    assert [b[:2] for b in batch_offsets(uncommitted.records)] == [(0, 1), (2, 2)]
    assert uncommitted.last_stable_offset == 0 and uncommitted.aborted is None
    nothing = await p.read(0, 1 << 20, committed=True)
    assert nothing.records == b"" and nothing.last_stable_offset == 0 and nothing.aborted == []
    with pytest.raises(InvalidTxnState):
        await p.append(txn(1, 0, 2, transactional=False))
    await p.append(txn(2, 0, 0))  # 3-4: producer 2's transaction
    r = await p.write_txn_marker(1, 0, commit=True, coordinator_epoch=0)  # 5
    assert r.base_offset == 5
    assert (p.high_watermark, p.last_stable_offset) == (6, 3)  # producer 2's still open
    part = await p.read(0, 1 << 20, committed=True)
    assert [b[:2] for b in batch_offsets(part.records)] == [(0, 1), (2, 2)]
    r = await p.write_txn_marker(2, 0, commit=False, coordinator_epoch=0)  # 6
    assert p.last_stable_offset == p.high_watermark == 7
    done = await p.read(0, 1 << 20, committed=True)
    assert batch_offsets(done.records) == [
        (0, 1, False),
        (2, 2, False),
        (3, 4, False),
        (5, 5, True),
        (6, 6, True),
    ]
    assert done.aborted == [(2, 3)]
    assert (await p.read(5, 1 << 20, committed=True)).aborted == [(2, 3)]
    assert (await p.read(0, 1, committed=True)).aborted == []  # only the first batch read
    # the marker is Kafka's: control batch, key (0, type), value (0, coordinator epoch)
    marker = records.read_header(
        done.records, [b for b in records.iter_headers(done.records)][3].position
    )
    ((_, key, value),) = records.iter_records(done.records, marker)
    assert (key, value) == (b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")
    assert marker.producer_id == 1 and marker.is_transactional
    # what DescribeProducers shows
    rows = {a.producer_id: a for a in p.active_producers()}
    assert rows[2].coordinator_epoch == 0 and rows[2].current_txn_start_offset == -1


async def test_fencing_of_zombie_producers_and_coordinators(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e = await engine(tmp_path, engines, 1)
    p = await e.open_partition(TP, "id", 1, PartitionConfig())
    await p.append(txn(1, 0, 0))
    # the coordinator fences the producer: abort with the bumped epoch
    await p.write_txn_marker(1, 1, commit=False, coordinator_epoch=3)
    with pytest.raises(InvalidProducerEpoch):
        await p.append(txn(1, 0, 2))
    with pytest.raises(InvalidProducerEpoch):
        await p.write_txn_marker(1, 0, commit=True, coordinator_epoch=3)
    with pytest.raises(TransactionCoordinatorFenced):
        await p.write_txn_marker(1, 1, commit=True, coordinator_epoch=2)
    with pytest.raises(InvalidRecord):  # control batches come from the broker only
        await p.append(
            records.build_batch(
                [(b"\x00\x00\x00\x01", b"")],
                producer_id=1,
                producer_epoch=1,
                attributes=records.CONTROL_FLAG,
            )
        )
    await p.append(txn(1, 1, 0))  # the new incarnation starts at sequence 0
    assert p.last_stable_offset == 3
    await p.delete_records_before(4)  # the open transaction's start is deleted
    assert (p.log_start_offset, p.last_stable_offset, p.high_watermark) == (4, 4, 5)


async def test_kill_9_and_a_move_keep_the_lso_and_the_aborted_index(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e1 = await engine(tmp_path, engines, 1)
    p1 = await e1.open_partition(TP, "id", 1, PartitionConfig())
    await p1.append(txn(1, 0, 0))  # 0-1 aborted below
    await p1.append(txn(2, 0, 0))  # 2-3 stays open
    await p1.commit_checkpoint()  # part in the checkpoint, part only in the WAL
    await p1.write_txn_marker(1, 0, commit=False, coordinator_epoch=1)  # 4
    await p1.append(txn(3, 0, 0))  # 5-6 committed below
    await p1.write_txn_marker(3, 0, commit=True, coordinator_epoch=1)  # 7
    assert (p1.last_stable_offset, p1.high_watermark) == (2, 8)
    await e1.abandon()  # kill -9: no clean checkpoint, the WAL replayed by the next owner
    engines.remove(e1)

    e2 = await engine(tmp_path, engines, 2)
    p2 = await e2.open_partition(TP, "id", 2, PartitionConfig())
    assert (p2.last_stable_offset, p2.high_watermark) == (2, 8)
    stable = await p2.read(0, 1 << 20, committed=True)
    assert batch_offsets(stable.records) == [(0, 1, False)] and stable.aborted == [(1, 0)]
    with pytest.raises(InvalidTxnState):  # producer 2 is still in its transaction
        await p2.append(txn(2, 0, 2, transactional=False))
    with pytest.raises(TransactionCoordinatorFenced):
        await p2.write_txn_marker(3, 0, commit=True, coordinator_epoch=0)
    await p2.write_txn_marker(2, 0, commit=True, coordinator_epoch=1)  # 8
    got = await p2.read(0, 1 << 20, committed=True)
    assert got.aborted == [(1, 0)] and got.last_stable_offset == 9
    await e2.close_partition(TP)  # a move: clean close, the next owner reads the checkpoint

    e3 = await engine(tmp_path, engines, 3)
    p3 = await e3.open_partition(TP, "id", 3, PartitionConfig())
    assert (p3.last_stable_offset, p3.high_watermark) == (9, 9)
    assert (await p3.read(0, 1 << 20, committed=True)).aborted == [(1, 0)]
    await p3.delete_records_before(5)  # the aborted transaction is below the log start now
    assert (await p3.read(5, 1 << 20, committed=True)).aborted == []
