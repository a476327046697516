"""Idempotent-producer state of one partition: duplicate detection and sequence checks.

Per producer id the partition remembers the epoch and the metadata of its last five batches
(Kafka's window of in-flight requests). The rules follow Kafka's ProducerAppendInfo:

* a lower epoch than known -> InvalidProducerEpoch;
* a new (higher) epoch must start at sequence 0 -> else OutOfOrderSequence; the state resets;
* a batch equal to one of the last five (same epoch, first and last sequence) is a duplicate:
  the append succeeds with the original offsets and nothing is written;
* otherwise the first sequence must follow the last one (mod 2^31) -> else OutOfOrderSequence;
* an unknown producer id must start at sequence 0 -> else UnknownProducerId. We choose
  UNKNOWN_PRODUCER_ID over OUT_OF_ORDER_SEQUENCE_NUMBER because librdkafka and the Java client
  (KIP-360) recover from it by bumping the epoch and resetting sequences, whereas an
  out-of-order error is fatal to a librdkafka idempotent producer. The case arises after the
  producer's state was lost, e.g. expired or its data deleted by retention.

Transactions (KIP-98, docs/transactions.md) add per producer id the first offset of its ongoing
transaction and the last coordinator epoch seen in a marker. The first transactional batch of a
producer with none starts one; a commit/abort marker completes it (`complete`), returning what
the aborted-transactions index needs.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tidalmq_broker.storage.api import (
    InvalidProducerEpoch,
    InvalidTxnState,
    OutOfOrderSequence,
    TransactionCoordinatorFenced,
    UnknownProducerId,
)

WINDOW = 5
PRODUCER_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms default
_SEQ_MOD = 1 << 31

# The kind of a producer batch in the WAL index (its 7th element; absent = IDEMPOTENT)
IDEMPOTENT = 0
TRANSACTIONAL = 1
ABORT_MARKER = 2
COMMIT_MARKER = 3


class BatchMeta(NamedTuple):
    """One of a producer's last batches. A named tuple: two are made per idempotent batch
    (the append's state, the flush's durable state), and a frozen dataclass is built through
    one object.__setattr__ per field."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last_seen_ms: int = 0
    txn_first_offset: int = -1  # first offset of the ongoing transaction; -1 = none
    coordinator_epoch: int = -1  # of the last marker written for this producer id

    def clone(self) -> ProducerEntry:
        return ProducerEntry(
            self.epoch,
            self.batches.copy(),
            self.last_seen_ms,
            self.txn_first_offset,
            self.coordinator_epoch,
        )


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended: its producer id, first offset and the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


def _next_sequence(entry: ProducerEntry) -> int:
    return (entry.batches[-1].last_seq + 1) % _SEQ_MOD


