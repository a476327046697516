"""The stream engine: the partitions one broker owns, their shared WAL, cache and upkeep.

Construction (what the broker does with its settings):

    store = open_object_store("file:///var/lib/tidalmq/objects")   # or s3://bucket/prefix?...
    engine = ObjectStreamEngine(store, broker_id=1, config=StorageConfig(...),
                                lease_check=lease.valid, on_fenced=partitions.fenced,
                                owns_store=True)
    await engine.start()
    log = await engine.open_partition(tp, topic_id, leader_epoch, PartitionConfig(...))
    ...
    await engine.stop()

The broker's StorageConfig comes from its settings (BrokerSettings.storage_config()).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tidalmq_core.model import PartitionMap, TopicPartition

from tidalmq_broker.storage import keys, metrics
from tidalmq_broker.storage.aborted_txns import AbortedTxns
from tidalmq_broker.storage.api import (
    LeaseCheck,
    ObjectStoreUnavailable,
    OnFenced,
    PartitionClosing,
    PartitionConfig,
    PartitionDataLost,
    PartitionFenced,
    StorageConfig,
    StorageError,
    StoreLost,
)
from tidalmq_broker.storage.cache import TailCache
from tidalmq_broker.storage.checkpoint import Checkpoint, CheckpointStore
from tidalmq_broker.storage.compaction import (
    CompactionPolicy,
    merge_max_age_ms,
    plan_segments,
    roll_jitter_bound_ms,
    segment_entries,
    should_compact,
)
from tidalmq_broker.storage.garbage import (
    CheckpointRefsCache,
    OwnWalTracker,
    segment_garbage,
    wal_garbage,
)
from tidalmq_broker.storage.health import WriteHealth, probe_key
from tidalmq_broker.storage.identity import identity_problem, read_identity
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.log_cleaner import LogCleaner
from tidalmq_broker.storage.objectstore.base import ObjectInfo, ObjectStore
from tidalmq_broker.storage.objectstore.metered import MeteredObjectStore
from tidalmq_broker.storage.partition import Partition, State
from tidalmq_broker.storage.producer_state import ProducerStateTable
from tidalmq_broker.storage.recovery import recover_tail
from tidalmq_broker.storage.retention import oldest_segment_expiry_ms, retention_log_start
from tidalmq_broker.storage.upkeep import (
    CHECKPOINTS,
    CLEANER,
    COMPACTION,
    RETENTION,
    UpkeepSchedule,
)
from tidalmq_broker.storage.wal_writer import Flush, PendingAppend, WalWriter

log = logging.getLogger(__name__)

_PARALLEL_UPKEEP = 8

# Compaction holds a whole segment's sources (up to segment.bytes, 64 MiB by default) in memory
# while it uploads them: views of the cache's chunks, which stay alive until the PUT returns even
# if the cache evicts them meanwhile, and the ranges read back from the store. One partition at
# a time keeps that to one segment's worth instead of eight, and leaves the store's threads to
# the WAL.
_PARALLEL_COMPACTIONS = 1


class ObjectStreamEngine:
    """Implements api.StreamEngine on an ObjectStore."""

    def __init__(
        self,
        store: ObjectStore,
        broker_id: int | str,
        config: StorageConfig | None = None,
        *,
        lease_check: LeaseCheck | None = None,
        on_fenced: OnFenced | None = None,
        incarnation: str | None = None,
        owns_store: bool = False,
    ) -> None:
        self.config = config or StorageConfig()
        self.broker_label = str(broker_id)
        self.incarnation = incarnation or keys.new_incarnation()
        self.raw_store = store
        self.m = metrics.BrokerMetrics(self.broker_label)
        self._open_gauge = metrics.OPEN_PARTITIONS.labels(self.broker_label)
        self._cache_gauge = metrics.CACHE_BYTES.labels(self.broker_label)
        # whether the store takes our writes (every PUT reports; storage/health.py)
        self.write_health = WriteHealth(self.broker_label)
        self.write_health.on_change = self._write_health_changed
        self.store: ObjectStore = MeteredObjectStore(store, self.broker_label, self.write_health)
        self.checkpoints = CheckpointStore(self.store)
        self.cache = TailCache(self.config.cache_bytes)
        self.writer: WalWriter[Partition] = WalWriter(
            self.store, self.broker_label, self.incarnation, self.config, self._flush_completed
        )
        self.writer.before_put = self._store_new_partitions
        self.writer.on_timeout = self.write_health.failed
        self.tracker = OwnWalTracker()
        self.swept_checkpoints = CheckpointRefsCache()  # the sweep's, from one to the next
        self.cleaner = LogCleaner(self)  # compacted topics (docs/compaction.md)
        self._lease_check = lease_check
        self._on_fenced = on_fenced
        self._owns_store = owns_store
        self._partitions: PartitionMap[Partition] = PartitionMap()
        # which open partitions each upkeep pass looks at next (changed or due; upkeep.py)
        self.upkeep: UpkeepSchedule[Partition] = UpkeepSchedule()
        # partitions opened, closed or whose high watermark advanced since the broker last
        # took them (heartbeats report what changed, not every open partition each time)
        self._changed: set[TopicPartition] = set()
        # partitions this incarnation opened at least once (only a first open can be lazy):
        # their numbers by (topic, topic id), no object made per partition
        self._opened_once: dict[tuple[str, str], set[int]] = {}
        # called with a partition whose first checkpoint was just stored (it was new)
        self.on_stored: Callable[[Partition], None] | None = None
        self._open_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._gauges_due = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._started = False
        self._stopped = False
        # the store's identity (see identity.py): the cluster id and `store_marker` of the
        # metadata this broker got, the verdict of the last check, and who wants to hear of it
        self.store_problem: str | None = None
        self._identity: tuple[str, bool] | None = None
        self._identity_checked: tuple[str, bool] | None = None
        self._identity_lock = asyncio.Lock()
        self.on_store_state: Callable[[str | None], None] | None = None
        metrics.STORE_LOST.labels(self.broker_label).set(0)
        metrics.STORE_UNWRITABLE.labels(self.broker_label).set(0)

    def __repr__(self) -> str:
        return f"ObjectStreamEngine(broker={self.broker_label}, incarnation={self.incarnation}, {self.raw_store!r})"

    # ---------------------------------------------------------------- helpers
    def checkpoint_key(self, tp: TopicPartition, topic_id: str) -> str:
        return keys.checkpoint_key(tp, topic_id)

    def lease_ok(self) -> bool:
        if self._lease_check is None:
            return True
        try:
            return bool(self._lease_check())
        except Exception:
            log.exception("lease check raised; treating the lease as lapsed")
            return False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("storage task %s stopped: %r", task.get_name(), exc, exc_info=exc)

    def _update_gauges(self) -> None:
        """On every open and close: once per event-loop turn (a creation opens thousands of
        partitions in one), right away when no loop runs."""
        if self._gauges_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._set_gauges()
            return
        self._gauges_due = True
        loop.call_soon(self._set_gauges)

    def _set_gauges(self) -> None:
        self._gauges_due = False
        self._open_gauge.set(len(self._partitions))
        self._cache_gauge.set(self.cache.bytes)

    def _open_lock(self, tp: TopicPartition) -> asyncio.Lock:
        lock = self._open_locks.get(tp)
        if lock is None:
            lock = self._open_locks[tp] = asyncio.Lock()
        return lock

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        cfg = self.config
        self._loops = [
            self._loop("checkpoints", cfg.checkpoint_interval_s, self.checkpoint_all),
            self._loop("compaction", cfg.compaction_interval_s, self.compact_all),
            self._loop("cleaner", cfg.cleaner_backoff_ms / 1000, self.clean_all),
            self._loop("retention", cfg.retention_check_interval_s, self.apply_retention_all),
            self._loop("garbage-sweep", cfg.garbage_sweep_interval_s, self.collect_garbage),
            self._loop("identity", cfg.identity_check_interval_ms / 1000, self.check_identity),
        ]
        if cfg.store_probe_interval_ms > 0:
            self._loops.append(
                asyncio.get_running_loop().create_task(self._probe_loop(), name="storage-probe")
            )
        log.info(
            "storage engine started: broker %s incarnation %s on %r",
            self.broker_label,
            self.incarnation,
            self.raw_store,
        )

    def _loop(
        self, name: str, interval_s: float, fn: Callable[[], Awaitable[object]]
    ) -> asyncio.Task[None]:
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await fn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("storage %s pass failed; next pass in %.1fs", name, interval_s)
                self._update_gauges()

        task = asyncio.get_running_loop().create_task(run(), name=f"storage-{name}")
        task.add_done_callback(self._task_done)
        return task

    # ---------------------------------------------------------------- write health
    @property
    def write_problem(self) -> str | None:
        """Why the store does not take this broker's writes now (None: it does)."""
        return self.write_health.problem

    async def _probe_loop(self) -> None:
        """Write a few bytes when no PUT got an answer for store_probe_interval_ms, and every
        second while the store fails: an idle broker notices the store is gone, and a failing
        one that it is back."""
        interval_s = self.config.store_probe_interval_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, interval_s))
            health = self.write_health
            if health.failing_since is None and health.idle_for() < interval_s:
                continue
            try:
                await self.probe_store()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # recorded by probe_store; the next pass tries again
                log.debug("store probe failed: %s", exc)

    async def probe_store(self) -> None:
        """One small PUT, bounded by flush_timeout_ms (its outcome goes to write_health)."""
        timeout_s = self.config.flush_timeout_ms / 1000 or None
        payload = f"{self.incarnation} {time.time():.3f}\n".encode()
        try:
            async with asyncio.timeout(timeout_s):
                await self.store.put(probe_key(self.broker_label), payload)
        except TimeoutError:
            exc = ObjectStoreUnavailable(
                f"a {len(payload)}-byte PUT did not return within {timeout_s:g}s"
            )
            self.write_health.failed(exc)
            raise exc from None

    def _write_health_changed(self, problem: str | None) -> None:
        metrics.STORE_UNWRITABLE.labels(self.broker_label).set(0 if problem is None else 1)
        if self.on_store_state is not None and problem is None:
            try:  # partitions that failed to open while it was down are looked at again
                self.on_store_state(None)
            except Exception:
                log.exception("store state listener failed")

    async def stop(self) -> None:
        """Stop accepting appends, flush, close every partition cleanly."""
        if self._stopped:
            return
        self._stopped = True
        results = await asyncio.gather(
            *(self.close_partition(tp) for tp in list(self._partitions)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning("closing a partition on stop failed: %r", result)
        await self._cancel_everything(PartitionClosing("the storage engine stopped"))
        if self._owns_store:
            await self.raw_store.close()
        log.info("storage engine of broker %s stopped", self.broker_label)

    async def abandon(self) -> None:
        """Simulate a crash (kill -9): stop every task at once, write nothing more. The next
        owner of each partition finds an unclean checkpoint and replays this broker's WAL."""
        self._stopped = True
        for p in self._partitions.values():
            p.abandon()
        self._partitions.clear()
        self.upkeep = UpkeepSchedule()
        await self._cancel_everything(PartitionClosing("the storage engine was abandoned"))

    async def _cancel_everything(self, error: BaseException) -> None:
        left = self.writer.abandon(error)
        by_partition: dict[int, tuple[Partition, list[PendingAppend[Partition]]]] = {}
        for a in left:
            by_partition.setdefault(id(a.partition), (a.partition, []))[1].append(a)
        for p, appends in by_partition.values():
            p.fail_appends(appends, error)
        tasks = [*self._loops, *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loops = []
        self._update_gauges()

    # ---------------------------------------------------------------- WAL completion
    def _flush_completed(self, flush: Flush[Partition]) -> None:
        if flush.error is None:
            self.tracker.written(flush.seq, flush.key, {p.tracker_key for p, _, _ in flush.groups})
            for p, entry, views in flush.groups:
                p.flush_completed(entry, flush.key, views, None)
            return
        groups: dict[int, tuple[Partition, list[tuple[PendingAppend[Partition], memoryview]]]] = {}
        for a in flush.appends:
            groups.setdefault(id(a.partition), (a.partition, []))[1].append((a, memoryview(b"")))
        for p, views in groups.values():
            p.flush_completed(None, flush.key, views, flush.error)

    # ---------------------------------------------------------------- partitions
    def get(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    def high_watermark_advanced(self, tp: TopicPartition) -> None:
        """Called by an open partition whose high watermark moved."""
        self._changed.add(tp)

    def partition_changed(self, p: Partition) -> None:
        """Called by an open partition on every change its next checkpoint carries."""
        self.upkeep.changed(p)

    def take_changed(self) -> set[TopicPartition]:
        """The partitions opened, closed, fenced or whose high watermark advanced since the
        last call (O(changed): what a heartbeat reports)."""
        changed, self._changed = self._changed, set()
        return changed

    def partitions(self) -> list[TopicPartition]:
        """The partitions open here (in no particular order)."""
        return list(self._partitions)

    def has_topic(self, name: str) -> bool:
        """Whether any partition of topic `name` is open here (O(1))."""
        return self._partitions.has_topic(name)

    async def open_partition(
        self,
        tp: TopicPartition,
        topic_id: str,
        leader_epoch: int,
        config: PartitionConfig,
        *,
        created: bool = False,
        end_offset_floor: int = 0,
        accepted_from: int | None = None,
    ) -> Partition:
        if self._stopped:
            raise PartitionClosing("the storage engine is stopped")
        if self._identity is not None and self._identity_checked != self._identity:
            await self.check_identity()  # the first open after a new cluster id: look first
        if self.store_problem is not None:
            raise StoreLost(f"{tp}: {self.store_problem}")
        if tp not in self._partitions and tp not in self._open_locks:
            # never opened or closed through the lock here: a new partition opens at once
            # (no await, so no lock needed, and no Lock object made: a creation opens thousands)
            partition = self._open_new(tp, topic_id, leader_epoch, config, created, accepted_from)
            if partition is not None:
                self._partitions[tp] = partition
                self._changed.add(tp)
                self._update_gauges()
                return partition
        async with self._open_lock(tp):
            existing = self._partitions.get(tp)
            if existing is not None:
                if existing.topic_id == topic_id and existing.leader_epoch == leader_epoch:
                    self._set_config(existing, config)
                    return existing
                if existing.topic_id == topic_id and leader_epoch < existing.leader_epoch:
                    raise PartitionFenced(
                        f"{tp}: epoch {leader_epoch} is older than the open epoch {existing.leader_epoch}"
                    )
                await self._close_locked(tp)
            partition = await self._open(
                tp, topic_id, leader_epoch, config, created, end_offset_floor, accepted_from
            )
            self._partitions[tp] = partition
            self._changed.add(tp)
            if len(partition.index) or partition.config.compacted:
                self.upkeep.changed(partition)  # its passes set their deadlines
            self._update_gauges()
            return partition

    async def _open(
        self,
        tp: TopicPartition,
        topic_id: str,
        epoch: int,
        config: PartitionConfig,
        created: bool = False,
        floor: int = 0,
        accepted_from: int | None = None,
    ) -> Partition:
        new = self._open_new(tp, topic_id, epoch, config, created, accepted_from)
        if new is not None:
            return new
        key = keys.checkpoint_key(tp, topic_id)
        loaded = await self.checkpoints.load(key)
        if loaded is None:
            if created and accepted_from is None:
                # the partition existed (a broker opened it) and its checkpoint is gone: never
                # start it over at offset 0 as if it were new
                raise PartitionDataLost(
                    tp, expected_end=floor, found_end=0, reason="checkpoint missing"
                )
            start = accepted_from or 0
            fresh = self._new_checkpoint(tp, topic_id, epoch, start)
            if accepted_from is None:
                # Never stored by anyone (an earlier leader had no data and wrote nothing):
                # new, as at epoch 0, its first checkpoint written before its first data (with
                # If-None-Match: fenced if someone stored one meanwhile)
                metrics.RECOVERIES.labels(self.broker_label, "new").inc()
                log.debug("%s: created (epoch %d; stored with its first data)", tp, epoch)
                return Partition(self, tp, topic_id, epoch, config, fresh, None)
            try:
                etag = await self.checkpoints.commit(key, fresh, None)
                metrics.RECOVERIES.labels(self.broker_label, "new").inc()
                if start:
                    log.warning(
                        "%s: created again at offset %d after an accepted data loss (epoch %d)",
                        tp,
                        start,
                        epoch,
                    )
                else:
                    log.info("%s: created (epoch %d)", tp, epoch)
                return Partition(self, tp, topic_id, epoch, config, fresh, etag)
            except PartitionFenced:
                loaded = await self.checkpoints.load(key)  # created by someone else meanwhile
                if loaded is None:
                    raise
        cp, etag = loaded
        if cp.leader_epoch > epoch:
            raise PartitionFenced(
                f"{tp}: checkpoint carries epoch {cp.leader_epoch}, newer than {epoch} "
                f"(owner broker {cp.owner_broker})"
            )
        producers = ProducerStateTable.from_json(cp.producers)  # type: ignore[arg-type]
        producers.load_txn_json(cp.transactions)
        aborted = AbortedTxns.from_json(cp.aborted_txns)
        index = list(cp.index)
        next_offset = cp.next_offset
        if cp.clean_shutdown:
            kind = "clean"
        else:
            kind = "unclean"
            started = time.monotonic()
            tail = await recover_tail(self.store, cp)
            now_ms = int(time.time() * 1000)
            for batch in tail.producers:
                done = producers.apply_tuple(batch, now_ms)
                if done is not None and done.aborted:
                    aborted.add(done.producer_id, done.first_offset, done.last_offset)
            index.extend(tail.entries)
            next_offset = tail.next_offset
            log.info(
                "%s: recovered offsets %d-%d from %d WAL objects of broker %s/%s in %.3fs "
                "(%d entries skipped)",
                tp,
                cp.next_offset,
                next_offset - 1,
                tail.objects_scanned,
                cp.owner_broker,
                cp.owner_incarnation,
                time.monotonic() - started,
                tail.skipped,
            )
        log_start = cp.log_start_offset
        if accepted_from is not None and next_offset < accepted_from:
            # an operator accepted the loss of [next_offset, accepted_from): continue after it,
            # so no offset is ever reused with other data
            log.warning(
                "%s: log ends at %d; continuing at %d after an accepted data loss",
                tp,
                next_offset,
                accepted_from,
            )
            next_offset = log_start = accepted_from
            index = []
            producers.truncate_from(next_offset)
            aborted.drop_before(next_offset)
        elif next_offset < floor:
            raise PartitionDataLost(
                tp,
                expected_end=floor,
                found_end=next_offset,
                reason=f"checkpoint ends at {next_offset}, expected at least {floor}",
            )
        mine = Checkpoint(
            topic=tp.topic,
            topic_id=topic_id,
            partition=tp.partition,
            leader_epoch=epoch,
            owner_broker=self.broker_label,
            owner_incarnation=self.incarnation,
            wal_position=self.writer.completed_seq,
            log_start_offset=log_start,
            next_offset=next_offset,
            clean_shutdown=False,
            index=index,
            producers=producers.to_json(),
            transactions=producers.txn_to_json(),
            aborted_txns=aborted.to_json(),
            # the cleaner's progress stays valid: it only ever lies below the old log end
            cleaner=dict(cp.cleaner) if index else {},
        )
        metrics.RECOVERIES.labels(self.broker_label, kind).inc()
        if kind == "clean" and accepted_from is None:
            # A clean handover (the earlier leader closed it and wrote everything): nobody
            # writes it until we do, so our checkpoint (the new epoch) is stored before our
            # first data, with If-Match on the one we read (writer.before_put), not now: a
            # rebalance of thousands of partitions costs each target one read per partition.
            log.info(
                "%s: opened (clean, epoch %d -> %d, offsets %d-%d; stored with its first data)",
                tp,
                cp.leader_epoch,
                epoch,
                log_start,
                next_offset,
            )
            return Partition(self, tp, topic_id, epoch, config, mine, etag, epoch_stored=False)
        etag = await self.checkpoints.commit(key, mine, etag)
        log.info(
            "%s: opened (%s, epoch %d -> %d, offsets %d-%d)",
            tp,
            kind,
            cp.leader_epoch,
            epoch,
            log_start,
            next_offset,
        )
        return Partition(self, tp, topic_id, epoch, config, mine, etag)

    def _open_new(
        self,
        tp: TopicPartition,
        topic_id: str,
        epoch: int,
        config: PartitionConfig,
        created: bool,
        accepted_from: int | None,
    ) -> Partition | None:
        """A new partition, or None when it may have data. Epoch 0 means no broker led it
        before us (every change of leader bumps the epoch), so there is nothing to read. Its
        first checkpoint is written before the first flush holding its data
        (writer.before_put), not now: creating many partitions costs no store round trip each.
        Only a first open here can be new (`_opened_once`)."""
        if epoch != 0 or created or accepted_from is not None:
            return None
        opened = self._opened_once.get((tp.topic, topic_id))
        if opened is None:
            opened = self._opened_once[(tp.topic, topic_id)] = set()
        elif tp.partition in opened:
            return None
        opened.add(tp.partition)
        fresh = self._new_checkpoint(tp, topic_id, epoch, 0)
        return Partition(self, tp, topic_id, epoch, config, fresh, None)

    def _new_checkpoint(
        self, tp: TopicPartition, topic_id: str, epoch: int, start: int = 0
    ) -> Checkpoint:
        return Checkpoint(
            topic=tp.topic,
            topic_id=topic_id,
            partition=tp.partition,
            leader_epoch=epoch,
            owner_broker=self.broker_label,
            owner_incarnation=self.incarnation,
            wal_position=self.writer.completed_seq,
            log_start_offset=start,
            next_offset=start,
        )

    # ---------------------------------------------------------------- the store's identity
    def expect_identity(self, cluster_id: str, store_marker: bool) -> None:
        """The metadata this broker got names the cluster (and whether the store holds its
        identity marker). The next open checks the store first; the loop keeps checking."""
        if not cluster_id or self._identity == (cluster_id, store_marker):
            return
        self._identity = (cluster_id, store_marker)
        if self._started and not self._stopped:
            self.spawn(self.check_identity(), "identity check")

    async def check_identity(self) -> str | None:
        """Read the marker and compare; on a change of verdict stop (or resume) serving.
        Returns the problem, None when the store may be used."""
        async with self._identity_lock:
            expected = self._identity
            if expected is None:
                return self.store_problem
            try:
                found = await read_identity(self.store)
            except ObjectStoreUnavailable as exc:
                # an unreachable store is not a wiped one: keep the last verdict
                log.debug("identity check failed: %s", exc)
                return self.store_problem
            problem = identity_problem(found, *expected)
            self._identity_checked = expected
            if problem != self.store_problem:
                self._store_state_changed(problem)
            return problem

    def _store_state_changed(self, problem: str | None) -> None:
        self.store_problem = problem
        metrics.STORE_LOST.labels(self.broker_label).set(0 if problem is None else 1)
        if problem is not None:
            log.warning(
                "object store lost (%s): every partition stops serving; nothing is "
                "read from or written into the store",
                problem,
            )
            error = StoreLost(problem)
            # drop every open partition without writing (no checkpoint, no WAL, no ack): when the
            # store is back they open again through the usual checks
            for p in list(self._partitions.values()):
                p.fence(error)
                self.upkeep.forget(p)
                self.tracker.released(p.tracker_key)
            self._partitions.clear()
            self._update_gauges()
        else:
            log.warning("object store identity verified again: partitions open again")
        if self.on_store_state is not None:
            try:
                self.on_store_state(problem)
            except Exception:
                log.exception("store state listener failed")

    async def update_config(self, tp: TopicPartition, config: PartitionConfig) -> None:
        p = self._partitions.get(tp)
        if p is None:
            raise PartitionClosing(f"{tp} is not open on this broker")
        self._set_config(p, config)

    def _set_config(self, p: Partition, config: PartitionConfig) -> None:
        if p.config != config:
            p.config = config
            self.upkeep.changed(p)  # retention, compaction and cleaning may be due otherwise

    async def close_partition(self, tp: TopicPartition) -> None:
        async with self._open_lock(tp):
            await self._close_locked(tp)

    async def _close_locked(self, tp: TopicPartition) -> None:
        p = self._partitions.get(tp)
        if p is None:
            return
        try:
            await p.close()
        finally:
            if self._partitions.get(tp) is p:
                del self._partitions[tp]
                self._changed.add(tp)
            self.upkeep.forget(p)
            self.tracker.released(p.tracker_key)
            self._update_gauges()

    async def delete_partition(self, tp: TopicPartition, topic_id: str) -> None:
        async with self._open_lock(tp):
            p = self._partitions.pop(tp, None)
            if p is not None:
                self.upkeep.forget(p)
                p.fence()  # fails whatever is pending; nothing of it matters any more
                self.tracker.released(p.tracker_key)
            key = keys.checkpoint_key(tp, topic_id)
            await self.store.delete([key])
            objects = await self.store.list(keys.partition_prefix(tp, topic_id))
            if objects:
                await self.delete_objects([o.key for o in objects], "segment", "delete")
            self._update_gauges()
        log.info("%s (topic id %s): deleted", tp, topic_id)

    def partition_fenced(self, p: Partition) -> None:
        """A checkpoint commit lost: another owner has the partition now."""
        if p.state is State.FENCED:
            return
        log.warning("%s: fenced by another owner; no longer serving it", p.tp)
        p.fence()
        if self._partitions.get(p.tp) is p:
            del self._partitions[p.tp]
            self._changed.add(p.tp)
        self.upkeep.forget(p)
        self.tracker.released(p.tracker_key)
        self._update_gauges()
        if self._on_fenced is not None:
            self.spawn(self._on_fenced(p.tp), f"on-fenced {p.tp}")

    async def _store_new_partitions(self, flush: Flush[Partition]) -> None:
        """Before a WAL object holding data of partitions not stored yet is written: store
        their first checkpoints (all at once), so no record is acknowledged, or visible, before
        its partition's checkpoint exists. A failure fails the flush (the producers retry)."""
        new = {id(p): p for p, _, _ in flush.groups if p.unstored}
        if new:
            await asyncio.gather(*(p.store_first() for p in new.values()))

    def first_stored(self, p: Partition) -> None:
        if self.on_stored is not None:
            try:
                self.on_stored(p)
            except Exception:
                log.exception("on_stored listener failed")

    def checkpoint_committed(self, p: Partition, cp: Checkpoint) -> None:
        free = self.tracker.committed(
            p.tracker_key, cp.wal_position, {e.key for e in cp.index if e.in_wal}
        )
        if free:
            self.spawn(self.delete_objects(free, "wal", "refcount"), "delete unreferenced WAL")

    async def delete_objects(self, object_keys: list[str], kind: str, path: str) -> None:
        await self.store.delete(object_keys)
        metrics.GARBAGE_DELETED.labels(self.broker_label, kind, path).inc(len(object_keys))

    # ---------------------------------------------------------------- upkeep passes
    # Each pass looks only at the partitions that changed since it last ran or whose deadline
    # came (upkeep.py), never at every open partition: a broker with 50,000 open partitions and
    # 200 being written does the work of 200.
    async def _each_partition(
        self,
        name: str,
        chosen: list[Partition],
        fn: Callable[[Partition], Awaitable[object]],
        parallel: int,
        then: Callable[[Partition], None],
    ) -> None:
        """`fn` on each partition of `chosen` still open here, then `then` (it says when pass
        `name` looks at the partition again), whatever `fn` did. One not open right now (a
        rollback in progress) is looked at again by the next pass."""
        semaphore = asyncio.Semaphore(parallel)

        def here(p: Partition) -> bool:
            return self._partitions.get(p.tp) is p

        async def one(p: Partition) -> None:
            async with semaphore:
                if p.state is not State.OPEN or self.store_problem is not None:
                    if here(p):
                        self.upkeep.again(name, p)
                    return
                try:
                    await fn(p)
                except PartitionFenced:
                    pass  # already handed back
                except StorageError as exc:
                    log.warning("%s: %s failed: %s", p.tp, getattr(fn, "__name__", fn), exc)
                finally:
                    if here(p):
                        if p.state is State.OPEN:
                            then(p)
                        else:
                            self.upkeep.again(name, p)

        if chosen:
            await asyncio.gather(*(one(p) for p in chosen))

    async def checkpoint_all(self) -> None:
        chosen = [p for p in self.upkeep.take(CHECKPOINTS, 0.0) if p.dirty]
        await self._each_partition(
            CHECKPOINTS,
            chosen,
            lambda p: p.commit_checkpoint(),
            _PARALLEL_UPKEEP,
            self._checkpoint_again,
        )

    def _checkpoint_again(self, p: Partition) -> None:
        if p.dirty:  # the commit failed, or something changed meanwhile
            self.upkeep.again(CHECKPOINTS, p)

    async def compact_all(self) -> None:
        chosen = self.upkeep.take(COMPACTION, time.monotonic())
        await self._each_partition(
            COMPACTION,
            chosen,
            self.compact_partition,
            _PARALLEL_COMPACTIONS,
            self._schedule_compaction,
        )

    def _schedule_compaction(self, p: Partition) -> None:
        """A partition with WAL ranges left is compacted when its oldest has waited
        compaction_idle_s (sooner if it grows past the thresholds: a flush is a change)."""
        if p.index.wal_ranges():
            wait = max(0.0, self.config.compaction_idle_s - p.wal_age_s())
            self.upkeep.due_at(COMPACTION, p, time.monotonic() + wait)

    async def clean_all(self) -> None:
        """One round of the log cleaner over the compacted partitions that changed or are due
        (upkeep.py): a pass over each that needs one (overdue first, then the dirtiest),
        `cleaner_threads` at a time; the others are looked at again when time alone could make
        them cleanable (LogCleaner.next_due) or on their next change."""
        threads = self.config.cleaner_threads
        if threads <= 0:
            return
        now = int(time.time() * 1000)
        candidates = [p for p in self.upkeep.take(CLEANER, now) if self.cleaner.wanted(p)]
        chosen = self.cleaner.choose(candidates, now)
        picked = set(chosen)
        for p in candidates:
            if p not in picked:
                self._schedule_cleaning(p)
        for i in range(0, len(chosen), threads):  # in priority order
            await self._each_partition(
                CLEANER, chosen[i : i + threads], self.cleaner.clean, threads,
                self._schedule_cleaning,
            )  # fmt: skip

    def _schedule_cleaning(self, p: Partition) -> None:
        self.upkeep.due_at(CLEANER, p, self.cleaner.next_due(p, int(time.time() * 1000)))

    async def apply_retention_all(self) -> None:
        chosen = self.upkeep.take(RETENTION, time.time() * 1000)
        await self._each_partition(
            RETENTION, chosen, self.apply_retention, _PARALLEL_UPKEEP, self._schedule_retention
        )

    def _schedule_retention(self, p: Partition) -> None:
        """Next when its oldest segment expires by time; by size, only when it grows."""
        cfg = p.config
        if "delete" not in cfg.cleanup_policy:
            return
        entries = p.index.entries
        left = retention_log_start(
            entries,
            now_ms=int(time.time() * 1000),
            retention_ms=cfg.retention_ms,
            retention_bytes=cfg.retention_bytes,
        )
        if left is not None and left > p.log_start_offset:
            self.upkeep.again(RETENTION, p)  # the pass failed: the next one tries again
            return
        self.upkeep.due_at(RETENTION, p, oldest_segment_expiry_ms(entries, cfg.retention_ms))

    async def compact_partition(self, p: Partition, *, force: bool = False) -> int:
        """Copy WAL ranges into segments; returns the number of segments written."""
        cfg = self.config
        policy = CompactionPolicy(
            cfg.compaction_min_ranges,
            cfg.compaction_min_bytes,
            0.0 if force else cfg.compaction_idle_s,
            p.config.segment_bytes,
            cfg.index_granule_bytes,
        )
        entries = p.index.entries
        if not should_compact(entries, p.wal_age_s(), policy):
            return 0
        written = 0
        plans = plan_segments(
            entries,
            policy.segment_bytes,
            now_ms=int(time.time() * 1000),
            merge_max_age_ms=merge_max_age_ms(p.config),
            jitter_bound_ms=roll_jitter_bound_ms(p.config),
        )
        reads = asyncio.Semaphore(8)

        async def read(entry: IndexEntry) -> list[memoryview]:
            async with reads:
                return await p.read_entry_parts(entry)

        for sources in plans:
            # the segment is the sources' bytes one after the other: the store writes the parts
            # as they are (no copy into one segment buffer on the event loop)
            parts = [
                part for got in await asyncio.gather(*(read(e) for e in sources)) for part in got
            ]
            size = sum(len(part) for part in parts)
            key = keys.segment_key(p.tp, p.topic_id, sources[0].base_offset)
            await self.store.put(key, parts, if_none_match=True)
            del parts
            new = segment_entries(key, sources, policy.granule_bytes)
            try:
                swapped = await p.swap_index(sources, new)
            except BaseException:
                await self._delete_quietly([key])
                metrics.COMPACTIONS.labels(self.broker_label, "failed").inc()
                raise
            if not swapped:
                await self._delete_quietly([key])
                metrics.COMPACTIONS.labels(self.broker_label, "raced").inc()
                continue
            written += 1
            replaced = {e.key for e in sources if not e.in_wal} - p.index.keys()
            if replaced:  # a small segment merged into the new one
                await self.delete_objects(sorted(replaced), "segment", "compaction")
            metrics.COMPACTIONS.labels(self.broker_label, "ok").inc()
            metrics.COMPACTED_BYTES.labels(self.broker_label).inc(size)
        return written

    async def _delete_quietly(self, object_keys: list[str]) -> None:
        try:
            await self.store.delete(object_keys)
        except ObjectStoreUnavailable as exc:
            log.warning("could not delete %s (the sweep will): %s", object_keys, exc)

    async def apply_retention(self, p: Partition) -> int:
        """Drop expired segments; returns how many segment objects were deleted. As in Kafka,
        `retention.ms` and `retention.bytes` apply only to a `cleanup.policy` with `delete`: a
        compact-only log keeps every key's latest record however old (docs/compaction.md)."""
        cfg = p.config
        if "delete" not in cfg.cleanup_policy:
            return 0
        new_start = retention_log_start(
            p.index.entries,
            now_ms=int(time.time() * 1000),
            retention_ms=cfg.retention_ms,
            retention_bytes=cfg.retention_bytes,
        )
        if new_start is None or new_start <= p.log_start_offset:
            return 0
        gone = await p.advance_log_start(min(new_start, p.high_watermark))
        if gone:
            await self.delete_objects(gone, "segment", "retention")
            metrics.RETENTION_SEGMENTS.labels(self.broker_label).inc(len(gone))
        return len(gone)

    async def collect_garbage(self) -> int:
        """The sweep: delete WAL objects and segments no checkpoint needs (see garbage.py)."""
        if self.store_problem is not None:
            return 0  # a wiped store has nothing to sweep; a foreign one is not ours to touch
        now = time.time()
        wal_objects = await self.store.list(keys.WAL_ROOT)
        partition_objects = await self.store.list(keys.PARTITIONS_ROOT)
        semaphore = asyncio.Semaphore(16)

        async def load(listed: ObjectInfo) -> tuple[ObjectInfo, Checkpoint | None]:
            async with semaphore:
                loaded = await self.checkpoints.load(listed.key)
                return listed, None if loaded is None else loaded[0]

        cache = self.swept_checkpoints
        stale = cache.to_load(
            o
            for o in partition_objects
            if (pk := keys.parse_partition_key(o.key)) is not None and pk.kind == "checkpoint"
        )
        for listed, cp in await asyncio.gather(*(load(o) for o in stale)):
            cache.put(listed, cp)
        checkpoints = cache.refs()
        wal = wal_garbage(
            wal_objects,
            checkpoints,
            now_s=now,
            grace_s=self.config.garbage_grace_s,
            keep=self.tracker.keys(),
        )
        segments = segment_garbage(
            partition_objects, checkpoints, now_s=now, grace_s=self.config.garbage_grace_s
        )
        if wal:
            await self.delete_objects(wal, "wal", "sweep")
        if segments:
            await self.delete_objects(segments, "segment", "sweep")
        if wal or segments:
            log.info(
                "garbage sweep deleted %d WAL objects and %d segments", len(wal), len(segments)
            )
        return len(wal) + len(segments)
