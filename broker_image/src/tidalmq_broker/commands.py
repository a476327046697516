"""Registration of the broker's own sub-commands. Only argparse and stdlib here: every
`tidalmq` call imports this module, so what a command needs is imported by its handler."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

# a string: argparse's _SubParsersAction is generic for type checkers only (not subscriptable at
# run time), and this alias is evaluated at import
Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

BROKER_HELP = "run one broker (with its own controller unless --controller-url is given)"

# Every built-in command: its help line (the one place it is written: `tidalmq --help` lists it,
# and the command's own registration uses it) and the module:function that registers its parser.
# Only the command about to run is registered: its module is imported then, and not before.
BUILTIN: dict[str, tuple[str, str]] = {
    "broker": (BROKER_HELP, "tidalmq_broker.commands:_register_broker"),
    "drain": (
        "ask a running broker to move its partitions to the others (preStop hook)",
        "tidalmq_broker.commands:_register_drain",
    ),
    "local": ("the embedded local cluster", "tidalmq_broker.commands:_register_local"),
    "reassign": (
        "move partitions between brokers (kafka-reassign-partitions compatible)",
        "tidalmq_broker.reassign_cli:register",
    ),
    "static-topic": (
        "static topics: fixed logic queues over remappable physical queues",
        "tidalmq_broker.static_topics.cli:register",
    ),
    "recover": (
        "list lost partitions; --accept-data-loss continues them without the lost data",
        "tidalmq_broker.local.recover:register",
    ),
    "controller": (
        "the controllers the feature levels count; forget one gone for good",
        "tidalmq_broker.controller_cli:register",
    ),
}
BUILTIN_NAMES = frozenset(BUILTIN)


def command_help(name: str) -> str:
    """The help line of a built-in command (for its registration)."""
    return BUILTIN[name][0]


def builtin_commands(command: str | None = None, *, every: bool = False) -> list[Register]:
    """The registrations of the built-in sub-commands; `command`: the one about to run, whose
    whole parser is built (its module imported); any other is listed by its help line, which is
    all `tidalmq --help` or an unknown command's error shows. `every`: all of them whole (the
    tests that walk every parser)."""
    return [
        _registration(name, target) if every or name == command else _listing(name, help_line)
        for name, (help_line, target) in BUILTIN.items()
    ]


def _registration(name: str, target: str) -> Register:
    module_name, function = target.split(":")
    module = importlib.import_module(module_name)
    register: Register = getattr(module, function)
    return register


def _listing(name: str, help_line: str) -> Register:
    def listing(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        sub.add_parser(name, help=help_line)

    return listing


def _register_drain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "drain",
        help=command_help("drain"),
        description="Ask a broker (through its control port) to hand every partition to the "
        "other brokers, and wait until it leads none. Exits 0 when drained. Run in the broker's "
        "own environment (its preStop hook), it finds the broker's control address and token "
        "from the TIDALMQ_* variables the broker reads.",
    )
    from tidalmq_broker.cli_args import http_url

    p.add_argument(
        "--http-url",
        type=http_url,
        default="",
        help="the broker's control port (default: from "
        "TIDALMQ_CONTROL_HOST/HTTP_HOST and TIDALMQ_CONTROL_PORT/HTTP_PORT)",
    )
    p.add_argument(
        "--control-token-file",
        default="",
        help="the broker's control token "
        "(default: TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN)",
    )
    p.add_argument("--timeout", type=float, default=50.0, help="seconds to wait")
    p.set_defaults(handler=_run_drain)


def _run_drain(args: argparse.Namespace) -> int:
    import json
    import sys
    import urllib.error
    import urllib.request

    from tidalmq_core.control_auth import TokenError, authorization
    from tidalmq_core.control_tls import ControlTlsError, server_is_broker

    from tidalmq_broker.settings import from_sources

    overrides = {"control_token_file": args.control_token_file, "control_token": ""}
    settings = from_sources(**(overrides if args.control_token_file else {}))
    if not args.http_url and settings.http_port <= 0:
        print(
            "drain: give --http-url (or TIDALMQ_HTTP_PORT, as the broker has it)", file=sys.stderr
        )
        return 2
    try:
        credentials = settings.control_credentials()
        tls = settings.control_tls()  # the broker's own certificate, with control-plane mTLS
    except (TokenError, ControlTlsError) as exc:
        print(f"drain: {exc}", file=sys.stderr)
        return 2
    if credentials is None:
        print(
            "drain: the broker's control token is needed (TIDALMQ_CONTROL_TOKEN_FILE, "
            "TIDALMQ_CONTROL_TOKEN or --control-token-file)",
            file=sys.stderr,
        )
        return 2
    url = (args.http_url or settings.control_url()).rstrip("/")
    req = urllib.request.Request(
        url + "/v1/drain",
        data=json.dumps({"timeout_s": args.timeout}).encode(),
        headers={"Content-Type": "application/json", **authorization(credentials.token)},
        method="POST",
    )
    try:
        context = (  # a broker's certificate: the broker's own control endpoint
            tls.client_context(server_is_broker)
            if tls is not None and url.startswith("https:")
            else None
        )
        with urllib.request.urlopen(req, timeout=args.timeout + 5, context=context) as resp:
            result = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        print(f"drain failed: {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"drain failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if result.get("drained") else 1


def _register_broker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tidalmq_broker.settings import add_arguments

    p = sub.add_parser(
        "broker",
        help=command_help("broker"),
        description="Run one TidalMQ broker. Settings come from flags, then TIDALMQ_* "
        "environment variables, then defaults.",
    )
    add_arguments(p)
    p.set_defaults(handler=_run_broker)


def _run_broker(args: argparse.Namespace) -> int:
    from tidalmq_broker.serve import run_broker

    return run_broker(args)


def _register_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tidalmq_broker.cli_args import add_output
    from tidalmq_broker.local.client import STATUS_KEYS

    p = sub.add_parser("local", help=command_help("local"))
    local_sub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = local_sub.add_parser(
        "up",
        help="start a local cluster in the foreground (Ctrl-C stops it cleanly within 10 s)",
        description="Start the controller, the brokers and a local object store; print the "
        "bootstrap address and a live table of brokers; stay in the foreground until Ctrl-C.",
    )
    up.add_argument(
        "--brokers",
        type=int,
        default=3,
        help="number of brokers of a new cluster "
        "(default 3; a restart brings back the brokers the cluster has)",
    )
    up.add_argument(
        "--port",
        type=int,
        default=9092,
        help="the bootstrap port (default 9092): "
        "brokers get the ports from here up, lowest free first",
    )
    up.add_argument("--controller-port", type=int, default=9690, help="controller HTTP port")
    up.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    up.add_argument("--storage-url", default="", help="object store (default: DATA_DIR/objects)")
    up.add_argument("--fresh", action="store_true", help="delete existing data first")
    up.add_argument(
        "--security",
        choices=("plaintext", "sasl_ssl"),
        default="plaintext",
        help="sasl_ssl: brokers listen with SASL_SSL only (a CA and certificates, an admin "
        "user and a client.properties are made in DATA_DIR/security)",
    )
    up.add_argument(
        "--control-tls",
        choices=("on", "off"),
        default="on",
        help="mTLS between the controller, the brokers and the CLI (default on: a cluster CA "
        "and a certificate per process are made in DATA_DIR/control-tls)",
    )
    up.add_argument(
        "--auto-create-topics",
        choices=("true", "false"),
        default=None,
        help="Kafka's auto.create.topics.enable for every broker (default true, as Kafka; "
        "or TIDALMQ_AUTO_CREATE_TOPICS)",
    )
    _data_dir(up)
    up.set_defaults(handler=_run_local_up, exit_without_teardown=True)
    _register_local_changes(local_sub)
    status = local_sub.add_parser(
        "status",
        help="print the brokers, their partition counts, the moves and lost partitions",
        description="The running local cluster's brokers (state, process, address, partitions "
        "led, moves onto and off each), the moves in flight and the lost partitions.",
    )
    # `table`: its name before --output json came to every command
    add_output(status, STATUS_KEYS, legacy=("table",))
    _data_dir(status)
    status.set_defaults(handler=_run_local_command)
    top = local_sub.add_parser(
        "top",
        help="a live view of the brokers' bytes and records in and out, the groups' lag and "
        "the moves, from the metrics",
        description="Refresh every --interval seconds until Ctrl-C: per broker the bytes and "
        "records in and out per second, connections, partitions and moves; the consumer "
        "groups' lag in records and age (docs/metrics.md); the moves in flight and done.",
    )
    top.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    _data_dir(top)
    top.set_defaults(handler=_run_local_command)


def _register_local_changes(local_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tidalmq_broker.cli_args import add_output
    from tidalmq_broker.local.client import CHANGE_KEYS, DEFAULT_MOVE_TIMEOUT_S

    add = local_sub.add_parser(
        "add-broker",
        help="start one more broker (replacing the lowest dead one, if any); partitions "
        "rebalance onto it, with progress",
        description="Start one more broker (replacing the lowest dead one, if any), then show "
        "the partitions rebalancing onto it (moves done / total, the rate) until they are all "
        "there or --timeout runs out (exit 1 then: the moves go on in the background).",
    )
    add.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the broker serves, without waiting for the moves",
    )
    remove = local_sub.add_parser(
        "remove-broker",
        help="drain a broker (its partitions move, with progress), then stop it; a dead or "
        "killed one is forgotten at once",
        description="Drain a broker: its partitions move to the others (moves done / total, "
        "the rate), then it stops and is forgotten. A dead or killed one is forgotten at once. "
        "A drain longer than --timeout stops the broker anyway (its partitions fail over).",
    )
    remove.add_argument("broker_id", type=int, metavar="N", help="the broker's id")
    kill = local_sub.add_parser(
        "kill-broker",
        help="SIGKILL a broker, as a crash; the controller fails it over",
        description="SIGKILL a broker, as a crash; the controller fails its partitions over.",
    )
    kill.add_argument("broker_id", type=int, metavar="N", help="the broker's id")
    for cmd in (add, remove):
        cmd.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_MOVE_TIMEOUT_S,
            metavar="S",
            help="seconds to wait for the moves",
        )
    for name, cmd in (("add-broker", add), ("remove-broker", remove), ("kill-broker", kill)):
        add_output(cmd, CHANGE_KEYS[name])
        _data_dir(cmd)
        cmd.set_defaults(handler=_run_local_command)


def _data_dir(parser: argparse.ArgumentParser) -> None:
    from tidalmq_broker.local.processes import DATA_DIR_HELP

    parser.add_argument("--data-dir", default="", help=DATA_DIR_HELP)


def _run_local_up(args: argparse.Namespace) -> int:
    """Lock the data dir first, before importing (let alone starting) anything: a second
    `local up` on the same dir refuses at once and touches nothing."""
    from pathlib import Path

    from tidalmq_broker.local.processes import DataDirLock, LocalUpError, resolve_data_dir

    data = resolve_data_dir(args.data_dir)
    shown_as = args.data_dir
    if not args.data_dir:
        older = Path(".tidalmq/local").resolve()
        if older != data and (older / "metadata").is_dir():
            print(
                f"note: {older} holds the data of a local cluster started from this directory "
                f"before; this one uses {data} (`--data-dir .tidalmq/local` for that one)",
                flush=True,
            )
    lock = DataDirLock(data, shown_as)
    try:
        lock.acquire()
    except (LocalUpError, OSError) as exc:
        print(f"tidalmq local up: {exc}", file=sys.stderr)
        return 1
    try:
        from tidalmq_broker.local.cluster import run_local_cluster

        return run_local_cluster(args, data, shown_as)
    finally:
        lock.release()


def _run_local_command(args: argparse.Namespace) -> int:
    from tidalmq_broker.local.client import local_command

    return local_command(args)
