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

Object allocator: a broker runs on glibc's malloc (PYTHONMALLOC=malloc) instead of Python's
small-object allocator. Python's allocator hands memory back only in whole 1 MiB arenas, and an
arena goes back only once every block in it is free. After 5,000 idle connections came and went,
every connection's objects were freed (allocated blocks back to within 0.5 MiB of the start) but
the ~0.5 MiB of objects made meanwhile and still alive (logs, metrics, groups) were spread over
24-28 of the arenas the wave had taken, which stayed resident: RSS 29-34 MiB above where it
started, for good. glibc's `malloc_trim(0)` returns every free page inside its heaps, however
fragmented (server/heap.py calls it after a wave of closes): RSS comes back to within a few MiB.
The allocator is chosen when the interpreter starts, so `tidalmq broker` re-executes itself once
with PYTHONMALLOC=malloc (`reexec_with_system_malloc`, before anything else is imported); a
PYTHONMALLOC set by whoever started it is kept (e.g. PYTHONMALLOC=pymalloc to compare).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Mapping, Sequence

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


def wants_system_malloc(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether `tidalmq ARGV` is a broker with runtime tuning on whose allocator nobody chose
    (the flag and the variable of settings.runtime_tuning, read without importing settings)."""
    if not argv or argv[0] != "broker" or "PYTHONMALLOC" in env:
        return False
    tuning = env.get("TIDALMQ_RUNTIME_TUNING", "true")
    for i, arg in enumerate(argv):
        if arg == "--runtime-tuning" and i + 1 < len(argv):
            tuning = argv[i + 1]
        elif arg.startswith("--runtime-tuning="):
            tuning = arg.split("=", 1)[1]
    return tuning.strip().lower() not in ("0", "false", "no", "off")


def allocator_env(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """What to add to the environment of a child started as `tidalmq ARGV` so that it starts
    on glibc's malloc at once, without re-executing itself (`tidalmq local up` starts its
    brokers so: a re-exec is a second interpreter start, ~0.1-0.2 s on every add-broker)."""
    if wants_system_malloc(argv, env) and _is_glibc():
        return {"PYTHONMALLOC": "malloc"}
    return {}


def reexec_with_system_malloc(argv: Sequence[str]) -> None:
    """Replace this process (same pid) by the same command on glibc's malloc, when
    wants_system_malloc (only on glibc, where malloc_trim gives the pages back); returns
    otherwise."""
    if not wants_system_malloc(argv, os.environ) or not _is_glibc():
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def _is_glibc() -> bool:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True
