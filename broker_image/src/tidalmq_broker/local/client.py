"""`tidalmq local status | top | add-broker | remove-broker | kill-broker`: the commands that talk to a
running `local up` over its controller's HTTP port (local/control.py finds it and its token).

add-broker and remove-broker wait for the partitions to move (onto the new broker; off the
removed one) and show moves done / total and the rate, as `reassign --wait` does, until the
moves are done or --timeout runs out (a clear message then: they go on in the background).

Stdlib and local/control.py only (no asyncio, no controller, no storage): these commands start
in the interpreter's time (docs/cli.md). `local up` imports format_table from here for its table.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from tidalmq_broker.cli_args import print_json, wants_json

if TYPE_CHECKING:
    from tidalmq_core.control_tls import ControlTls

POLL_S = 0.2
DEFAULT_MOVE_TIMEOUT_S = 120.0
STOP_ALLOWANCE_S = 40.0  # beyond the drain: the broker's stop (local up's STOP_TIMEOUT_S) and slack

STATUS_KEYS = (
    '{"bootstrap", "controller", "metadata_version", "brokers": [{"broker", "state", '
    '"dead_since", "process", "address", "partitions", "moves_in", "moves_out", "moved_in", '
    '"moved_out", "pid", "http_port"}], "leaderless", "moves_in_flight", "failovers_opening", '
    '"moves_done", '
    '"store_problem", "lost": [{"topic", "partition", "expected_end", "found_end", '
    '"missing_offsets", "reason"}]}'
)
CHANGE_KEYS = {
    "add-broker": '{"broker", "address", "moves": {"done", "total"}, "finished", "elapsed_s"}',
    "remove-broker": '{"broker", "moves": {"done", "total"}, "finished", "elapsed_s"}',
    "kill-broker": '{"broker", "killed"}',
}


class LocalCommandError(Exception):
    """A one-line message for the user; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def local_command(args: argparse.Namespace) -> int:
    from tidalmq_broker.local.control import ControlError, find_controller

    try:
        base, token, tls = find_controller(None, args.data_dir)
        client = Client(base, token, tls)
        action = args.local_command
        if action == "status":
            return _status(client, args)
        if action == "top":
            from tidalmq_broker.local import top

            return top.run(client, max(args.interval, 0.1), args.once)
        if action == "kill-broker":
            client.post("kill-broker", {"broker_id": args.broker_id})
            if wants_json(args):
                print_json({"broker": args.broker_id, "killed": True})
            else:
                print(
                    f"broker {args.broker_id} killed (SIGKILL); the controller fails its "
                    "partitions over (`tidalmq local status` shows them)"
                )
            return 0
        stream = sys.stderr if wants_json(args) else sys.stdout
        if action == "add-broker":
            result = add_broker(client, args.timeout, stream, wait=not args.no_wait)
        else:
            result = remove_broker(client, args.broker_id, args.timeout, stream)
    except ControlError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except LocalCommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    if wants_json(args):
        print_json(result.to_json())
    else:
        print(result.describe())
    return 0 if result.finished else 1


class Client:
    """The local cluster's controller: its URL, the control token, the admin's certificate
    (control-plane mTLS; None: plain HTTP)."""

    def __init__(self, base: str, token: str, tls: ControlTls | None = None) -> None:
        self.base, self.token, self.tls = base, token, tls

    def status(self) -> dict[str, Any]:
        from tidalmq_broker.local.control import request

        doc: dict[str, Any] = request(
            self.base, "/v1/local/status", self.token, method="GET", timeout_s=10, tls=self.tls
        )
        return doc

    def post(self, action: str, body: dict[str, Any], timeout_s: float = 180) -> Any:
        """POST /v1/local/<action>; the cluster's refusal (unknown broker, last broker, a stop
        that timed out) as a LocalCommandError with its message."""
        import json
        import urllib.error

        from tidalmq_broker.local.control import request

        try:
            return request(
                self.base,
                f"/v1/local/{action}",
                self.token,
                body,
                timeout_s=timeout_s,
                tls=self.tls,
            )
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or str(exc)
            except ValueError:
                message = str(exc)
            raise LocalCommandError(message) from None


