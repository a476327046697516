"""balance_load: the planner's load balancing (bytes in, bytes out; partition count as tie-break)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from tidalmq_core.balance import balance_load, imbalances
from tidalmq_core.model import TopicPartition

TP = TopicPartition


def loads_of(
    assignment: Mapping[TP, int], load: Mapping[TP, Sequence[float]], brokers: Sequence[int]
) -> dict[int, list[float]]:
    dims = len(next(iter(load.values())))
    out = {b: [0.0] * dims for b in brokers}
    for p, b in assignment.items():
        for d, x in enumerate(load.get(p, (0.0,) * dims)):
            out[b][d] += x
    return out


def check_plan(assignment, load, brokers, plan) -> None:  # type: ignore[no-untyped-def]
    """Invariants of every plan: moves match the assignment, each partition moves once, the
    reported loads are the real ones, and no plan beats the lower bound."""
    moved = [m.partition for m in plan.moves]
    assert len(moved) == len(set(moved))
    for m in plan.moves:
        assert assignment[m.partition] == m.source
        assert plan.assignment[m.partition] == m.target
        assert m.target in brokers
    changed = {p for p in assignment if assignment[p] != plan.assignment[p]}
    assert changed == set(moved)
    assert set(plan.assignment.values()) <= set(brokers)
    for b, vec in loads_of(plan.assignment, load, brokers).items():
        assert plan.after[b] == pytest.approx(vec)
    if plan.balanced:
        assert len(plan.moves) >= plan.lower_bound


def test_already_balanced_moves_nothing() -> None:
    assignment = {TP("t", i): i % 4 for i in range(40)}
    load = {tp: (100.0, 50.0) for tp in assignment}
    plan = balance_load(assignment, load, [0, 1, 2, 3])
    assert plan.moves == [] and plan.balanced and plan.lower_bound == 0
    assert plan.imbalance_before() == plan.imbalance_after() == (1.0, 1.0)


def test_within_threshold_is_left_alone() -> None:
    # 5% apart: inside a 1.10 band, so nothing moves although a move would even it out
    assignment = {TP("t", 0): 0, TP("t", 1): 1, TP("t", 2): 0, TP("t", 3): 1}
    load = {TP("t", 0): (52.0,), TP("t", 1): (48.0,), TP("t", 2): (50.0,), TP("t", 3): (50.0,)}
    assert balance_load(assignment, load, [0, 1], threshold=1.1).moves == []


def test_skewed_hot_partitions_spread_with_the_fewest_moves() -> None:
    # 3 brokers; topic "hot" has 6 partitions 10x the others, and all of them sit on broker 0
    assignment: dict[TP, int] = {}
    load: dict[TP, tuple[float, float]] = {}
    for i in range(6):
        assignment[TP("hot", i)] = 0
        load[TP("hot", i)] = (1000.0, 2000.0)
    for i in range(60):
        assignment[TP("cold", i)] = i % 3
        load[TP("cold", i)] = (100.0, 200.0)
    brokers = [0, 1, 2]
    plan = balance_load(assignment, load, brokers, threshold=1.1)
    check_plan(assignment, load, brokers, plan)
    assert plan.imbalance_before()[0] == pytest.approx(8000 / 4000)
    assert plan.balanced
    assert max(plan.imbalance_after()) <= 1.1 + 1e-9
    # broker 0 holds 8000 of 12000 (mean 4000, cap 4400): it sheds 3600, i.e. at least 4 hot
    # partitions; brokers 1 and 2 (2000 each, floor 3600) each need 2 of them: 4 is optimal
    assert plan.lower_bound == 4
    assert len(plan.moves) == 4
    assert all(m.partition.topic == "hot" and m.source == 0 for m in plan.moves)
    assert Counter(m.target for m in plan.moves) == {1: 2, 2: 2}


def test_broker_that_just_joined_takes_its_share() -> None:
    rng = random.Random(7)
    assignment = {TP(f"t{t}", i): (t * 8 + i) % 3 for t in range(4) for i in range(8)}
    load = {tp: (rng.uniform(50, 150), rng.uniform(0, 300)) for tp in assignment}
    brokers = [0, 1, 2, 3]
    plan = balance_load(assignment, load, brokers, threshold=1.1)
    check_plan(assignment, load, brokers, plan)
    assert plan.before[3] == (0.0, 0.0)
    assert plan.balanced
    assert sum(m.target == 3 for m in plan.moves) >= 5
    mean = [sum(v[d] for v in plan.after.values()) / 4 for d in range(2)]
    for d in range(2):
        assert plan.after[3][d] >= 0.9 * mean[d] - 1e-6
        assert max(v[d] for v in plan.after.values()) <= 1.1 * mean[d] + 1e-6
    assert len(plan.moves) <= 1.2 * plan.lower_bound + 1


def test_joined_broker_takes_only_from_the_others_when_they_were_balanced() -> None:
    assignment = {TP(f"t{t}", i): (t * 8 + i) % 3 for t in range(4) for i in range(8)}
    load = {tp: (100.0 + tp.partition,) for tp in assignment}
    plan = balance_load(assignment, load, [0, 1, 2, 3], threshold=1.1)
    assert plan.balanced
    assert all(m.target == 3 for m in plan.moves)  # nothing shuffles between the old brokers
    assert len(plan.moves) == plan.lower_bound


def test_move_budget_is_respected_and_reported() -> None:
    assignment = {TP("t", i): 0 for i in range(12)}
    load = {tp: (10.0,) for tp in assignment}
    plan = balance_load(assignment, load, [0, 1, 2], max_moves=3)
    assert len(plan.moves) == 3
    assert not plan.balanced and plan.stopped == "budget"
    assert plan.lower_bound == 8  # 2 brokers each need 4 (floor 0.9 * 40 = 36 -> 4 partitions)
    assert plan.imbalance_after()[0] < plan.imbalance_before()[0]
    full = balance_load(assignment, load, [0, 1, 2])
    assert full.balanced and len(full.moves) == full.lower_bound == 8


def test_partitions_of_a_gone_broker_are_placed_and_counted() -> None:
    assignment: dict[TP, int | None] = {TP("t", i): i % 4 for i in range(16)}
    assignment[TP("new", 0)] = None
    load = {tp: (10.0,) for tp in assignment}
    brokers = [0, 1, 2]
    plan = balance_load(assignment, load, brokers, max_moves=0)
    # orphans move even with no budget for anything else
    assert {m.partition for m in plan.moves} == {
        TP("t", 3),
        TP("t", 7),
        TP("t", 11),
        TP("t", 15),
        TP("new", 0),
    }
    assert all(m.source in (3, None) for m in plan.moves)
    full = balance_load(assignment, load, brokers)
    check_plan(assignment, load, brokers, full)
    # 17 equal partitions over 3 brokers: 6/6/5 is as even as it gets, but 5 is below the floor
    # (0.9 x 56.7): within the threshold, outside the band, and no further move helps
    assert full.within_threshold and not full.balanced and full.stopped == "stuck"
    assert len(full.moves) == 5 and full.lower_bound >= 5
    assert sorted(Counter(full.assignment.values()).values()) == [5, 6, 6]


def test_one_partition_above_the_threshold_raises_the_cap() -> None:
    # one partition carries 3x the mean broker load: no plan gets max/mean below 3, so the cap
    # becomes 3 and the others are balanced around it instead of failing
    assignment = {TP("giant", 0): 0} | {TP("t", i): i % 3 for i in range(30)}
    load = {TP("giant", 0): (900.0,)} | {TP("t", i): (10.0,) for i in range(30)}
    plan = balance_load(assignment, load, [0, 1, 2], threshold=1.1)
    assert plan.cap[0] == pytest.approx(900 / 400)
    assert plan.within_threshold  # (the floor cannot be met: the others share only 300)
    assert plan.after[0][0] == pytest.approx(900.0)  # the giant's broker holds nothing else
    # it sheds the ten small partitions (moving the giant instead would only move the problem)
    assert all(m.partition.topic == "t" for m in plan.moves)
    assert 10 <= len(plan.moves) <= 11


def test_bytes_out_is_balanced_too() -> None:
    # equal bytes in everywhere, but all six consumed partitions are on broker 0
    assignment = {TP("t", i): i % 2 for i in range(20)}
    load = {TP("t", i): (100.0, 300.0 if i % 2 == 0 and i < 12 else 0.0) for i in range(20)}
    plan = balance_load(assignment, load, [0, 1], threshold=1.1)
    assert plan.imbalance_before() == (1.0, 2.0)
    assert plan.balanced and max(plan.imbalance_after()) <= 1.1 + 1e-9
    # 3 consumed partitions must move to broker 1, and bytes in must stay even: partitions
    # come back, so the plan needs more than the bound of 3, but no more than 3 swaps
    assert plan.lower_bound == 3 and 3 < len(plan.moves) <= 6
    assert sum(m.target == 1 and load[m.partition][1] > 0 for m in plan.moves) == 3


def test_partition_count_breaks_ties() -> None:
    # two equally good receivers for the one move broker 0 needs: the one with fewer partitions
    assignment = {TP("a", 0): 0, TP("a", 1): 0} | {TP("b", i): 1 for i in range(5)}
    assignment |= {TP("c", i): 2 for i in range(2)}
    load = {TP("a", 0): (100.0,), TP("a", 1): (100.0,)} | {
        tp: (0.0,) for tp in assignment if tp.topic != "a"
    }
    plan = balance_load(assignment, load, [0, 1, 2], threshold=2.0, floor=0.0)
    assert [m.target for m in plan.moves] == [2]


def test_idle_cluster_only_places_orphans() -> None:
    assignment: dict[TP, int | None] = {TP("t", i): 0 for i in range(4)} | {TP("x", 0): None}
    plan = balance_load(assignment, {}, [0, 1])
    assert [m.partition for m in plan.moves] == [TP("x", 0)]
    assert plan.balanced and plan.imbalance_after() == (1.0,)


def test_bad_input() -> None:
    a = {TP("t", 0): 0}
    with pytest.raises(ValueError, match="no live brokers"):
        balance_load(a, {TP("t", 0): (1.0,)}, [])
    with pytest.raises(ValueError, match="threshold"):
        balance_load(a, {TP("t", 0): (1.0,)}, [0], threshold=0.9)
    with pytest.raises(ValueError, match="non-negative"):
        balance_load(a, {TP("t", 0): (-1.0,)}, [0])
    with pytest.raises(ValueError, match="differ in length"):
        balance_load(a | {TP("t", 1): 0}, {TP("t", 0): (1.0,), TP("t", 1): (1.0, 2.0)}, [0])


def optimum(assignment, load, brokers, plan) -> int | None:  # type: ignore[no-untyped-def]
    """The fewest moves that put every broker within the plan's band (brute force)."""
    parts = list(assignment)
    dims = len(next(iter(load.values())))
    mean = [sum(load[p][d] for p in parts) / len(brokers) for d in range(dims)]
    best = None
    for combo in itertools.product(brokers, repeat=len(parts)):
        moves = sum(1 for p, b in zip(parts, combo, strict=True) if assignment[p] != b)
        if best is not None and moves >= best:
            continue
        totals = {b: [0.0] * dims for b in brokers}
        for p, b in zip(parts, combo, strict=True):
            for d in range(dims):
                totals[b][d] += load[p][d]
        if all(
            plan.floor[d] * mean[d] - 1e-6 <= totals[b][d] <= plan.cap[d] * mean[d] + 1e-6
            for b in brokers
            for d in range(dims)
            if mean[d] > 0
        ):
            best = moves
    return best


