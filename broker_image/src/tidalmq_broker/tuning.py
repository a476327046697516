"""Process-wide runtime settings for TidalMQ's servers: brokers, and the processes hosting a
controller (`tidalmq local up`, the operator).

Garbage collector: the request path allocates many short-lived objects (futures, tasks, tuples)
and almost no cycles; at the default threshold (700) young collections ran every few requests
and promoted objects into costly older-generation passes over a large live heap (offset
indexes, cached chunks, a controller's image of 50,000 partitions).

glibc malloc: its mmap threshold grows to the size of the largest block freed (up to 32 MiB),
after which request frames, record copies and WAL objects of a few MiB come from the heap arenas
(one per thread that allocated, up to 8 per core) and their freed space stays resident: RSS grew
to 1.5-3x the live data. A fixed threshold hands such blocks back to the kernel when freed, and
two arenas bound what the store's threads keep.

Thread switch interval: a broker heartbeats, and a controller answers heartbeats, on threads of
their own beside a busy event loop (liveness.py, the controller's liveness thread). A thread that
wants the GIL waits for the holder to drop it, at most the switch interval (5 ms by default) each
time, and a heartbeat needs the GIL a dozen times (JSON, socket calls) on each side: under a
rebalance of 10,000 partitions a few heartbeats took over 100 ms. At 1 ms they wait a fifth of
that; the event loop's throughput does not change measurably (it rarely competes with anything
but these threads and the store's I/O threads, which drop the GIL while they wait).
"""

from __future__ import annotations

import ctypes
import gc
import sys

_GC_THRESHOLDS = (50_000, 20, 100)
_M_MMAP_THRESHOLD = -3  # mallopt parameters of glibc's malloc.h
_M_ARENA_MAX = -8
SWITCH_INTERVAL_S = 0.001


def tune_runtime() -> None:
    """Apply the settings above to this process."""
    gc.set_threshold(*_GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
        libc.mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator has its own policy
