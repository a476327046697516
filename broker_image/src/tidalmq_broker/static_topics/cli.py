"""`tidalmq static-topic`: describe, list, create, remap and repair static topics.

`describe` works through the Kafka protocol (`--bootstrap-server`, any broker: the mapping is in
every broker's metadata, exposed as read-only `static.*` topic configs) or through the controller
(`--controller-url`, or the local cluster's state file). The other commands change the mapping,
so they go to the controller's HTTP API, with the cluster's control token (the local cluster's,
or --control-token-file / TIDALMQ_CONTROL_TOKEN_FILE with --controller-url). On Kubernetes, create
and remap with `kubectl apply` of a StaticTopic instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from tidalmq_broker.cli_args import (
    add_output,
    bootstrap_servers,
    http_url,
    id_list,
    print_json,
    wants_json,
)
from tidalmq_broker.commands import command_help

if TYPE_CHECKING:
    from tidalmq_broker.local.control import Target

TOPIC_RESOURCE = 2
DESCRIPTION_KEYS = (
    '{"name", "totalQueues", "brokers", "epoch", "consistent", "queues": [{"queue", "broker", '
    '"leader", "gen", "items", "logicOffset", "physicalQueue"}], "copies", "problems", '
    '"ignored", "lastError"}'
)


class CliError(Exception):
    pass


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "static-topic",
        help=command_help("static-topic"),
        description=__doc__,
    )
    cmds = p.add_subparsers(dest="static_command", metavar="ACTION", required=True)

    d = cmds.add_parser("describe", help="logic queues, their broker, gen and items; the mapping")
    d.add_argument("name")
    d.add_argument("--json", action="store_true", help="the same as --output json")
    _where(d, kafka=True)
    add_output(d, DESCRIPTION_KEYS)
    d.set_defaults(handler=_describe)

    ls = cmds.add_parser("list", help="names of the static topics")
    _where(ls)
    add_output(ls, '{"names": ["NAME", ...]}')
    ls.set_defaults(handler=_list)

    c = cmds.add_parser("create", help="create a static topic")
    c.add_argument("name")
    c.add_argument("--queues", type=int, required=True, help="number of logic queues (fixed)")
    c.add_argument(
        "--brokers",
        type=id_list,
        metavar="IDS",
        help="comma-separated broker ids that may host it (default all)",
    )
    c.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config (repeatable)",
    )
    c.add_argument("--jump", type=int, help="availability remaps: largest logic-offset jump")
    _where(c)
    add_output(c, DESCRIPTION_KEYS)
    c.set_defaults(handler=_create)

    r = cmds.add_parser("remap", help="move logic queues to other brokers (no data moves)")
    r.add_argument("name")
    r.add_argument(
        "--move",
        action="append",
        required=True,
        metavar="QUEUE:BROKER[:MODE]",
        help="mode strict (block old, then switch) or available (switch new first)",
    )
    _where(r)
    add_output(
        r,
        '{"remaps": [{"queue", "source", "target", "mode", "old_physical", '
        '"new_physical", "opened_ms", "jump"}]}',
    )
    r.set_defaults(handler=_remap)

    rp = cmds.add_parser("repair", help="finish an interrupted remap (copies at different epochs)")
    rp.add_argument("name")
    _where(rp)
    add_output(rp, DESCRIPTION_KEYS)
    rp.set_defaults(handler=_repair)


def _where(p: argparse.ArgumentParser, *, kafka: bool = False) -> None:
    if kafka:
        p.add_argument(
            "--bootstrap-server",
            type=bootstrap_servers,
            metavar="HOST:PORT",
            help="any broker (Kafka protocol)",
        )
        p.add_argument(
            "--command-config",
            metavar="FILE",
            help="Kafka client properties for --bootstrap-server (security.protocol, "
            "ssl.*, sasl.*), as Kafka's tools take them",
        )
    p.add_argument(
        "--controller-url",
        type=http_url,
        default=os.environ.get("TIDALMQ_CONTROLLER_URL"),
        help="the controller's HTTP API (default: $TIDALMQ_CONTROLLER_URL or the local cluster's)",
    )
    p.add_argument(
        "--control-token-file",
        default="",
        help="the cluster's control token, with --controller-url (default: "
        "$TIDALMQ_CONTROL_TOKEN_FILE or $TIDALMQ_CONTROL_TOKEN)",
    )
    p.add_argument(
        "--data-dir",
        default="",
        help="the local cluster's data directory (default: "
        "$TIDALMQ_DATA_DIR, else ~/.tidalmq/local)",
    )


# ------------------------------------------------------------------------------ transports
def _controller(args: argparse.Namespace) -> Target:
    """The controller's URL, the control token and the client certificate."""
    from tidalmq_broker.local.control import ControlError, find_controller

    try:
        return find_controller(args.controller_url, args.data_dir, args.control_token_file)
    except ControlError as exc:
        raise CliError(f"{exc} (or --bootstrap-server for describe)") from exc


def _call(args: argparse.Namespace, path: str, body: dict[str, Any] | None, method: str) -> Any:
    import urllib.error

    from tidalmq_broker.local.control import ControlError, request

    base, token, tls = _controller(args)
    try:
        return request(base, path, token, body, method=method, timeout_s=300, tls=tls)
    except ControlError as exc:
        raise CliError(str(exc)) from exc
    except urllib.error.HTTPError as exc:
        raise CliError(f"the controller at {base} answered {exc.code} {exc.reason}") from exc


def _post(args: argparse.Namespace, path: str, body: dict[str, Any]) -> Any:
    doc = _call(args, path, body, "POST")
    if "fault" in doc:
        raise CliError(doc["fault"]["message"])
    return doc.get("result", doc)


