"""`tidalmq plan`: a rebalance plan from traffic history, with Spark in local mode.

    tidalmq plan --prometheus http://prometheus:9090 --window 7d --step 1m \\
        --bootstrap-server broker:9092 --out plan.json --report-dir report/
    tidalmq reassign --bootstrap-server broker:9092 --execute --reassignment-json-file plan.json

Registered through the `tidalmq.commands` entry point, so the broker never imports the planner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="propose a rebalance from Prometheus traffic history (Spark, local mode)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='--output json prints one JSON document on stdout: {"moves", "lowerBound", '
        '"partitions", "brokers", "imbalanceBefore", "imbalanceAfter", "withinThreshold", '
        '"balanced", "stopped", "timings", "written"}',
    )
    from tidalmq_planner.options import options

    options(p)
    # --output as every tidalmq command has it (the broker's cli_args, which the planner may not
    # import); --json is its older name
    p.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="text for people, json for scripts (keys: see below)",
    )
    p.add_argument("--json", action="store_true", help="the same as --output json")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from tidalmq_planner.job import run
    from tidalmq_planner.options import request_from_args
    from tidalmq_planner.report import format_table

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    if not args.master:
        args.master = f"local[{os.cpu_count() or 1}]"
    try:
        result = run(request_from_args(args))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(f"Error: {exc.code}", file=sys.stderr)
            return 2
        raise
    if args.json or args.output == "json":
        print(json.dumps(result.summary(), indent=2, sort_keys=True))
    else:
        print(format_table(result.report))
        for kind, path in sorted(result.written.items()):
            print(f"{kind}: {path}")
        if result.plan.moves and "plan" in result.written:
            print(
                "execute with: tidalmq reassign --bootstrap-server HOST:PORT --execute "
                f"--reassignment-json-file {result.written['plan']} --wait"
            )
    return 0 if result.report.within_threshold else 3
