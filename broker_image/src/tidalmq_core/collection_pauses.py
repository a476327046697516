"""Holding the cyclic garbage collector off while a process builds something big and short-lived.

A Prometheus scrape of a broker that leads 10,000 partitions builds about 140,000 container
objects (per partition: three counter families of two samples each and a gauge, every sample a
named tuple with a dict of labels) that are all alive until the text is written, and garbage
right after it, freed by reference counting: they hold no reference cycles. Built with the
collector on, they fill the young generation several times over, and each young collection
walks 50,000 live objects whose referents are spread over the whole heap (cache misses): 15-85
ms of CPU per collection, 60-165 ms for the middle generation they were promoted into, the GIL
held throughout. A broker's heartbeat thread waits for the GIL meanwhile, so a scrape during a
big topic's creation pushed heartbeat answers past 100 ms (bench/metadata_scale.py, "scenario").

`metrics_text()` is a scrape built so. `collection_paused()` disables the collector for the
block and enables it again after (if it was enabled before the first of any nested or
concurrent blocks: a count shared by the threads). What the block allocated and dropped is
freed as before; only the walk is skipped. Use it only around work that makes no reference
cycles, or whose cycles can wait for the next collection: it must not hold the collector off
for long (a scrape is milliseconds to a few hundred at most).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import generate_latest

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (any thread)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def metrics_text() -> bytes:
    """The default registry's Prometheus text, built with the collector off (the samples are
    acyclic garbage once written): what every /metrics of ours answers (broker, controller)."""
    with collection_paused():
        return generate_latest()
