from __future__ import annotations

import random
from collections import Counter
from itertools import combinations

import pytest
from tidalmq_core.balance import balance_counts
from tidalmq_core.model import TopicPartition


def lower_bound(assignment: dict, brokers: list[int]) -> int:
    """The fewest moves any balanced result needs, by brute force (independent of the code
    under test): each broker ends with floor or ceil of the average, so try every choice of the
    brokers that get the ceiling; a broker above its final count moves the excess away, and
    every partition on a broker that is not live moves."""
    counts = Counter(b for b in assignment.values() if b in brokers)
    orphans = sum(1 for b in assignment.values() if b not in brokers)
    base, extra = divmod(len(assignment), len(brokers))
    best = min(
        sum(max(0, counts[b] - (base + (b in ceil))) for b in brokers)
        for ceil in map(set, combinations(brokers, extra))
    )
    return orphans + best


def check(assignment: dict, brokers: list[int]) -> None:
    plan = balance_counts(assignment, brokers)
    counts = Counter(plan.assignment.values())
    avg = len(assignment) / len(brokers)
    assert set(counts) <= set(brokers)
    for b in brokers:
        assert abs(counts[b] - avg) < 1, (counts, avg)
    changed = [p for p in assignment if assignment[p] != plan.assignment[p]]
    assert len(changed) == len(plan.moves) == lower_bound(assignment, brokers)
    for move in plan.moves:
        assert plan.assignment[move.partition] == move.target
        assert assignment[move.partition] == move.source


def test_new_broker_gets_a_fair_share_with_minimal_moves() -> None:
    tps = [TopicPartition("t", i) for i in range(300)]
    assignment = {tp: i % 3 for i, tp in enumerate(tps)}
    plan = balance_counts(assignment, [0, 1, 2, 3])
    assert len(plan.moves) == 75
    assert Counter(plan.assignment.values()) == {0: 75, 1: 75, 2: 75, 3: 75}
    assert all(m.target == 3 for m in plan.moves)


def test_removed_broker_partitions_are_rehomed() -> None:
    assignment = {TopicPartition("t", i): i % 4 for i in range(24)}
    plan = balance_counts(assignment, [0, 1, 2])
    assert {m.source for m in plan.moves} == {3}
    assert len(plan.moves) == 6
    assert Counter(plan.assignment.values()) == {0: 8, 1: 8, 2: 8}


def test_already_balanced_moves_nothing() -> None:
    assignment = {TopicPartition("t", i): i % 3 for i in range(10)}
    assert balance_counts(assignment, [0, 1, 2]).moves == []


def test_topics_stay_spread() -> None:
    # two topics, all on broker 0; after balancing, each topic is split evenly
    assignment = {TopicPartition(t, i): 0 for t in ("a", "b") for i in range(4)}
    plan = balance_counts(assignment, [0, 1])
    for topic in ("a", "b"):
        per = Counter(b for tp, b in plan.assignment.items() if tp.topic == topic)
        assert per == {0: 2, 1: 2}


def test_unassigned_partitions_are_placed() -> None:
    assignment = {TopicPartition("t", i): None for i in range(5)}
    plan = balance_counts(assignment, [7, 9])
    assert sorted(Counter(plan.assignment.values()).values()) == [2, 3]


def test_no_brokers() -> None:
    with pytest.raises(ValueError):
        balance_counts({TopicPartition("t", 0): 0}, [])


@pytest.mark.parametrize("seed", range(40))
def test_random_assignments(seed: int) -> None:
    rng = random.Random(seed)
    brokers_before = list(range(rng.randint(1, 8)))
    brokers_after = sorted(rng.sample(range(10), rng.randint(1, 8)))
    assignment = {
        TopicPartition(f"t{rng.randint(0, 5)}", i): rng.choice(brokers_before)
        for i in range(rng.randint(0, 200))
    }
    check(assignment, brokers_after)


def test_new_broker_gets_a_share_of_every_topic() -> None:
    assignment = {TopicPartition("offsets", i): i % 3 for i in range(16)}
    assignment |= {TopicPartition("orders", i): i % 3 for i in range(12)}
    plan = balance_counts(assignment, [0, 1, 2, 3])
    assert len(plan.moves) == 7  # the lower bound
    for topic, share in (("offsets", 4), ("orders", 3)):
        per = Counter(b for tp, b in plan.assignment.items() if tp.topic == topic)
        assert per == {0: share, 1: share, 2: share, 3: share}, (topic, per)
