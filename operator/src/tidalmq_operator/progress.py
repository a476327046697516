"""A PartitionReassignment's progress, the pure part: its status rows and the step Events of its
moves, from the controller's move tracker, the metadata and the status an earlier operator wrote.

Rows. Each publish rebuilds `status.partitions`, which the API server replaces as a whole, so a
row must carry everything worth keeping:

- a row that reached a final phase (Done, Cancelled, Failed) is frozen: a restarted operator's
  controller no longer tracks a move that finished before the restart, and the row keeps its
  source, times and unavailability as the earlier operator reported them;
- a row whose move the controller tracks takes the tracker's figures, except that a move in
  flight across an operator restart keeps its earlier startTime. The new tracker resumes it from
  the move's durable start in the metadata (`move_started_ms`, stamped before the commit that
  recorded the move, so up to one commit before the first tracker's stamp), or, in metadata
  without one, starts timing it at the restart (its unavailableMs then counts from the restart,
  and its message says so);
- a row with no tracked move takes the earlier row's figures and the metadata's word: the
  partition served by its target is Done; one no longer moving and elsewhere, after spec.cancel,
  is Cancelled (rolled back while no operator watched). A move elected before an operator
  restart is not tracked by the new controller (only moves still recorded as moving in the
  metadata are), so "served by its target" means elected there *and* reported open by the
  target at the partition's epoch; until then the row stays Opening, and the new operator
  measures the move's unavailableMs when it sees the partition open (from the row's startTime).
  A move that finished before the restart without its figures having been published says so
  in its message instead of showing none. (A graceful stop publishes once more after the moves
  past their election opened, so that happens only when an operator is killed.)

Step Events. The controller's tracker stamps each step of a move (`MoveStatus.started`, `closed`,
`elected`, `opened`, `finished`), but its event hook (`Controller.add_event_sink`) announces only
some of them (PartitionElected, ReassignmentCancelled: no move start, no Done), and a move's
Electing phase lasts no time at all (the election marks Electing and Opening in one step). So the
operator does not sample phases: on each publish it emits every step the tracker has stamped since
the last Event it emitted for that partition, in order, each Event stamped with the step's own
time. Steps are never missed however short, and none is emitted twice (the last one emitted is
kept, and restored from the status after a restart).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidalmq_controller import TROUBLE, MoveStatus
from tidalmq_core.metadata import PartitionState
from tidalmq_core.reassignment import Phase, PlanEntry

FINISHED = frozenset({Phase.DONE.value, Phase.CANCELLED.value, Phase.FAILED.value})
_RANK = {
    Phase.PENDING.value: 0,
    Phase.CLOSING.value: 1,
    Phase.ELECTING.value: 2,
    Phase.OPENING.value: 3,
    Phase.DONE.value: 4,
    Phase.CANCELLED.value: 4,
    Phase.FAILED.value: 4,
}
RESUMED_NOTE = "timed again from the operator restart"
MEASURED_NOTE = "opened across an operator restart: unavailableMs measured by the new operator"
UNMEASURED_NOTE = "finished while no operator watched: its unavailability was not measured"


def rank(phase: str | None) -> int:
    return _RANK.get(phase or "", -1)


@dataclass(frozen=True, slots=True)
class Step:
    phase: str
    at: float | None  # when the step began (the tracker's stamp); None when only inferred
    message: str
    warning: bool = False  # the move ended in trouble (its target lost, its topic deleted)


def now_iso(ts: float | None = None) -> str:
    """RFC 3339 in UTC, to the second (the API server's own resolution)."""
    moment = datetime.datetime.fromtimestamp(ts if ts is not None else time.time(), datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    """The inverse of now_iso (None when absent or not in its shape)."""
    if not text:
        return None
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return moment.replace(tzinfo=datetime.UTC).timestamp()


def steps_of(m: MoveStatus) -> list[Step]:
    """Every step the tracker has stamped for one move, in order."""
    tp = f"{m.topic}-{m.partition}"
    src = "no broker" if m.source is None else f"broker {m.source}"
    out = [Step(Phase.CLOSING.value, m.started, f"{tp}: {src} closes it for broker {m.target}")]
    if m.closed is not None:
        out.append(
            Step(
                Phase.ELECTING.value,
                m.closed,
                f"{tp}: released by {src}; electing broker {m.target}",
            )
        )
    if m.elected is not None:
        epoch = f" at epoch {m.epoch}" if m.epoch is not None else ""
        out.append(
            Step(
                Phase.OPENING.value,
                m.elected,
                f"{tp}: broker {m.target} elected{epoch}, opening it",
            )
        )
    if m.phase is Phase.DONE:
        took = (
            f" (unavailable {m.unavailable_s * 1000:.0f} ms)" if m.unavailable_s is not None else ""
        )
        out.append(
            Step(
                Phase.DONE.value, m.opened or m.finished, f"{tp}: served by broker {m.target}{took}"
            )
        )
    elif m.phase is Phase.CANCELLED and m.outcome in TROUBLE:
        # rolled back because its target went away (the reason names both brokers)
        out.append(Step(Phase.CANCELLED.value, m.finished, f"{tp}: {m.reason}", warning=True))
    elif m.phase is Phase.CANCELLED:
        out.append(
            Step(
                Phase.CANCELLED.value,
                m.finished,
                f"{tp}: {m.reason or 'cancelled'} (broker {m.source})",
            )
        )
    elif m.phase is Phase.FAILED:
        out.append(Step(Phase.FAILED.value, m.finished, f"{tp}: failed: {m.reason}", warning=True))
    return out


def steps_to_emit(
    m: MoveStatus | None, row_phase: str, last_emitted: str | None, tp: str
) -> list[Step]:
    """The steps of one row not announced yet (after `last_emitted`), oldest first."""
    if rank(last_emitted) >= rank(Phase.DONE.value):
        return []
    if m is not None:
        return [s for s in steps_of(m) if rank(s.phase) > rank(last_emitted)]
    if row_phase != last_emitted and rank(row_phase) > rank(last_emitted):
        # no tracked move (it finished before an operator restart): the metadata's word
        return [Step(row_phase, None, f"{tp}: {row_phase} (seen in the cluster metadata)")]
    return []


def reassignment_row(
    entry: PlanEntry,
    m: MoveStatus | None,
    previous: Mapping[str, Any] | None,
    part: PartitionState | None,
    *,
    cancel_requested: bool,
    opened: bool | None = None,
    seen_unopened: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """One row of status.partitions (see the module docstring for the rules). For a move the
    controller does not track: `opened` says whether its target reports the partition open at
    its current epoch (None: unknown), `seen_unopened` that this operator saw it elected and
    not open yet (then `now` is when it is first seen open)."""
    base: dict[str, Any] = {
        "topic": entry.tp.topic,
        "partition": entry.tp.partition,
        "target": entry.target,
    }
    before = dict(previous or {})
    if before.get("phase") in FINISHED:
        return {**before, **base}
    if m is not None:
        row = {
            **base,
            "source": m.source if m.source is not None else -1,
            "phase": m.phase.value,
            "startTime": now_iso(m.started),
            "endTime": now_iso(m.finished) if m.finished else None,
            "unavailableMs": round(m.unavailable_s * 1000) if m.unavailable_s is not None else None,
            "message": m.reason or None,
        }
        earlier = before.get("startTime")
        if earlier:  # reported by an earlier operator: the row's start does not move
            if earlier < row["startTime"]:  # the new tracker timed the move from the restart
                row["message"] = f"{m.reason}; {RESUMED_NOTE}" if m.reason else RESUMED_NOTE
            # else the new tracker took the move's durable start, stamped just before the
            # metadata commit that recorded it, while the first tracker stamped it just after:
            # up to one commit earlier, which may fall in the second before
            row["startTime"] = earlier
        return {k: v for k, v in row.items() if v is not None}
    row = {**before, **base, "phase": before.get("phase") or Phase.PENDING.value}
    if part is not None and not part.moving:
        if part.leader == entry.target and opened is False:
            # elected before an operator restart, and the target has not reported it open yet
            row["phase"] = Phase.OPENING.value
        elif part.leader == entry.target:
            row["phase"] = Phase.DONE.value
            if "unavailableMs" not in row:
                start = parse_iso(row.get("startTime"))
                if seen_unopened and start is not None and now is not None:
                    # this operator saw it elected and not yet open, then open: the move's
                    # unavailability is measured here, to within a publish interval
                    row["unavailableMs"] = max(0, round((now - start) * 1000))
                    row["endTime"] = now_iso(now)
                    row["message"] = MEASURED_NOTE
                else:
                    row["message"] = UNMEASURED_NOTE
        elif cancel_requested:
            row["phase"] = Phase.CANCELLED.value
            row["message"] = "cancelled: not moving, and served by its original broker"
    return row


def summary(rows: Sequence[Mapping[str, Any]]) -> tuple[str, bool, str]:
    """(overall phase, finished, a one-line account) of a reassignment's rows."""
    count = {p: sum(1 for r in rows if r.get("phase") == p) for p in FINISHED}
    done, cancelled, failed = (
        count[Phase.DONE.value],
        count[Phase.CANCELLED.value],
        count[Phase.FAILED.value],
    )
    finished = done + cancelled + failed == len(rows)
    if not finished:
        overall = "Running"
    elif failed:
        overall = "Failed"
    elif cancelled:
        overall = "Cancelled"
    else:
        overall = "Completed"
    text = f"{done} of {len(rows)} moved"
    if cancelled:
        text += f", {cancelled} rolled back"
    if failed:
        text += f", {failed} failed"
        # the reasons, so that `kubectl get` (the Message column) says why
        why = [
            f"{r.get('topic')}-{r.get('partition')}: {r.get('message') or 'no reason given'}"
            for r in rows
            if r.get("phase") == Phase.FAILED.value
        ]
        text += " (" + "; ".join(why[:5]) + ("; ..." if len(why) > 5 else "") + ")"
    return overall, finished, text
