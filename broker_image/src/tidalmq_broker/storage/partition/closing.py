"""The end of a partition here: the clean close of a move (stop appending, drain,
force the flush, commit a clean checkpoint, or leave an untouched one as it is), the fence when
another owner took over or the store was lost (fail everything pending, write nothing more), and
the abandon of a partition that never finished opening.
"""

from __future__ import annotations

import asyncio
import logging

from tidalmq_broker.storage.api import (
    ObjectStoreUnavailable,
    PartitionClosing,
    PartitionFenced,
    StorageError,
    StoreLost,
)
from tidalmq_broker.storage.partition.flushes import Flushes
from tidalmq_broker.storage.partition.state import State

log = logging.getLogger(__name__)


class Closing(Flushes):
    """Close, fence and abandon."""

    __slots__ = ()

    async def close(self) -> None:
        """The close of a move (steps 3-4): stop appending, drain, force the flush, clean checkpoint."""
        if self._state in (State.CLOSED, State.FENCED):
            return
        self._closing = True
        if self._state is State.OPEN:
            self._state = State.CLOSING
        self._notify()
        self._engine.writer.flush_now()
        await self._wait_drained()
        while self._recovery_task is not None:
            await asyncio.shield(self._recovery_task)
        if self._state is State.FENCED:
            return
        self._state = State.CLOSING
        if self._etag is None and self._hwm == self._log_start and not self.dirty:
            self._release()  # new and never written: nothing to keep, the next owner starts it
            return
        if not self._epoch_stored and not self.dirty:
            # opened from a clean checkpoint and nothing changed since: it stays what the next
            # owner opens (a partition moved twice without a write costs no store write here)
            self._release()
            return
        try:
            for attempt in range(3):
                try:
                    await self.commit_checkpoint(clean=True)
                    break
                except ObjectStoreUnavailable as exc:
                    if attempt == 2:
                        log.warning(
                            "%s: clean checkpoint failed (%s); the next owner recovers from the WAL",
                            self._tp,
                            exc,
                        )
                    else:
                        await asyncio.sleep(0.2 * (attempt + 1))
        except PartitionFenced:
            return
        except StoreLost as exc:
            log.warning("%s: closed without a checkpoint: %s", self._tp, exc)
        finally:
            self._release()

    def _release(self) -> None:
        if self._state is not State.FENCED:
            self._state = State.CLOSED
        self._cache.clear()
        self._readahead = None
        self._notify()

    def fence(self, error: StorageError | None = None) -> None:
        """Another owner took over (or the store was lost: `error`): fail everything pending
        and stop, writing nothing more."""
        self._state = State.FENCED
        self._failure = error or PartitionFenced(f"{self._tp} was taken over by another owner")
        removed = self._engine.writer.remove_pending(self)
        self.fail_appends(removed, self._failure)
        self._cache.clear()
        self._readahead = None
        self._notify()

    def abandon(self) -> None:
        self._state = State.CLOSED
        self._failure = PartitionClosing(f"{self._tp} was abandoned")
        self._cache.clear()
        self._notify()
