"""Registration of the broker's own sub-commands: `broker` and `local`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Callable


def builtin_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    return [_register_broker, _register_local]


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
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.logs import setup_logging
    from tidalmq_broker.settings import from_sources

    settings = from_sources(args)
    setup_logging(settings.log_level, settings.log_format)

    async def main() -> None:
        broker = Broker(settings)
        await broker.start()
        host, port = settings.advertised
        print(f"TidalMQ broker {settings.broker_id} serving on {host}:{port}", flush=True)
        await wait_for_signal()
        await broker.stop()

    asyncio.run(main())
    return 0


def _register_local(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("local", help="the embedded local cluster")
    local_sub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = local_sub.add_parser(
        "up",
        help="start a local cluster in the foreground (Ctrl-C stops it cleanly)",
        description="Start the controller, the brokers and a local object store; print the "
        "bootstrap address and stay in the foreground until Ctrl-C.",
    )
    up.add_argument("--port", type=int, default=9092, help="Kafka port of the first broker")
    up.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    up.add_argument(
        "--data-dir", default=".tidalmq/local", help="where the local object store keeps data"
    )
    up.add_argument(
        "--storage-url", default="", help="use this object store instead (s3://bucket?...)"
    )
    up.add_argument("--fresh", action="store_true", help="delete existing data first")
    up.set_defaults(handler=_run_local_up)


def _run_local_up(args: argparse.Namespace) -> int:
    from tidalmq_broker.local.cluster import run_local_cluster

    return run_local_cluster(args)


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(sig)
