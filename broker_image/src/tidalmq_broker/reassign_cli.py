"""`tidalmq reassign`: the `kafka-reassign-partitions` workflow for TidalMQ.

Same JSON files and options as Kafka's tool (--generate, --execute, --verify, --cancel,
--bootstrap-server, --reassignment-json-file, --topics-to-move-json-file, --broker-list,
--timeout in milliseconds), with a non-zero exit and a clear message for a bad plan. --execute
returns once the moves are started, like Kafka's; --verify shows how far they are (and --wait,
TidalMQ's own, waits with a progress bar). --command-config takes Kafka's client properties
(TLS, SASL: tidalmq_core.client_properties), as Kafka's tools do. Options that mean nothing here
(--throttle, --disable-rack-aware, ...) are accepted, with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from tidalmq_broker.cli_args import add_output, bootstrap_servers, id_list, print_json, wants_json
from tidalmq_broker.commands import command_help

if TYPE_CHECKING:  # imported by the modes that use them: `--help` and `--list` start fast
    from tidalmq_core.model import TopicPartition
    from tidalmq_core.reassignment import PlanEntry

    from tidalmq_broker.admin_client import AdminClient

EXIT_BAD_PLAN = 2
EXIT_FAILED = 1
DEFAULT_TIMEOUT_MS = 10_000  # Kafka's default for --timeout
DEFAULT_WAIT_S = 120.0  # --wait without --timeout


JSON_KEYS = (
    '--list: {"reassignments": [{"topic", "partition", "replicas", "adding", "removing"}]}; '
    '--verify: {"partitions": [{"topic", "partition", "target", "status", "replicas", "leader"}], '
    '"done", "in_flight", "total"} with status one of completed, in_progress, opening, '
    "not_started, target_gone (the target broker is not in the cluster); "
    '--generate: {"current", "proposed"} (Kafka\'s reassignment JSON each), "moves"; '
    '--execute: {"current", "started": ["topic-partition"], "failed": {"topic-partition": '
    'message}}; --cancel: {"cancelled": ["topic-partition"]}'
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reassign",
        help=command_help("reassign"),
        description=__doc__,
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", action="store_true", help="propose a balanced assignment")
    mode.add_argument("--execute", action="store_true", help="start the moves in the plan")
    mode.add_argument("--verify", action="store_true", help="check whether the moves finished")
    mode.add_argument("--cancel", action="store_true", help="cancel moves still in progress")
    mode.add_argument("--list", action="store_true", help="list moves in progress")
    p.add_argument(
        "--bootstrap-server",
        required=True,
        type=bootstrap_servers,
        metavar="HOST:PORT",
        help="any broker (several: comma-separated)",
    )
    p.add_argument("--reassignment-json-file", help="the plan (Kafka's reassignment JSON)")
    p.add_argument("--topics-to-move-json-file", help="--generate: topics to spread")
    p.add_argument(
        "--broker-list", type=id_list, metavar="IDS", help="--generate: comma-separated broker ids"
    )
    p.add_argument(
        "--wait", action="store_true", help="--execute: wait until done, showing progress"
    )
    p.add_argument(
        "--timeout",
        type=_timeout_ms,
        default=None,
        metavar="MS",
        help="milliseconds, like Kafka's (a value ending in s is seconds): how long "
        f"the controller may take to start the moves (default {DEFAULT_TIMEOUT_MS}), "
        f"and how long --wait waits (default {DEFAULT_WAIT_S:.0f}s)",
    )
    p.add_argument(
        "--throttle",
        type=int,
        default=-1,
        help="accepted for compatibility; moves copy no data, so there is nothing to throttle",
    )
    p.add_argument("--additional", action="store_true", help="accepted for compatibility")
    p.add_argument("--preserve-throttles", action="store_true", help="accepted for compatibility")
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="Kafka client properties (security.protocol, sasl.mechanism, "
        "sasl.jaas.config, ssl.truststore.location, ssl.keystore.location: PEM) "
        "to reach a TLS or SASL listener",
    )
    p.add_argument(
        "--disable-rack-aware",
        action="store_true",
        help="accepted for compatibility: --generate does not place by rack",
    )
    p.add_argument("plan_file", nargs="?", help="the plan (same as --reassignment-json-file)")
    add_output(p, JSON_KEYS)
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
    if args.disable_rack_aware:
        _note("--disable-rack-aware is ignored: --generate does not place by rack")
    if args.execute and args.throttle >= 0:
        _note("--throttle is ignored: a TidalMQ move copies no data")


def _note(message: str) -> None:
    print(f"Note: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from tidalmq_broker.admin_client import AdminClient, AdminError

    _notes(args)
    security = None  # PLAINTEXT, without importing the properties' parser (docs/cli.md)
    if args.command_config:
        from tidalmq_core import client_properties

        try:
            security = client_properties.from_file(args.command_config)
        except client_properties.ClientConfigError as exc:
            return _fail(f"--command-config: {exc}")
    try:
        with AdminClient(args.bootstrap_server, security=security) as admin:
            if args.generate:
                return _generate(admin, args)
            if args.list:
                return _list(admin, args)
            return _with_plan(admin, args)
    except AdminError as exc:
        return _fail(str(exc))


def _with_plan(admin: AdminClient, args: argparse.Namespace) -> int:
    from tidalmq_core.reassignment import InvalidPlan, parse_plan

    plan_file = args.reassignment_json_file or args.plan_file
    if not plan_file:
        return _fail("a plan file is required (--reassignment-json-file FILE)")
    try:
        entries = parse_plan(_read(plan_file))
    except OSError as exc:
        return _fail(f"cannot read {plan_file}: {exc}")
    except InvalidPlan as exc:
        return _fail(f"invalid plan: {exc}", EXIT_BAD_PLAN)
    # every mode refuses a plan naming what does not exist (Kafka's tool does too); --cancel
    # ignores the replicas, and --verify reports a target that is gone (removed) per partition
    # one Metadata request for the plan's topics: it names the brokers too, and --execute
    # prints the rollback plan from the same answer (a move's time counts from the command's
    # start: docs/cli.md)
    md = admin.metadata(sorted({e.tp.topic for e in entries}))
    problem = _check_plan(md, entries, brokers=args.execute)
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
        return _execute(admin, md, entries, args)
    if args.verify:
        return _verify(admin, entries, args)
    return _cancel(admin, entries, args)


def _read(path: str) -> str:
    """A plan's text (open(), not pathlib: pathlib imports urllib.parse, ipaddress and fnmatch
    at a move's start, docs/cli.md)."""
    with open(path, encoding="utf-8") as f:
        return f.read()


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"Error: {message}", file=sys.stderr)
    return code