def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.status()
    if wants_json(args):
        print_json(status)
        return 0
    print(f"bootstrap: {status['bootstrap']}")
    print(format_table(status, now=time.time()))
    return 0


# ---------------------------------------------------------------------- moves and progress
@dataclass
class MoveCount:
    """Moves done / total of a change: done from the controller's finished moves (since the
    change began), remaining from its moves queued or in flight; done never goes back."""

    done: int = 0
    remaining: int = 0

    def update(self, done: int, remaining: int) -> None:
        self.done = max(self.done, done)
        self.remaining = remaining

    @property
    def total(self) -> int:
        return self.done + self.remaining


@dataclass
class ChangeResult:
    action: str  # "added" | "removed"
    broker: int
    moves: MoveCount
    finished: bool  # every move done (else the timeout ran out)
    elapsed_s: float
    timeout_s: float
    address: str = ""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "broker": self.broker,
            "moves": {"done": self.moves.done, "total": self.moves.total},
            "finished": self.finished,
            "elapsed_s": round(self.elapsed_s, 3),
        }
        if self.address:
            doc["address"] = self.address
        return doc

    def describe(self) -> str:
        where = f" on {self.address}" if self.address else ""
        onto = "onto it" if self.action == "added" else "off it"
        if self.finished:
            return (
                f"broker {self.broker} {self.action}{where}: {self.moves.total} partitions "
                f"moved {onto} in {self.elapsed_s:.1f}s"
            )
        left = self.moves.remaining
        return (
            f"broker {self.broker} {self.action}{where}, but {left} of {self.moves.total} "
            f"partition moves {onto} not finished after {self.timeout_s:g}s; they go on in the "
            "background (`tidalmq local status` shows them)"
        )


def _row(status: dict[str, Any], broker: int) -> dict[str, Any] | None:
    return next((r for r in status["brokers"] if r["broker"] == broker), None)


def _count(row: dict[str, Any] | None, key: str) -> int:
    return int(row.get(key, 0)) if row else 0


def add_broker(
    client: Client, timeout_s: float, stream: TextIO, *, wait: bool = True
) -> ChangeResult:
    """Start a broker, then follow the moves onto it (the rebalance of its join, queued before
    `local up` answers) until none is left or the timeout runs out. A replacement takes a dead
    broker's id: what moved onto that one before does not count."""
    started = time.monotonic()
    answer = client.post("add-broker", {})
    broker = int(answer["broker"])
    moves = MoveCount()

    def look(status: dict[str, Any]) -> tuple[int, int]:
        row = _row(status, broker)  # moved_in: since this broker's process started
        return _count(row, "moved_in"), _count(row, "moves_in")

    address = str((_row(client.status(), broker) or {}).get("address", ""))
    finished = True
    if wait:
        finished = _follow(
            client, moves, look, started, started + timeout_s, stream, "partitions moved onto it"
        )
    return ChangeResult(
        "added", broker, moves, finished, time.monotonic() - started, timeout_s, address
    )


