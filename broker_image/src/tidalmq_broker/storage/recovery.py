"""Unclean open: replay the previous owner's WAL objects written after its last checkpoint.

The checkpoint names the owner incarnation and the last WAL sequence it already reflects. Every
later object of that incarnation is listed, its small index read with a ranged GET, and the
entries of this partition (same topic id, the checkpoint's leader epoch) that continue exactly at
the expected next offset are taken, in sequence order. Entries that do not continue the log are
skipped: they are batches of a flush whose appends failed (never acknowledged), and the data that
replaced them appears later at the same offsets.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.keys import wal_key, wal_prefix
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.wal import (
    INDEX_PROBE_BYTES,
    ProducerBatch,
    WalEntry,
    decode_wal_index,
    index_length,
)

log = logging.getLogger(__name__)

_PARALLEL_INDEX_READS = 16


@dataclass(slots=True)
class RecoveredTail:
    entries: list[IndexEntry] = field(default_factory=list)
    producers: list[ProducerBatch] = field(default_factory=list)
    next_offset: int = 0
    objects_scanned: int = 0
    skipped: int = 0


async def read_wal_index(store: ObjectStore, key: str) -> list[WalEntry]:
    head = await store.get(key, 0, INDEX_PROBE_BYTES)
    need = index_length(head)
    if need > len(head):
        head = await store.get(key, 0, need)
    return decode_wal_index(head)


async def recover_tail(store: ObjectStore, cp: Checkpoint) -> RecoveredTail:
    prefix = wal_prefix(cp.owner_broker, cp.owner_incarnation)
    start_after = (
        wal_key(cp.owner_broker, cp.owner_incarnation, cp.wal_position)
        if cp.wal_position >= 0
        else None
    )
    objects = await store.list(prefix, start_after)
    semaphore = asyncio.Semaphore(_PARALLEL_INDEX_READS)

    async def read(key: str) -> list[WalEntry]:
        async with semaphore:
            return await read_wal_index(store, key)

    indexes = await asyncio.gather(*(read(o.key) for o in objects))
    tail = RecoveredTail(next_offset=cp.next_offset, objects_scanned=len(objects))
    for obj, entries in zip(objects, indexes, strict=True):
        for e in entries:
            if (
                e.topic != cp.topic
                or e.topic_id != cp.topic_id
                or e.partition != cp.partition
                or e.leader_epoch != cp.leader_epoch
            ):
                continue
            if e.base_offset != tail.next_offset:
                tail.skipped += 1
                log.info(
                    "recovery of %s-%d skips %s offsets %d-%d (expected %d)",
                    cp.topic,
                    cp.partition,
                    obj.key,
                    e.base_offset,
                    e.last_offset,
                    tail.next_offset,
                )
                continue
            tail.entries.append(
                IndexEntry(
                    e.base_offset, e.last_offset, obj.key, e.position, e.size, e.max_timestamp
                )
            )
            tail.producers.extend(e.producers)
            tail.next_offset = e.last_offset + 1
    return tail
