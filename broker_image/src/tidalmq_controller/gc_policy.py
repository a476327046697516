"""Garbage collection in a process hosting a controller: freeze the metadata after big changes.

A big change (a topic of thousands of partitions created, a cluster's image loaded, a wave of
first openings) leaves hundreds of thousands of new long-lived objects (about 5 per partition:
the image's partition states, the leadership indexes, the membership's open partitions).
CPython's cyclic collector walks every tracked object of the generations it collects, and these
objects climb through the young generations into the old one, so the older-generation
collections that follow walk all of them again, holding the GIL: the liveness thread answers no
heartbeat meanwhile (over 100 ms at 200,000 partitions with the hosting processes' thresholds,
and at 50,000 with CPython's, measured by bench/controller_gc_pauses.py).

The policy (docs/control-plane.md, "Garbage collection during big changes"):
- `install()` (start-up, before the controller starts): a full collection, then `gc.freeze()`,
  as a broker does after start-up: modules, classes and settings are never walked again.
- Once the batches applied since the last freeze changed at least `freeze_after` partitions (a
  partition counts once per proposal that changed it; a created, grown or changed topic counts
  all its partitions; a controller's start counts the whole log it loaded), on the event loop's
  next turn (after the rest of the slice that applied them, so the managers' indexes built
  from the same records go too): collect the young generations, then `gc.freeze()`. The
  collection walks only what was made since the last freeze, so its garbage cycles are freed,
  not frozen; the freeze is O(1) (the generation lists are spliced into the permanent
  generation), and frozen objects are never walked again. A frozen object is still freed by
  reference counting the moment its last reference goes (a deleted topic's partition states
  and index entries).
- When a controller stops: `gc.unfreeze()`, and the next freeze collects everything first. A
  controller's objects hold each other (its managers hold it), so once the process drops a
  stopped one (the operator starts a new controller when its replica is elected again) only a
  collection frees it, its whole image with it; frozen, it would stay for good. The next
  freeze is the next controller's start, which loads the log before it serves.
- No other unfreeze: while a controller runs, what is frozen does not become garbage cycles
  (none found after creating and deleting 200,000 partitions, nor after a join's moves), and
  a full collection of everything is the very pause this avoids (65-192 ms at 50,000
  partitions on a loaded machine, 1.8 s at 1,000,000).

Not for the broker's request path: a broker freezes once after start-up (serve.py) and must
collect its connections' objects later (server/heap.py); only processes whose main work is the
controller install this (`tidalmq local up`, the operator). `install()` also exports the
collector's pauses by generation and what is frozen as Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

FREEZE_AFTER_PARTITIONS = 2000

PAUSE_SECONDS = Histogram(
    "tidalmq_controller_gc_pause_seconds",
    "Pauses of the cyclic garbage collector (wall time, the GIL held), by generation collected",
    ["generation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
FROZEN_OBJECTS = Gauge(
    "tidalmq_controller_gc_frozen_objects",
    "Objects in the garbage collector's permanent generation (gc.freeze), never walked again",
)
FREEZES = Counter(
    "tidalmq_controller_gc_freezes_total",
    "gc.freeze() calls after metadata batches that changed many partitions",
)


class GcPolicy:
    """Counts the partitions the applied batches changed (`changed`) and freezes once they
    reach `freeze_after`, on the loop's next turn. `freeze` and `schedule` are the collector's
    and the running loop's unless a test passes its own."""

    def __init__(
        self,
        freeze_after: int = FREEZE_AFTER_PARTITIONS,
        *,
        collect_young: Callable[[], object] = lambda: gc.collect(1),
        collect_all: Callable[[], object] = gc.collect,
        unfreeze: Callable[[], None] = gc.unfreeze,
        freeze: Callable[[], None] = gc.freeze,
        schedule: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        self.freeze_after = freeze_after
        self.pending = 0  # partitions changed since the last freeze
        self.freezes = 0
        self._collect_young = collect_young
        self._collect_all = collect_all
        self._unfreeze = unfreeze
        self._full = True  # the next freeze collects everything first (the first, and after
        # an unfreeze)
        self._freeze = freeze
        self._schedule = schedule
        self._scheduled = False

    def changed(self, partitions: int) -> None:
        """A batch changing `partitions` partitions was applied (from the event loop)."""
        self.pending += partitions
        if self.pending < self.freeze_after or self._scheduled:
            return
        self._scheduled = True
        if self._schedule is not None:
            self._schedule(self.freeze_now)
        else:
            try:
                asyncio.get_running_loop().call_soon(self.freeze_now)
            except RuntimeError:  # no loop (a controller loading outside one): now
                self.freeze_now()

    def freeze_now(self) -> None:
        """Collect the young generations (what was made since the last freeze: the garbage
        cycles among it are freed, not frozen), or everything the first time and after an
        unfreeze; then freeze what survived."""
        self._scheduled = False
        self.pending = 0
        if self._full:
            self._collect_all()
            self._full = False
        else:
            self._collect_young()
        self._freeze()
        self.freezes += 1
        FREEZES.inc()

    def unfreeze(self) -> None:
        """A controller stopped: give everything back to the collector. A controller's objects
        hold each other (its managers hold it), so once the process drops it (the operator
        starts a new one when its replica is elected again) only a collection frees it, its
        whole image with it; frozen, it would stay for good. The next freeze collects
        everything first: the next controller's start, which loads the log (before it serves)."""
        self._unfreeze()
        self._full = True


class PauseMeter:
    """Each collection's wall time into PAUSE_SECONDS (a gc callback; the collector runs no
    collection inside its callbacks, so observing here cannot recurse)."""

    def __init__(self) -> None:
        self._started = 0.0
        self._children = [PAUSE_SECONDS.labels(generation=str(g)) for g in range(3)]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._children[info["generation"]].observe(time.perf_counter() - self._started)


_installed: GcPolicy | None = None
_meter: PauseMeter | None = None


def install(policy: GcPolicy | None = None) -> GcPolicy:
    """Turn the policy on for this process (a process hosting a controller, once its modules
    are imported and before its controller starts); every controller of the process reports
    its batches to it. Freezes what the process holds by now (a full collection first, as
    a broker does after start-up: modules, classes, settings), so the later young collections
    before each freeze walk only what was made since. Returns it (idempotent: the installed
    one; a test may install its own `policy` after `uninstall`)."""
    global _installed, _meter
    if _installed is None:
        _installed = policy or GcPolicy()
        _meter = PauseMeter()
        gc.callbacks.append(_meter)
        FROZEN_OBJECTS.set_function(gc.get_freeze_count)
        _installed.freeze_now()
    return _installed


def uninstall() -> None:
    """Turn it off (tests, benchmarks); what is frozen stays frozen."""
    global _installed, _meter
    if _meter is not None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(_meter)
    _installed = _meter = None


def installed() -> GcPolicy | None:
    return _installed


def controller_stopped() -> None:
    """What the controller calls at the end of its stop; nothing unless installed."""
    if _installed is not None:
        _installed.unfreeze()


def changed(partitions: int) -> None:
    """What the controller calls after applying a batch; nothing unless installed."""
    if _installed is not None:
        _installed.changed(partitions)
