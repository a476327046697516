"""The value of the annotation tidalmq.io/accept-data-loss (tidalmq_operator.recovery)."""

from __future__ import annotations

import pytest
from tidalmq_operator.recovery import InvalidValue, parse_partitions


def test_true_accepts_every_lost_partition() -> None:
    assert parse_partitions("true", 8) is None
    assert parse_partitions(" True ", 8) is None


def test_partition_lists_and_ranges() -> None:
    assert parse_partitions("0,3,7", 8) == [0, 3, 7]
    assert parse_partitions("0-2, 5,5", 8) == [0, 1, 2, 5]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "empty"),
        ("yes", "'yes' is not a partition number"),
        ("1,x", "'x'"),
        ("3-1", "empty range"),
        ("8", "has no partition 8 (it has 8)"),
        ("6-9", "has no 2 partitions: 8-9"),
    ],
)
def test_invalid_values_say_why(value: str, why: str) -> None:
    with pytest.raises(InvalidValue, match=None) as info:
        parse_partitions(value, 8)
    assert why in str(info.value)
