"""Whether a topic's partitions are really served, the pure part: the `Degraded` condition of
Topics and StaticTopics, and the per-partition facts their status rows show.

A partition is not served when
- its data is lost: a broker found less in the object store than the metadata knows was
  acknowledged (`PartitionState.lost`), reason `DataLost`, until the loss is accepted
  (annotation `tidalmq.io/accept-data-loss`);
- the whole store is lost (the controller's `store_problem`: its identity marker is missing or
  names another cluster), reason `StoreLost`: every partition of every topic;
- its broker is not alive: not registered, declared dead, or silent for longer than its lease
  (it can no longer acknowledge anything; the controller declares it dead only after the
  longer session timeout), reason `BrokerNotAlive`;
- it has had no leader for longer than a grace period (a move or an election normally takes
  well under a second), reason `Leaderless`.

The reason of the condition is the gravest one present, in that order; its message names the
partitions of every kind (long lists compressed: "12 partitions: 0-5, 9, 11-16") and the
missing offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState

DATA_LOST = "DataLost"
STORE_LOST = "StoreLost"
BROKER_NOT_ALIVE = "BrokerNotAlive"
LEADERLESS = "Leaderless"
SEVERITY = (STORE_LOST, DATA_LOST, BROKER_NOT_ALIVE, LEADERLESS)


# A condition's message may not exceed 32 KiB (the CRDs' schema): the partitions of a 10,000-
# partition topic on a broker that is not alive, every third one, named one by one, made a
# Degraded message over that, and the operator could publish no status for the topic at all
MAX_RANGES = 40


def compress(ids: Iterable[int], max_ranges: int = MAX_RANGES) -> str:
    """`[0, 1, 2, 3, 4, 5, 9, 11, 12]` -> "0-5, 9, 11-12" (sorted, duplicates dropped); past
    `max_ranges` ranges, "... and N more" (N: the ids not shown)."""
    spans: list[tuple[int, int]] = []  # (first, last) of each run of consecutive ids
    for i in sorted(set(ids)):
        if spans and i == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], i)
        else:
            spans.append((i, i))
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:max_ranges])
    hidden = sum(b - a + 1 for a, b in spans[max_ranges:])
    return f"{text}, ... and {hidden} more" if hidden else text


def naming(ids: Iterable[int], noun: str = "partition") -> str:
    """ "partition 3", "3 partitions: 0-2"."""
    ids = sorted(set(ids))
    if len(ids) == 1:
        return f"{noun} {ids[0]}"
    return f"{len(ids)} {noun}s: {compress(ids)}"


def brokers_not_alive(
    meta: ClusterMetadata, last_heartbeat: Mapping[int, float], now: float, lease_s: float
) -> dict[int, str]:
    """Broker id -> why it does not serve, for every broker the metadata names that is dead,
    or whose last heartbeat (monotonic, as the controller tracks it) is older than a lease.
    Brokers not in the metadata at all are reported by `broker_state`."""
    out: dict[int, str] = {}
    for broker_id, info in meta.brokers.items():
        if info.state == "dead":
            out[broker_id] = "declared dead"
            continue
        seen = last_heartbeat.get(broker_id)
        if seen is None:
            out[broker_id] = "not heartbeating"
        elif now - seen > lease_s:
            out[broker_id] = "heartbeats stopped, lease expired"
    return out


def broker_state(meta: ClusterMetadata, not_alive: Mapping[int, str], broker: int) -> str | None:
    """Why `broker` does not serve (None: it does)."""
    if broker not in meta.brokers:
        return "not registered"
    return not_alive.get(broker)


@dataclass(frozen=True, slots=True)
class Problem:
    """One partition (or logic queue) that is not served."""

    partition: int
    kind: str  # DATA_LOST, BROKER_NOT_ALIVE or LEADERLESS (STORE_LOST is topic-wide)
    broker: int | None = None
    why: str = ""  # the broker's state, or the loss's reason
    missing_offsets: int = 0
    expected_end: int | None = None
    found_end: int | None = None


def partition_problem(
    index: int,
    part: PartitionState,
    meta: ClusterMetadata,
    not_alive: Mapping[int, str],
    leaderless_for: float | None,
    grace_s: float,
) -> Problem | None:
    """The problem of one partition, if any (`leaderless_for`: seconds it has had no leader)."""
    lost = getattr(part, "lost", None)
    if lost is not None:
        return Problem(
            index,
            DATA_LOST,
            lost.broker,
            lost.reason,
            lost.missing_offsets,
            lost.expected_end,
            lost.found_end,
        )
    if part.leader != NO_LEADER:
        why = broker_state(meta, not_alive, part.leader)
        if why is not None:
            return Problem(index, BROKER_NOT_ALIVE, part.leader, why)
        return None
    if leaderless_for is not None and leaderless_for > grace_s:
        return Problem(index, LEADERLESS, None, f"no leader for {leaderless_for:.0f} s")
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    degraded: bool
    reason: str
    message: str


def verdict(
    problems: Iterable[Problem], store_problem: str | None, noun: str = "partition"
) -> Verdict:
    """The Degraded condition of a topic from its partitions' problems and the store's."""
    problems = list(problems)
    parts: list[str] = []
    kinds: list[str] = []
    if store_problem:
        kinds.append(STORE_LOST)
        parts.append(f"the object store is lost ({store_problem}): no {noun} is served")
    lost = [p for p in problems if p.kind == DATA_LOST]
    if lost:
        kinds.append(DATA_LOST)
        missing = sum(p.missing_offsets for p in lost)
        detail = ", ".join(
            f"{p.partition}: {p.missing_offsets} missing (expected end {p.expected_end}, found "
            f"{p.found_end})"
            for p in sorted(lost, key=lambda p: p.partition)[:8]
        )
        more = "; ..." if len(lost) > 8 else ""
        parts.append(
            f"data lost in {naming((p.partition for p in lost), noun)}, {missing} "
            f"acknowledged offsets missing ({detail}{more}); accept the loss with the "
            "annotation tidalmq.io/accept-data-loss"
        )
    dead = [p for p in problems if p.kind == BROKER_NOT_ALIVE]
    if dead:
        kinds.append(BROKER_NOT_ALIVE)
        by_broker: dict[int, list[Problem]] = {}
        for p in dead:
            by_broker.setdefault(p.broker if p.broker is not None else -1, []).append(p)
        for broker, ps in sorted(by_broker.items()):
            parts.append(
                f"{naming((p.partition for p in ps), noun)} on broker {broker}, which "
                f"is not alive ({ps[0].why})"
            )
    leaderless = [p for p in problems if p.kind == LEADERLESS]
    if leaderless:
        kinds.append(LEADERLESS)
        parts.append(f"{naming((p.partition for p in leaderless), noun)} without a leader")
    if not kinds:
        return Verdict(False, "Serving", "")
    reason = min(kinds, key=SEVERITY.index)
    return Verdict(True, reason, "; ".join(parts))


def row_fields(problem: Problem | None, store_problem: str | None) -> dict[str, Any]:
    """What a status row of a partition shows about it (nothing when it is served)."""
    if problem is None:
        return {"problem": STORE_LOST} if store_problem else {}
    out: dict[str, Any] = {"problem": problem.kind}
    if problem.kind == DATA_LOST:
        out.update(
            lost=True,
            missingOffsets=problem.missing_offsets,
            expectedEnd=problem.expected_end,
            foundEnd=problem.found_end,
            lostReason=problem.why,
        )
    return out