class ProducerStateTable:
    __slots__ = ("producers",)

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        transactional: bool = False,
    ) -> BatchMeta | None:
        """Validate a batch. Returns the original batch if it is a duplicate, None if it is
        the next one; raises the Kafka error otherwise. Does not change the state."""
        found = self._check_sequence(producer_id, epoch, first_seq, last_seq)
        if found is None and not transactional:
            entry = self.producers.get(producer_id)
            if entry is not None and entry.txn_first_offset >= 0:
                raise InvalidTxnState(
                    f"producer {producer_id} sent a non-transactional batch during its "
                    f"transaction (started at offset {entry.txn_first_offset})"
                )
        return found

    def _check_sequence(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> BatchMeta | None:
        entry = self.producers.get(producer_id)
        if entry is None:
            if first_seq != 0:
                raise UnknownProducerId(
                    f"producer {producer_id} is unknown here and sent sequence {first_seq}"
                )
            return None
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id} epoch {epoch} is older than {entry.epoch}"
            )
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id} new epoch {epoch} must start at sequence 0, "
                    f"got {first_seq}"
                )
            return None
        for meta in entry.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        if not entry.batches:
            if first_seq != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id} expected sequence 0, got {first_seq}"
                )
            return None
        expected = _next_sequence(entry)
        if first_seq != expected:
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: expected sequence {expected}, got {first_seq}"
            )
        return None

    def next_sequence_if_ahead(self, producer_id: int, epoch: int, first_seq: int) -> int | None:
        """The producer's next sequence when `first_seq` is ahead of it (at the same epoch),
        else None: the gap of a batch whose predecessors have not arrived yet."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch or not entry.batches:
            return None
        expected = _next_sequence(entry)
        return expected if 0 < (first_seq - expected) % _SEQ_MOD < _SEQ_MOD // 2 else None

    def apply(
        self,
        producer_id: int,
        epoch: int,
        meta: BatchMeta,
        now_ms: int = 0,
        transactional: bool = False,
    ) -> None:
        entry = self._entry(producer_id, epoch)
        entry.batches.append(meta)
        entry.last_seen_ms = max(entry.last_seen_ms, now_ms)
        if transactional and entry.txn_first_offset < 0:
            entry.txn_first_offset = meta.base_offset

    def _entry(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry at `epoch`: a new epoch forgets the sequence window and keeps
        the transaction (a bumped epoch continues or ends it, as in Kafka)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        elif epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches = deque(maxlen=WINDOW)
        return entry

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Validate a commit/abort marker the coordinator asks for (Kafka's
        ProducerAppendInfo.appendEndTxnMarker). Does not change the state."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"marker for producer {producer_id} has epoch {epoch}, older than {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFenced(
                f"marker for producer {producer_id} has coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}"
            )

    def complete(
        self,
        producer_id: int,
        epoch: int,
        commit: bool,
        coordinator_epoch: int,
        offset: int,
        now_ms: int = 0,
    ) -> CompletedTxn | None:
        """Apply a marker at `offset`: the ongoing transaction (if any) ends there."""
        entry = self._entry(producer_id, epoch)
        entry.coordinator_epoch = coordinator_epoch
        entry.last_seen_ms = max(entry.last_seen_ms, now_ms)
        first, entry.txn_first_offset = entry.txn_first_offset, -1
        if first < 0:
            return None  # a marker of an empty transaction changes no offset's visibility
        return CompletedTxn(producer_id, first, offset, not commit)

    def apply_tuple(self, batch: Sequence[int], now_ms: int = 0) -> CompletedTxn | None:
        """Apply one producer row of a WAL index (storage/wal.py ProducerBatch)."""
        pid, epoch, first_seq, last_seq, base, last = batch[:6]
        kind = batch[6] if len(batch) > 6 else IDEMPOTENT
        if kind in (ABORT_MARKER, COMMIT_MARKER):
            coordinator_epoch = batch[7] if len(batch) > 7 else -1
            return self.complete(pid, epoch, kind == COMMIT_MARKER, coordinator_epoch, base, now_ms)
        meta = BatchMeta(first_seq, last_seq, base, last)
        self.apply(pid, epoch, meta, now_ms, transactional=kind == TRANSACTIONAL)
        return None

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest ongoing transaction, None if there is none."""
        firsts = [e.txn_first_offset for e in self.producers.values() if e.txn_first_offset >= 0]
        return min(firsts) if firsts else None

    def truncate_from(self, offset: int) -> None:
        """Forget batches at or after `offset` (used when a partition rolls back)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if len(kept) != len(entry.batches):
                entry.batches = deque(kept, maxlen=WINDOW)
            if entry.txn_first_offset >= offset:
                entry.txn_first_offset = -1

    def expire(self, now_ms: int, max_idle_ms: int = PRODUCER_EXPIRATION_MS) -> int:
        # a producer in the middle of a transaction is never forgotten (it holds back the LSO
        # until the coordinator ends the transaction)
        stale = [
            pid
            for pid, e in self.producers.items()
            if now_ms - e.last_seen_ms > max_idle_ms and e.txn_first_offset < 0
        ]
        for pid in stale:
            del self.producers[pid]
        return len(stale)

    def describe(self) -> list[tuple[int, int, int, int, int, int]]:
        """(producer id, epoch, last sequence or -1, last seen ms or -1, coordinator epoch or
        -1, first offset of the ongoing transaction or -1) per producer."""
        return [
            (
                pid,
                e.epoch,
                e.batches[-1].last_seq if e.batches else -1,
                e.last_seen_ms or -1,
                e.coordinator_epoch,
                e.txn_first_offset,
            )
            for pid, e in sorted(self.producers.items())
        ]

    def copy(self) -> ProducerStateTable:
        clone = ProducerStateTable()
        if self.producers:  # most partitions open with none: no deepcopy machinery for them
            clone.producers = copy.deepcopy(self.producers)
        return clone

    # ---------------------------------------------------------------- persistence
    def to_json(self) -> dict[str, object]:
        return {
            str(pid): [
                e.epoch,
                e.last_seen_ms,
                [[b.first_seq, b.last_seq, b.base_offset, b.last_offset] for b in e.batches],
            ]
            for pid, e in self.producers.items()
        }

    def txn_to_json(self) -> dict[str, list[int]]:
        """The checkpoint's `transactions`: [first offset of the ongoing transaction or -1,
        coordinator epoch] per producer id that has either (kept apart from `producers`, whose
        format older brokers read)."""
        return {
            str(pid): [e.txn_first_offset, e.coordinator_epoch]
            for pid, e in self.producers.items()
            if e.txn_first_offset >= 0 or e.coordinator_epoch >= 0
        }

    def load_txn_json(self, raw: dict[str, list[int]]) -> None:
        for pid, (first, coordinator_epoch) in raw.items():
            entry = self.producers.get(int(pid))
            if entry is None:
                continue  # expired when the checkpoint was written (only without a transaction)
            entry.txn_first_offset = int(first)
            entry.coordinator_epoch = int(coordinator_epoch)

    @classmethod
    def from_json(cls, raw: dict[str, list[object]]) -> ProducerStateTable:
        table = cls()
        for pid, (epoch, last_seen, batches) in raw.items():
            entry = ProducerEntry(int(epoch), last_seen_ms=int(last_seen))  # type: ignore[call-overload]
            for fs, ls, bo, lo in batches:  # type: ignore[attr-defined]
                entry.batches.append(BatchMeta(int(fs), int(ls), int(bo), int(lo)))
            table.producers[int(pid)] = entry
        return table
