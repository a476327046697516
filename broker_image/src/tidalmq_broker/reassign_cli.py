"""`tidalmq reassign`: the `kafka-reassign-partitions` workflow for TidalMQ.

Same JSON files and options as Kafka's tool (--generate, --execute, --verify, --cancel,
--bootstrap-server, --reassignment-json-file, --topics-to-move-json-file, --broker-list,
--timeout in milliseconds), with a non-zero exit and a clear message for a bad plan. --execute
returns once the moves are started, like Kafka's; --verify shows how far they are (and --wait,
TidalMQ's own, waits with a progress bar). Options that mean nothing here (--throttle,
--command-config, --disable-rack-aware, ...) are accepted, with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tidalmq_core.balance import balance_counts
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, PlanEntry, format_plan, parse_plan

from tidalmq_broker.admin_client import AdminClient, AdminError

EXIT_BAD_PLAN = 2
EXIT_FAILED = 1
DEFAULT_TIMEOUT_MS = 10_000  # Kafka's default for --timeout
DEFAULT_WAIT_S = 120.0  # --wait without --timeout


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reassign",
        help="move partitions between brokers (kafka-reassign-partitions compatible)",
        description=__doc__,
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", action="store_true", help="propose a balanced assignment")
    mode.add_argument("--execute", action="store_true", help="start the moves in the plan")
    mode.add_argument("--verify", action="store_true", help="check whether the moves finished")
    mode.add_argument("--cancel", action="store_true", help="cancel moves still in progress")
    mode.add_argument("--list", action="store_true", help="list moves in progress")
    p.add_argument("--bootstrap-server", required=True, help="HOST:PORT of any broker")
    p.add_argument("--reassignment-json-file", help="the plan (Kafka's reassignment JSON)")
    p.add_argument("--topics-to-move-json-file", help="--generate: topics to spread")
    p.add_argument("--broker-list", help="--generate: comma-separated broker ids")
    p.add_argument(
        "--wait", action="store_true", help="--execute: wait until done, showing progress"
    )
    p.add_argument("--timeout", type=_timeout_ms, default=None, metavar="MS",
                   help="milliseconds, like Kafka's (a value ending in s is seconds): how long "
                        f"the controller may take to start the moves (default {DEFAULT_TIMEOUT_MS}), "
                        f"and how long --wait waits (default {DEFAULT_WAIT_S:.0f}s)")  # fmt: skip
    p.add_argument("--throttle", type=int, default=-1,
                   help="accepted for compatibility; moves copy no data, so there is nothing to throttle")  # fmt: skip
    p.add_argument("--additional", action="store_true", help="accepted for compatibility")
    p.add_argument("--preserve-throttles", action="store_true", help="accepted for compatibility")
    p.add_argument("--command-config", metavar="FILE",
                   help="accepted for compatibility and ignored: the CLI needs no client "
                        "properties (no TLS or SASL)")  # fmt: skip
    p.add_argument("--disable-rack-aware", action="store_true",
                   help="accepted for compatibility: --generate does not place by rack")  # fmt: skip
    p.add_argument("plan_file", nargs="?", help="the plan (same as --reassignment-json-file)")
    p.set_defaults(handler=run)


def _timeout_ms(text: str) -> int:
    """Kafka's --timeout is in milliseconds; "120s" (seconds) is accepted too."""
    text = text.strip().lower()
    try:
        if text.endswith("ms"):
            value = float(text[:-2])
        elif text.endswith("s"):
            value = float(text[:-1]) * 1000
        else:
            value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration in milliseconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the timeout must not be negative")
    return int(value)


def _notes(args: argparse.Namespace) -> None:
    """What Kafka's options that mean nothing here do (nothing), on stderr."""
    if args.command_config:
        _note(f"--command-config {args.command_config} is ignored: no client properties needed")
    if args.disable_rack_aware:
        _note("--disable-rack-aware is ignored: --generate does not place by rack")
    if args.execute and args.throttle >= 0:
        _note("--throttle is ignored: a TidalMQ move copies no data")


