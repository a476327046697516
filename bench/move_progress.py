"""Where a move phase of bench/metadata_scale.py stands, from its Metadata polls.

A poll of a large cluster (50,000 partitions) takes the tracker's thread tens of milliseconds
to apply, while the bench's main thread checks every 0.1 s whether the phase is done. Each poll
is therefore applied to new objects and published with one assignment: a reader sees the whole
previous poll or the whole new one, never the counts of the new one (the new broker leading
its fair share) with only part of its arrivals (a sample of moved partitions that looks empty,
so "every sampled partition served" holds with none of them probed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

TP = tuple[str, int]


@dataclass(frozen=True)
class Poll:
    """One applied Metadata poll; never changed once published."""

    leaders: Mapping[TP, int] = field(default_factory=dict)  # the tracked topics' partitions
    led_by: Counter[int] = field(default_factory=Counter)  # every topic's, internal ones too
    moved_at: Mapping[TP, float] = field(default_factory=dict)  # first seen at its new home


@dataclass(frozen=True)
class Applied:
    """What a poll changed: sampled partitions that arrived (to probe) and partitions that
    left their new home again (to forget)."""

    arrived_sampled: list[TP]
    left: list[TP]


class MoveProgress:
    """`moved(tp, leader)` says whether a partition is at its new home; `sample` the partitions
    whose arrival is probed with a write."""

    def __init__(
        self,
        topics: Collection[str],
        moved: Callable[[TP, int], bool],
        sample: Collection[TP],
    ) -> None:
        self.topics = set(topics)
        self.moved = moved
        self.sample = frozenset(sample)
        self.current = Poll()
        self.left = 0

    @property
    def leaders(self) -> Mapping[TP, int]:
        return self.current.leaders

    @property
    def led_by(self) -> Counter[int]:
        return self.current.led_by

    @property
    def moved_at(self) -> Mapping[TP, float]:
        return self.current.moved_at

    def sampled_moved(self) -> set[TP]:
        return self.sample & self.current.moved_at.keys()

    def apply(self, leaders: Mapping[TP, int], seen: float) -> Applied:
        """Every partition of every topic -> its leader, answered at `seen`."""
        before = self.current.moved_at
        moved_at = dict(before)
        ours: dict[TP, int] = {}
        arrived: list[TP] = []
        left: list[TP] = []
        for tp, leader in leaders.items():
            if tp[0] not in self.topics:
                continue
            ours[tp] = leader
            there = self.moved(tp, leader)
            if there and tp not in before:
                moved_at[tp] = seen
                if tp in self.sample:
                    arrived.append(tp)
            elif not there and tp in before:
                del moved_at[tp]
                left.append(tp)
        self.left += len(left)
        self.current = Poll(ours, Counter(leaders.values()), moved_at)  # the one publication
        return Applied(arrived, left)
