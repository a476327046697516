"""The one replay both coordinators load their shard with (internal_shards.replay): every keyed
record from the log start to the high watermark, in order and once, control batches included,
reads that begin inside a batch trimmed, an early stop once the shard closed, and a loud error
instead of a spin when a read returns no whole batch."""

from __future__ import annotations

import asyncio

import pytest
from tidalmq_broker.internal_shards import REPLAY_READ_BYTES, ReplayedRecord, replay
from tidalmq_broker.protocol.records import CONTROL_FLAG, build_batch
from tidalmq_broker.storage.api import ReadResult


class BatchLog:
    """A partition log of given batches; a read returns whole batches from the one holding
    `offset`, at most `batches_per_read` of them (a stand-in for max_bytes)."""

    def __init__(self, batches: list[bytes], offsets: list[int], end: int, per_read: int = 1):
        self.batches, self.offsets = batches, offsets
        self.log_start_offset, self.high_watermark = offsets[0], end
        self.per_read = per_read
        self.reads: list[tuple[int, int]] = []

    async def read(self, offset: int, max_bytes: int, *, committed: bool = False) -> ReadResult:
        self.reads.append((offset, max_bytes))
        first = max(i for i, base in enumerate(self.offsets) if base <= offset)
        data = b"".join(self.batches[first : first + self.per_read])
        return ReadResult(data, self.high_watermark, self.log_start_offset)


def collect(log: BatchLog, closed: list[bool] | None = None) -> list[ReplayedRecord]:
    async def run() -> list[ReplayedRecord]:
        out = []
        async for record in replay(log, lambda: bool(closed and closed[0])):  # type: ignore[arg-type]
            out.append(record)
        return out

    return asyncio.run(run())


def three_batches() -> BatchLog:
    batches = [
        build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=10),
        build_batch([(b"c", None)], base_offset=12),  # a tombstone
        build_batch(
            [(b"\x00\x00\x00\x01", b"\x00\x00")],
            base_offset=13,
            producer_id=7,
            producer_epoch=0,
            attributes=CONTROL_FLAG,
        ),
    ]
    return BatchLog(batches, [10, 12, 13], end=14)


@pytest.mark.parametrize("per_read", [1, 2, 3])
def test_every_keyed_record_once_in_order_whatever_a_read_returns(per_read: int) -> None:
    log = three_batches()
    log.per_read = per_read
    records = collect(log)
    assert [(r.offset, r.key, r.value) for r in records] == [
        (10, b"a", b"1"),
        (11, b"b", b"2"),
        (12, b"c", None),
        (13, b"\x00\x00\x00\x01", b"\x00\x00"),
    ]
    assert [r.header.is_control for r in records] == [False, False, False, True]
    assert records[-1].header.producer_id == 7
    assert log.reads[0] == (10, REPLAY_READ_BYTES)
    assert len(log.reads) == -(-3 // per_read)  # one read per batch group, none at the end


def test_a_read_that_starts_inside_a_batch_skips_what_lies_before_the_log_start() -> None:
    log = three_batches()
    log.log_start_offset = 11  # the batch at 10 still holds offset 10
    assert [r.offset for r in collect(log)] == [11, 12, 13]


def test_records_without_a_key_are_skipped() -> None:
    log = BatchLog([build_batch([(None, b"x"), (b"k", b"v")], base_offset=0)], [0], end=2)
    assert [(r.offset, r.key) for r in collect(log)] == [(1, b"k")]


def test_stops_at_the_high_watermark_and_once_closed() -> None:
    log = three_batches()
    log.high_watermark = 12
    assert [r.offset for r in collect(log)] == [10, 11]
    closed = [False]
    log = three_batches()

    async def run() -> list[int]:
        out = []
        async for record in replay(log, lambda: closed[0]):  # type: ignore[arg-type]
            out.append(record.offset)
            closed[0] = True  # the partition closes while the first batch is replayed
        return out

    assert asyncio.run(run()) == [10, 11]  # the batch in hand ends, no further read
    assert len(log.reads) == 1


def test_a_read_with_no_whole_batch_fails_instead_of_spinning() -> None:
    whole = build_batch([(b"a", b"1")], base_offset=0)
    log = BatchLog([whole[:-3]], [0], end=1)  # a truncated batch: no whole one
    with pytest.raises(RuntimeError, match="no whole batch"):
        collect(log)
