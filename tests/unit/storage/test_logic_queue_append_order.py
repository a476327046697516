"""Appends to a logic queue (static topics) start in arrival order, as on any partition.

The first batch of an idempotent producer on a logic queue's new physical queue waits for the
producer state of the previous (sealed) one; batches pipelined behind it must not overtake it.
A storage-free model: the physical queue is a producer-state table with offsets, the sealed
queue's state arrives after a delay the test controls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest
from tidalmq_broker.protocol import records
from tidalmq_broker.static_topics.service import LogicQueueLog, StaticTopicService
from tidalmq_broker.storage.api import AppendResult, OutOfOrderSequence
from tidalmq_broker.storage.producer_state import (
    BatchMeta,
    ProducerEntry,
    ProducerStateTable,
)
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.static_mapping import MappingItem

from tests.support.storage_helpers import batch

PID = 7
OLD = MappingItem(0, 0, 0, 0, 0, 10, time_of_end=1)  # sealed: logic offsets 0-9
NEW = MappingItem(1, 1, 1, 10, 0)  # the writable leader from logic offset 10


class PhysicalQueue:
    """The new physical queue: producer checks and offsets as a partition applies them."""

    def __init__(self) -> None:
        self.producers = ProducerStateTable()
        self.next_offset = 0
        self.log: list[tuple[int, int]] = []  # (first sequence, physical offset)
        self.log_start_offset = 0

    def producer_entry(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.producers.get(producer_id)

    def adopt_producer(self, producer_id: int, entry: ProducerEntry) -> bool:
        if producer_id in self.producers.producers:
            return False
        self.producers.producers[producer_id] = entry
        return True

    def start_append(
        self, data: bytes | memoryview, *, acks: int = -1, owned: bool = False
    ) -> Awaitable[AppendResult]:
        (h,) = list(records.iter_headers(data))
        found = self.producers.check(PID, h.producer_epoch, h.base_sequence, h.last_sequence)
        if found is None:
            base, last = self.next_offset, self.next_offset + h.last_offset_delta
            self.producers.apply(
                PID, h.producer_epoch, BatchMeta(h.base_sequence, h.last_sequence, base, last)
            )
            self.next_offset = last + 1
            self.log.append((h.base_sequence, base))
        else:
            base, last = found.base_offset, found.last_offset

        async def acknowledged() -> AppendResult:
            await asyncio.sleep(0.01)  # the WAL flush
            return AppendResult(base, last, -1, 0, found is not None)

        return acknowledged()

    async def append(self, data: bytes | memoryview, **kw: object) -> AppendResult:
        return await self.start_append(data, **kw)  # type: ignore[arg-type]


class SealedState:
    """What the reader of the sealed physical queue answers: sequences 0-9 in 5 batches."""

    def producers(self) -> ProducerStateTable:
        table = ProducerStateTable()
        for seq in range(0, 10, 2):
            table.apply(PID, 0, BatchMeta(seq, seq + 1, seq, seq + 1))
        return table


def logic_queue(delays: list[float]) -> tuple[StaticTopicService, PhysicalQueue]:
    """A service whose n-th read of the sealed queue's state takes delays[n] seconds."""
    service = StaticTopicService(1, lambda: ClusterMetadata("c"), None, None)  # type: ignore[arg-type]
    queue = PhysicalQueue()

    async def ready_reader(topic: str, item: MappingItem, topic_id: str) -> SealedState:
        delay = delays.pop(0) if delays else 0.0
        if delay:
            await asyncio.sleep(delay)
        return SealedState()

    service.ready_reader = ready_reader  # type: ignore[assignment,method-assign]
    return service, queue


def produce(
    service: StaticTopicService, queue: PhysicalQueue, seq: int
) -> asyncio.Task[AppendResult]:
    """One pipelined Produce request: its append starts as a task, in arrival order."""
    log = LogicQueueLog(service, TopicPartition("t", 0), 1, [OLD, NEW], queue, "id")  # type: ignore[arg-type]
    data = batch(2, producer_id=PID, producer_epoch=0, base_sequence=seq)
    return asyncio.ensure_future(log.append(data))


async def test_a_batch_arriving_after_the_old_state_was_read_waits_its_turn() -> None:
    # the second request's read of the old state is slower than the first one's, and the
    # third request arrives once the first has read it (it would need no read at all)
    service, queue = logic_queue([0.01, 0.05])
    first, second = produce(service, queue, 10), produce(service, queue, 12)
    await asyncio.sleep(0.03)
    third = produce(service, queue, 14)
    results = await asyncio.gather(first, second, third)
    assert [r.base_offset for r in results] == [10, 12, 14]
    assert not any(r.duplicate for r in results)
    assert queue.log == [(10, 0), (12, 2), (14, 4)]


async def test_pipelined_batches_keep_their_order_whatever_the_reads_take() -> None:
    for delays in ([0.03, 0.0, 0.0], [0.0, 0.03, 0.0], [0.02, 0.01, 0.0], [0.0, 0.0, 0.02]):
        service, queue = logic_queue(list(delays))
        tasks = [produce(service, queue, seq) for seq in (8, 10, 12, 14)]  # 8: a retry
        results = await asyncio.gather(*tasks)
        assert [r.base_offset for r in results] == [8, 10, 12, 14], delays
        assert [r.duplicate for r in results] == [True, False, False, False], delays
        # a real gap is still the producer's fatal error once it appended here
        with pytest.raises(OutOfOrderSequence):
            await produce(service, queue, 30)
