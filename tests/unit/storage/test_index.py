from __future__ import annotations

import pytest
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex


def entry(
    base: int, last: int, ts: int, key: str = "wal/1/a/000000000001", pos: int = 0
) -> IndexEntry:
    return IndexEntry(base, last, key, pos, (last - base + 1) * 10, ts)


def test_find_by_offset() -> None:
    index = OffsetIndex([entry(0, 9, 100), entry(10, 19, 200), entry(20, 20, 150)])
    assert index.find(0) == 0
    assert index.find(9) == 0
    assert index.find(10) == 1
    assert index.find(20) == 2
    assert index.find(21) is None
    assert index.find(-1) is None
    assert (index.start_offset, index.end_offset, index.size_bytes) == (0, 21, 210)


def test_find_by_timestamp_uses_running_maximum() -> None:
    index = OffsetIndex(
        [entry(0, 9, 100), entry(10, 19, 300), entry(20, 29, 200), entry(30, 39, 400)]
    )
    assert index.find_timestamp(50) == 0
    assert index.find_timestamp(100) == 0
    assert index.find_timestamp(101) == 1
    assert index.find_timestamp(250) == 1  # entry 2 has max 200 but entry 1 already reached 300
    assert index.find_timestamp(301) == 3
    assert index.find_timestamp(401) is None


def test_entries_must_be_contiguous() -> None:
    index = OffsetIndex([entry(0, 9, 1)])
    with pytest.raises(ValueError):
        index.append(entry(11, 12, 1))
    with pytest.raises(ValueError):
        index.append(IndexEntry(10, 9, "k", 0, 1, 1))


def test_drop_before_and_truncate() -> None:
    index = OffsetIndex([entry(0, 9, 1), entry(10, 19, 2), entry(20, 29, 3)])
    assert index.drop_before(15) == [entry(0, 9, 1)]  # the entry holding 15 stays
    assert index.start_offset == 10
    assert index.truncate_from(20) == [entry(20, 29, 3)]
    assert index.end_offset == 20
    assert index.find_timestamp(2) == 0


def test_replace_swaps_a_run_only_if_unchanged() -> None:
    a, b, c = entry(0, 9, 1), entry(10, 19, 5), entry(20, 29, 3)
    index = OffsetIndex([a, b, c])
    seg = IndexEntry(0, 19, "partitions/t/id/0/segments/x", 0, 200, 5)
    assert index.replace([a, b], [seg])
    assert index.entries == [seg, c]
    assert not index.replace([a, b], [seg])  # already gone
    assert index.wal_keys() == {c.key} and index.wal_ranges() == 1
    with pytest.raises(ValueError):
        index.replace([seg], [IndexEntry(0, 18, "x", 0, 1, 1)])