@pytest.mark.parametrize("seed", range(60))
def test_small_instances_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    brokers = list(range(rng.randint(2, 3)))
    n = rng.randint(3, 7)
    assignment = {TP(f"t{rng.randint(0, 1)}", i): rng.choice(brokers) for i in range(n)}
    skew = rng.choice([0.3, 1.0, 2.0])
    load = {tp: (rng.lognormvariate(0, skew), rng.lognormvariate(0, skew)) for tp in assignment}
    threshold = rng.choice([1.1, 1.3, 1.6])
    plan = balance_load(assignment, load, brokers, threshold=threshold)
    check_plan(assignment, load, brokers, plan)
    best = optimum(assignment, load, brokers, plan)
    if best is not None:
        assert plan.lower_bound <= best  # the bound is a bound
        if plan.balanced:
            assert len(plan.moves) >= best
    else:
        assert not plan.balanced


def test_greedy_is_near_the_optimum_on_small_instances() -> None:
    exact = feasible = 0
    for seed in range(150):
        rng = random.Random(1000 + seed)
        brokers = list(range(3))
        assignment = {TP("t", i): rng.choice(brokers) for i in range(7)}
        load = {tp: (rng.lognormvariate(0, 0.6),) for tp in assignment}
        plan = balance_load(assignment, load, brokers, threshold=1.5)
        best = optimum(assignment, load, brokers, plan)
        if best is None:
            continue
        feasible += 1
        exact += plan.balanced and len(plan.moves) == best
    assert feasible >= 50
    assert exact >= 0.8 * feasible, (exact, feasible)