def _note(message: str) -> None:
    print(f"Note: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    _notes(args)
    try:
        with AdminClient(args.bootstrap_server) as admin:
            if args.generate:
                return _generate(admin, args)
            if args.list:
                return _list(admin)
            plan_file = args.reassignment_json_file or args.plan_file
            if not plan_file:
                return _fail("a plan file is required (--reassignment-json-file FILE)")
            try:
                entries = parse_plan(Path(plan_file).read_text())
            except OSError as exc:
                return _fail(f"cannot read {plan_file}: {exc}")
            except InvalidPlan as exc:
                return _fail(f"invalid plan: {exc}", EXIT_BAD_PLAN)
            # every mode refuses a plan naming what does not exist (Kafka's tool does too);
            # --cancel ignores the replicas, so only its partitions are checked
            problem = _check_plan(admin, entries, brokers=not args.cancel)
            if problem:
                return _fail(f"invalid plan: {problem}", EXIT_BAD_PLAN)
            if args.execute:
                missing = [str(e.tp) for e in entries if e.target is None]
                if missing:  # Kafka's tool refuses these too (its --cancel ignores replicas)
                    return _fail(
                        f'invalid plan: no "replicas" for {", ".join(missing)}: --execute needs '
                        "the broker each partition moves to",
                        EXIT_BAD_PLAN,
                    )
                return _execute(admin, entries, args)
            if args.verify:
                return _verify(admin, entries)
            return _cancel(admin, entries)
    except AdminError as exc:
        return _fail(str(exc))


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"Error: {message}", file=sys.stderr)
    return code


def _check_plan(
    admin: AdminClient, entries: list[PlanEntry], *, brokers: bool = True
) -> str | None:
    """Kafka's tool refuses a plan naming unknown brokers or partitions before sending it."""
    known = set(admin.brokers())
    topics = sorted({e.tp.topic for e in entries})
    md = admin.metadata(topics)
    counts = {t.name: len(t.partitions) for t in md.topics if t.error_code == 0}
    problems = []
    for e in entries:
        if e.tp.topic not in counts:
            problems.append(f"{e.tp}: unknown topic {e.tp.topic!r}")
        elif e.tp.partition >= counts[e.tp.topic]:
            problems.append(f"{e.tp}: unknown partition (topic has {counts[e.tp.topic]})")
        if brokers and e.target is not None and e.target not in known:
            problems.append(f"{e.tp}: unknown broker {e.target} (brokers: {sorted(known)})")
    return "; ".join(problems) or None


