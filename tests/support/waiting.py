"""Waiting in a test for a condition the system reaches in its own time: poll it until it holds,
or fail naming what did not happen (never a fixed sleep for correctness)."""

from __future__ import annotations

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
