"""Registration of the broker's own sub-commands: `broker` and `local`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidalmq_broker.settings import BrokerSettings


def builtin_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from tidalmq_broker import reassign_cli
    from tidalmq_broker.local import recover
    from tidalmq_broker.static_topics import cli as static_topic_cli

    return [
        _register_broker, _register_drain, _register_local, reassign_cli.register,
        static_topic_cli.register, recover.register,
    ]  # fmt: skip


def _register_drain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "drain",
        help="ask a running broker to move its partitions to the others (preStop hook)",
        description="Ask a broker (through its control port) to hand every partition to the "
        "other brokers, and wait until it leads none. Exits 0 when drained. Run in the broker's "
        "own environment (its preStop hook), it finds the broker's control address and token "
        "from the TIDALMQ_* variables the broker reads.",
    )
    p.add_argument("--http-url", default="", help="the broker's control port (default: from "
                   "TIDALMQ_CONTROL_HOST/HTTP_HOST and TIDALMQ_CONTROL_PORT/HTTP_PORT)")  # fmt: skip
    p.add_argument("--control-token-file", default="", help="the broker's control token "
                   "(default: TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=50.0, help="seconds to wait")
    p.set_defaults(handler=_run_drain)


def _run_drain(args: argparse.Namespace) -> int:
    import json
    import sys
    import urllib.error
    import urllib.request

    from tidalmq_core.control_auth import TokenError, authorization

    from tidalmq_broker.settings import from_sources

    overrides = {"control_token_file": args.control_token_file, "control_token": ""}
    settings = from_sources(**(overrides if args.control_token_file else {}))
    if not args.http_url and settings.http_port <= 0:
        print("drain: give --http-url (or TIDALMQ_HTTP_PORT, as the broker has it)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        credentials = settings.control_credentials()
    except TokenError as exc:
        print(f"drain: {exc}", file=sys.stderr)
        return 2
    if credentials is None:
        print("drain: the broker's control token is needed (TIDALMQ_CONTROL_TOKEN_FILE, "
              "TIDALMQ_CONTROL_TOKEN or --control-token-file)", file=sys.stderr)  # fmt: skip
        return 2
    url = (args.http_url or settings.control_url()).rstrip("/")
    req = urllib.request.Request(
        url + "/v1/drain",
        data=json.dumps({"timeout_s": args.timeout}).encode(),
        headers={"Content-Type": "application/json", **authorization(credentials.token)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=args.timeout + 5) as resp:
            result = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        print(f"drain failed: {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"drain failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if result.get("drained") else 1


def _register_broker(sub: argparse._SubParsersAction) -> None:
    from tidalmq_broker.settings import add_arguments

    p = sub.add_parser(
        "broker",
        help="run one broker (with its own controller unless --controller-url is given)",
        description="Run one TidalMQ broker. Settings come from flags, then TIDALMQ_* "
        "environment variables, then defaults.",
    )
    add_arguments(p)
    p.set_defaults(handler=_run_broker)


def _run_broker(args: argparse.Namespace) -> int:
    from tidalmq_broker.lifecycle import exit_with_parent
    from tidalmq_broker.logs import setup_logging
    from tidalmq_broker.settings import from_sources

    settings = from_sources(args)
    linked = False
    if settings.parent_pid:  # first: a parent already gone means nothing should start
        linked = exit_with_parent(settings.parent_pid)
    setup_logging(settings.log_level, settings.log_format)
    if settings.runtime_tuning:
        from tidalmq_broker.tuning import tune_runtime

        tune_runtime()
    from tidalmq_broker.security import SecurityConfigError

    try:
        with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
            runner.run(_serve_broker(settings, watch_parent=not linked))
    except OSError as exc:  # e.g. the Kafka or HTTP port is taken
        print(f"tidalmq broker {settings.broker_id}: cannot start: {exc}", file=sys.stderr)
        return 1
    except SecurityConfigError as exc:  # listeners, TLS, SASL: one line naming the setting
        print(f"tidalmq broker {settings.broker_id}: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve_broker(settings: BrokerSettings, *, watch_parent: bool) -> None:
    """Serve until SIGTERM/SIGINT/SIGHUP (or the parent's exit, with --parent-pid), then stop
    cleanly, within --stop-deadline-s of the signal (Shutdown exits the process then)."""
    from tidalmq_broker import lifecycle
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.security.endpoints import describe_authorization

    shutdown = lifecycle.Shutdown(
        f"broker {settings.broker_id}", deadline_s=settings.stop_deadline_s
    )
    shutdown.install()
    background: list[asyncio.Task[None]] = []
    if settings.parent_pid and watch_parent:  # no PR_SET_PDEATHSIG here: poll
        background.append(
            asyncio.create_task(lifecycle.watch_parent(settings.parent_pid, shutdown))
        )
    broker = Broker(settings)
    starting = asyncio.create_task(broker.start(), name="broker start")
    stop = asyncio.create_task(shutdown.wait(), name="stop signal")
    await asyncio.wait([starting, stop], return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        if starting.exception() is not None:
            stop.cancel()
            starting.result()  # raises
        if settings.runtime_tuning:
            gc.freeze()  # everything alive after start-up is never scanned again
        first = broker.advertised[0]
        also = "".join(f", {e.name} on {e.host}:{e.port}" for e in broker.advertised[1:])
        print(f"TidalMQ broker {settings.broker_id} serving on {first.host}:{first.port}"
              f"{f' ({first.name}{also})' if also else ''}", flush=True)  # fmt: skip
        print(f"TidalMQ broker {settings.broker_id}: "
              f"{describe_authorization(settings, broker.authorizer)}", flush=True)  # fmt: skip
        await stop
    else:  # asked to stop while starting (e.g. still registering with the controller)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
    logging.getLogger(__name__).info(
        "broker %d stopping (%s)", settings.broker_id, shutdown.signal_name
    )
    for task in background:
        task.cancel()
    # the deadline stays armed through the interpreter's exit (a stuck executor thread)
    await broker.stop(shutdown.deadline())


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop the broker runs on: uvloop (libuv; cheaper socket I/O, timers and callbacks,
    which is most of the broker's per-request work) when installed, else asyncio's own."""
    if choice not in ("auto", "asyncio", "uvloop"):
        raise SystemExit(f"unknown event loop {choice!r}: use auto, asyncio or uvloop")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def _register_local(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("local", help="the embedded local cluster")
    local_sub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = local_sub.add_parser(
        "up",
        help="start a local cluster in the foreground (Ctrl-C stops it cleanly within 10 s)",
        description="Start the controller, the brokers and a local object store; print the "
        "bootstrap address and a live table of brokers; stay in the foreground until Ctrl-C.",
    )
    up.add_argument("--brokers", type=int, default=3, help="number of brokers of a new cluster "
                    "(default 3; a restart brings back the brokers the cluster has)")  # fmt: skip
    up.add_argument("--port", type=int, default=9092, help="the bootstrap port (default 9092): "
                    "brokers get the ports from here up, lowest free first")  # fmt: skip
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
        "--auto-create-topics",
        choices=("true", "false"),
        default=None,
        help="Kafka's auto.create.topics.enable for every broker (default true, as Kafka; "
        "or TIDALMQ_AUTO_CREATE_TOPICS)",
    )
    _data_dir(up)
    up.set_defaults(handler=_run_local_up)
    for name, help_text in [
        (
            "add-broker",
            "start one more broker (replacing the lowest dead one, if any); "
            "partitions rebalance onto it",
        ),
        (
            "remove-broker",
            "drain a broker (its partitions move), then stop it; a dead or "
            "killed one is forgotten at once",
        ),
        ("kill-broker", "SIGKILL a broker, as a crash; the controller fails it over"),
        ("status", "print the brokers, their partition counts and lost partitions"),
    ]:
        cmd = local_sub.add_parser(name, help=help_text, description=help_text)
        if name in ("remove-broker", "kill-broker"):
            cmd.add_argument("broker_id", type=int, metavar="N")
        if name == "status":
            cmd.add_argument("--output", choices=("table", "json"), default="table")
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
    from tidalmq_broker.local.cluster import local_command

    return local_command(args)