def _generate(admin: AdminClient, args: argparse.Namespace) -> int:
    if not args.topics_to_move_json_file or not args.broker_list:
        return _fail("--generate needs --topics-to-move-json-file and --broker-list")
    try:
        doc = json.loads(Path(args.topics_to_move_json_file).read_text())
        topics = [t["topic"] for t in doc["topics"]]
        brokers = [int(b) for b in args.broker_list.split(",") if b.strip()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return _fail(f"bad input: {exc}", EXIT_BAD_PLAN)
    unknown = set(brokers) - set(admin.brokers())
    if unknown:
        return _fail(f"unknown brokers {sorted(unknown)}", EXIT_BAD_PLAN)
    try:
        current = {tp: r[0] for tp, r in admin.assignment(topics).items()}
    except AdminError as exc:
        return _fail(str(exc), EXIT_BAD_PLAN)
    plan = balance_counts(current, brokers)
    print("Current partition replica assignment")
    print(format_plan(current))
    print()
    print("Proposed partition reassignment configuration")
    print(format_plan({tp: b for tp, b in plan.assignment.items()}))  # type: ignore[misc]
    print(f"\n# {len(plan.moves)} of {len(current)} partitions move", file=sys.stderr)
    return 0


def _execute(admin: AdminClient, entries: list[PlanEntry], args: argparse.Namespace) -> int:
    current = admin.assignment(sorted({e.tp.topic for e in entries}))
    print("Current partition replica assignment\n")
    print(format_plan({tp: r[0] for tp, r in current.items() if tp in {e.tp for e in entries}}))
    print("\nSave this to use as the --reassignment-json-file option during rollback")
    timeout_ms = DEFAULT_TIMEOUT_MS if args.timeout is None else args.timeout
    results = admin.alter_reassignments({e.tp: e.target for e in entries}, timeout_ms=timeout_ms)
    failed = {tp: r for tp, r in results.items() if r[0] != 0}
    for tp, (code, message) in sorted(failed.items()):
        print(f"Error reassigning {tp}: {message or code}", file=sys.stderr)
    started = len(results) - len(failed)
    if started:
        print(f"Successfully started partition reassignment{'s' if started != 1 else ''} for "
              f"{', '.join(str(tp) for tp in sorted(results) if tp not in failed)}")  # fmt: skip
    if failed:
        return EXIT_FAILED
    if args.wait:
        wait_s = DEFAULT_WAIT_S if args.timeout is None else args.timeout / 1000
        if args.timeout is not None and args.timeout < 1000:
            _note(f"--timeout is in milliseconds like Kafka's: waiting {wait_s:.3f}s "
                  "(write e.g. 120s for seconds)")  # fmt: skip
        return _wait(admin, entries, wait_s)
    return 0


def _wait(admin: AdminClient, entries: list[PlanEntry], timeout_s: float) -> int:
    wanted = {e.tp: e.target for e in entries if e.target is not None}
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    while True:
        moving = admin.list_reassignments()
        leaders = admin.leaders(sorted({tp.topic for tp in wanted}))
        done = sum(1 for tp, b in wanted.items() if tp not in moving and leaders.get(tp) == b)
        _progress(done, len(wanted), time.monotonic() - started)
        if done == len(wanted):
            print()
            return 0
        if time.monotonic() > deadline:
            print()
            return _fail(f"{len(wanted) - done} moves not finished after {timeout_s:g}s")
        time.sleep(0.1)


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _progress(done: int, total: int, elapsed: float) -> None:
    sys.stdout.write(f"\r{_bar(done, total)} {done}/{total} partitions moved ({elapsed:.1f}s)")
    sys.stdout.flush()


def _verify(admin: AdminClient, entries: list[PlanEntry]) -> int:
    """Kafka's per-partition status lines, then how far the plan is: done, in flight (with
    what each move is adding and removing), and not started or elsewhere."""
    moving = admin.list_reassignments()
    replicas = admin.assignment(sorted({e.tp.topic for e in entries}))
    leaders = admin.leaders(sorted({e.tp.topic for e in entries}))
    print("Status of partition reassignment:")
    wanted = [e for e in entries if e.target is not None]
    done = 0
    in_flight: list[str] = []
    for e in wanted:
        if e.tp in moving:
            print(f"Reassignment of partition {e.tp} is still in progress.")
            _, adding, removing = moving[e.tp]
            serving = "no broker serves it until the target opens it"
            if leaders.get(e.tp, -1) >= 0:
                serving = f"broker {leaders[e.tp]} serves it"
            in_flight.append(f"  {e.tp}: adding {adding}, removing {removing} ({serving})")
        elif replicas.get(e.tp) == [e.target] and leaders.get(e.tp) == e.target:
            print(f"Reassignment of partition {e.tp} is completed.")
            done += 1
        elif replicas.get(e.tp) == [e.target]:
            print(f"Reassignment of partition {e.tp} is still in progress (opening on "
                  f"broker {e.target}).")  # fmt: skip
            in_flight.append(f"  {e.tp}: elected on broker {e.target}, opening")
        else:
            print(f"There is no active reassignment of partition {e.tp}, but replica set is "
                  f"{replicas.get(e.tp)} rather than {[e.target]}.")  # fmt: skip
    print(f"\nProgress: {_bar(done, len(wanted))} {done}/{len(wanted)} partitions moved, "
          f"{len(in_flight)} in flight")  # fmt: skip
    for line in in_flight:
        print(line)
    return 0 if done == len(wanted) else EXIT_FAILED


def _cancel(admin: AdminClient, entries: list[PlanEntry]) -> int:
    moving = admin.list_reassignments()
    targets: dict[TopicPartition, int | None] = {e.tp: None for e in entries if e.tp in moving}
    if not targets:
        print("None of the specified partition reassignments are active.")
        return 0
    results = admin.alter_reassignments(targets)
    cancelled = [tp for tp, (code, _) in results.items() if code == 0]
    print(f"Successfully cancelled partition reassignment{'s' if len(cancelled) != 1 else ''} "
          f"for: {', '.join(str(tp) for tp in sorted(cancelled))}")  # fmt: skip
    return 0 if len(cancelled) == len(targets) else EXIT_FAILED


def _list(admin: AdminClient) -> int:
    moving = admin.list_reassignments()
    if not moving:
        print("No partition reassignments found.")
    for tp, (rs, ar, rr) in sorted(moving.items()):
        print(f"{tp}: replicas {rs}, adding {ar}, removing {rr}")
    return 0
