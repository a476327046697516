"""Process lifecycle of `tidalmq broker` and `tidalmq local up`: stop signals with a deadline that
holds whatever the event loop is doing, and child processes that never outlive their parent.

Stopping by the deadline is safe for data: a producer is acknowledged only once its records are
in an object the store has made durable, so a process that stops short of closing a partition
loses nothing acknowledged; the partition's next owner finds an unclean checkpoint and replays
the WAL objects, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Sent by the kernel when the parent dies (PR_SET_PDEATHSIG). Not SIGTERM: the kernel sends it
# again each time the dying parent's exiting threads hand this process on to another of them, and
# a repeated SIGTERM would count as the second signal that forces an immediate exit. It only ever
# asks for the clean, bounded stop.
PARENT_DEATH_SIGNAL = signal.SIGUSR1
FORCED_EXIT_CODE = 1
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Shutdown:
    """The first SIGINT, SIGTERM or SIGHUP asks for a clean stop (`await wait()`) and arms a
    deadline; at the deadline, or at a second signal, `on_force` runs and the process exits at
    once. PARENT_DEATH_SIGNAL asks for the same stop, however often it comes.

    The handlers are installed with signal.signal rather than loop.add_signal_handler: such a
    handler runs in the main thread at the next bytecode, even while a coroutine keeps the loop
    busy, so the deadline is armed when the signal arrives, not when the loop next gets round to
    its callbacks. The deadline is an interval timer (SIGALRM): no thread, no loop."""

    def __init__(
        self,
        what: str,
        *,
        deadline_s: float,
        on_force: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
        self.deadline_s = deadline_s
        self.on_force = on_force or log_forced
        self.signalled_at: float | None = None  # time.monotonic() of the first signal
        self.signal_name = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def install(self) -> None:
        """In the main thread, from a coroutine of the loop that will `await wait()`."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.signal(PARENT_DEATH_SIGNAL, self._on_parent_death)
        signal.signal(signal.SIGALRM, self._on_deadline)

    async def wait(self) -> None:
        assert self._event is not None, "install() first"
        await self._event.wait()

    def deadline(self) -> float:
        """time.monotonic() by which the process is gone (stop requested)."""
        assert self.signalled_at is not None
        return self.signalled_at + self.deadline_s

    def request(self, name: str = "request") -> None:
        """As if a first signal arrived (e.g. the parent process exited)."""
        if self.signalled_at is not None:
            return
        self.signalled_at = time.monotonic()
        self.signal_name = name
        signal.setitimer(signal.ITIMER_REAL, max(self.deadline_s, 0.001))
        if self._loop is not None and self._event is not None:
            # deque append + a byte to the loop's self-pipe: safe from a signal handler. A loop
            # already closed (the process is on its way out) only has the deadline left.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._event.set)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signalled_at is None:
            self.request(name)
        else:
            self.force(f"second {name} while stopping: exiting now")

    def _on_parent_death(self, signum: int, frame: FrameType | None) -> None:
        self.request("parent exited")

    def _on_deadline(self, signum: int, frame: FrameType | None) -> None:
        self.force(f"not stopped {self.deadline_s:g}s after {self.signal_name}: exiting now")

    def force(self, reason: str) -> NoReturn:
        """Exit at once. Acknowledged records are durable in the object store already, so this
        loses none; partitions not closed are recovered from the WAL by their next owner.
        `on_force` says so (and, for `local up`, kills the brokers) first."""
        with contextlib.suppress(Exception):
            self.on_force(f"{self.what} {reason}")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(FORCED_EXIT_CODE)


def log_forced(message: str) -> None:
    log.warning("%s (acknowledged data is already in the object store)", message)


def exit_with_parent(parent_pid: int) -> bool:
    """Make this process receive PARENT_DEATH_SIGNAL (its clean, bounded stop, once Shutdown is
    installed; before that the signal's default action ends it) when the process `parent_pid`
    exits, however it exits (SIGKILL included). False when that needs polling `parent_alive`
    (not Linux). Exits at once when the parent is already gone (it died before this ran).

    Linux PR_SET_PDEATHSIG, set here after exec rather than before it in the child (preexec_fn is
    unsafe in a process with threads): the window between the fork and this call is closed by
    checking the parent pid after arming. The signal follows the *thread* that forked this
    process, so the parent must start it from its main thread."""
    armed = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(err))
        else:
            armed = True
    if not parent_alive(parent_pid):
        raise SystemExit(
            f"the process that started this one (pid {parent_pid}) has already exited; not starting"
        )
    return armed


def parent_alive(parent_pid: int) -> bool:
    """Our parent is still `parent_pid` (an orphan is re-parented to init or a subreaper)."""
    return os.getppid() == parent_pid


async def watch_parent(parent_pid: int, shutdown: Shutdown, interval_s: float = 1.0) -> None:
    """Where PR_SET_PDEATHSIG does not exist: stop when the parent is gone."""
    while True:
        await asyncio.sleep(interval_s)
        if not parent_alive(parent_pid):
            break
    log.warning("the process that started this one (pid %d) has exited: stopping", parent_pid)
    shutdown.request("parent exited")


# A stop step slower than this is logged (at INFO) with its duration: a whole broker stop
# usually takes 0.25-0.7 s, and a stop cut short by the deadline must say where it spent it.
SLOW_STOP_STEP_S = 0.5


class StopSteps:
    """The steps of a process's clean stop, timed: each one slower than SLOW_STOP_STEP_S is
    logged when it ends, and `describe()` tells, at a forced exit (from the signal handler:
    it only reads), the step still running and for how long, with the slow ones before it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.slow: list[tuple[str, float]] = []
        self.current: tuple[str, float] | None = None  # (step, time.monotonic() it began)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        self.current = (name, began)
        try:
            yield
        finally:
            self.current = None
            took = time.monotonic() - began
            if took > SLOW_STOP_STEP_S:
                self.slow.append((name, took))
                log.info("%s stop: %s took %.2fs", self.what, name, took)

    def describe(self) -> str:
        current = self.current
        parts = []
        if current is not None:
            parts.append(f"still in {current[0]} after {time.monotonic() - current[1]:.2f}s")
        if self.slow:
            before = ", ".join(f"{name} {took:.2f}s" for name, took in self.slow)
            parts.append(f"slow steps before: {before}")
        return "; ".join(parts) or "no stop step running"
