"""Partition reassignment: the plan format, its validation, and the state machine of one move.

The plan is Kafka's reassignment JSON:
    {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2]}]}
A TidalMQ partition has exactly one replica (its data is in object storage), so a replica list
names the one broker that should lead it.

The move of one partition follows the move protocol, with Kafka's bookkeeping (ORS, the
original replica set; TRS, the target; AR = TRS - ORS adding; RR = ORS - TRS removing):

    PENDING   recorded, nothing asked yet
    CLOSING   target recorded without electing (leader = none); the source stops appending,
              waits for in-flight appends, force-uploads, writes a clean checkpoint, closes
    ELECTING  the source reported it closed (or the election timeout fenced it)
    OPENING   the target is elected with epoch + 1 and opens the meta stream
    DONE      the target serves the partition
    CANCELLED rolled back before the target was elected: a queued move (the source still
              leads) only forgets its target, at the same epoch; a closing one goes back to
              the original broker at epoch + 1 (`cancel_changes`)
    FAILED    could not complete (e.g. the topic was deleted)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from tidalmq_core.model import TopicPartition

if TYPE_CHECKING:  # the plan file's half (parse_plan, format_plan) is `tidalmq reassign`'s,
    # which starts without the metadata model (docs/cli.md); the controller's half imports it
    from tidalmq_core.metadata import ClusterMetadata, PartitionState


class Phase(enum.StrEnum):
    PENDING = "Pending"
    CLOSING = "Closing"
    ELECTING = "Electing"
    OPENING = "Opening"
    DONE = "Done"
    CANCELLED = "Cancelled"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.DONE, Phase.CANCELLED, Phase.FAILED)


class InvalidPlan(ValueError):
    """A reassignment plan that cannot be executed; the message says which entry and why."""


class NoReassignmentInProgress(ValueError):
    """Cancel of a partition that is not moving (NO_REASSIGNMENT_IN_PROGRESS)."""


class PlanEntry(NamedTuple):
    """One partition of a plan. A NamedTuple, not a dataclass: `tidalmq reassign` imports this
    module, and dataclasses imports inspect, ast, dis and tokenize (~8 ms of a command's
    start, docs/cli.md)."""

    tp: TopicPartition
    target: int | None  # None: cancel the move in progress


def parse_plan(text: str | bytes | Mapping[str, Any]) -> list[PlanEntry]:
    """Parse Kafka's reassignment JSON. Structural problems raise InvalidPlan."""
    try:
        doc = json.loads(text) if isinstance(text, str | bytes) else dict(text)
    except json.JSONDecodeError as exc:
        raise InvalidPlan(f"the plan is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise InvalidPlan('the plan must be an object with a "partitions" list')
    if doc.get("version", 1) != 1:
        raise InvalidPlan(f"unsupported plan version {doc.get('version')!r} (expected 1)")
    entries: list[PlanEntry] = []
    seen: set[TopicPartition] = set()
    for i, item in enumerate(doc["partitions"]):
        where = f"partitions[{i}]"
        if not isinstance(item, dict):
            raise InvalidPlan(f"{where} is not an object")
        topic, partition = item.get("topic"), item.get("partition")
        if not isinstance(topic, str) or not topic:
            raise InvalidPlan(f'{where} has no "topic"')
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise InvalidPlan(f'{where} ({topic}) has no valid "partition"')
        tp = TopicPartition(topic, partition)
        if tp in seen:
            raise InvalidPlan(f"{tp} appears more than once in the plan")
        seen.add(tp)
        replicas = item.get("replicas")
        if replicas is None:
            entries.append(PlanEntry(tp, None))
            continue
        if not isinstance(replicas, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in replicas
        ):
            raise InvalidPlan(f"{where} ({tp}): replicas must be a list of broker ids")
        if len(replicas) != 1:
            raise InvalidPlan(
                f"{tp}: replicas {replicas} must name exactly one broker (TidalMQ keeps one "
                "replica per partition; its data lives in object storage)"
            )
        log_dirs = item.get("log_dirs")
        if log_dirs is not None and not isinstance(log_dirs, list):
            raise InvalidPlan(f'{where} ({tp}): log_dirs must be a list (e.g. ["any"])')
        if log_dirs is not None and any(d != "any" for d in log_dirs):
            raise InvalidPlan(f'{tp}: log_dirs other than "any" are meaningless here')
        entries.append(PlanEntry(tp, replicas[0]))
    return entries


def validate_plan(entries: Iterable[PlanEntry], meta: ClusterMetadata) -> None:
    """Check every entry against the cluster: known topic, partition and broker."""
    live = set(meta.live_brokers())
    problems: list[str] = []
    for entry in entries:
        topic = meta.topics.get(entry.tp.topic)
        if topic is None:
            problems.append(f"{entry.tp}: unknown topic {entry.tp.topic!r}")
        elif not 0 <= entry.tp.partition < len(topic.partitions):
            problems.append(
                f"{entry.tp}: unknown partition (topic has {len(topic.partitions)} partitions)"
            )
        if entry.target is not None and entry.target not in live:
            known = ", ".join(str(b) for b in sorted(live)) or "none"
            problems.append(f"{entry.tp}: unknown broker {entry.target} (live brokers: {known})")
    if problems:
        raise InvalidPlan("; ".join(problems))


def format_plan(assignment: Mapping[TopicPartition, int]) -> str:
    """Kafka's reassignment JSON for an assignment (what --generate prints)."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": [b], "log_dirs": ["any"]}
                for tp, b in sorted(assignment.items())
            ],
        }
    )


# ------------------------------------------------------------------ as record changes
# The controller writes moves as partition records (tidalmq_core.records): these say which
# fields change, without touching the partition; they are the one definition of a move's
# transitions (the controller applies them through records, and so do the tests). A move is queued first (target recorded, the
# source still serves: moves run in waves, a capped number per broker at a time), then closing
# (leader none: the source stops appending and closes), then elected on the target.


def queue_changes(part: PartitionState, target: int) -> dict[str, object] | None:
    """Record `target` as the partition's destination. None: nothing to do (it already lives
    there, or already goes there). A moving partition retargeted to where it came from is
    cancelled instead (`cancel_changes`)."""
    if part.moving:
        if part.target_replicas == [target]:
            return None
        if part.original_replicas == [target]:
            return cancel_changes(part)
        return {"target_replicas": [target]}
    if part.replicas == [target] and part.leader == target:
        return None
    return {"original_replicas": list(part.replicas), "target_replicas": [target]}


def closing_changes(now_ms: int) -> dict[str, object]:
    """Start a queued move: nobody leads until the source closed (or its lease ran out)."""
    from tidalmq_core.metadata import NO_LEADER

    return {"leader": NO_LEADER, "move_started_ms": now_ms}


def closing(part: PartitionState) -> bool:
    """A move whose source has been asked to close (not only queued)."""
    from tidalmq_core.metadata import NO_LEADER

    return part.moving and part.leader == NO_LEADER


def elect_changes(part: PartitionState, target: int | None = None) -> dict[str, object]:
    """The source closed (or was fenced): the target leads with a higher epoch."""
    if not part.moving or part.target_replicas is None:
        raise NoReassignmentInProgress("partition is not moving")
    return _end_move_changes(part, part.target_replicas[0] if target is None else target)


def cancel_changes(part: PartitionState) -> dict[str, object]:
    """Roll back a move whose target was not elected: a queued one just forgets its target; a
    closing one goes back to the original broker with a higher epoch (its own earlier
    incarnation of the partition is closed or fenced)."""
    from tidalmq_core.metadata import NO_LEADER

    if not part.moving or part.original_replicas is None:
        raise NoReassignmentInProgress("partition is not moving")
    if part.leader != NO_LEADER:
        return {"original_replicas": None, "target_replicas": None, "move_started_ms": None}
    return _end_move_changes(part, part.original_replicas[0])


def _end_move_changes(part: PartitionState, leader: int) -> dict[str, object]:
    """The move is over, elected or rolled back from closing: `leader` alone holds the
    partition, at a higher epoch, and nothing of the move remains."""
    return {
        "replicas": [leader],
        "leader": leader,
        "leader_epoch": part.leader_epoch + 1,
        "original_replicas": None,
        "target_replicas": None,
        "move_started_ms": None,
    }


def adding_removing(part: PartitionState) -> tuple[list[int], list[int], list[int]]:
    """(RS, AR, RR) of a moving partition as ListPartitionReassignments reports them."""
    ors = part.original_replicas or part.replicas
    trs = part.target_replicas or part.replicas
    rs = list(dict.fromkeys([*trs, *ors]))
    return rs, [b for b in trs if b not in ors], [b for b in ors if b not in trs]


def moving_partitions(meta: ClusterMetadata) -> dict[TopicPartition, PartitionState]:
    return {
        TopicPartition(name, i): part
        for name, topic in meta.topics.items()
        for i, part in enumerate(topic.partitions)
        if part.moving
    }


def current_assignment(
    meta: ClusterMetadata, topics: Sequence[str] | None = None
) -> dict[TopicPartition, int | None]:
    """Partition → broker (the target of a move in progress counts as its broker)."""
    out: dict[TopicPartition, int | None] = {}
    for name, topic in meta.topics.items():
        if topics is not None and name not in topics:
            continue
        for i, part in enumerate(topic.partitions):
            replicas = part.target_replicas or part.replicas
            out[TopicPartition(name, i)] = replicas[0] if replicas else None
    return out
