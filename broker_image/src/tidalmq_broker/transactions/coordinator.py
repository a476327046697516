"""The transaction coordinator: transactional ids, durable in `__transaction_state`.

Modelled on the group coordinator (groups/coordinator.py): transactional id T is coordinated by
the broker leading partition `abs(hash(T)) % partitions` of `__transaction_state`. When that
partition opens here its log is replayed into a TxnShard (the latest record of each id wins);
when it closes (a move, a drain) the shard stops and clients get NOT_COORDINATOR, find the new
coordinator and retry there. Every change is appended and acknowledged by the storage engine
before it is answered or acted on.

EndTxn logs Prepare* (the point of no return), answers, then has the markers written into every
partition of the transaction (WriteTxnMarkers semantics; `markers.py` reaches the leaders),
retrying a partition until its leader acknowledges, across leader changes and moves, and then
logs Complete*. A coordinator that loads a partition holding Prepare* resumes those markers.
The coordinator epoch in the markers is the leader epoch of the `__transaction_state`
partition, so a deposed coordinator's markers are refused by the partitions that saw newer ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode
from tidalmq_core.deadlines import DeadlineQueue
from tidalmq_core.metadata import TXN_STATE_TOPIC
from tidalmq_core.model import TopicPartition

from tidalmq_broker.internal_shards import InternalShards, replay
from tidalmq_broker.protocol.records import build_batch
from tidalmq_broker.storage.api import PartitionLog, StorageError
from tidalmq_broker.transactions import state as txn
from tidalmq_broker.transactions.records import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for_transactional_id,
)
from tidalmq_broker.transactions.state import TxnError, TxnMetadata, TxnState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TxnSettings:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms (Kafka: 10 s)
    timeout_check_interval_s: float = 10.0
    marker_backoff_s: float = 0.1  # first retry of a marker; doubles up to marker_backoff_max_s
    marker_backoff_max_s: float = 2.0
    # transactional.id.expiration.ms (Kafka: 7 days): an id with no transaction open and no
    # change for this long is forgotten; checked every id_expiration_check_interval_s
    # (transaction.remove.expired.transaction.cleanup.interval.ms, Kafka: 1 hour)
    id_expiration_ms: int = 604_800_000
    id_expiration_check_interval_s: float = 3600.0
    # rewrite every transactional id's state and trim the log before it after this many records,
    # so replay stays short (as the group coordinator does); not on a compacted log, which the
    # log cleaner keeps short
    snapshot_after_records: int = 20_000


@dataclass(frozen=True, slots=True)
class Marker:
    """One WriteTxnMarkers entry for one partition."""

    tp: TopicPartition
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


MarkerSender = Callable[[list[Marker]], Awaitable[dict[TopicPartition, int]]]
"""Writes markers at their partitions' leaders; the Kafka error code of each (NONE: durable)."""