def _check_plan(md: Any, entries: list[PlanEntry], *, brokers: bool = True) -> str | None:
    """Kafka's tool refuses a plan naming unknown brokers or partitions before sending it.
    `md`: the Metadata answer for the plan's topics."""
    known = {b.node_id for b in md.brokers}
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
    from tidalmq_core.balance import balance_counts
    from tidalmq_core.reassignment import format_plan

    from tidalmq_broker.admin_client import AdminError

    if not args.topics_to_move_json_file or not args.broker_list:
        return _fail("--generate needs --topics-to-move-json-file and --broker-list")
    try:
        topics = topics_to_move(_read(args.topics_to_move_json_file))
    except OSError as exc:
        return _fail(f"cannot read {args.topics_to_move_json_file}: {exc}")
    except ValueError as exc:
        return _fail(f"{args.topics_to_move_json_file}: {exc}", EXIT_BAD_PLAN)
    brokers: list[int] = args.broker_list
    unknown = set(brokers) - set(admin.brokers())
    if unknown:
        return _fail(f"unknown brokers {sorted(unknown)}", EXIT_BAD_PLAN)
    try:
        current = {tp: r[0] for tp, r in admin.assignment(topics).items()}
    except AdminError as exc:
        return _fail(str(exc), EXIT_BAD_PLAN)
    plan = balance_counts(current, brokers)
    proposed = {tp: b for tp, b in plan.assignment.items() if b is not None}
    if wants_json(args):
        print_json(
            {
                "current": json.loads(format_plan(current)),
                "proposed": json.loads(format_plan(proposed)),
                "moves": len(plan.moves),
            }
        )
        return 0
    print("Current partition replica assignment")
    print(format_plan(current))
    print()
    print("Proposed partition reassignment configuration")
    print(format_plan(proposed))
    print(f"\n# {len(plan.moves)} of {len(current)} partitions move", file=sys.stderr)
    return 0


