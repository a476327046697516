"""Give freed heap memory back to the kernel after a wave of connections closed.

A connection's objects are freed by reference counting the moment it closes (server/framing.py
keeps no reference cycles), but glibc's malloc keeps the freed space of its arenas resident
until something asks for it back: after 4,000 connections came and went, RSS stayed 26 MiB above
where it started; malloc_trim(0) hands back what it can (the rest is the pages Python's own
allocator still uses). The listener calls `trim()` once a second at most, and only after at least
`TRIM_AFTER_CLOSES` connections closed since the last call: walking the heap costs a few ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_AFTER_CLOSES = 256


def _malloc_trim() -> Callable[[int], int] | None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
        return fn  # type: ignore[no-any-return]
    return None  # not glibc: its allocator has its own policy


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return free heap pages to the kernel (glibc); False where there is no malloc_trim."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
