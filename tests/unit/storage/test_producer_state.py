from __future__ import annotations

import pytest
from tidalmq_broker.storage.api import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId
from tidalmq_broker.storage.producer_state import BatchMeta, ProducerStateTable


def table_with(pid: int, epoch: int, *batches: tuple[int, int, int, int]) -> ProducerStateTable:
    t = ProducerStateTable()
    for fs, ls, bo, lo in batches:
        t.apply(pid, epoch, BatchMeta(fs, ls, bo, lo))
    return t


def test_unknown_producer_must_start_at_zero() -> None:
    t = ProducerStateTable()
    assert t.check(1, 0, 0, 4) is None
    with pytest.raises(UnknownProducerId):
        t.check(1, 0, 5, 9)


def test_next_sequence_is_accepted_and_gap_rejected() -> None:
    t = table_with(1, 0, (0, 4, 100, 104))
    assert t.check(1, 0, 5, 9) is None
    with pytest.raises(OutOfOrderSequence):
        t.check(1, 0, 6, 9)


def test_duplicates_of_the_last_five_batches_return_original_offsets() -> None:
    t = table_with(1, 0, *[(i * 2, i * 2 + 1, 100 + i * 2, 101 + i * 2) for i in range(7)])
    assert t.check(1, 0, 12, 13) == BatchMeta(12, 13, 112, 113)
    assert t.check(1, 0, 4, 5) == BatchMeta(4, 5, 104, 105)  # 5th newest
    with pytest.raises(OutOfOrderSequence):
        t.check(1, 0, 2, 3)  # older than the window: not recognisable any more


def test_epochs() -> None:
    t = table_with(1, 3, (0, 0, 0, 0))
    with pytest.raises(InvalidProducerEpoch):
        t.check(1, 2, 1, 1)
    assert t.check(1, 4, 0, 0) is None  # new epoch restarts at zero
    with pytest.raises(OutOfOrderSequence):
        t.check(1, 4, 1, 1)
    t.apply(1, 4, BatchMeta(0, 0, 9, 9))
    assert list(t.producers[1].batches) == [BatchMeta(0, 0, 9, 9)]


def test_sequence_wraps_around() -> None:
    top = (1 << 31) - 1
    t = table_with(1, 0, (top - 1, top, 0, 1))
    assert t.check(1, 0, 0, 3) is None


def test_persistence_truncation_and_expiry() -> None:
    t = table_with(1, 0, (0, 1, 0, 1), (2, 3, 2, 3))
    t.apply(2, 5, BatchMeta(0, 0, 4, 4), now_ms=10)
    clone = ProducerStateTable.from_json(t.to_json())
    assert clone.to_json() == t.to_json()
    clone.truncate_from(2)
    assert [b.last_offset for b in clone.producers[1].batches] == [1]
    assert clone.producers[2].batches == type(clone.producers[2].batches)([], maxlen=5)
    assert t.expire(now_ms=10 + 25 * 3600 * 1000) == 2


def test_describe_lists_each_producer_with_its_last_sequence() -> None:
    t = ProducerStateTable()
    assert t.describe() == []
    t.apply(7, 0, BatchMeta(0, 4, 0, 4), now_ms=1000)
    t.apply(7, 0, BatchMeta(5, 9, 5, 9), now_ms=2000)
    t.apply(3, 2, BatchMeta(0, 0, 10, 10))
    assert t.describe() == [(3, 2, 0, -1, -1, -1), (7, 0, 9, 2000, -1, -1)]
    t.truncate_from(5)  # a rollback forgets producer 3's batch and producer 7's second one
    assert t.describe() == [(3, 2, -1, -1, -1, -1), (7, 0, 4, 2000, -1, -1)]
