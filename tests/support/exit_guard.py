"""The test process ends when the session ends, whatever a test left running.

Python waits for every non-daemon thread before it exits. A test that gives up on a client thread
(a librdkafka call that never returns once its brokers are gone, a consumer's close waiting for a
coordinator that was killed) would otherwise keep pytest alive after its summary, with the test
already reported failed, until CI's own time limit kills the whole run and with it every result
(CI once lost 70 minutes and its report that way). At the end of the session this plugin names
the threads still running, with their stacks, and ends the process with the session's status.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tests.support.threads import thread_stacks

# how long the threads still running get to finish on their own after the session
GRACE_S = 5.0


def _idle_pool_worker(t: threading.Thread) -> bool:
    """A thread pool's worker waiting for work: the interpreter's exit ends it (concurrent.futures
    joins its workers at exit after telling them to stop); one busy with a job is a straggler."""
    frame = sys._current_frames().get(t.ident or -1)
    return (
        frame is not None
        and frame.f_code.co_name == "_worker"
        and frame.f_code.co_filename.endswith(os.path.join("concurrent", "futures", "thread.py"))
    )


def _stragglers() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread()
        and not t.daemon
        and t.is_alive()
        and not _idle_pool_worker(t)
    ]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    left = _stragglers()
    for t in left:
        t.join(GRACE_S / max(len(left), 1))
    left = _stragglers()
    if not left:
        return
    out = sys.__stderr__ or sys.stderr
    print(
        f"\n[exit guard] {len(left)} thread(s) left running by the tests; "
        "ending the process anyway:",
        file=out,
    )
    print(thread_stacks(left), file=out)
    out.flush()
    sys.stdout.flush()
    status = getattr(config, "_exit_guard_status", 1)
    os._exit(int(status))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._exit_guard_status = exitstatus  # type: ignore[attr-defined]