def _describe_over_kafka(bootstrap: str, name: str, command_config: str | None) -> dict[str, Any]:
    from tidalmq_core import client_properties
    from tidalmq_core.static_description import MAPPING_KEY

    from tidalmq_broker.admin_client import AdminClient, AdminError

    try:
        security = client_properties.from_file(command_config)
    except client_properties.ClientConfigError as exc:
        raise CliError(f"--command-config: {exc}") from exc
    try:
        with AdminClient(bootstrap, security=security) as admin:
            resp = admin.call(
                32,
                4,
                {
                    "resources": [
                        {
                            "resource_type": TOPIC_RESOURCE,
                            "resource_name": name,
                            "configuration_keys": [MAPPING_KEY],
                        }
                    ],
                    "include_synonyms": False,
                    "include_documentation": False,
                },
            )
    except AdminError as exc:
        raise CliError(str(exc)) from exc
    (result,) = resp.results
    if result.error_code != 0:
        raise CliError(f"topic {name}: {result.error_message or result.error_code.name}")
    for entry in result.configs:
        if entry.name == MAPPING_KEY:
            mapping: dict[str, Any] = json.loads(entry.value)
            return mapping
    raise CliError(f"{name} is not a static topic")


# ------------------------------------------------------------------------------- commands
def _show(args: argparse.Namespace, description: dict[str, Any]) -> None:
    if wants_json(args):
        print_json(description)
    else:
        print(format_description(description))


def _run(fn: Any, args: argparse.Namespace) -> int:
    try:
        return int(fn(args) or 0)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def format_description(d: dict[str, Any]) -> str:
    state = "consistent" if d["consistent"] else "INCONSISTENT"
    brokers = "all brokers" if d.get("brokers") is None else f"brokers {d['brokers']}"
    lines = [
        f"static topic {d['name']}: {d['totalQueues']} logic queues on {brokers}, "
        f"epoch {d['epoch']}, {state}",
        f"{'QUEUE':>5} {'BROKER':>6} {'LEADER':>6} {'GEN':>4} {'ITEMS':>5} {'LOGIC-OFFSET':>12} "
        f"{'PHYSICAL':>8}",
    ]
    for q in d["queues"]:
        leader = "-" if q["leader"] < 0 else str(q["leader"])
        lines.append(
            f"{q['queue']:>5} {q['broker']:>6} {leader:>6} {q['gen']:>4} {q['items']:>5} "
            f"{q['logicOffset']:>12} {q['physicalQueue']:>8}"
        )
    copies = ", ".join(f"{b}@{c['epoch']}" for b, c in d.get("copies", {}).items())
    lines.append(f"copies (broker@epoch): {copies}")
    for problem in d.get("problems", []) + d.get("ignored", []):
        lines.append(f"problem: {problem}")
    if d.get("lastError"):
        lines.append(f"last error: {d['lastError']}")
    return "\n".join(lines)


def _describe(args: argparse.Namespace) -> int:
    def run(args: argparse.Namespace) -> None:
        if args.bootstrap_server:
            d = _describe_over_kafka(args.bootstrap_server, args.name, args.command_config)
        elif args.command_config:
            raise CliError("--command-config goes with --bootstrap-server")
        else:
            d = _post(args, "/v1/static-topics/describe", {"name": args.name})
        if args.json or wants_json(args):
            print_json(d)
        else:
            print(format_description(d))

    return _run(run, args)


def _list(args: argparse.Namespace) -> int:
    def run(args: argparse.Namespace) -> None:
        names = _call(args, "/v1/static-topics", None, "GET")["names"]
        if wants_json(args):
            print_json({"names": names})
        elif names:
            print("\n".join(names))

    return _run(run, args)


def _create(args: argparse.Namespace) -> int:
    def run(args: argparse.Namespace) -> None:
        configs = {}
        for item in args.config:
            key, sep, value = item.partition("=")
            if not sep:
                raise CliError(f"--config {item!r}: expected KEY=VALUE")
            configs[key] = value
        d = _post(
            args,
            "/v1/static-topics/create",
            {
                "name": args.name,
                "total_queues": args.queues,
                "brokers": args.brokers,
                "configs": configs,
                "jump": args.jump,
            },
        )
        _show(args, d)

    return _run(run, args)


def _remap(args: argparse.Namespace) -> int:
    def run(args: argparse.Namespace) -> None:
        moves = []
        for item in args.move:
            parts = item.split(":")
            if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
                raise CliError(f"--move {item!r}: expected QUEUE:BROKER[:strict|available]")
            move: dict[str, Any] = {"queue": int(parts[0]), "broker": int(parts[1])}
            if len(parts) == 3:
                move["mode"] = parts[2]
            moves.append(move)
        records = _post(args, "/v1/static-topics/remap", {"name": args.name, "moves": moves})
        if wants_json(args):
            print_json({"remaps": records})
            return
        for r in records:
            opened = f"{r['opened_ms']:.0f} ms" if r["opened_ms"] is not None else "not yet"
            jump = f", logic offsets jumped by {r['jump']}" if r["jump"] else ""
            print(
                f"queue {r['queue']}: broker {r['source']} -> {r['target']} ({r['mode']}), "
                f"physical queue {r['old_physical']} -> {r['new_physical']}, served after "
                f"{opened}{jump}"
            )
        if not records:
            print("nothing to do: every queue is already there")

    return _run(run, args)


def _repair(args: argparse.Namespace) -> int:
    def run(args: argparse.Namespace) -> None:
        d = _post(args, "/v1/static-topics/repair", {"name": args.name})
        _show(args, d)

    return _run(run, args)
