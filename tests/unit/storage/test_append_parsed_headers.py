"""The Produce handler parses a partition's batch headers once and hands them to the append
(Partition.start_append's `headers`): the append must still check every batch's CRC and that the
headers cover the bytes, and undo a multi-batch append's producer state when a later batch is
refused (the entry is copied for the undo only before a batch that is not the last)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    Acknowledgement,
    CorruptRecord,
    OutOfOrderSequence,
    PartitionConfig,
)
from tidalmq_broker.storage.engine import ObjectStreamEngine

from tests.unit.storage.test_producer_catching_up import PID, TP, idem
from tests.unit.storage.test_transactions import engine


async def test_parsed_headers_still_have_their_crc_checked(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e = await engine(tmp_path, engines, 1)
    p = await e.open_partition(TP, "id", 1, PartitionConfig())
    data = bytearray(idem(0))
    headers = records.read_headers(data)  # the handler's parse: bounds, not the CRC
    data[-1] ^= 0xFF  # a record byte: only the CRC can tell
    with pytest.raises(CorruptRecord, match="CRC"):
        p.start_append(memoryview(data), owned=True, headers=records.read_headers(data))
    with pytest.raises(CorruptRecord, match="cover"):
        p.start_append(idem(0) + idem(2), headers=headers)  # the second batch not parsed
    taken = p.start_append(idem(0), headers=records.read_headers(idem(0)))
    assert isinstance(taken, Acknowledgement)
    assert (await taken).base_offset == 0  # the producer's state untouched by the refusals
    assert p.high_watermark == 2


async def test_a_refused_later_batch_undoes_the_earlier_ones(
    tmp_path: Path, engines: list[ObjectStreamEngine]
) -> None:
    e = await engine(tmp_path, engines, 1)
    p = await e.open_partition(TP, "id", 1, PartitionConfig())
    both = idem(0) + idem(5)  # the second batch out of order
    with pytest.raises(OutOfOrderSequence):
        p.start_append(both, headers=records.read_headers(both))
    # sequence 0 was not kept: it is appended, not answered as a duplicate
    first = await p.append(idem(0))
    assert (first.base_offset, first.duplicate) == (0, False)
    # a record set whose last batch is a duplicate: the batch before it is undone too
    again = idem(2) + idem(0)
    retried = await p.append(again)
    assert retried.duplicate
    assert p.producer_entry(PID) is not None
    second = await p.append(idem(2))
    assert (second.base_offset, second.duplicate) == (2, False)
    assert p.high_watermark == 4
