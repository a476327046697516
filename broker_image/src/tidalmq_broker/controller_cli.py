"""`tidalmq controller`: the controllers whose supported feature levels the cluster counts, and
forgetting one gone for good (Kafka's `kafka-metadata-quorum remove-controller`).

    tidalmq controller list                 the active controller and every registered one
    tidalmq controller forget --id local    a controller id gone for good no longer counts

UpdateFeatures (`kafka-features upgrade`) refuses a level some registered controller does not
support: a controller registers when it claims the metadata log, and a standby when it starts
(docs/transactions-v2.md, "Which levels the controllers support"). An id that will never lead
again (a cluster moved from `tidalmq local up` to Kubernetes, a standby removed for good) keeps
counting until it is forgotten. The active controller cannot be forgotten; a standby still
running registers again at its next attempt. The controller is the local cluster's (found
through `<data-dir>/cluster.json`, with its control token) or `--controller-url` (with
`--control-token-file`, TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN: the cluster's
control token).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidalmq_broker.cli_args import add_output, http_url
from tidalmq_broker.commands import command_help
from tidalmq_broker.local.processes import DATA_DIR_HELP

KEYS = '{"active": ID, "controllers": {ID: {FEATURE: [lowest, highest]}}}'


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "controller",
        help=command_help("controller"),
        description=__doc__,
    )
    actions = p.add_subparsers(dest="controller_command", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", help="the active controller and the supported levels of every registered one"
    )
    forget = actions.add_parser(
        "forget", help="forget a controller id gone for good (its levels no longer count)"
    )
    forget.add_argument("--id", required=True, help="the controller id to forget")
    for q in (listing, forget):
        q.add_argument(
            "--controller-url",
            type=http_url,
            default="",
            help="the controller (default: the local cluster's)",
        )
        q.add_argument(
            "--control-token-file",
            default="",
            help="the cluster's control token, with --controller-url (default: "
            "$TIDALMQ_CONTROL_TOKEN_FILE or $TIDALMQ_CONTROL_TOKEN)",
        )
        q.add_argument("--data-dir", default="", help=DATA_DIR_HELP)
        add_output(q, KEYS)
    p.set_defaults(handler=run_controller)


class Failure(Exception):
    """A one-line error for the user."""


def _call(args: argparse.Namespace, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    import urllib.error

    from tidalmq_broker.local.control import ControlError, find_controller, request

    try:
        base, token, tls = find_controller(
            args.controller_url, args.data_dir, args.control_token_file
        )
    except ControlError as exc:
        raise Failure(str(exc)) from exc
    method = "GET" if body is None else "POST"
    try:
        doc: dict[str, Any] = request(base, path, token, body, method=method, timeout_s=30, tls=tls)
    except ControlError as exc:
        raise Failure(str(exc)) from exc
    except urllib.error.HTTPError as exc:
        raise Failure(f"the controller at {base} answered {exc.code} {exc.reason}") from exc
    if "fault" in doc:
        raise Failure(doc["fault"]["message"])
    return doc


def _ranges(ranges: dict[str, list[int]]) -> str:
    parts = [
        f"{name} {lo}" if lo == hi else f"{name} {lo}-{hi}" for name, (lo, hi) in ranges.items()
    ]
    return ", ".join(sorted(parts)) or "no features (level 0 of each)"


def run_controller(args: argparse.Namespace) -> int:
    try:
        if args.controller_command == "forget":
            doc = _call(args, "/v1/controllers/forget", {"id": args.id})
        else:
            doc = _call(args, "/v1/controllers", None)
    except Failure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = {"active": doc["active"], "controllers": doc["controllers"]}
    if args.output == "json":
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if args.controller_command == "forget":
        print(f"controller {args.id} forgotten: its feature levels no longer count")
    for cid, ranges in sorted(out["controllers"].items()):
        active = "  (active)" if cid == out["active"] else ""
        print(f"{cid}: supports {_ranges(ranges)}{active}")
    return 0
