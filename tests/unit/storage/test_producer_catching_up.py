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
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    OutOfOrderSequence,
    PartitionConfig,
    ProducerCatchingUp,
)
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_core.model import TopicPartition

from tests.unit.storage.test_transactions import engine

TP = TopicPartition("t", 0)
PID = 42


def idem(seq: int, n: int = 2) -> bytes:
    return records.build_batch(
        [(b"k", b"v-%d" % (seq + i)) for i in range(n)],
        timestamp_ms=1_700_000_000_000,
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
    )


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
