"""Whether the object store takes this broker's writes, from what its PUTs did ([R1] item 7).

Every PUT the engine makes (WAL objects, checkpoints, segments) reports its outcome here
(MeteredObjectStore calls `ok` and `failed`; a WAL flush that ran out of time calls `failed`
itself): the store is unwritable from the first PUT that fails (ObjectStoreUnavailable: the S3
endpoint down or hanging, the local store's disk full, its directory gone) until the next one
that succeeds. A PUT that loses a conditional write (PreconditionFailed) got an answer: it counts
as a success. A broker with no traffic writes nothing, so the engine probes (`PROBE_KEY`, a few
bytes) when no PUT succeeded for a while, and every second while the store is failing, which is
what notices it has come back.

While the store is unwritable the broker is not ready (/readyz answers 503 with the reason) and
appends fail at once with KAFKA_STORAGE_ERROR (retriable: producers retry, and an idempotent
producer's retry is deduplicated), instead of waiting for a flush that cannot succeed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def probe_key(broker: str) -> str:
    """The object a broker's health probe writes (outside wal/ and partitions/: no sweep or
    recovery looks at it; one per broker, overwritten)."""
    return f"health/{broker}"


class WriteHealth:
    def __init__(self, broker: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self._clock = clock
        self.failing_since: float | None = None
        self.last_error = ""
        self.last_ok = clock()  # the last PUT that got an answer (start-up counts as one)
        self.failures = 0  # PUTs failed since the last success
        self._recovered = asyncio.Event()
        self._recovered.set()
        self.on_change: Callable[[str | None], None] | None = None

    @property
    def problem(self) -> str | None:
        """Why the store is not taking writes, or None."""
        if self.failing_since is None:
            return None
        since = self._clock() - self.failing_since
        return (
            f"object store writes failing for {since:.1f}s ({self.failures} failed): "
            f"{self.last_error}"
        )

    def ok(self) -> None:
        self.last_ok = self._clock()
        if self.failing_since is None:
            return
        took = self.last_ok - self.failing_since
        log.warning(
            "object store takes writes again after %.1fs (%d failed PUTs)", took, self.failures
        )
        self.failing_since = None
        self.failures = 0
        self.last_error = ""
        self._recovered.set()
        self._changed(None)

    def failed(self, error: BaseException | str) -> None:
        self.failures += 1
        self.last_error = str(error)[:300] or type(error).__name__
        if self.failing_since is not None:
            return
        self.failing_since = self._clock()
        self._recovered = asyncio.Event()
        log.warning(
            "object store write failed: %s; appends are refused (KAFKA_STORAGE_ERROR) "
            "and /readyz says not ready until a write succeeds",
            self.last_error,
        )
        self._changed(self.problem)

    def idle_for(self) -> float:
        """Seconds since the last PUT that got an answer."""
        return self._clock() - self.last_ok

    async def wait_recovered(self, timeout_s: float) -> bool:
        """Until the store takes writes again (True) or `timeout_s` passed."""
        if self.failing_since is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._recovered.wait()
        except TimeoutError:
            return False
        return True

    def _changed(self, problem: str | None) -> None:
        if self.on_change is not None:
            try:
                self.on_change(problem)
            except Exception:
                log.exception("store health listener failed")
