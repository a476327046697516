"""The shards of an internal topic that this broker leads: one a partition of
`__consumer_offsets` for the group coordinator, of `__transaction_state` for the transaction
coordinator. A shard is made when its partition opens here and loaded in the background (its
log replayed); it is closed and dropped when the partition closes or moves, and dropped when its
load fails. Both coordinators route a request to a shard by hashing its id to a partition and
answer with their own errors while it is missing or loading. Both replay their partition's log
the same way on open: `replay` below."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Generic, NamedTuple, Protocol, TypeVar

from tidalmq_core.model import TopicPartition

from tidalmq_broker.protocol.records import BatchHeader, iter_complete_headers, iter_records
from tidalmq_broker.storage.api import PartitionLog

log = logging.getLogger(__name__)


REPLAY_READ_BYTES = 4 * 1024 * 1024


class ReplayedRecord(NamedTuple):
    """One keyed record of an internal topic's log, with the header of its batch (control
    batches too: a transaction marker settles what a producer id wrote before it)."""

    header: BatchHeader
    offset: int
    key: bytes
    value: bytes | None  # None: a tombstone


async def replay(plog: PartitionLog, closed: Callable[[], bool]) -> AsyncIterator[ReplayedRecord]:
    """Every keyed record of `plog` from its log start to its high watermark, in order, read
    REPLAY_READ_BYTES at a time; stops early once `closed()` (the partition left meanwhile).
    Records without a key are skipped (an internal topic never writes one). A read that
    returns data but no whole batch would never advance: raised, so the load fails loudly
    rather than spinning (the log promises at least one whole batch per read)."""
    offset = plog.log_start_offset
    while offset < plog.high_watermark and not closed():
        result = await plog.read(offset, REPLAY_READ_BYTES)
        if not result.records:
            return
        data = result.records
        start = offset
        for header in iter_complete_headers(data):
            for rec_offset, key, value in iter_records(data, header):
                # the first batch may begin below `offset` (reads return whole batches)
                if rec_offset >= offset and key is not None:
                    yield ReplayedRecord(header, rec_offset, key, value)
            offset = header.last_offset + 1
        if offset == start:
            raise RuntimeError(f"replay: a read at offset {start} returned no whole batch")


class Shard(Protocol):
    loaded: asyncio.Event  # set once its log is replayed

    async def load(self) -> None: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=Shard)


class InternalShards(Generic[S]):
    """The shards of `topic`'s partitions led here, by partition; `make` builds one for a
    partition's log, `what` names what it holds in the log line of a failed load."""

    def __init__(self, topic: str, what: str, make: Callable[[int, PartitionLog], S]) -> None:
        self._topic = topic
        self._what = what
        self._make = make
        self._shards: dict[int, S] = {}
        self._loads: dict[int, asyncio.Task[None]] = {}

    def on_partition(self, tp: TopicPartition, plog: PartitionLog | None) -> None:
        """PartitionManager hook: load a shard when its partition opens, drop it on close."""
        if tp.topic != self._topic:
            return
        old = self._shards.pop(tp.partition, None)
        if old is not None:
            old.close()
        load = self._loads.pop(tp.partition, None)
        if load is not None:
            load.cancel()
        if plog is None:
            return
        shard = self._make(tp.partition, plog)
        self._shards[tp.partition] = shard

        async def load_shard() -> None:
            try:
                await shard.load()
            except Exception:
                log.exception("%s: loading %s failed", tp, self._what)
                if self._shards.get(tp.partition) is shard:
                    self._shards.pop(tp.partition)

        self._loads[tp.partition] = asyncio.create_task(load_shard())

    def get(self, partition: int) -> S | None:
        """The shard of `partition`, loaded or still loading (None: not led here)."""
        return self._shards.get(partition)

    def loaded(self) -> list[S]:
        return [s for s in self._shards.values() if s.loaded.is_set()]

    def close(self) -> None:
        for task in self._loads.values():
            task.cancel()
        for shard in self._shards.values():
            shard.close()
        self._shards.clear()
