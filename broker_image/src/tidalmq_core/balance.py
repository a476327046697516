"""Balancing partitions over brokers while moving as few as possible.

Two entry points share one model (an assignment of partitions to brokers):

- `balance_counts`: every live broker ends within one partition of the average, partitions on
  brokers that left are re-homed, and the number of moves equals the lower bound
  (sum over brokers of max(0, current - target)). Used by the controller when brokers join or
  leave, and by `tidalmq reassign --generate`.
- `balance_load`: balances a load vector per partition (bytes in, bytes out, ...) within a
  tolerance, with partition count as tie-break and a move budget. Used by the planner.

Within a broker, the partitions that move first are those of the topic most concentrated there,
so topics stay spread over the fleet.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

P = TypeVar("P", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Move:
    partition: Hashable
    source: int | None  # None: the partition had no live broker
    target: int


@dataclass(slots=True)
class Plan:
    assignment: dict[Hashable, int]
    moves: list[Move] = field(default_factory=list)


def _topic_of(partition: Hashable) -> Hashable:
    topic = getattr(partition, "topic", None)
    if topic is not None:
        return topic
    if isinstance(partition, tuple) and partition:
        return partition[0]
    return partition


def count_targets(current: Mapping[int, int], brokers: Sequence[int], total: int) -> dict[int, int]:
    """How many partitions each live broker should hold: floor or ceil of the average, the
    ceilings going to the brokers that hold the most already (fewest moves)."""
    if not brokers:
        raise ValueError("no live brokers")
    base, extra = divmod(total, len(brokers))
    order = sorted(brokers, key=lambda b: (-current.get(b, 0), b))
    return {b: base + (1 if i < extra else 0) for i, b in enumerate(order)}


def balance_counts(assignment: Mapping[P, int | None], brokers: Sequence[int]) -> Plan:
    """Balance partition counts over `brokers` with the minimum number of moves."""
    live = sorted(set(brokers))
    if not live:
        raise ValueError("no live brokers to balance onto")
    live_set = set(live)
    holding: dict[int, list[P]] = defaultdict(list)
    orphans: list[P] = []
    for partition, broker in assignment.items():
        if broker is not None and broker in live_set:
            holding[broker].append(partition)
        else:
            orphans.append(partition)
    counts = {b: len(holding[b]) for b in live}
    targets = count_targets(counts, live, len(assignment))

    topic_count: dict[int, Counter[Hashable]] = {
        b: Counter(_topic_of(p) for p in holding[b]) for b in live
    }
    # a topic's fair share per broker: moves prefer partitions of topics a broker holds more
    # of than its share, and land where the topic is least represented, so every topic
    # spreads over the fleet while the total number of moves stays at the lower bound
    topic_total = Counter(_topic_of(p) for p in assignment)
    share = {t: n / len(live) for t, n in topic_total.items()}
    surplus: list[tuple[P, int | None]] = [(p, assignment[p]) for p in sorted(orphans, key=repr)]
    for b in live:
        excess = counts[b] - targets[b]
        if excess <= 0:
            continue
        pool = sorted(holding[b], key=repr)
        tc = topic_count[b]
        for _ in range(excess):
            best = max(
                pool,
                key=lambda p: (tc[_topic_of(p)] - share[_topic_of(p)], tc[_topic_of(p)], repr(p)),
            )
            pool.remove(best)
            tc[_topic_of(best)] -= 1
            surplus.append((best, b))
        counts[b] -= excess

    new = {p: b for p, b in assignment.items()}
    moves: list[Move] = []
    # place the partitions of the most over-represented topics first
    surplus.sort(key=lambda item: (-topic_total[_topic_of(item[0])], repr(item[0])))
    for partition, source in surplus:
        topic = _topic_of(partition)
        candidates = [b for b in live if counts[b] < targets[b]]
        target = min(candidates, key=lambda b: (topic_count[b][topic], counts[b] - targets[b], b))
        counts[target] += 1
        topic_count[target][topic] += 1
        new[partition] = target
        moves.append(Move(partition, source, target))
    return Plan(new, moves)  # type: ignore[arg-type]


def imbalance(loads: Mapping[int, float]) -> float:
    """max / mean of broker loads (1.0 is perfect); 1.0 for an idle fleet."""
    if not loads:
        return 1.0
    mean = sum(loads.values()) / len(loads)
    return max(loads.values()) / mean if mean > 0 else 1.0


def broker_loads(
    assignment: Mapping[P, int], load: Mapping[P, float], brokers: Sequence[int]
) -> dict[int, float]:
    out = dict.fromkeys(brokers, 0.0)
    for partition, broker in assignment.items():
        if broker in out:
            out[broker] += load.get(partition, 0.0)
    return out


def place_orphans(assignment: Mapping[P, int | None], brokers: Sequence[int]) -> dict[P, int]:
    """Homes for the partitions whose broker is gone, on the least loaded live brokers, without
    moving any other partition (failover: only the dead broker's partitions move)."""
    live = sorted(set(brokers))
    if not live:
        raise ValueError("no live brokers")
    live_set = set(live)
    counts = Counter(b for b in assignment.values() if b in live_set)
    topic_count: dict[int, Counter[Hashable]] = defaultdict(Counter)
    for p, b in assignment.items():
        if b in live_set:
            topic_count[b][_topic_of(p)] += 1
    out: dict[P, int] = {}
    for p in sorted((p for p, b in assignment.items() if b not in live_set), key=repr):
        topic = _topic_of(p)
        target = min(live, key=lambda b: (counts[b], topic_count[b][topic], b))
        counts[target] += 1
        topic_count[target][topic] += 1
        out[p] = target
    return out
