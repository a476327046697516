"""A partition's checkpoints: the snapshot of its durable state (index, log start,
high watermark, durable producers and transactions, aborted transactions, the cleaner's
progress) and its commit to the store with If-Match on the last ETag (fenced when another owner
wrote since). One commit at a time (the checkpoint lock); the engine decides when (upkeep.py).

Never writes into a store it has lost (StoreLost) nor after the partition was fenced. Must not
change the log itself: what a checkpoint carries is changed by the other parts.
"""

from __future__ import annotations

import time

from tidalmq_broker.storage import metrics
from tidalmq_broker.storage.api import ObjectStoreUnavailable, PartitionFenced, StoreLost
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.partition.state import PartitionState, State


class Checkpoints(PartitionState):
    """Snapshot and commit of the partition's checkpoint."""

    __slots__ = ()

    @property
    def dirty(self) -> bool:
        return self._version != self._committed_version

    def snapshot(self, *, clean: bool = False) -> Checkpoint:
        return Checkpoint(
            topic=self._tp.topic,
            topic_id=self.topic_id,
            partition=self._tp.partition,
            leader_epoch=self._epoch,
            owner_broker=self._engine.broker_label,
            owner_incarnation=self._engine.incarnation,
            wal_position=self._engine.writer.completed_seq,
            log_start_offset=self._log_start,
            next_offset=self._hwm,
            clean_shutdown=clean,
            index=self._index.entries,
            producers=self._durable_producers.to_json(),
            transactions=self._durable_producers.txn_to_json(),
            aborted_txns=self._aborted.to_json(),
            cleaner=dict(self._cleaner_state),
        )

    @property
    def unstored(self) -> bool:
        """New, or opened from an earlier leader's clean checkpoint, and our checkpoint not
        written yet (it is written before our first data)."""
        return (self._etag is None or not self._epoch_stored) and self._state in (
            State.OPEN,
            State.CLOSING,
        )

    async def store_first(self) -> None:
        """Write our first checkpoint (if nobody did meanwhile): a new partition's, or ours at
        our epoch over the earlier leader's (If-Match: fenced if someone else wrote since)."""
        async with self._cp_lock:
            if self._etag is None or not self._epoch_stored:
                await self._commit_locked(force=True)

    async def commit_checkpoint(self, *, clean: bool = False, force: bool = False) -> None:
        async with self._cp_lock:
            await self._commit_locked(clean=clean, force=force)

    async def _commit_locked(self, *, clean: bool = False, force: bool = False) -> None:
        if not (force or clean or self.dirty):
            return
        if self._state is State.FENCED:
            if isinstance(self._failure, StoreLost):
                raise self._failure
            raise PartitionFenced(f"{self._tp} was taken over by another owner")
        if self._engine.store_problem is not None:  # never write into a wiped or foreign store
            raise StoreLost(f"{self._tp}: {self._engine.store_problem}")
        version = self._version
        self._durable_producers.expire(int(time.time() * 1000))
        cp = self.snapshot(clean=clean)
        first = self._etag is None
        try:
            self._etag = await self._engine.checkpoints.commit(self._key, cp, self._etag)
        except PartitionFenced:
            metrics.CHECKPOINTS.labels(self._engine.broker_label, "fenced").inc()
            self._engine.partition_fenced(self)
            raise
        except ObjectStoreUnavailable:
            metrics.CHECKPOINTS.labels(self._engine.broker_label, "failed").inc()
            raise
        metrics.CHECKPOINTS.labels(self._engine.broker_label, "ok").inc()
        self._epoch_stored = True
        self._committed_version = version
        self._committed_position = cp.wal_position
        self._engine.checkpoint_committed(self, cp)
        if first:
            self._engine.first_stored(self)
