"""Running one broker process (`tidalmq broker`): its event loop, its start, serving until a
signal (or the parent's exit), its bounded stop."""

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


def run_broker(args: argparse.Namespace) -> int:
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
    from tidalmq_controller import UnsupportedFinalizedLevel

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
    except UnsupportedFinalizedLevel as exc:  # its embedded controller: a level it lacks
        print(f"tidalmq broker {settings.broker_id}: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_broker(settings: BrokerSettings, *, watch_parent: bool) -> None:
    """Serve until SIGTERM/SIGINT/SIGHUP (or the parent's exit, with --parent-pid), then stop
    cleanly, within --stop-deadline-s of the signal (Shutdown exits the process then)."""
    from tidalmq_broker import lifecycle
    from tidalmq_broker.apis import KAFKA_APIS
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
    broker = Broker(settings, apis=KAFKA_APIS)

    def forced(message: str) -> None:  # from the signal handler: the stop's step, read only
        lifecycle.log_forced(f"{message} ({broker.stop_steps.describe()})")

    shutdown.on_force = forced
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
        print(
            f"TidalMQ broker {settings.broker_id} serving on {first.host}:{first.port}"
            f"{f' ({first.name}{also})' if also else ''}",
            flush=True,
        )
        print(
            f"TidalMQ broker {settings.broker_id}: "
            f"{describe_authorization(settings, broker.authorizer)}",
            flush=True,
        )
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