def topics_to_move(text: str) -> list[str]:
    """Kafka's --topics-to-move-json-file: {"version": 1, "topics": [{"topic": "t"}, ...]};
    ValueError with one line naming what is wrong."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    items = doc.get("topics") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError('expected {"version": 1, "topics": [{"topic": "NAME"}, ...]}')
    topics = []
    for i, item in enumerate(items):
        name = item.get("topic") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f'topics[{i}] has no "topic"')
        topics.append(name)
    return topics


def _execute(
    admin: AdminClient, md: Any, entries: list[PlanEntry], args: argparse.Namespace
) -> int:
    from tidalmq_core.reassignment import format_plan

    from tidalmq_broker.admin_client import assignment_of

    as_json = wants_json(args)
    current = assignment_of(md)
    rollback = {tp: r[0] for tp, r in current.items() if tp in {e.tp for e in entries}}
    if not as_json:
        print("Current partition replica assignment\n")
        print(format_plan(rollback))
        print("\nSave this to use as the --reassignment-json-file option during rollback")
    timeout_ms = DEFAULT_TIMEOUT_MS if args.timeout is None else args.timeout
    results = admin.alter_reassignments({e.tp: e.target for e in entries}, timeout_ms=timeout_ms)
    failed = {tp: r for tp, r in results.items() if r[0] != 0}
    started = [tp for tp in sorted(results) if tp not in failed]
    if as_json:
        print_json(
            {
                "current": json.loads(format_plan(rollback)),
                "started": [str(tp) for tp in started],
                "failed": {str(tp): message or str(code) for tp, (code, message) in failed.items()},
            }
        )
    else:
        for tp, (code, message) in sorted(failed.items()):
            print(f"Error reassigning {tp}: {message or code}", file=sys.stderr)
        if started:
            print(
                f"Successfully started partition reassignment{'s' if len(started) != 1 else ''} "
                f"for {', '.join(str(tp) for tp in started)}"
            )
    if failed:
        return EXIT_FAILED
    if args.wait:
        wait_s = DEFAULT_WAIT_S if args.timeout is None else args.timeout / 1000
        if args.timeout is not None and args.timeout < 1000:
            _note(
                f"--timeout is in milliseconds like Kafka's: waiting {wait_s:.3f}s "
                "(write e.g. 120s for seconds)"
            )
        return _wait(admin, entries, wait_s, sys.stderr if as_json else sys.stdout)
    return 0


def _wait(admin: AdminClient, entries: list[PlanEntry], timeout_s: float, stream: Any) -> int:
    from tidalmq_broker.progress import Progress

    wanted = {e.tp: e.target for e in entries if e.target is not None}
    deadline = time.monotonic() + timeout_s
    progress = Progress(stream)
    while True:
        moving = admin.list_reassignments()
        leaders = admin.leaders(sorted({tp.topic for tp in wanted}))
        done = sum(1 for tp, b in wanted.items() if tp not in moving and leaders.get(tp) == b)
        progress.show(done, len(wanted))
        if done == len(wanted):
            progress.end()
            return 0
        if time.monotonic() > deadline:
            progress.end()
            return _fail(f"{len(wanted) - done} moves not finished after {timeout_s:g}s")
        time.sleep(0.1)


def verify_status(
    entry: PlanEntry,
    moving: dict[TopicPartition, Any],
    replicas: list[int] | None,
    leader: int,
    brokers: set[int],
) -> str:
    """One partition of --verify: completed, in_progress, opening, not_started or target_gone
    (its target broker is no longer in the cluster: removed, so the move cannot complete)."""
    if entry.tp in moving:
        return "in_progress"
    if replicas == [entry.target] and leader == entry.target:
        return "completed"
    if entry.target not in brokers:
        return "target_gone"
    if replicas == [entry.target]:
        return "opening"
    return "not_started"


def _verify(admin: AdminClient, entries: list[PlanEntry], args: argparse.Namespace) -> int:
    """Kafka's per-partition status lines, then how far the plan is: done, in flight (with
    what each move is adding and removing), and not started or elsewhere."""
    from tidalmq_broker.admin_client import assignment_of, leaders_of
    from tidalmq_broker.progress import bar

    topics = sorted({e.tp.topic for e in entries})
    moving = admin.list_reassignments()
    # replicas, leaders and brokers from one Metadata answer, after the list: one snapshot
    md = admin.metadata(topics)
    replicas = assignment_of(md)
    leaders = leaders_of(md)
    brokers = {b.node_id for b in md.brokers}
    wanted = [e for e in entries if e.target is not None]
    rows: list[dict[str, Any]] = []
    for e in wanted:
        status = verify_status(e, moving, replicas.get(e.tp), leaders.get(e.tp, -1), brokers)
        rows.append(
            {
                "topic": e.tp.topic,
                "partition": e.tp.partition,
                "target": e.target,
                "status": status,
                "replicas": replicas.get(e.tp),
                "leader": leaders.get(e.tp, -1),
            }
        )
    done = sum(r["status"] == "completed" for r in rows)
    in_flight = sum(r["status"] in ("in_progress", "opening") for r in rows)
    code = 0 if done == len(wanted) else EXIT_FAILED
    if wants_json(args):
        print_json({"partitions": rows, "done": done, "in_flight": in_flight, "total": len(rows)})
        return code
    print("Status of partition reassignment:")
    details: list[str] = []
    for e, row in zip(wanted, rows, strict=True):
        status = row["status"]
        if status == "in_progress":
            print(f"Reassignment of partition {e.tp} is still in progress.")
            _, adding, removing = moving[e.tp]
            serving = "no broker serves it until the target opens it"
            if row["leader"] >= 0:
                serving = f"broker {row['leader']} serves it"
            details.append(f"  {e.tp}: adding {adding}, removing {removing} ({serving})")
        elif status == "completed":
            print(f"Reassignment of partition {e.tp} is completed.")
        elif status == "opening":
            print(
                f"Reassignment of partition {e.tp} is still in progress (opening on "
                f"broker {e.target})."
            )
            details.append(f"  {e.tp}: elected on broker {e.target}, opening")
        elif status == "target_gone":
            print(
                f"Reassignment of partition {e.tp} cannot complete: its target broker "
                f"{e.target} is not in the cluster (removed?); brokers: {sorted(brokers)}; "
                f"replica set is {row['replicas']}."
            )
        else:
            print(
                f"There is no active reassignment of partition {e.tp}, but replica set is "
                f"{row['replicas']} rather than {[e.target]}."
            )
    print(
        f"\nProgress: {bar(done, len(wanted))} {done}/{len(wanted)} partitions moved, "
        f"{in_flight} in flight"
    )
    for line in details:
        print(line)
    return code


def _cancel(admin: AdminClient, entries: list[PlanEntry], args: argparse.Namespace) -> int:
    moving = admin.list_reassignments()
    targets: dict[TopicPartition, int | None] = {e.tp: None for e in entries if e.tp in moving}
    results = admin.alter_reassignments(targets) if targets else {}
    cancelled = sorted(tp for tp, (code, _) in results.items() if code == 0)
    if wants_json(args):
        print_json({"cancelled": [str(tp) for tp in cancelled]})
    elif not targets:
        print("None of the specified partition reassignments are active.")
    else:
        print(
            f"Successfully cancelled partition reassignment{'s' if len(cancelled) != 1 else ''} "
            f"for: {', '.join(str(tp) for tp in cancelled)}"
        )
    return 0 if len(cancelled) == len(targets) else EXIT_FAILED


def _list(admin: AdminClient, args: argparse.Namespace) -> int:
    moving = admin.list_reassignments()
    if wants_json(args):
        print_json(
            {
                "reassignments": [
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "replicas": rs,
                        "adding": ar,
                        "removing": rr,
                    }
                    for tp, (rs, ar, rr) in sorted(moving.items())
                ]
            }
        )
        return 0
    if not moving:
        print("No partition reassignments found.")
    for tp, (rs, ar, rr) in sorted(moving.items()):
        print(f"{tp}: replicas {rs}, adding {ar}, removing {rr}")
    return 0
