"""CPU time per request: what each request costs the event loop's thread.

A request's handler runs as a task whose steps interleave with every other request's, so its
wall time says nothing about its cost. `Metered` wraps the task's coroutine and reads the
thread's CPU clock (time.thread_time, CLOCK_THREAD_CPUTIME_ID) around each step, so only the
request's own synchronous parts are counted: time spent waiting (a WAL flush, a coordinator)
is not, nor CPU the kernel or other threads spend. A preempted step (the machine is shared)
is not counted as the request's either, which a wall clock (perf_counter) would do.

The clock is a system call, about 0.6 us a read on the 2-core machine the benchmarks run on:
two reads per step of the handler's task plus two around the request's decoding, about 4 us
for a produce request (two steps), against the hundreds of microseconds it measures.

Owns: `RequestCpu` (one request's seconds so far) and `Metered` (the coroutine wrapper). The
listener (server/listener.py) charges the decoding and runs each handler through Metered; the
broker's metrics export the sum and count per API (tidalmq_request_cpu_seconds).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from time import thread_time
from typing import Any, TypeVar

T = TypeVar("T")


class RequestCpu:
    """Thread CPU seconds one request has spent so far."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds


class Metered(Coroutine[Any, Any, T]):
    """`coro`, with the thread CPU time of each of its steps added to `cpu`.

    A Coroutine (asyncio.create_task takes it as one): the task drives it with send() and
    throw(), which drive `coro` the same way between two reads of the clock."""

    __slots__ = ("_coro", "_cpu")

    def __init__(self, coro: Coroutine[Any, Any, T], cpu: RequestCpu) -> None:
        self._coro = coro
        self._cpu = cpu

    def send(self, value: Any) -> Any:
        start = thread_time()
        try:
            return self._coro.send(value)
        finally:
            self._cpu.seconds += thread_time() - start

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        start = thread_time()
        try:
            if val is None and tb is None:
                return self._coro.throw(typ)
            return self._coro.throw(typ, val, tb)
        finally:
            self._cpu.seconds += thread_time() - start

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()

    def __repr__(self) -> str:
        return f"<Metered {self._coro!r}>"