ProducerIds = Callable[[], Awaitable[int]]
Clock = Callable[[], int]  # milliseconds


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class TxnShard:
    """The transactional ids of one `__transaction_state` partition led by this broker."""

    def __init__(
        self,
        partition: int,
        plog: PartitionLog,
        settings: TxnSettings,
        send_markers: MarkerSender,
        allocate_producer_id: ProducerIds,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.partition = partition
        self._log = plog
        self._settings = settings
        self._send_markers = send_markers
        self._allocate = allocate_producer_id
        self._clock = clock
        self.coordinator_epoch = plog.leader_epoch
        self.txns: dict[str, TxnMetadata] = {}
        # ongoing transactions by when they time out: the timeout check takes the due ones
        # instead of walking every transactional id of the shard each interval
        self._timeouts: DeadlineQueue[str] = DeadlineQueue()
        self.loaded = asyncio.Event()
        self._closed = False
        self._records_since_snapshot = 0
        self._writes_open = asyncio.Event()  # cleared while a snapshot writes and trims
        self._writes_open.set()
        self._writes_in_flight = 0
        self._writes_drained = asyncio.Event()
        self._writes_drained.set()
        self._snapshotting: asyncio.Task[None] | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._completing: dict[str, asyncio.Task[None]] = {}
        self._ticker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def load(self) -> None:
        """Replay the log from its start: the latest record of each transactional id wins."""
        started = time.perf_counter()
        count = 0
        async for record in replay(self._log, lambda: self._closed):
            if record.header.is_control:
                continue
            tid = decode_key(record.key)
            if record.value is None:
                self.txns.pop(tid, None)
            else:
                self.txns[tid] = decode_value(tid, record.value)
            count += 1
        self._records_since_snapshot = count
        for meta in self.txns.values():
            self._track(meta)
        self.loaded.set()
        for meta in self.txns.values():
            if meta.state.preparing:  # past the point of no return: finish it
                self._spawn_completion(meta.transactional_id)
        self._ticker = asyncio.create_task(self._tick(), name=f"txn timeouts {self.partition}")
        (log.info if count else log.debug)(
            "%s-%d: loaded %d transactional ids from %d records in %.0f ms",
            TXN_STATE_TOPIC,
            self.partition,
            len(self.txns),
            count,
            (time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        for task in self._completing.values():
            task.cancel()
        if self._snapshotting is not None:
            self._snapshotting.cancel()

    # ------------------------------------------------------------------ requests
    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> tuple[int, int]:
        if not 0 < timeout_ms <= self._settings.max_timeout_ms:
            raise TxnError(
                ErrorCode.invalid_transaction_timeout,
                f"transaction timeout {timeout_ms} ms is not in 1..{self._settings.max_timeout_ms}"
                " (transaction.max.timeout.ms)",
            )
        async with self._lock(transactional_id):
            now = self._clock()
            meta = self.txns.get(transactional_id)
            if meta is None:
                if expected is not None and expected[0] >= 0:
                    raise TxnError(ErrorCode.invalid_producer_id_mapping)
                new = txn.new_producer(transactional_id, await self._allocate(), timeout_ms, now)
            elif meta.state is TxnState.ONGOING:
                # a new incarnation while the old one's transaction is open: abort it first
                # (fencing the old epoch); the producer retries until it is complete
                await self._write(txn.fence_and_abort(meta, now))
                self._spawn_completion(transactional_id)
                raise TxnError(ErrorCode.concurrent_transactions)
            else:
                bumped = txn.reinit(meta, timeout_ms=timeout_ms, now_ms=now, expected=expected)
                if bumped is None:  # epoch exhausted: a new producer id
                    new = txn.new_producer(
                        transactional_id, await self._allocate(), timeout_ms, now
                    )
                else:
                    new = bumped
            await self._write(new)
            return new.producer_id, new.producer_epoch

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[tuple[str, int]],
        *,
        tv2: bool = False,
    ) -> None:
        """AddPartitionsToTxn / AddOffsetsToTxn, or (`tv2`) the implicit add of a transaction
        version 2 client's Produce v12 / TxnOffsetCommit v5: answered once durable."""
        async with self._lock(transactional_id):
            meta = self._get(transactional_id)
            new = txn.add_partitions(
                meta, producer_id, producer_epoch, partitions, self._clock(), tv2=tv2
            )
            if new is not None:
                await self._write(new)

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:
        meta = self.txns.get(transactional_id)
        return txn.verify_partitions(meta, producer_id, producer_epoch, partitions)

    async def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        tv2: bool = False,
    ) -> tuple[int, int]:
        """EndTxn; answers the producer id and epoch of the producer's next transaction (EndTxn
        v5): bumped for a TV2 transaction (`tv2`: v5 at transaction.version 2), else as is."""
        async with self._lock(transactional_id):
            meta = self._get(transactional_id)
            next_pid = -1
            if txn.needs_new_producer_id(meta, producer_epoch, tv2=tv2):
                next_pid = await self._allocate()
            new = txn.prepare_end(
                meta,
                producer_id,
                producer_epoch,
                commit,
                self._clock(),
                tv2=tv2,
                next_producer_id=next_pid,
            )
            if new is None:
                return txn.end_answer(meta)  # already completed that way: a retry
            await self._write(new)  # the point of no return
        self._spawn_completion(transactional_id)
        return txn.end_answer(new)

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.txns.get(transactional_id)

    # ------------------------------------------------------------------ markers
    def _spawn_completion(self, transactional_id: str) -> None:
        running = self._completing.get(transactional_id)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(
            self._complete(transactional_id), name=f"txn markers {transactional_id}"
        )
        self._completing[transactional_id] = task
        task.add_done_callback(lambda t: self._completing.pop(transactional_id, None))

    async def _complete(self, transactional_id: str) -> None:
        """Write the markers of a prepared transaction until every partition has one, then
        log Complete*. Stops (without completing) when the shard closes: the next
        coordinator resumes from the Prepare* record."""
        meta = self.txns[transactional_id]
        commit = meta.state is TxnState.PREPARE_COMMIT
        pending = {
            TopicPartition(t, p): Marker(
                TopicPartition(t, p),
                meta.producer_id,
                meta.producer_epoch,
                commit,
                self.coordinator_epoch,
            )
            for t, p in meta.partitions
        }
        backoff = self._settings.marker_backoff_s
        while pending and not self._closed:
            try:
                results = await self._send_markers(list(pending.values()))
            except Exception as exc:  # a transport failure: retry them all
                log.warning("%s: markers failed: %s", transactional_id, exc)
                results = {}
            for tp, code in results.items():
                if code == ErrorCode.none:
                    pending.pop(tp, None)
                elif code in (
                    ErrorCode.unknown_topic_or_partition,
                    ErrorCode.invalid_producer_epoch,
                    ErrorCode.transaction_coordinator_fenced,
                ):
                    # the partition is gone, or a newer epoch/coordinator already wrote past
                    # this transaction: no marker of ours can ever be written there
                    log.warning(
                        "%s: marker for %s not written: %s",
                        transactional_id,
                        tp,
                        ErrorCode(code).name,
                    )
                    pending.pop(tp, None)
            if pending:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._settings.marker_backoff_max_s)
        if self._closed:
            return
        async with self._lock(transactional_id):
            current = self.txns.get(transactional_id)
            if current is None or not current.state.preparing:
                return
            try:
                await self._write(txn.complete(current, self._clock()))
            except TxnError as exc:
                log.warning("%s: logging the completion failed: %s", transactional_id, exc)
                if not self._closed:
                    self._spawn_later(transactional_id)
                return
        log.debug("%s: transaction %s", transactional_id, "committed" if commit else "aborted")

    def _spawn_later(self, transactional_id: str) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(
            1.0, lambda: None if self._closed else self._spawn_completion(transactional_id)
        )

    # ------------------------------------------------------------------ timeouts
    async def _tick(self) -> None:
        last_expiry = time.monotonic()
        while not self._closed:
            await asyncio.sleep(self._settings.timeout_check_interval_s)
            try:
                await self.abort_expired()
            except Exception:
                log.exception("%s-%d: transaction timeouts failed", TXN_STATE_TOPIC, self.partition)
            if time.monotonic() - last_expiry >= self._settings.id_expiration_check_interval_s:
                last_expiry = time.monotonic()
                try:
                    await self.expire_ids()
                except Exception:
                    log.exception(
                        "%s-%d: expiring transactional ids failed", TXN_STATE_TOPIC, self.partition
                    )

    async def abort_expired(self) -> list[str]:
        """Abort (bumping the epoch) every ongoing transaction past its timeout."""
        aborted = []
        now = self._clock()
        due = [m for tid in self._timeouts.pop_due(now) if (m := self.txns.get(tid)) is not None]
        for meta in txn.expired(due, now):
            tid = meta.transactional_id
            async with self._lock(tid):
                current = self.txns.get(tid)
                if current is None or not current.expired(self._clock()):
                    continue
                try:
                    await self._write(txn.fence_and_abort(current, self._clock()))
                except TxnError as exc:
                    log.warning("%s: aborting the timed-out transaction failed: %s", tid, exc)
                    self._timeouts.schedule(tid, self._clock())  # the next check tries again
                    continue
            log.info("%s: transaction timed out after %d ms: aborting", tid, meta.timeout_ms)
            self._spawn_completion(tid)
            aborted.append(tid)
        return aborted

    async def expire_ids(self, chunk: int = 500) -> list[str]:
        """Forget the transactional ids with no transaction open and no change for
        transactional.id.expiration.ms (Kafka's removeExpiredTransactionalIds): a tombstone per
        id in the log (a replay forgets it too), gone from describe and list; its next
        InitProducerId starts it again with a new producer id. Ids busy with a request are left
        for the next pass. Tombstones go `chunk` to a batch, so a pass costs O(expired ids)
        appends / `chunk`, not one WAL flush each."""
        expiration = self._settings.id_expiration_ms
        candidates = txn.expired_ids(list(self.txns.values()), self._clock(), expiration)
        removed: list[str] = []
        for i in range(0, len(candidates), chunk):
            held: list[tuple[str, asyncio.Lock]] = []
            try:
                for meta in candidates[i : i + chunk]:
                    tid = meta.transactional_id
                    lock = self._lock(tid)
                    if lock.locked():
                        continue
                    await lock.acquire()  # free: taken at once, no other task runs meanwhile
                    held.append((tid, lock))
                now = self._clock()
                ids = [
                    t
                    for t, _ in held
                    if (m := self.txns.get(t)) and txn.id_expired(m, now, expiration)
                ]
                if ids:
                    await self._append([(encode_key(t), None) for t in ids])
                    for t in ids:
                        self.txns.pop(t, None)
                        self._timeouts.cancel(t)
                    removed.extend(ids)
            except TxnError as exc:
                log.warning(
                    "%s-%d: expiring transactional ids failed: %s",
                    TXN_STATE_TOPIC,
                    self.partition,
                    exc,
                )
                break
            finally:
                for tid, lock in held:
                    lock.release()
                    if tid not in self.txns and not getattr(lock, "_waiters", None):
                        # nobody waits for it (asyncio.Lock keeps its waiters there): drop it
                        self._locks.pop(tid, None)
        if removed:
            log.info(
                "%s-%d: %d transactional ids expired (no change for %d ms)",
                TXN_STATE_TOPIC,
                self.partition,
                len(removed),
                expiration,
            )
        return removed

    # ------------------------------------------------------------------ persistence
    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def _get(self, transactional_id: str) -> TxnMetadata:
        meta = self.txns.get(transactional_id)
        if meta is None:
            raise TxnError(ErrorCode.invalid_producer_id_mapping)
        return meta

    async def _write(self, meta: TxnMetadata) -> None:
        """Make `meta` durable, then current. A failed append changes nothing. Waits while a
        snapshot is written (it must not trim a record it did not include)."""
        await self._append([(encode_key(meta.transactional_id), encode_value(meta))])
        self.txns[meta.transactional_id] = meta
        self._track(meta)

    def _track(self, meta: TxnMetadata) -> None:
        """An ongoing transaction is due at the first millisecond past its timeout."""
        if meta.state is TxnState.ONGOING:
            self._timeouts.schedule(meta.transactional_id, meta.start_ms + meta.timeout_ms + 1)
        else:
            self._timeouts.cancel(meta.transactional_id)

    async def _append(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Append records (a None value: a tombstone) durably; TxnError if that fails."""
        while not self._writes_open.is_set():
            await self._writes_open.wait()
        if self._closed:
            raise TxnError(ErrorCode.not_coordinator)
        batch = build_batch(list(records), timestamp_ms=self._clock())
        self._writes_in_flight += 1
        self._writes_drained.clear()
        try:
            await self._log.append(batch, acks=-1)
        except StorageError as exc:
            log.warning(
                "%s-%d: logging the transaction state failed: %s",
                TXN_STATE_TOPIC,
                self.partition,
                exc,
            )
            raise TxnError(ErrorCode.coordinator_not_available) from exc
        finally:
            self._writes_in_flight -= 1
            if not self._writes_in_flight:
                self._writes_drained.set()
        self._records_since_snapshot += len(records)
        if (
            self._records_since_snapshot >= self._settings.snapshot_after_records
            and not self._log.config.compacted  # the log cleaner keeps a compacted log short
            and (self._snapshotting is None or self._snapshotting.done())
        ):
            self._records_since_snapshot = 0
            self._snapshotting = asyncio.create_task(
                self.snapshot(), name=f"txn snapshot {self.partition}"
            )

    async def snapshot(self) -> None:
        """Write every transactional id's current state again, then trim the log before it.
        New writes wait and writes in flight finish first, so `txns` is exactly the durable
        state and every record below the trim point is superseded by one written here."""
        self._writes_open.clear()
        try:
            await self._writes_drained.wait()
            if self._closed:
                return
            live = list(self.txns.values())
            start = self._log.high_watermark
            for i in range(0, len(live), 500):
                batch = build_batch(
                    [(encode_key(m.transactional_id), encode_value(m)) for m in live[i : i + 500]],
                    timestamp_ms=self._clock(),
                )
                result = await self._log.append(batch, acks=-1)
                if i == 0:
                    start = result.base_offset
            await self._log.delete_records_before(start)
            log.info(
                "%s-%d: snapshot of %d transactional ids, log trimmed before %d",
                TXN_STATE_TOPIC,
                self.partition,
                len(live),
                start,
            )
        except StorageError as exc:
            log.warning("%s-%d: snapshot failed: %s", TXN_STATE_TOPIC, self.partition, exc)
        finally:
            self._writes_open.set()


class TransactionCoordinator:
    """Routes transactional requests to the shard of the partition their id hashes to."""

    def __init__(
        self,
        settings: TxnSettings,
        state_partitions: Callable[[], int],
        send_markers: MarkerSender,
        allocate_producer_id: ProducerIds,
        create_state_topic: Callable[[], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self._state_partitions = state_partitions
        self._create_state_topic = create_state_topic
        self._creating: asyncio.Task[None] | None = None
        self._shards = InternalShards(
            TXN_STATE_TOPIC,
            "transactions",
            lambda partition, plog: TxnShard(
                partition, plog, settings, send_markers, allocate_producer_id
            ),
        )

    def partition_for(self, transactional_id: str) -> int:
        n = self._state_partitions()
        if n <= 0:
            raise TxnError(ErrorCode.coordinator_not_available)
        return partition_for_transactional_id(transactional_id, n)

    def ensure_state_topic(self) -> None:
        """Have the controller create `__transaction_state` (once at a time, in the
        background: the client is told COORDINATOR_NOT_AVAILABLE meanwhile and retries)."""
        if self._creating is not None and not self._creating.done():
            return

        async def create() -> None:
            try:
                await self._create_state_topic()
            except Exception as exc:
                log.warning("creating %s failed: %s", TXN_STATE_TOPIC, exc)

        self._creating = asyncio.create_task(create(), name=f"create {TXN_STATE_TOPIC}")

    async def on_partition(self, tp: TopicPartition, plog: PartitionLog | None) -> None:
        """PartitionManager hook: load a shard when its partition opens, stop it on close."""
        self._shards.on_partition(tp, plog)

    def shard(self, transactional_id: str) -> TxnShard:
        if not transactional_id:
            raise TxnError(ErrorCode.invalid_request, "transactional id is empty")
        shard = self._shards.get(self.partition_for(transactional_id))
        if shard is None:
            raise TxnError(ErrorCode.not_coordinator)
        if not shard.loaded.is_set():
            raise TxnError(ErrorCode.coordinator_load_in_progress)
        return shard

    def shards(self) -> list[TxnShard]:
        return self._shards.loaded()

    async def close(self) -> None:
        if self._creating is not None:
            self._creating.cancel()
        self._shards.close()
