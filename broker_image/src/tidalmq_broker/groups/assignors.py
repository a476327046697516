"""Server-side partition assignors of the consumer group protocol (KIP-848).

The coordinator computes a group's target assignment itself (`group.consumer.assignors`; a member
may ask for one by name). Both assignors are pure functions of the members' subscriptions, their
current target (for stickiness) and the subscribed topics' partition counts; topics are named by
id, as in the protocol.

- `uniform` (Kafka's default): every partition to one subscriber, the members' partition counts
  as even as the subscriptions allow, and a partition stays with its current owner when that
  keeps the balance (sticky), so a rebalance moves as few partitions as it can.
- `range`: per topic, the subscribers sorted (by instance id, then member id) take contiguous
  ranges, the first `partitions % members` one partition more (Kafka's range assignor), so
  co-partitioned topics land together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Assignment = dict[str, frozenset[int]]
"""topic id -> partitions"""


@dataclass(frozen=True, slots=True)
class MemberSpec:
    subscribed: frozenset[str]  # topic ids
    current: Mapping[str, frozenset[int]] = field(default_factory=dict)  # its target so far
    instance_id: str | None = None


class Assignor:
    name = ""

    def assign(
        self, members: Mapping[str, MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        raise NotImplementedError


def _freeze(owned: dict[str, dict[str, set[int]]]) -> dict[str, Assignment]:
    return {
        member: {t: frozenset(ps) for t, ps in sorted(parts.items()) if ps}
        for member, parts in owned.items()
    }


class UniformAssignor(Assignor):
    name = "uniform"

    def assign(
        self, members: Mapping[str, MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        owned: dict[str, dict[str, set[int]]] = {m: {} for m in members}
        count = dict.fromkeys(members, 0)
        # each partition's candidates: the members subscribed to its topic
        partitions = [
            (topic, p, sorted(m for m, spec in members.items() if topic in spec.subscribed))
            for topic in sorted(topics)
            for p in range(topics[topic])
        ]
        partitions = [entry for entry in partitions if entry[2]]
        # the most constrained partitions first (heterogeneous subscriptions)
        partitions.sort(key=lambda entry: (len(entry[2]), entry[0], entry[1]))
        quota = _quotas(partitions, members)

        def give(member: str, topic: str, p: int) -> None:
            owned[member].setdefault(topic, set()).add(p)
            count[member] += 1

        unassigned = []
        for topic, p, candidates in partitions:  # sticky pass: owners keep up to their quota
            owner = next(
                (m for m in candidates if p in members[m].current.get(topic, frozenset())), None
            )
            if owner is not None and count[owner] < quota[owner]:
                give(owner, topic, p)
            else:
                unassigned.append((topic, p, candidates))
        for topic, p, candidates in unassigned:  # the rest to the least loaded candidate
            target = min(candidates, key=lambda m: (count[m] >= quota[m], count[m], m))
            give(target, topic, p)
        _balance(owned, count, members)
        return _freeze(owned)


def _quotas(
    partitions: list[tuple[str, int, list[str]]], members: Mapping[str, MemberSpec]
) -> dict[str, int]:
    """How many partitions each member may keep in the sticky pass: the share a greedy
    least-loaded assignment gives it, ties to the partition's current owner (floor or ceil of
    partitions/members when every member subscribes to the same topics)."""
    load = dict.fromkeys(members, 0)
    for topic, p, candidates in partitions:
        least = min(
            candidates,
            key=lambda m: (load[m], p not in members[m].current.get(topic, frozenset()), m),
        )
        load[least] += 1
    return load


def _balance(
    owned: dict[str, dict[str, set[int]]], count: dict[str, int], members: Mapping[str, MemberSpec]
) -> None:
    """Move partitions from a member holding two more than another subscriber of their topic
    until no such pair is left (each move narrows the spread, so this ends)."""
    moved = True
    while moved:
        moved = False
        for giver in sorted(count, key=lambda m: (-count[m], m)):
            for topic in sorted(owned[giver]):
                takers = [
                    m
                    for m in members
                    if topic in members[m].subscribed and count[m] + 1 < count[giver]
                ]
                if not takers or not owned[giver][topic]:
                    continue
                taker = min(takers, key=lambda m: (count[m], m))
                p = max(owned[giver][topic])
                owned[giver][topic].discard(p)
                owned[taker].setdefault(topic, set()).add(p)
                count[giver] -= 1
                count[taker] += 1
                moved = True
                break
            if moved:
                break


class RangeAssignor(Assignor):
    name = "range"

    def assign(
        self, members: Mapping[str, MemberSpec], topics: Mapping[str, int]
    ) -> dict[str, Assignment]:
        owned: dict[str, dict[str, set[int]]] = {m: {} for m in members}
        for topic in sorted(topics):
            subscribers = sorted(
                (m for m, spec in members.items() if topic in spec.subscribed),
                key=lambda m: (members[m].instance_id or "", m),
            )
            if not subscribers:
                continue
            per, extra = divmod(topics[topic], len(subscribers))
            start = 0
            for i, member in enumerate(subscribers):
                size = per + (1 if i < extra else 0)
                if size:
                    owned[member][topic] = set(range(start, start + size))
                start += size
        return _freeze(owned)


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}


def assignors_named(names: str) -> list[Assignor]:
    """`group.consumer.assignors`: a comma-separated list of known assignor names, the first
    the default. Raises ValueError for an unknown or empty list."""
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in ASSIGNORS]
    if not chosen or unknown:
        raise ValueError(
            f"group.consumer.assignors must name some of {sorted(ASSIGNORS)}; got {names!r}"
        )
    return [ASSIGNORS[n] for n in chosen]
