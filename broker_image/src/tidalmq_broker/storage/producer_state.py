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
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

from tidalmq_broker.storage.api import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId

WINDOW = 5
PRODUCER_EXPIRATION_MS = 24 * 3600 * 1000  # Kafka's producer.id.expiration.ms default
_SEQ_MOD = 1 << 31


@dataclass(frozen=True, slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last_seen_ms: int = 0


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> BatchMeta | None:
        """Validate a batch. Returns the original batch if it is a duplicate, None if it is
        the next one; raises the Kafka error otherwise. Does not change the state."""
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
        expected = (entry.batches[-1].last_seq + 1) % _SEQ_MOD
        if first_seq != expected:
            raise OutOfOrderSequence(
                f"producer {producer_id} epoch {epoch}: expected sequence {expected}, got {first_seq}"
            )
        return None

    def apply(
        self,
        producer_id: int,
        epoch: int,
        meta: BatchMeta,
        now_ms: int = 0,
    ) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        entry.batches.append(meta)
        entry.last_seen_ms = max(entry.last_seen_ms, now_ms)

    def apply_tuple(self, batch: tuple[int, int, int, int, int, int], now_ms: int = 0) -> None:
        pid, epoch, first_seq, last_seq, base, last = batch
        self.apply(pid, epoch, BatchMeta(first_seq, last_seq, base, last), now_ms)

    def truncate_from(self, offset: int) -> None:
        """Forget batches at or after `offset` (used when a partition rolls back)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if len(kept) != len(entry.batches):
                entry.batches = deque(kept, maxlen=WINDOW)

    def expire(self, now_ms: int, max_idle_ms: int = PRODUCER_EXPIRATION_MS) -> int:
        stale = [pid for pid, e in self.producers.items() if now_ms - e.last_seen_ms > max_idle_ms]
        for pid in stale:
            del self.producers[pid]
        return len(stale)

    def describe(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence or -1, last seen ms or -1) per producer."""
        return [
            (pid, e.epoch, e.batches[-1].last_seq if e.batches else -1, e.last_seen_ms or -1)
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
            str(pid): [e.epoch, e.last_seen_ms, [[b.first_seq, b.last_seq, b.base_offset, b.last_offset] for b in e.batches]]
            for pid, e in self.producers.items()
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, list[object]]) -> ProducerStateTable:
        table = cls()
        for pid, (epoch, last_seen, batches) in raw.items():
            entry = ProducerEntry(int(epoch), last_seen_ms=int(last_seen))  # type: ignore[call-overload]
            for fs, ls, bo, lo in batches:  # type: ignore[attr-defined]
                entry.batches.append(BatchMeta(int(fs), int(ls), int(bo), int(lo)))
            table.producers[int(pid)] = entry
        return table
