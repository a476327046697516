"""Give freed heap memory back to the kernel after a wave of connections closed.

A connection's objects are freed by reference counting the moment it closes (server/framing.py
keeps no reference cycles), but glibc's malloc keeps the freed space of its heaps resident until
something asks for it back; `malloc_trim(0)` returns every free page, also those between blocks
still in use. A broker allocates its objects from glibc's malloc too (tuning.py: Python's own
allocator keeps whole arenas for a few survivors), so after 5,000 idle connections came and went
the trim brings RSS back to within a few MiB of where it started, where it stayed 29-34 MiB above.

Before trimming, a full collection (`gc.collect()`): not for the connections, which are gone
already, but because only a full collection empties the interpreter's free lists (tuples, lists,
dicts, floats: up to 2,000 tuples of each small size). A wave of connections leaves them
full of blocks spread over the whole heap, each keeping its page: trimming without emptying them
left RSS 16 MiB above the start, with them 4-6 MiB. The broker's start-up objects are frozen
(gc.freeze), so the collection walks only what was made since; `release()` returns its cost and
the listener logs it with the trim's.

When (`AfterCloses`): once at least `TRIM_AFTER_CLOSES` connections closed since the last trim
and then a sweep interval (1 s) passed without a close: the wave is over and its objects are
freed (a connection's transport and buffers may go a little after its task has ended).
Trimming at the 256th close instead, as the listener first did, ran before most of the wave had
closed and left the rest of it resident. Under a steady churn of closes a trim still comes
`TRIM_MAX_INTERVAL_S` (a minute) after the closes that called for it. Collecting and walking
the heap cost 15-45 ms for a wave of 5,000, on the sweeper's turn of the event loop, never on a
request's path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

TRIM_AFTER_CLOSES = 256
TRIM_MAX_INTERVAL_S = 60.0


def _malloc_trim() -> Callable[[int], int] | None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
        return fn
    return None  # not glibc: its allocator has its own policy


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return free heap pages to the kernel (glibc); False where there is no malloc_trim."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


@dataclass(frozen=True, slots=True)
class Released:
    """What one `release()` cost: seconds in the full collection and in malloc_trim."""

    collect_s: float
    trim_s: float
    trimmed: bool  # False where there is no malloc_trim


def release() -> Released:
    """Empty the free lists (a full collection), then return free heap pages to the kernel."""
    started = time.perf_counter()
    gc.collect()
    collected = time.perf_counter()
    trimmed = trim()
    return Released(collected - started, time.perf_counter() - collected, trimmed)


class AfterCloses:
    """When to release the heap: `closed()` on every closed connection, `tick(now)` on every
    sweep (monotonic seconds), which calls `release` once a wave of closes is over (module
    docstring) and returns what it returned (None when it did not call it)."""

    __slots__ = ("_recent", "_release", "_since", "after", "max_interval_s", "pending")

    def __init__(
        self,
        after: int = TRIM_AFTER_CLOSES,
        max_interval_s: float = TRIM_MAX_INTERVAL_S,
        release: Callable[[], Released] = release,
    ) -> None:
        self.after = after
        self.max_interval_s = max_interval_s
        self.pending = 0  # closes since the last release
        self._recent = 0  # closes since the last tick
        self._since: float | None = None  # the tick that first saw `after` closes pending
        self._release = release

    def closed(self) -> None:
        self.pending += 1
        self._recent += 1

    def tick(self, now: float) -> Released | None:
        recent, self._recent = self._recent, 0
        if self.pending < self.after:
            return None
        if self._since is None:
            self._since = now
        if recent and now - self._since < self.max_interval_s:
            return None  # the wave is still closing
        self.pending = 0
        self._since = None
        return self._release()