def test_large_skewed_fleet_within_the_benchmark_bar() -> None:
    # 4000 partitions of 80 topics (topic heat lognormal), 20 brokers of which one just joined
    rng = random.Random(7)
    brokers = list(range(20))
    assignment: dict[TP, int] = {}
    load: dict[TP, tuple[float, float]] = {}
    for t in range(80):
        heat = rng.lognormvariate(0, 1.0)
        for i in range(50):
            tp = TP(f"t{t}", i)
            assignment[tp] = (t + i) % 19  # broker 19 just joined
            x = heat * rng.lognormvariate(0, 0.5)
            load[tp] = (x, x * rng.choice([0.0, 1.0, 2.0]))
    plan = balance_load(assignment, load, brokers, threshold=1.1)
    check_plan(assignment, load, brokers, plan)
    assert plan.balanced
    assert max(imbalances(plan.after)) <= 1.1 + 1e-9
    assert len(plan.moves) <= 1.2 * plan.lower_bound


def test_only_movable_partitions_move() -> None:
    assignment = {TP("a", i): 0 for i in range(6)} | {TP("b", i): 0 for i in range(6)}
    load = {tp: (10.0,) for tp in assignment}
    plan = balance_load(
        assignment, load, [0, 1], movable=[tp for tp in assignment if tp.topic == "b"]
    )
    assert plan.balanced and len(plan.moves) == 6 == plan.lower_bound
    assert all(m.partition.topic == "b" for m in plan.moves)
    pinned = balance_load(assignment, load, [0, 1], movable=[TP("b", 0)])
    assert [m.partition for m in pinned.moves] == [TP("b", 0)] and pinned.stopped == "stuck"
