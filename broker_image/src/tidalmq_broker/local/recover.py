"""`tidalmq recover`: list the partitions whose data the object store lost, and (explicitly
only, like Kafka's unclean leader election) accept the loss so they serve again.

    tidalmq recover                                   what is lost (a dry run)
    tidalmq recover --accept-data-loss orders         every lost partition of `orders`
    tidalmq recover --accept-data-loss orders --partitions 0,3
    tidalmq recover --all                             every lost partition of every topic

An accepted partition continues at its end-offset floor (the last offset the cluster
acknowledged), never at 0: committed consumer offsets stay valid and no offset is reused. The
controller is the local cluster's (found through `<data-dir>/cluster.json`, with its control
token) or `--controller-url` (with `--control-token-file`, TIDALMQ_CONTROL_TOKEN_FILE or
TIDALMQ_CONTROL_TOKEN: the cluster's control token).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from tidalmq_broker.cli_args import add_output, http_url, id_list
from tidalmq_broker.commands import command_help
from tidalmq_broker.local.processes import DATA_DIR_HELP

if TYPE_CHECKING:
    from tidalmq_broker.local.control import Target


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recover",
        help=command_help("recover"),
        description=__doc__,
    )
    p.add_argument(
        "--accept-data-loss",
        metavar="TOPIC",
        default="",
        help="accept the loss of TOPIC's lost partitions (they serve again)",
    )
    p.add_argument(
        "--partitions",
        type=id_list,
        default=None,
        metavar="IDS",
        help="only these partitions: 0,1,...",
    )
    p.add_argument("--all", action="store_true", help="accept the loss of every lost partition")
    p.add_argument(
        "--controller-url",
        type=http_url,
        default="",
        help="the controller (default: the local cluster's)",
    )
    p.add_argument(
        "--control-token-file",
        default="",
        help="the cluster's control token, with --controller-url (default: "
        "$TIDALMQ_CONTROL_TOKEN_FILE or $TIDALMQ_CONTROL_TOKEN)",
    )
    p.add_argument("--data-dir", default="", help=DATA_DIR_HELP)
    add_output(
        p,
        '{"lost": [{"topic", "partition", "expected_end", "found_end", '
        '"missing_offsets", "reason", ...}], "store_problem"} (a dry run); with '
        '--accept-data-loss or --all: {"accepted": [{"topic", "partition", '
        '"continues_at", "given_up", "loss"}]}',
    )
    p.set_defaults(handler=run_recover)


class Failure(Exception):
    """A one-line error for the user."""


def _call(controller: Target, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    import urllib.error

    from tidalmq_broker.local.control import ControlError, request

    base, token, tls = controller
    try:
        doc: dict[str, Any] = request(base, path, token, body, timeout_s=60, tls=tls)
    except ControlError as exc:
        raise Failure(str(exc)) from exc
    except urllib.error.HTTPError as exc:
        raise Failure(f"the controller at {base} answered {exc.code} {exc.reason}") from exc
    if "fault" in doc:
        raise Failure(doc["fault"]["message"])
    return doc


def _controller(args: argparse.Namespace) -> Target:
    from tidalmq_broker.local.control import ControlError, find_controller

    try:
        return find_controller(args.controller_url, args.data_dir, args.control_token_file)
    except ControlError as exc:
        raise Failure(str(exc)) from exc


def run_recover(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except Failure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    base = _controller(args)
    state = _call(base, "/v1/data-loss")
    lost: list[dict[str, Any]] = state["lost"]
    problem = state.get("store_problem")
    if not args.accept_data_loss and not args.all:
        if args.output == "json":
            print(json.dumps(state, indent=2))
            return 0
        if problem:
            print(f"OBJECT STORE LOST: {problem}")
        if not lost:
            print("no lost partitions")
            return 0
        print(f"{'PARTITION':<30} {'EXPECTED END':>12} {'FOUND END':>10} {'MISSING':>8}  REASON")
        for row in lost:
            name = f"{row['topic']}-{row['partition']}"
            print(
                f"{name:<30} {row['expected_end']:>12} {row['found_end']:>10} "
                f"{row['missing_offsets']:>8}  {row['reason']}"
            )
        print(
            "dry run: `tidalmq recover --accept-data-loss TOPIC` continues them without the "
            "lost data"
        )
        return 0
    partitions: list[int] | None = args.partitions
    if args.all:
        topics = sorted({row["topic"] for row in lost})
        if not topics:
            raise Failure(
                f"nothing to recover: no lost partitions{f' ({problem})' if problem else ''}"
            )
    else:
        topics = [args.accept_data_loss]
    results: list[dict[str, Any]] = []
    for topic in topics:
        doc = _call(base, "/v1/data-loss/accept", {"topic": topic, "partitions": partitions})
        results.extend({"topic": topic, **a} for a in doc["accepted"])
    if args.output == "json":
        print(json.dumps({"accepted": results}, indent=2))
    if not results:
        which = f" {partitions}" if partitions else ""
        raise Failure(
            f"nothing to recover: topic {args.accept_data_loss} has no lost partitions{which}"
        )
    if args.output != "json":
        for r in results:
            reason = r["loss"]["reason"] if r.get("loss") else "object store wiped"
            print(
                f"recovered {r['topic']}-{r['partition']}: continues at offset "
                f"{r['continues_at']}; {r['given_up']} offsets given up ({reason})"
            )
    return 0
