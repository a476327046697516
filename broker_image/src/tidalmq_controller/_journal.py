"""The controller's journal: records in, committed batches out (group commit).

A manager that decides something calls `propose(records)`: the records are applied to the image
at once (later decisions see them) and join the open batch; the caller awaits `committed(v)`
before it answers anyone. One committer task appends the open batch as soon as the previous
append finished, so everything proposed meanwhile shares one write, whatever the load. Once a
batch is durable, the journal keeps it in memory (brokers behind are sent the batches they miss),
and tells its listeners (the pushers to brokers, the operator).

Nothing here is copied whole per change. Snapshots are made from the previous snapshot and the
batches since, in a worker thread (tidalmq_core.snapshots.roll), when the bytes of records since
the last one reach the size of that snapshot (at least `snapshot_min_bytes`): snapshot bytes
per record byte stay at most one, so a change costs O(its records) however large the cluster.

Failures: an append that another controller won (LogConflict) deposes this one, every waiter
gets ControllerFenced. Any other failure (the store is down) is retried with backoff, the same
batch at the same version, while new proposals wait in the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import MetadataDelta, Record, apply_record

from tidalmq_controller._log import Batch, LoadedLog, LogConflict, MetadataLog

log = logging.getLogger(__name__)

BATCHES = Counter("tidalmq_controller_metadata_batches_total", "Metadata batches committed")
RECORDS = Counter("tidalmq_controller_metadata_records_total", "Metadata records committed")
BYTES = Counter("tidalmq_controller_metadata_bytes_total", "Bytes of metadata batches committed")
SNAPSHOT_BYTES = Counter(
    "tidalmq_controller_metadata_snapshot_bytes_total", "Bytes of metadata snapshots written"
)
COMMIT_SECONDS = Histogram(
    "tidalmq_controller_metadata_commit_seconds",
    "Time to append one metadata batch to its store",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)

QUEUE_RECORDS = Gauge(
    "tidalmq_controller_metadata_commit_queue_records",
    "Metadata records proposed and not yet committed (the batch being filled and the one being "
    "stored)",
)

RING_MIN_BATCHES = 1000  # kept beyond the last snapshot, for brokers slightly behind


class Deposed(Exception):
    """Another controller appended to the log: this one must stop."""


@dataclass(slots=True)
class _Open:
    """The batch being filled."""

    version: int
    records: list[Record] = field(default_factory=list)
    delta: MetadataDelta = field(default_factory=MetadataDelta)
    done: asyncio.Future[None] | None = None


CommitListener = Callable[[Batch, MetadataDelta], None]
AppliedHook = Callable[[MetadataDelta], None]


class Journal:
    def __init__(
        self,
        store: MetadataLog,
        *,
        snapshot_min_bytes: int = 8 * 1024 * 1024,
        retry_max_s: float = 2.0,
    ) -> None:
        self.store = store
        self.image: ClusterMetadata | None = None
        self.epoch = 0
        self.committed_version = 0
        self.snapshot_bytes: bytes | None = None
        self.snapshot_version = 0
        self._snapshot_min = snapshot_min_bytes
        self._retry_max = retry_max_s
        self._ring: deque[Batch] = deque()
        self._bytes_since_snapshot = 0
        self._open: _Open | None = None
        self._in_flight: _Open | None = None
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._snapshotting: asyncio.Task[int] | None = None
        QUEUE_RECORDS.set_function(self.queued_records)  # the process's (newest) controller
        self._listeners: list[CommitListener] = []
        self._applied_hooks: list[AppliedHook] = []
        self._deposed: BaseException | None = None
        self.on_deposed: Callable[[str], None] = lambda why: None
        self.last_commit_at = float("-inf")  # monotonic start of the last successful append

    # ------------------------------------------------------------------ start
    def load(self, loaded: LoadedLog, empty: ClusterMetadata) -> ClusterMetadata:
        """Adopt what the store holds (or `empty`, a new cluster); returns the image."""
        image = loaded.image() or empty
        self.image = image
        self.committed_version = loaded.head
        image.version = loaded.head
        self.snapshot_bytes = loaded.snapshot
        self.snapshot_version = loaded.snapshot_version
        self._ring = deque(loaded.batches)
        self._bytes_since_snapshot = sum(len(b.data) for b in loaded.batches)
        return image

    def start(self, epoch: int) -> None:
        self.epoch = epoch
        self._committer = asyncio.create_task(self._commit_loop(), name="metadata committer")

    async def stop(self) -> None:
        for task in (self._committer, self._snapshotting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._fail_pending(Deposed("the controller stopped"))

    def add_listener(self, listener: CommitListener) -> None:
        self._listeners.append(listener)

    def add_applied_hook(self, hook: AppliedHook) -> None:
        """Called with each proposal's delta right after it is applied to the image."""
        self._applied_hooks.append(hook)

    # ------------------------------------------------------------------ proposing
    @property
    def next_version(self) -> int:
        """The version the records proposed now will be committed at."""
        if self._open is not None:
            return self._open.version
        if self._in_flight is not None:
            return self._in_flight.version + 1
        return self.committed_version + 1

    def writes(self, version: int) -> bool:
        """Whether `version` is ours: committed, being appended, or open to be appended next
        (the role check must not take our own append of it for another controller's)."""
        if self.committed_version >= version:
            return True
        return any(b is not None and b.version == version for b in (self._open, self._in_flight))

    def propose(self, records: list[Record]) -> int:
        """Apply records to the image now and queue them; returns their future version."""
        if self._deposed is not None:
            raise Deposed(str(self._deposed))
        if self.image is None:
            raise RuntimeError("journal not loaded")
        if self._open is None:
            self._open = _Open(self.next_version, done=asyncio.get_running_loop().create_future())
        batch = self._open
        delta = MetadataDelta()
        for rec in records:
            apply_record(self.image, rec, delta)
        self.image.version = batch.version
        batch.records.extend(records)
        batch.delta.merge(delta)
        for hook in self._applied_hooks:
            hook(delta)
        self._wake.set()
        return batch.version

    async def committed(self, version: int) -> None:
        """Until the batch `version` is durable. Raises Deposed."""
        while self.committed_version < version:
            if self._deposed is not None:
                raise Deposed(str(self._deposed))
            flight, open_ = self._in_flight, self._open
            if flight is not None and flight.version >= version:
                target = flight
            elif open_ is not None and open_.version >= version:
                target = open_
            else:
                raise RuntimeError(f"metadata version {version} was never proposed")
            assert target.done is not None
            await asyncio.shield(target.done)

    async def commit(self, records: list[Record]) -> int:
        """propose and wait; returns the version."""
        version = self.propose(records)
        await self.committed(version)
        return version

    def queued_records(self) -> int:
        return sum(len(b.records) for b in (self._open, self._in_flight) if b is not None)

    # ------------------------------------------------------------------ committing
    async def _commit_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = self._open
            if batch is None:
                continue
            self._open = None
            self._in_flight = batch
            stored = Batch(batch.version, self.epoch, batch.records)
            delay = 0.05
            while True:
                started = time.monotonic()
                try:
                    await self.store.append(stored)
                    break
                except LogConflict as exc:
                    self._depose(exc)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "metadata batch %d not stored (%s); retrying in %.2fs",
                        batch.version,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._retry_max)
            COMMIT_SECONDS.observe(time.monotonic() - started)
            self.last_commit_at = started
            self.committed_version = batch.version
            self._in_flight = None
            self._ring.append(stored)
            self._bytes_since_snapshot += len(stored.data)
            BATCHES.inc()
            RECORDS.inc(len(stored.records))
            BYTES.inc(len(stored.data))
            assert batch.done is not None
            if not batch.done.done():
                batch.done.set_result(None)
            for listener in self._listeners:
                try:
                    listener(stored, batch.delta)
                except Exception:
                    log.exception("metadata commit listener failed")
            self._maybe_snapshot()
            if self._open is not None:
                self._wake.set()

    def _depose(self, exc: BaseException) -> None:
        if self._deposed is None:
            self._deposed = exc
            self._fail_pending(Deposed(str(exc)))
            self.on_deposed(str(exc))

    def depose(self, why: str) -> None:
        """Someone else holds the log now (seen by a role check): stop committing."""
        self._depose(Deposed(why))

    def _fail_pending(self, exc: BaseException) -> None:
        for batch in (self._in_flight, self._open):
            if batch is not None and batch.done is not None and not batch.done.done():
                batch.done.set_exception(exc)
                batch.done.exception()  # retrieved: waiters get it through `committed`

    @property
    def deposed(self) -> bool:
        return self._deposed is not None

    # ------------------------------------------------------------------ reading back
    def batches_since(self, version: int) -> list[Batch] | None:
        """The committed batches after `version`, or None when the oldest of them is no longer
        kept (send the snapshot and the batches after it instead)."""
        if version >= self.committed_version:
            return []
        if not self._ring or self._ring[0].version > version + 1:
            return None
        first = version + 1 - self._ring[0].version
        return [self._ring[i] for i in range(first, len(self._ring))]

    # ------------------------------------------------------------------ snapshots
    def _maybe_snapshot(self) -> None:
        due = max(self._snapshot_min, len(self.snapshot_bytes or b""))
        if self._bytes_since_snapshot < due:
            return
        if self._snapshotting is not None and not self._snapshotting.done():
            return
        self._snapshotting = asyncio.create_task(self.write_snapshot(), name="metadata snapshot")

    async def write_snapshot(self, *, again: bool = False) -> int:
        """Roll a snapshot at the committed version (in a worker thread) and store it. `again`:
        also when nothing was committed since the last one (its object may be gone: the store
        was wiped), storing that one once more."""
        base, base_version = self.snapshot_bytes, self.snapshot_version
        batches = [b for b in self._ring if b.version > base_version]
        version = batches[-1].version if batches else base_version
        if version == base_version and base is not None:
            if again:
                await self.store.write_snapshot(version, base)
            return version
        empty = None
        if base is None:
            assert self.image is not None
            empty = ClusterMetadata(cluster_id=self.image.cluster_id)
        started = time.monotonic()
        data = await asyncio.to_thread(
            snapshots.roll, base, [(b.version, b.records) for b in batches], empty
        )
        await self.store.write_snapshot(version, data)
        SNAPSHOT_BYTES.inc(len(data))
        self.snapshot_bytes, self.snapshot_version = data, version
        self._bytes_since_snapshot = sum(len(b.data) for b in self._ring if b.version > version)
        # batches the snapshot covers are kept a while for brokers just behind
        while len(self._ring) > RING_MIN_BATCHES and self._ring[0].version <= version:
            self._ring.popleft()
        log.info(
            "metadata snapshot at version %d: %d bytes in %.2fs",
            version,
            len(data),
            time.monotonic() - started,
        )
        try:
            await self.store.trim()
        except Exception as exc:
            log.warning(
                "trimming the metadata log failed (retried after the next snapshot): %s", exc
            )
        return version
