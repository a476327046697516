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

import functools
import heapq
from collections import Counter, defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

P = TypeVar("P", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Move(Generic[P]):
    partition: P
    source: int | None  # None: the partition had no live broker
    target: int


@dataclass(slots=True)
class Plan(Generic[P]):
    assignment: dict[P, int]
    moves: list[Move[P]] = field(default_factory=list)


def _topic_of(partition: Hashable) -> Hashable:
    topic: Hashable | None = getattr(partition, "topic", None)
    if topic is not None:
        return topic
    if isinstance(partition, tuple) and partition:
        first: Hashable = partition[0]
        return first
    return partition


def _split_live(
    assignment: Mapping[P, int | None], live: Sequence[int]
) -> tuple[dict[int, list[P]], list[P]]:
    """The partitions each live broker holds, and those without a live broker (orphans)."""
    live_set = set(live)
    holding: dict[int, list[P]] = defaultdict(list)
    orphans: list[P] = []
    for partition, broker in assignment.items():
        if broker is not None and broker in live_set:
            holding[broker].append(partition)
        else:
            orphans.append(partition)
    return holding, orphans


def _topic_counts(
    holding: Mapping[int, Sequence[Hashable]], live: Sequence[int]
) -> dict[int, Counter[Hashable]]:
    """Per live broker, how many partitions of each topic it holds."""
    return {b: Counter(_topic_of(p) for p in holding.get(b, ())) for b in live}


def count_targets(current: Mapping[int, int], brokers: Sequence[int], total: int) -> dict[int, int]:
    """How many partitions each live broker should hold: floor or ceil of the average, the
    ceilings going to the brokers that hold the most already (fewest moves)."""
    if not brokers:
        raise ValueError("no live brokers")
    base, extra = divmod(total, len(brokers))
    order = sorted(brokers, key=lambda b: (-current.get(b, 0), b))
    return {b: base + (1 if i < extra else 0) for i, b in enumerate(order)}


def _take(
    held: Sequence[P], excess: int, tc: Counter[Hashable], share: Mapping[Hashable, float]
) -> list[P]:
    """`excess` partitions of one broker to move away: each time, one of the topic it holds
    most above that topic's fair share (then most of), greatest repr first, as a scan over all
    of them would pick, from a heap of its topics. Updates `tc` (its per-topic counts)."""
    pool = sorted(held, key=repr)
    rank = {id(p): i for i, p in enumerate(pool)}  # ties between topics: greatest repr first
    by_topic: dict[Hashable, list[P]] = defaultdict(list)
    for p in pool:
        by_topic[_topic_of(p)].append(p)  # ascending: pop() takes the greatest

    def key(topic: Hashable) -> tuple[float, int, int]:
        return (-(tc[topic] - share[topic]), -tc[topic], -rank[id(by_topic[topic][-1])])

    heap = [(key(t), i, t) for i, t in enumerate(by_topic)]
    heapq.heapify(heap)
    out: list[P] = []
    for _ in range(excess):
        _, i, topic = heapq.heappop(heap)
        out.append(by_topic[topic].pop())
        tc[topic] -= 1
        if by_topic[topic]:
            heapq.heappush(heap, (key(topic), i, topic))
    return out


def balance_counts(assignment: Mapping[P, int | None], brokers: Sequence[int]) -> Plan[P]:
    """Balance partition counts over `brokers` with the minimum number of moves.

    O(N log N) for N partitions (a 50,000-partition rebalance takes well under a second):
    each overloaded broker gives up partitions from a heap of its topics keyed by how far the
    topic exceeds its fair share there."""
    live = sorted(set(brokers))
    if not live:
        raise ValueError("no live brokers to balance onto")
    holding, orphans = _split_live(assignment, live)
    counts = {b: len(holding[b]) for b in live}
    targets = count_targets(counts, live, len(assignment))

    topic_count = _topic_counts(holding, live)
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
        surplus.extend((p, b) for p in _take(holding[b], excess, topic_count[b], share))
        counts[b] -= excess

    placed: dict[P, int] = {}
    moves: list[Move[P]] = []
    # place the partitions of the most over-represented topics first
    surplus.sort(key=lambda item: (-topic_total[_topic_of(item[0])], repr(item[0])))
    for partition, source in surplus:
        topic = _topic_of(partition)
        candidates = [b for b in live if counts[b] < targets[b]]
        target = min(candidates, key=lambda b: (topic_count[b][topic], counts[b] - targets[b], b))
        counts[target] += 1
        topic_count[target][topic] += 1
        placed[partition] = target
        moves.append(Move(partition, source, target))
    # in the assignment's order; every partition without a broker (None) is an orphan, placed
    # in the loop above, so each partition gets a broker
    new: dict[P, int] = {}
    for partition, broker in assignment.items():
        if partition in placed:
            new[partition] = placed[partition]
        elif broker is not None:
            new[partition] = broker
    return Plan(new, moves)


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
    holding, orphans = _split_live(assignment, live)
    counts = {b: len(holding[b]) for b in live}
    topic_count = _topic_counts(holding, live)
    out: dict[P, int] = {}
    for p in sorted(orphans, key=repr):
        topic = _topic_of(p)
        target = min(live, key=lambda b: (counts[b], topic_count[b][topic], b))
        counts[target] += 1
        topic_count[target][topic] += 1
        out[p] = target
    return out


# ------------------------------------------------------------------------------- load balance
_EPS = 1e-9  # in units of the mean broker load
_WORSE = float("inf")


@dataclass(slots=True)
class LoadPlan(Plan[P]):
    """What `balance_load` proposes and what it achieves.

    Broker loads are absolute, one value per load dimension in the caller's order. `cap` and
    `floor` are per dimension, as multiples of the mean broker load: the band the plan aims for
    (`cap` is above the threshold where one partition alone carries more than that).
    """

    brokers: list[int] = field(default_factory=list)
    before: dict[int, tuple[float, ...]] = field(default_factory=dict)
    after: dict[int, tuple[float, ...]] = field(default_factory=dict)
    lower_bound: int = 0
    cap: tuple[float, ...] = ()
    floor: tuple[float, ...] = ()
    balanced: bool = True  # every broker ends within [floor, cap] x mean in every dimension
    within_threshold: bool = True  # every broker ends at most cap x mean (the floor may be unmet)
    stopped: str = "balanced"  # balanced | budget (move budget spent) | stuck (no move helps)

    def imbalance_before(self) -> tuple[float, ...]:
        return imbalances(self.before)

    def imbalance_after(self) -> tuple[float, ...]:
        return imbalances(self.after)


def imbalances(loads: Mapping[int, Sequence[float]]) -> tuple[float, ...]:
    """max / mean per dimension of broker load vectors (1.0 for an idle dimension)."""
    if not loads:
        return ()
    dims = len(next(iter(loads.values())))
    return tuple(imbalance({b: v[d] for b, v in loads.items()}) for d in range(dims))


def balance_load(
    assignment: Mapping[P, int | None],
    load: Mapping[P, Sequence[float]],
    brokers: Sequence[int],
    *,
    threshold: float | Sequence[float] = 1.10,
    floor: float | Sequence[float] | None = None,
    max_moves: int | None = None,
    movable: Collection[P] | None = None,
) -> LoadPlan[P]:
    """Balance per-partition load vectors (e.g. bytes in, bytes out) over `brokers`, moving as
    few partitions as possible.

    Goal: in every dimension d, every broker's load lies within [floor_d, cap_d] x the mean
    broker load, where cap_d is `threshold` (raised to the largest single partition's load when
    one partition alone exceeds it: no plan can do better) and floor_d defaults to
    2 - threshold (so a broker that just joined takes its share). Partitions whose broker is
    not in `brokers` (or None) are always placed; they count against `max_moves`, which bounds
    all moves. Partitions absent from `load` weigh nothing. With `movable`, only those
    partitions move (the others count, where they are); orphans are placed regardless.

    Method: greedy on the total violation V (per broker and dimension, the squared distance
    outside the band, in units of the mean). Each step takes the broker furthest outside the
    band and makes the single move into or out of it that lowers V most (or, when no single
    move helps, the best swap with another broker). A move may not make any broker worse in
    any dimension (no trading one broker's excess for another's), so V falls at every step.
    Ties go to the move that adds no partition to the plan (a partition that already moved
    may move again or go back), then to the one that brings both brokers closer to the mean,
    then from the broker with more partitions to the one with fewer (partition count is the
    tie-break), then to the broker holding fewer partitions of the topic. Finally, moves that
    the end result does not need are undone.

    `lower_bound` is a bound no plan reaching the band can beat: a broker above its cap must
    shed at least as many partitions as it takes of its own largest ones to get below it, a
    broker under its floor must receive at least as many as it takes of the largest partitions
    elsewhere, and each move has one source and one target.
    """
    live = sorted(set(brokers))
    if not live:
        raise ValueError("no live brokers to balance onto")
    holding, orphans = _split_live(assignment, live)
    dims = _dimensions(load)
    caps_in = _per_dim(threshold, dims, "threshold")
    if any(c < 1.0 for c in caps_in):
        raise ValueError(f"threshold must be at least 1.0 (got {threshold})")
    floors_in = _per_dim(floor, dims, "floor") if floor is not None else [2.0 - c for c in caps_in]
    state = _LoadState(assignment, load, live, holding, orphans, dims, caps_in, floors_in, movable)
    before = state.absolute()

    # 1. partitions without a live broker: largest first, where they add the least violation
    for i in sorted((state.index[p] for p in orphans), key=lambda i: (-sum(state.u[i]), i)):
        state.move(i, min(live, key=functools.partial(state.placement_cost, i)))

    # 2. greedy moves towards the band
    budget = max_moves if max_moves is not None else len(assignment) + 1
    stopped = "balanced"
    for _ in range(4 * len(assignment) + 100):  # every step lowers V; this only bounds time
        outside = sorted(
            (b for b in live if state.viol(state.level[b]) > _EPS),
            key=lambda b: (-state.viol(state.level[b]), b),
        )
        if not outside:
            break
        spare = budget - state.moved_count
        # the broker furthest outside the band first (trying every broker at each step costs
        # several times more and, on skewed fleets, found no shorter plans)
        best = state.best_move(outside[:1], spare)
        if best is not None:
            state.move(*best)
            continue
        swap = None
        for b in outside:
            swap = state.best_swap(b, spare)
            if swap is not None:
                break
        if swap is None:
            stopped = "budget" if spare <= 0 else "stuck"
            break
        (i, bi), (j, bj) = swap
        state.move(i, bj)
        state.move(j, bi)

    # 3. moves the end result does not need: send partitions back where that costs nothing
    state.prune()

    balanced = all(state.viol(state.level[b]) <= _EPS for b in live)
    within = all(x <= h + _EPS for b in live for x, h in zip(state.level[b], state.hi, strict=True))
    return LoadPlan(
        assignment={p: _placed(state.owner[state.index[p]]) for p in assignment},
        moves=[
            Move(state.parts[i], assignment[state.parts[i]], state.owner[i])
            for i in state.first_moved
            if state.owner[i] != state.original[i]
        ],
        brokers=live,
        before=before,
        after=state.absolute(),
        lower_bound=state.lower_bound,
        cap=state.cap_all,
        floor=state.floor_all,
        balanced=balanced,
        within_threshold=within,
        stopped="balanced" if balanced else stopped,
    )


def _placed(broker: int) -> int:
    if broker < 0:  # pragma: no cover - every orphan is placed before the result is built
        raise AssertionError("a partition was left without a broker")
    return broker


class _LoadState:
    """The working state of `balance_load`: partitions by index, normalised load vectors (the
    mean broker load is 1.0 in every dimension that carries load), per-broker levels."""

    def __init__(
        self,
        assignment: Mapping[Any, int | None],
        load: Mapping[Any, Sequence[float]],
        live: list[int],
        holding: Mapping[int, list[Any]],
        orphans: list[Any],
        dims: int,
        caps_in: list[float],
        floors_in: list[float],
        movable: Collection[Any] | None,
    ) -> None:
        self.live = live
        self.dims = dims
        self.parts: list[Any] = sorted(assignment, key=repr)
        self.index = {p: i for i, p in enumerate(self.parts)}
        zero = (0.0,) * dims
        raw = [tuple(float(x) for x in load.get(p, zero)) for p in self.parts]
        n = len(live)
        self.means = [sum(v[d] for v in raw) / n for d in range(dims)]
        self.active = [d for d in range(dims) if self.means[d] > 0]
        self.u: list[tuple[float, ...]] = [
            tuple(v[d] / self.means[d] for d in self.active) for v in raw
        ]
        biggest = [max((u[k] for u in self.u), default=0.0) for k in range(len(self.active))]
        self.hi = [max(caps_in[d], biggest[k]) for k, d in enumerate(self.active)]
        self.lo = [max(0.0, min(floors_in[d], 1.0)) for d in self.active]
        self.cap_all = tuple(caps_in)
        self.floor_all = tuple(max(0.0, min(f, 1.0)) for f in floors_in)
        for k, d in enumerate(self.active):
            self.cap_all = (*self.cap_all[:d], self.hi[k], *self.cap_all[d + 1 :])
        topics: dict[Hashable, int] = {}
        self.topic = [topics.setdefault(_topic_of(p), len(topics)) for p in self.parts]
        self.owner = [-1] * len(self.parts)
        self.on: dict[int, set[int]] = {b: set() for b in live}
        self.level: dict[int, list[float]] = {b: [0.0] * len(self.active) for b in live}
        self.topic_count: dict[int, Counter[int]] = {b: Counter() for b in live}
        for b in live:
            for p in holding.get(b, ()):
                self._add(self.index[p], b)
        # partitions that may not move (not movable); orphans are placed regardless
        self.pinned = bytearray(len(self.parts))
        if movable is not None:
            allowed = set(movable)
            for i, p in enumerate(self.parts):
                self.pinned[i] = p not in allowed
        self.original = list(self.owner)  # -1: an orphan
        self.first_moved: list[int] = []  # partitions in the order they first moved
        self._listed: set[int] = set()
        self.moved_count = 0  # partitions away from their original broker
        self.lower_bound = self._lower_bound([self.index[p] for p in orphans])

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, i: int, b: int) -> None:
        lv = self.level[b]
        for k, x in enumerate(self.u[i]):
            lv[k] += x
        self.owner[i] = b
        self.on[b].add(i)
        self.topic_count[b][self.topic[i]] += 1

    def _remove(self, i: int, b: int) -> None:
        lv = self.level[b]
        for k, x in enumerate(self.u[i]):
            lv[k] -= x
        self.on[b].discard(i)
        self.topic_count[b][self.topic[i]] -= 1

    def move(self, i: int, target: int) -> None:
        source = self.owner[i]
        if source >= 0:
            self._remove(i, source)
        self._add(i, target)
        if i not in self._listed:
            self._listed.add(i)
            self.first_moved.append(i)
        self.moved_count += (target != self.original[i]) - (source != self.original[i])

    def absolute(self) -> dict[int, tuple[float, ...]]:
        out = {}
        for b in self.live:
            v = [0.0] * self.dims
            for k, d in enumerate(self.active):
                v[d] = self.level[b][k] * self.means[d]
            out[b] = tuple(v)
        return out

    # ------------------------------------------------------------------ scoring
    def viol(self, lv: Sequence[float]) -> float:
        """How far a broker lies outside the band: the sum over dimensions of the squared
        distance (squares make a broker short of two resources fill the scarcer one first)."""
        v = 0.0
        for x, h, low in zip(lv, self.hi, self.lo, strict=True):
            if x > h:
                v += (x - h) ** 2
            elif x < low:
                v += (low - x) ** 2
        return v

    def _viol_shift(
        self, lv: Sequence[float], u: Sequence[float], sign: float, strict: bool = True
    ) -> float:
        """The violation of broker level `lv` after adding sign x `u`; infinite when that makes
        any one dimension worse (a move may not trade one broker's or one dimension's
        violation for another's: the broker that just joined must not become a dump for a hot
        broker's partitions, and partitions move only once)."""
        v = 0.0
        for x, y, h, low in zip(lv, u, self.hi, self.lo, strict=True):
            z = x + sign * y
            if z > h:
                if strict and z > x + _EPS and z > h + _EPS:
                    return _WORSE
                v += (z - h) ** 2
            elif z < low:
                if strict and z < x - _EPS and z < low - _EPS:
                    return _WORSE
                v += (low - z) ** 2
        return v

    @staticmethod
    def _sq_shift(lv: Sequence[float], u: Sequence[float], sign: float) -> float:
        return sum((x + sign * y - 1.0) ** 2 for x, y in zip(lv, u, strict=True))

    def placement_cost(self, i: int, b: int) -> tuple[float, float, int, int, int]:
        lv, u = self.level[b], self.u[i]
        return (
            self._viol_shift(lv, u, 1.0, strict=False) - self.viol(lv),
            self._sq_shift(lv, u, 1.0) - self._sq_shift(lv, u, 0.0),
            len(self.on[b]),
            self.topic_count[b][self.topic[i]],
            b,
        )

    def _tie_key(self, i: int, s: int, r: int) -> tuple[float, int, int, int, int]:
        ls, lr, u = self.level[s], self.level[r], self.u[i]
        closer = (
            self._sq_shift(ls, u, 0.0)
            + self._sq_shift(lr, u, 0.0)
            - self._sq_shift(ls, u, -1.0)
            - self._sq_shift(lr, u, 1.0)
        )
        t = self.topic[i]
        return (
            closer,
            len(self.on[s]) - len(self.on[r]),
            self.topic_count[s][t] - self.topic_count[r][t],
            -i,
            -r,
        )

    def cost(self, i: int, target: int) -> int:
        """How many more partitions end away from their original broker after this move."""
        o = self.original[i]
        return (target != o) - (self.owner[i] != o)

    def best_move(self, outside: Sequence[int], spare: int) -> tuple[int, int] | None:
        """The single move out of a broker above its cap or into a broker below its floor that
        lowers the total violation most, within `spare` more moved partitions: (partition
        index, target). A partition that already moved may move again (its plan entry changes)
        or go back (the entry goes)."""
        best_gain = _EPS
        best: tuple[int, int, int] | None = None
        best_key: tuple[Any, ...] | None = None
        base = {x: self.viol(lv) for x, lv in self.level.items()}

        def consider(i: int, s: int, r: int, gain: float) -> None:
            nonlocal best_gain, best, best_key
            c = self.cost(i, r)
            if c > spare:
                return
            key = (-c, *self._tie_key(i, s, r))
            if best_key is None or gain > best_gain + _EPS or key > best_key:
                best_gain, best, best_key = max(gain, best_gain), (i, s, r), key

        u, pinned, shift, level = self.u, self.pinned, self._viol_shift, self.level
        over = [
            b for b in outside if any(x > h + _EPS for x, h in zip(level[b], self.hi, strict=True))
        ]
        under = [
            b
            for b in outside
            if any(x < lo - _EPS for x, lo in zip(level[b], self.lo, strict=True))
        ]
        for s in over:
            # what s sheds does not depend on the receiver
            ls = level[s]
            for i in self.on[s]:
                if pinned[i] or not any(u[i]):
                    continue
                out = base[s] - shift(ls, u[i], -1.0)
                for r, lr in level.items():
                    if r != s:
                        gain = out + base[r] - shift(lr, u[i], 1.0)
                        if gain >= best_gain - _EPS:
                            consider(i, s, r, gain)
        if under:
            for s, ls in level.items():
                for i in self.on[s]:
                    if pinned[i] or not any(u[i]):
                        continue
                    out = base[s] - shift(ls, u[i], -1.0)
                    for r in under:
                        if r != s:
                            gain = out + base[r] - shift(level[r], u[i], 1.0)
                            if gain >= best_gain - _EPS:
                                consider(i, s, r, gain)
        if best is None:
            return None
        return best[0], best[2]

    def best_swap(
        self, b: int, spare: int, width: int = 24
    ) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """The exchange of a partition of `b` with one of another broker that lowers the total
        violation most, for when no single move helps (every candidate is too big for any
        receiver). Only the `width` largest and smallest partitions of each broker are tried."""

        def ends(x: int) -> list[int]:
            ps = sorted((i for i in self.on[x] if not self.pinned[i]), key=lambda i: sum(self.u[i]))
            return ps[:width] + ps[-width:] if len(ps) > 2 * width else ps

        mine = ends(b)
        best: tuple[float, int, tuple[int, int], tuple[int, int]] | None = None
        vb = self.viol(self.level[b])
        for r, lr in self.level.items():
            if r == b:
                continue
            vr = self.viol(lr)
            for j in ends(r):
                cj = self.cost(j, b)
                for i in mine:
                    c = self.cost(i, r) + cj
                    if c > spare:
                        continue
                    diff = [x - y for x, y in zip(self.u[i], self.u[j], strict=True)]
                    gain = (
                        vb
                        + vr
                        - self._viol_shift(self.level[b], diff, -1.0)
                        - self._viol_shift(lr, diff, 1.0)
                    )
                    if gain > _EPS and (best is None or (gain, -c) > (best[0], -best[1])):
                        best = (gain, c, (i, b), (j, r))
        if best is None:
            return None
        return best[2], best[3]

    def prune(self) -> None:
        """Undo moves, latest first, where sending the partition back to its original broker
        makes no broker and no dimension any worse (greedy steps that later steps made
        unnecessary)."""
        for i in reversed(self.first_moved):
            s, o = self.owner[i], self.original[i]
            if o < 0 or s == o:
                continue
            ls, lo = self.level[s], self.level[o]
            after_s = self._viol_shift(ls, self.u[i], -1.0)
            after_o = self._viol_shift(lo, self.u[i], 1.0)
            if after_s + after_o <= self.viol(ls) + self.viol(lo) + _EPS:
                self.move(i, o)

    # ------------------------------------------------------------------ lower bound
    def _lower_bound(self, orphans: list[int]) -> int:
        movable = [i for i in range(len(self.parts)) if not self.pinned[i]]
        shed = receive = 0
        for b in self.live:
            lv = self.level[b]
            excess = {k: lv[k] - h for k, h in enumerate(self.hi) if lv[k] - h > _EPS}
            if excess:
                shed += self._fewest([i for i in movable if self.owner[i] == b], excess)
            deficit = {k: low - lv[k] for k, low in enumerate(self.lo) if low - lv[k] > _EPS}
            if deficit:
                receive += self._fewest([i for i in movable if self.owner[i] != b], deficit)
        return max(len(orphans) + shed, receive)

    def _fewest(self, candidates: list[int], need: Mapping[int, float]) -> int:
        """A lower bound on how many of `candidates` it takes to reach `need[k]` of load in
        every dimension k at once. Any such set also reaches any nonnegative combination of
        the needs; a few combinations (each dimension alone, all equally, each one doubled) are
        each bounded by their largest candidates, and the largest of those bounds holds. 0 when
        some combination is out of reach (no plan meets the goal there)."""
        dims = list(need)
        weights = [{k: 1.0} for k in dims]
        if len(dims) > 1:
            weights.append(dict.fromkeys(dims, 1.0))
            weights += [{k: 2.0 if k == j else 1.0 for k in dims} for j in dims]
        best = 0
        for lam in weights:
            sizes = sorted(
                (sum(w * self.u[i][k] / need[k] for k, w in lam.items()) for i in candidates),
                reverse=True,
            )
            k = _fewest_covering(sizes, sum(lam.values()))
            if k == 0:
                return 0
            best = max(best, k)
        return best


def _dimensions(load: Mapping[Any, Sequence[float]]) -> int:
    dims = {len(v) for v in load.values()}
    if len(dims) > 1:
        raise ValueError(f"load vectors differ in length: {sorted(dims)}")
    for p, v in load.items():
        for x in v:
            if not (0.0 <= x < float("inf")):
                raise ValueError(f"load of {p} must be finite and non-negative: {tuple(v)}")
    return dims.pop() if dims else 1


def _per_dim(value: float | Sequence[float], dims: int, name: str) -> list[float]:
    if isinstance(value, int | float):
        return [float(value)] * dims
    values = [float(x) for x in value]
    if len(values) != dims:
        raise ValueError(f"{name} has {len(values)} values for {dims} load dimensions")
    return values


def _fewest_covering(sizes: Iterable[float], amount: float) -> int:
    """How many of `sizes` (largest first) it takes to add up to `amount`; 0 when they cannot
    (the goal is out of reach, and a lower bound must not count it)."""
    total = 0.0
    for k, x in enumerate(sizes, 1):
        total += x
        if total >= amount - _EPS:
            return k
    return 0
