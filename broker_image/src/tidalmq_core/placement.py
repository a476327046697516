"""Placement of partitions on brokers (partition i on broker i mod n)."""

from __future__ import annotations

from collections.abc import Sequence


def place_partitions(brokers: Sequence[int], count: int, *, first_partition: int = 0) -> list[int]:
    """The broker of each new partition, partitions `first_partition .. first_partition+count-1`.

    Brokers are taken in id order; partition i goes to broker number (i mod n), so adding
    partitions to an existing topic continues the same round robin.
    """
    if not brokers:
        raise ValueError("no live broker to place partitions on")
    ordered = sorted(brokers)
    n = len(ordered)
    return [ordered[i % n] for i in range(first_partition, first_partition + count)]