def remove_broker(client: Client, broker: int, timeout_s: float, stream: TextIO) -> ChangeResult:
    """Drain a broker (its partitions move to the others), stop it, forget it: the request runs
    in a thread while this one follows the moves off it."""
    started = time.monotonic()
    before = client.status()
    if _row(before, broker) is None:
        known = ", ".join(str(r["broker"]) for r in before["brokers"]) or "none"
        raise LocalCommandError(f"broker {broker} is not in the cluster (brokers: {known})")
    moved_before = _count(_row(before, broker), "moved_out")
    moves = MoveCount()
    outcome: list[BaseException | None] = []

    def remove() -> None:
        try:
            client.post(
                "remove-broker",
                {"broker_id": broker, "drain_timeout_s": timeout_s},
                timeout_s=timeout_s + STOP_ALLOWANCE_S,
            )
            outcome.append(None)
        except BaseException as exc:  # handed to the main thread
            outcome.append(exc)

    worker = threading.Thread(target=remove, name="remove-broker", daemon=True)
    worker.start()

    def look(status: dict[str, Any]) -> tuple[int, int]:
        row = _row(status, broker)
        if row is None:  # forgotten: whatever it led has moved (or fails over now)
            return moves.total, 0
        # the drain queues a move for every partition it leads: once started, its moves out
        left = max(_count(row, "partitions"), _count(row, "moves_out"))
        return _count(row, "moved_out") - moved_before, left

    _follow(
        client,
        moves,
        look,
        started,
        started + timeout_s + STOP_ALLOWANCE_S,
        stream,
        "partitions moved off it",
        until=lambda: not worker.is_alive(),
    )
    worker.join(timeout=1.0)
    if outcome and outcome[0] is not None:
        raise outcome[0]
    if worker.is_alive():
        raise LocalCommandError(
            f"broker {broker} was not removed within {timeout_s + STOP_ALLOWANCE_S:g}s; "
            "`tidalmq local status` shows where it is"
        )
    moves.update(moves.total, 0)
    return ChangeResult("removed", broker, moves, True, time.monotonic() - started, timeout_s)


def _follow(
    client: Client,
    moves: MoveCount,
    look: Callable[[dict[str, Any]], tuple[int, int]],
    started: float,
    deadline: float,
    stream: TextIO,
    what: str,
    until: Callable[[], bool] | None = None,
) -> bool:
    """Polls the status, showing the progress line, until nothing remains (and `until()`, if
    given, says so) or the deadline. True when finished."""
    from tidalmq_broker.progress import Progress

    progress = Progress(stream, what, started)
    try:
        while True:
            moves.update(*look(client.status()))
            progress.show(moves.done, moves.total)
            if moves.remaining == 0 and (until is None or until()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
    finally:
        progress.end()


# ---------------------------------------------------------------------------------- the table
def format_table(status: dict[str, Any], now: float | None = None) -> str:
    """The brokers table. With `now` (time.time()), a dead broker says how long ago it died;
    without (local up's live table, printed when it changes), since when."""
    lines = [f"{'BROKER':>6}  {'STATE':<9} {'PROCESS':<9} {'ADDRESS':<21} {'PARTITIONS':>10}"]
    for row in status["brokers"]:
        line = (
            f"{row['broker']:>6}  {row['state']:<9} {row['process']:<9} {row['address']:<21} "
            f"{row['partitions']:>10}"
        )
        if row["state"] == "dead":
            line += "  " + _dead_note(row.get("dead_since"), now)
        lines.append(line)
    extra = f"moves in flight: {status['moves_in_flight']}, done: {status['moves_done']}"
    if status.get("failovers_opening"):
        extra += f", failed-over partitions opening: {status['failovers_opening']}"
    if status["leaderless"]:
        extra += f", partitions without a leader: {status['leaderless']}"
    lines.append(extra)
    if status.get("store_problem"):
        lines.append(f"OBJECT STORE LOST: {status['store_problem']}")
    lost = status.get("lost") or []
    if lost:
        lines.append(
            f"LOST PARTITIONS: {len(lost)} (data missing from the object store; "
            "`tidalmq recover --accept-data-loss TOPIC` continues them without it)"
        )
        lines.append(
            f"  {'PARTITION':<30} {'EXPECTED END':>12} {'FOUND END':>10} {'MISSING':>8}  REASON"
        )
        for row in lost:
            name = f"{row['topic']}-{row['partition']}"
            lines.append(
                f"  {name:<30} {row['expected_end']:>12} {row['found_end']:>10} "
                f"{row['missing_offsets']:>8}  {row['reason']}"
            )
    return "\n".join(lines)


def _dead_note(since: float | None, now: float | None) -> str:
    replace = "(`tidalmq local add-broker` replaces it, `remove-broker` forgets it)"
    if since is None:
        return f"dead since before this start {replace}"
    if now is None:
        return f"dead since {time.strftime('%H:%M:%S', time.localtime(since))} {replace}"
    return f"dead for {_duration(max(0.0, now - since))} {replace}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
