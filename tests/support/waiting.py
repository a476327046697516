"""Waiting in a test for a condition the system reaches in its own time: poll it until it holds,
or fail naming what did not happen (never a fixed sleep for correctness)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_for(
    what: str, condition: Callable[[], bool], *, timeout_s: float, poll_s: float = 0.2
) -> None:
    """Poll `condition` every `poll_s` seconds until it holds; an AssertionError naming `what`
    if it still does not once `timeout_s` have passed (the condition is asked first, so one that
    holds when the deadline comes counts)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(poll_s)


async def eventually(
    condition: Callable[[], object],
    timeout_s: float = 10.0,
    poll_s: float = 0.01,
    what: str = "condition",
) -> None:
    """`wait_for` inside an event loop: polls `condition` every `poll_s` seconds, letting the
    loop run the code under test in between; an AssertionError naming `what` once `timeout_s`
    have passed without it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(poll_s)
