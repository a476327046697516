"""The brokers' half of static topics: Kafka APIs on logic queues.

The broker leading logic queue q of static topic T (the broker of q's writable physical queue)
serves it through `LogicQueueLog`, a `PartitionLog` over the mapping, so the Produce, Fetch,
ListOffsets and OffsetForLeaderEpoch handlers work on logic queues unchanged:

- append: to the writable physical queue; offsets are answered as logic offsets. A producer the
  physical queue does not know continues from the state an older physical queue of the logic
  queue kept (Double-Read-Check of idempotence data, newest first): a retry of a batch written
  before the remap is answered as a duplicate, not written twice.
- read: the item holding the logic offset is found in the mapping; the leader's physical queue
  is read locally, older ones from object storage (`ClosedPartitionReader`); batches are copied
  and their base offsets rewritten to logic offsets (records are never re-encoded).
- ListOffsets: earliest = the oldest item's first record, latest = the leader's end, by time:
  the items are searched by their time range first, then inside the physical queue.

Committed offsets (`OffsetKeys`) are stored under the leader's physical queue and read back with
Double-Read-Check (every item of the logic queue, newest first), so nothing moves on a remap.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tidalmq_core.metadata import NO_LEADER, ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.static_mapping import (
    MappingItem,
    MappingView,
    earliest,
    locate,
    logic_high_watermark,
    physical_topic_name,
    time_candidates,
)
from tidalmq_core.topics import InvalidTopic

from tidalmq_broker.groups.coordinator import OffsetKeys
from tidalmq_broker.partitions import LeaderNotAvailable, NotLeader, UnknownPartition
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    ActiveProducer,
    AppendResult,
    InvalidRecord,
    OffsetOutOfRange,
    PartitionClosing,
    PartitionConfig,
    PartitionLog,
    PartitionStats,
    ReadResult,
    TimestampLookup,
    VerificationGuard,
)
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.producer_state import BatchMeta, ProducerEntry
from tidalmq_broker.storage.sealed import ClosedPartitionReader
from tidalmq_broker.storage.timestamps import first_of_greatest

if TYPE_CHECKING:
    from tidalmq_broker.partitions import PartitionManager

Key = tuple[str, int]
_READERS = 256
_UNSEALED_REFRESH_S = 0.2  # re-read the checkpoint of a physical queue still being sealed
_PRODUCER_LOOKBACK = 3  # how many older physical queues the producer-state check reads
_SEQUENCE_SPACE = 1 << 31


def _has_transactional(data: bytes | memoryview) -> bool:
    try:
        return any(h.is_transactional for h in records.iter_headers(data))
    except records.InvalidRecordBatch:
        return False  # the append reports it


def shift_base_offsets(data: bytes, delta: int) -> bytes:
    """A copy of whole record batches with every base offset moved by `delta` (physical to
    logic offsets). Only the base offset field changes; it is not covered by the CRC."""
    if delta == 0 or not data:
        return data
    buf = bytearray(data)
    for h in records.iter_headers(buf):
        records.patch_base_offset(buf, h, h.base_offset + delta)
    return bytes(buf)


class StaticTopicService(OffsetKeys):
    def __init__(
        self,
        broker_id: int,
        metadata: Callable[[], ClusterMetadata],
        partitions: PartitionManager,
        store: ObjectStore,
        *,
        read_ahead_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.broker_id = broker_id
        self._metadata = metadata
        self._partitions = partitions
        self._store = store
        self._read_ahead = read_ahead_bytes
        self._views: dict[str, tuple[int, MappingView]] = {}
        self._append_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._readers: OrderedDict[tuple[str, int, str], ClosedPartitionReader] = OrderedDict()

    # ------------------------------------------------------------------ lookups
    def view(self, meta: ClusterMetadata, name: str) -> MappingView:
        cached = self._views.get(name)
        if cached is not None and cached[0] == meta.version:
            return cached[1]
        view = meta.static_topics[name].view()
        self._views[name] = (meta.version, view)
        return view

    def is_static(self, topic: str) -> bool:
        info = self._metadata().topics.get(topic)
        return info is not None and info.kind == "static"

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        """The log of logic queue `tp` if `tp.topic` is a static topic this broker leads it
        (None if it is not a static topic at all; NotLeader etc. otherwise)."""
        meta = self._metadata()
        topic = meta.topics.get(tp.topic)
        if topic is not None and topic.kind == "physical":
            raise InvalidTopic(
                f"{tp.topic} holds the physical queues of a static topic: use the static topic"
            )
        if topic is None or topic.kind != "static":
            return None
        if tp.topic not in meta.static_topics or not 0 <= tp.partition < len(topic.partitions):
            raise UnknownPartition(f"{tp} does not exist")
        part = topic.partitions[tp.partition]
        if part.leader == NO_LEADER:
            raise LeaderNotAvailable(f"logic queue {tp} is switching to another broker")
        if part.leader != self.broker_id:
            raise NotLeader(f"logic queue {tp} is led by broker {part.leader}")
        items = self.view(meta, tp.topic).items(tp.partition)
        if not items:
            raise LeaderNotAvailable(f"logic queue {tp} has no physical queue")
        leader = items[-1]
        phys = meta.topics[physical_topic_name(tp.topic)]
        plog = self._partitions.local_log(TopicPartition(phys.name, leader.queue))
        return LogicQueueLog(self, tp, part.leader_epoch, items, plog, phys.topic_id)

    def append_order(self, tp: TopicPartition) -> asyncio.Lock:
        """Held by an append to logic queue `tp` from its arrival until its batches have their
        place in the leader's physical queue (FIFO: appends start in arrival order)."""
        lock = self._append_locks.get(tp)
        if lock is None:
            lock = self._append_locks[tp] = asyncio.Lock()
        return lock

    def reader(self, topic: str, item: MappingItem, topic_id: str) -> ClosedPartitionReader:
        key = (topic, item.queue, topic_id)
        reader = self._readers.get(key)
        if reader is None:
            reader = ClosedPartitionReader(
                self._store,
                TopicPartition(topic, item.queue),
                topic_id,
                read_ahead_bytes=self._read_ahead,
            )
            self._readers[key] = reader
            while len(self._readers) > _READERS:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(key)
        return reader

    async def ready_reader(
        self, topic: str, item: MappingItem, topic_id: str
    ) -> ClosedPartitionReader:
        """A reader whose checkpoint reflects the item: final once the item is sealed, and
        re-read now and then while its old broker is still closing it."""
        reader = self.reader(topic, item, topic_id)
        cp = await reader.load()
        stale = time.monotonic() - reader.loaded_at > _UNSEALED_REFRESH_S
        if cp is None or (not reader.sealed and (item.sealed or stale)):
            await reader.refresh()
        return reader

    # ------------------------------------------------------------------ consumer lag
    def lag_ends(self, wanted: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The ends of the logic queues in `wanted` (others are left out) for consumer lag
        (docs/metrics.md): the leader item's physical end translated as Fetch and ListOffsets
        translate it (`logic_high_watermark`). The physical end is the live high watermark
        when the physical queue is open here, its end when sealed, else the acknowledged end
        the metadata holds (a floor: too low by at most the floor's delay, never too high).
        O(len(wanted)); the mapping view is cached per metadata version."""
        meta = self._metadata()
        out: dict[tuple[str, int], int] = {}
        for topic, queue in wanted:
            if topic not in meta.static_topics:
                continue
            phys = meta.topics.get(physical_topic_name(topic))
            items = self.view(meta, topic).items(queue)
            if phys is None or not items:
                continue
            leader = items[-1]
            if leader.sealed:
                end = leader.end_offset
            else:
                ptp = TopicPartition(phys.name, leader.queue)
                local = self._partitions.high_watermarks(lambda _topic: True, [ptp]).get(ptp)
                if local is not None:
                    end = local
                elif 0 <= leader.queue < len(phys.partitions):
                    end = phys.partitions[leader.queue].end_offset_floor
                else:
                    continue
            out[(topic, queue)] = logic_high_watermark(items, end)
        return out

    # ------------------------------------------------------------------ committed offsets
    def commit_key(self, topic: str, partition: int) -> Key:
        """Where an offset commit for (topic, partition) is stored: for a logic queue, under
        its leader's physical queue."""
        meta = self._metadata()
        if topic not in meta.static_topics:
            return topic, partition
        items = self.view(meta, topic).items(partition)
        if not items:
            return topic, partition
        return physical_topic_name(topic), items[-1].queue

    def read_keys(self, topic: str, partition: int) -> list[Key]:
        """Where to look for a committed offset, in order (Double-Read-Check: the leader's
        physical queue first, then the older ones)."""
        meta = self._metadata()
        if topic not in meta.static_topics:
            return [(topic, partition)]
        items = self.view(meta, topic).items(partition)
        phys = physical_topic_name(topic)
        return [(phys, i.queue) for i in reversed(items)] + [(topic, partition)]

    def logical(self, topic: str, partition: int) -> tuple[Key, int] | None:
        """The logic queue a stored key belongs to, with its rank (newer items rank higher);
        None for a key no logic queue maps any more."""
        meta = self._metadata()
        if not topic.startswith("__sq.") or topic[5:] not in meta.static_topics:
            return (topic, partition), -1
        name = topic[5:]
        found = self.view(meta, name).physical_queues().get(partition)
        if found is None:
            return None
        q, item = found
        return (name, q), item.gen


class LogicQueueLog:
    """PartitionLog of one logic queue, on the broker that leads it."""

    def __init__(
        self,
        service: StaticTopicService,
        tp: TopicPartition,
        epoch: int,
        items: list[MappingItem],
        plog: PartitionLog,
        physical_topic_id: str,
    ) -> None:
        self._svc = service
        self._tp = tp
        self._epoch = epoch
        self._items = items
        self._leader = items[-1]
        self._plog = plog
        self._phys = physical_topic_name(tp.topic)
        self._phys_id = physical_topic_id

    # ------------------------------------------------------------------ properties
    @property
    def tp(self) -> TopicPartition:
        return self._tp

    @property
    def leader_epoch(self) -> int:
        return self._epoch

    @property
    def config(self) -> PartitionConfig:
        return self._plog.config

    @property
    def log_start_offset(self) -> int:
        return earliest(self._items, {self._leader.queue: self._plog.log_start_offset})

    @property
    def high_watermark(self) -> int:
        return logic_high_watermark(self._items, self._plog.high_watermark)

    @property
    def last_stable_offset(self) -> int:
        return self.high_watermark  # static topics take no transactions (see append)

    def stats(self) -> PartitionStats:
        return PartitionStats(self.log_start_offset, self.high_watermark)

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        return False  # static topics take no transactional batches

    def start_verification(self, producer_id: int) -> VerificationGuard:
        return VerificationGuard()  # unused: a transactional batch is refused (append)

    def end_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        return None

    def active_producers(self) -> list[ActiveProducer]:
        """The producers of the writable physical queue (DescribeProducers): those that wrote
        only before the last remap are adopted from older queues at their next append."""
        return self._plog.active_producers()

    # ------------------------------------------------------------------ append
    async def append(
        self,
        records_: bytes | memoryview,
        *,
        acks: int = -1,
        owned: bool = False,
        verification: VerificationGuard | None = None,
    ) -> AppendResult:
        """`verification` is not used: static topics refuse transactional batches."""
        leader = self._leader
        if leader.sealed:
            raise PartitionClosing(f"logic queue {self._tp}: its physical queue is sealed")
        if _has_transactional(records_):
            # a transaction's markers and aborted index would have to follow remaps
            raise InvalidRecord(f"static topic {self._tp.topic} takes no transactional batches")
        start = getattr(self._plog, "start_append", None)
        if start is None:
            await self._adopt_producers(records_)
            result = await self._plog.append(records_, acks=acks, owned=owned)
        else:
            # Appends to a logic queue are started in arrival order, as on any partition
            # (handle_produce): adopting a producer's state may wait for object storage, and a
            # pipelined batch arriving meanwhile must not overtake the waiting one (it would be
            # refused as out of order after the client was told the earlier ones succeeded).
            # Only the start is ordered: acknowledgements are awaited outside the lock, and
            # an uncontended lock is taken without suspending.
            async with self._svc.append_order(self._tp):
                await self._adopt_producers(records_)
                acknowledged = start(records_, acks=acks, owned=owned)
            result = await acknowledged
        return AppendResult(
            leader.to_logic(result.base_offset),
            leader.to_logic(result.last_offset),
            result.log_append_time_ms,
            self.log_start_offset,
            result.duplicate,
        )

    async def _adopt_producers(self, data: bytes | memoryview) -> None:
        """Double-Read-Check of idempotent-producer state: a producer this physical queue does
        not know, sending a sequence other than 0, continues from the newest older physical
        queue that knows it. Until it has appended here, its batches must continue exactly
        where that state ends: a batch that overtook one refused a moment ago (pipelined
        requests while the older queue was still closing) is refused retriably too, instead of
        failing the producer with OUT_OF_ORDER_SEQUENCE_NUMBER."""
        entry_of = getattr(self._plog, "producer_entry", None)
        adopt = getattr(self._plog, "adopt_producer", None)
        if entry_of is None or adopt is None or len(self._items) < 2:
            return
        try:
            headers = list(records.iter_headers(data))
        except records.InvalidRecordBatch:
            return  # the append reports it
        idempotent = [
            h for h in headers if h.has_producer_id and h.base_sequence != records.NO_SEQUENCE
        ]
        wanted = {
            h.producer_id
            for h in idempotent
            if h.base_sequence != 0 and entry_of(h.producer_id) is None
        }
        leader = self._leader
        for item in list(reversed(self._items[:-1]))[:_PRODUCER_LOOKBACK]:
            if not wanted:
                break
            if not item.sealed or not item.decided:
                raise PartitionClosing(
                    f"logic queue {self._tp}: the previous physical queue is still closing; "
                    "its producer state is needed to accept this idempotent batch"
                )
            reader = await self._svc.ready_reader(self._phys, item, self._phys_id)
            table = reader.producers().producers
            for pid in [p for p in wanted if p in table]:
                entry = table[pid]
                moved = ProducerEntry(entry.epoch, last_seen_ms=entry.last_seen_ms)
                for b in entry.batches:
                    first = leader.to_physical(item.to_logic(b.base_offset))
                    last = leader.to_physical(item.to_logic(b.last_offset))
                    moved.batches.append(BatchMeta(b.first_seq, b.last_seq, first, last))
                adopt(pid, moved)
                wanted.discard(pid)
        for h in idempotent:
            entry = entry_of(h.producer_id)
            if entry is None or h.producer_epoch != entry.epoch or not entry.batches:
                continue
            if any(b.last_offset >= leader.start_offset for b in entry.batches):
                continue  # it appended here already: the ordinary checks apply
            if any(
                b.first_seq == h.base_sequence and b.last_seq == h.last_sequence
                for b in entry.batches
            ):
                continue  # a retry of a batch the older queue has: answered as a duplicate
            expected = (entry.batches[-1].last_seq + 1) % _SEQUENCE_SPACE
            if h.base_sequence != expected:
                raise PartitionClosing(
                    f"logic queue {self._tp}: producer {h.producer_id} sent sequence "
                    f"{h.base_sequence} before {expected}; retry in order"
                )

    # ------------------------------------------------------------------ read
    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> AppendResult:
        raise InvalidRecord(f"static topic {self._tp.topic} takes no transactions")

    async def read(self, offset: int, max_bytes: int, *, committed: bool = False) -> ReadResult:
        result = await self._read(offset, max_bytes)
        if not committed:
            return result
        return ReadResult(
            result.records,
            result.high_watermark,
            result.log_start_offset,
            result.high_watermark,
            [],
        )

    async def _read(self, offset: int, max_bytes: int) -> ReadResult:
        items = self._items
        start = self.log_start_offset
        if offset < start:
            raise OffsetOutOfRange(f"{self._tp}: offset {offset} is below {start}")
        i = locate(items, offset)
        assert i is not None
        item = items[i]
        hwm = self.high_watermark
        if item is self._leader:
            if not item.decided:
                return ReadResult(b"", max(hwm, offset), start)  # fixed in a moment
            physical = item.to_physical(max(offset, item.logic_offset))
            result = await self._plog.read(physical, max_bytes)
            data = shift_base_offsets(result.records, item.base - item.start_offset)
            return ReadResult(data, item.to_logic(result.high_watermark), start)
        reader = await self._svc.ready_reader(self._phys, item, self._phys_id)
        physical = item.to_physical(max(offset, item.logic_offset))
        end = item.end_offset if item.sealed else reader.next_offset
        data = b"" if physical >= end else await reader.read(physical, max_bytes)
        data = shift_base_offsets(data, item.base - item.start_offset)
        last = None
        for last in records.iter_headers(data):  # noqa: B007 - only the last one matters
            pass
        if last is not None:
            hwm = max(hwm, last.last_offset + 1)
        return ReadResult(data, max(hwm, offset), start)

    async def wait_for_data(
        self, offset: int, timeout_s: float, *, committed: bool = False
    ) -> None:
        leader = self._leader
        if leader.decided and offset >= leader.logic_offset:
            await self._plog.wait_for_data(leader.to_physical(offset), timeout_s)
        else:  # an older item still being sealed, or an undecided leader: look again soon
            await asyncio.sleep(min(timeout_s, 0.05))

    async def offset_for_timestamp(self, timestamp_ms: int) -> TimestampLookup | None:
        for item in time_candidates(self._items, timestamp_ms):
            if not item.decided:
                continue
            if item is self._leader:
                found = await self._plog.offset_for_timestamp(timestamp_ms)
            else:
                reader = await self._svc.ready_reader(self._phys, item, self._phys_id)
                found = await reader.offset_for_timestamp(timestamp_ms)
            if found is not None:
                return TimestampLookup(item.to_logic(found.offset), found.timestamp)
        return None

    async def offset_of_max_timestamp(self) -> TimestampLookup | None:
        """The first record with the greatest timestamp over every item (logic offsets: an
        earlier item's record wins a tie, as the first occurrence in the log would)."""
        best: TimestampLookup | None = None
        for item in self._items:
            if not item.decided:
                continue
            if item is self._leader:
                found = await self._plog.offset_of_max_timestamp()
            else:
                reader = await self._svc.ready_reader(self._phys, item, self._phys_id)
                found = await reader.offset_of_max_timestamp()
            if found is not None:
                logic = TimestampLookup(item.to_logic(found.offset), found.timestamp)
                best = first_of_greatest(best, logic)
        return best

    async def delete_records_before(self, offset: int) -> int:
        raise InvalidRecord(
            f"{self._tp} is a logic queue of a static topic: its records are deleted by "
            "retention of whole physical queues, not by DeleteRecords"
        )
