"""After a failover a client sends its unacknowledged batches to the new owner pipelined: the
first are refused while the partition opens, and one that arrives once it is open is ahead of
the log. It is answered retriably (NOT_LEADER_OR_FOLLOWER), not OUT_OF_ORDER_SEQUENCE_NUMBER,
on which librdkafka bumps its epoch and sends again, as new records, a batch the old owner had
made durable (CI read records twice after a kill -9 that way). Only until the producer's first
batch is appended or answered as a duplicate there: later, a gap is a gap."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.errors import error_code
from tidalmq_broker.storage.api import (
    OutOfOrderSequence,
    PartitionConfig,
    PartitionFenced,
    ProducerCatchingUp,
)
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_core.model import TopicPartition

from tests.support.storage_helpers import idempotent_batch
from tests.unit.storage.test_transactions import engine

TP = TopicPartition("t", 0)
PID = 42


def idem(seq: int, n: int = 2) -> bytes:
    return idempotent_batch(PID, seq, n)


async def test_a_batch_ahead_right_after_a_failover_is_retriable(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e1 = await engine(tmp_path, engines, 1)
    p1 = await e1.open_partition(TP, "id", 1, PartitionConfig())
    await p1.append(idem(0))
    await p1.append(idem(2))  # durable; say its acknowledgement was lost with the owner
    await e1.abandon()  # kill -9
    e2 = await engine(tmp_path, engines, 2)
    p2 = await e2.open_partition(TP, "id", 2, PartitionConfig())  # recovers 0-3
    # the batch after the unacknowledged ones arrives first (they were refused while opening)
    with pytest.raises(ProducerCatchingUp) as early:
        await p2.append(idem(6))
    assert error_code(early.value) == ErrorCode.not_leader_or_follower
    assert (await p2.append(idem(2))).duplicate  # the retries, in order
    assert (await p2.append(idem(4))).base_offset == 4
    assert (await p2.append(idem(6))).base_offset == 6
    # from now on a gap is a gap
    with pytest.raises(OutOfOrderSequence):
        await p2.append(idem(12))
    assert p2.high_watermark == 8


async def test_a_batch_made_durable_under_a_lapsed_lease_is_a_duplicate_after_the_reopen(
    tmp_path: Path,
) -> None:
    """The controller crash test's partition 360: its owner's lease lapsed while a flush was in
    flight; the batch became durable but was refused (NOT_LEADER_OR_FOLLOWER), the partition was
    closed and reopened at the next epoch, and the producer's retry under the same epoch and
    sequences is answered with the original offsets, not appended again. (What the crash test
    read twice came back under a new producer epoch, from sequence 0: see
    tests/unit/broker/test_fenced_release.py.)"""
    lease = {"ok": True}
    e1 = ObjectStreamEngine(
        LocalDirObjectStore(tmp_path / "objects"), 0, lease_check=lambda: lease["ok"]
    )
    await e1.start()
    try:
        p1 = await e1.open_partition(TP, "id", 1, PartitionConfig())
        assert (await p1.append(idem(0, 17))).base_offset == 0
        pending = p1.start_append(idem(17, 48))  # offsets 17-64, in the WAL writer's buffer
        lease["ok"] = False  # fenced before its flush completed
        with pytest.raises(PartitionFenced) as refused:
            await pending
        assert error_code(refused.value) == ErrorCode.not_leader_or_follower
        assert p1.high_watermark == 65  # durable all the same
        await e1.close_partition(TP)
        lease["ok"] = True  # registered again
        p2 = await e1.open_partition(TP, "id", 2, PartitionConfig())
        retry = await p2.append(idem(17, 48))
        assert retry.duplicate and (retry.base_offset, retry.last_offset) == (17, 64)
        assert (await p2.append(idem(65))).base_offset == 65
        assert p2.high_watermark == 67
    finally:
        await e1.stop()


async def test_a_retry_is_not_acknowledged_past_the_lease(tmp_path: Path) -> None:
    """A retried batch answered as a duplicate is an acknowledgement like the original's: not
    once this broker's lease lapsed (another owner may have opened the partition without the
    WAL object holding it), but NOT_LEADER_OR_FOLLOWER, retried elsewhere."""
    lease = {"ok": True}
    e1 = ObjectStreamEngine(
        LocalDirObjectStore(tmp_path / "objects"), 0, lease_check=lambda: lease["ok"]
    )
    await e1.start()
    try:
        p1 = await e1.open_partition(TP, "id", 1, PartitionConfig())
        assert (await p1.append(idem(0))).base_offset == 0
        lease["ok"] = False
        with pytest.raises(PartitionFenced) as refused:
            await p1.append(idem(0))
        assert error_code(refused.value) == ErrorCode.not_leader_or_follower
        lease["ok"] = True
        assert (await p1.append(idem(0))).duplicate
    finally:
        await e1.stop()
