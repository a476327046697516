"""A logic queue over two physical queues on real storage (local directory and S3): reads across
the boundary in logic offsets, and idempotent producers continuing on the new physical queue
(Double-Read-Check of their state: duplicates recognised, a batch that overtook a refused one
refused retriably instead of failing the producer)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.static_topics.service import StaticTopicService
from tidalmq_broker.storage.api import (
    AppendResult,
    OutOfOrderSequence,
    PartitionClosing,
    PartitionConfig,
)
from tidalmq_broker.storage.keys import checkpoint_key
from tidalmq_broker.storage.objectstore import ObjectStore
from tidalmq_broker.storage.sealed import seal_partition
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.static_mapping import MappingItem, StaticTopicState, distribute

from tests.integration.storage.conftest import Cluster
from tests.support.storage_helpers import CountingStore, batch, batches_of, payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

NAME = "ledger"
PHYS = f"__sq.{NAME}"
PID = 77
TOPIC_ID = "6a1f0c3e-0000-4000-8000-0000000000bb"


def metadata(old_end: int, *, sealed: bool = True) -> ClusterMetadata:
    """Logic queue 0 of static topic `ledger`: physical queue 0 (broker 0, gen 0, offsets
    0..old_end-1), then physical queue 1 on broker 1 from logic offset old_end."""
    old = MappingItem(0, 0, 0, 0, 0, old_end if sealed else -1, time_of_end=1)
    new = MappingItem(1, 1, 1, old_end if sealed else -1, 0, tentative_offset=old_end + 100)
    state = StaticTopicState(NAME, 1, None)
    state.copies = distribute({0: [old, new]}, 1, 1, (0, 1))
    meta = ClusterMetadata("c", version=5, static_topics={NAME: state})
    meta.topics[NAME] = TopicInfo(
        NAME, str(uuid.uuid4()), [PartitionState(1, 3, [1])], kind="static"
    )
    meta.topics[PHYS] = TopicInfo(
        PHYS,
        TOPIC_ID,
        [PartitionState(NO_LEADER, 1, [0]), PartitionState(1, 0, [1])],
        internal=True,
        kind="physical",
    )
    return meta


async def setup(cluster: Cluster, *, sealed: bool = True) -> tuple[StaticTopicService, list[bytes]]:
    old_broker = await cluster.engine(0)
    old_tp = TopicPartition(PHYS, 0)
    topic_id = TOPIC_ID
    log = await old_broker.open_partition(old_tp, topic_id, 0, PartitionConfig())
    sent = []
    for seq in range(0, 10, 2):  # an idempotent producer wrote sequences 0-9 there
        b = batch(2, tag=b"old%d" % seq, producer_id=PID, producer_epoch=0, base_sequence=seq)
        sent.append(b)
        await log.append(b)
    await old_broker.close_partition(old_tp)
    if sealed:
        await seal_partition(cluster.inspector(), old_tp, topic_id)
    new_broker = await cluster.engine(1)
    meta = metadata(10, sealed=sealed)
    partitions = PartitionManager(new_broker, 1)
    partitions.apply(meta)
    assert await partitions.wait_settled(10)
    service = StaticTopicService(1, lambda: meta, partitions, new_broker.store)
    partitions.logic_queues = service
    return service, sent


async def test_reads_cross_the_boundary_in_logic_offsets(cluster: Cluster) -> None:
    service, sent = await setup(cluster)
    log = service._partitions.get_log(TopicPartition(NAME, 0))
    result = await log.append(batch(3, tag=b"new"))
    assert (result.base_offset, result.last_offset) == (10, 12)
    assert log.log_start_offset == 0 and log.high_watermark == 13
    got = []
    offset = 0
    while offset < log.high_watermark:
        read = await log.read(offset, 1 << 20)
        for base, last, tail in batches_of(read.records):
            got.append((base, last, tail))
            offset = last + 1
    assert [(b, last) for b, last, _ in got] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 12)]
    assert [t[4:] for _, _, t in got[:5]] == [payload(b)[4:] for b in sent]  # bytes untouched
    found = await log.offset_for_timestamp(0)
    assert found is not None and found.offset == 0
    # the hidden physical topic is not for clients
    with pytest.raises(ValueError, match="physical queues"):
        service._partitions.get_log(TopicPartition(PHYS, 1))


async def test_idempotent_producers_continue_on_the_new_physical_queue(cluster: Cluster) -> None:
    service, _ = await setup(cluster)
    log = service._partitions.get_log(TopicPartition(NAME, 0))

    def idem(seq: int) -> bytes:
        return batch(2, tag=b"s%d" % seq, producer_id=PID, producer_epoch=0, base_sequence=seq)

    # a retry of a batch the old physical queue has is a duplicate, with its logic offsets
    dup = await log.append(idem(8))
    assert dup.duplicate and (dup.base_offset, dup.last_offset) == (8, 9)
    # a batch that overtook the next one is refused retriably (NOT_LEADER_OR_FOLLOWER)...
    with pytest.raises(PartitionClosing, match="retry in order"):
        await log.append(idem(12))
    # ... the next one is accepted, then the overtaken one
    assert (await log.append(idem(10))).base_offset == 10
    assert (await log.append(idem(12))).base_offset == 12
    # DescribeProducers lists it with the sequence it continues from
    (producer,) = log.active_producers()
    assert (producer.producer_id, producer.last_sequence) == (PID, 13)
    # once the producer appended here, a real gap is the usual fatal error
    with pytest.raises(OutOfOrderSequence):
        await log.append(idem(20))


async def test_while_the_old_queue_is_closing_its_producers_wait(cluster: Cluster) -> None:
    service, _ = await setup(cluster, sealed=False)
    log = service._partitions.get_log(TopicPartition(NAME, 0))
    with pytest.raises(PartitionClosing, match="still closing"):
        await log.append(batch(2, producer_id=PID, producer_epoch=0, base_sequence=10))
    # a new producer (sequence 0) does not need the old state: answered at the tentative offset
    fresh = await log.append(batch(2, producer_id=78, producer_epoch=0, base_sequence=0))
    assert fresh.base_offset == 110
    # reads of the undecided new item wait for its logic offset to be fixed
    assert (await log.read(10, 1 << 20)).records == b""


class GatedCheckpointReads(CountingStore):
    """Holds every read of the old physical queue's checkpoint until the test releases it."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.held: asyncio.Queue[asyncio.Event] = asyncio.Queue()

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        if key == checkpoint_key(TopicPartition(PHYS, 0), TOPIC_ID):
            gate = asyncio.Event()
            await self.held.put(gate)
            await gate.wait()
        return await super().get_with_etag(key)


async def test_pipelined_batches_are_appended_in_arrival_order(cluster: Cluster) -> None:
    """Produce requests pipelined on one connection start their appends in arrival order
    (handle_produce); the first batches of a producer on the new physical queue wait for the
    old queue's producer state. A batch arriving once that state is loaded must not overtake
    an earlier one still waiting for it: it would be refused with OUT_OF_ORDER_SEQUENCE_NUMBER
    after the client was told the earlier ones succeeded (fatal in librdkafka)."""
    service, _ = await setup(cluster)
    gated = GatedCheckpointReads(service._store)
    service._store = gated
    log = service._partitions.get_log(TopicPartition(NAME, 0))

    def produce(seq: int) -> asyncio.Task[AppendResult]:
        data = batch(2, tag=b"s%d" % seq, producer_id=PID, producer_epoch=0, base_sequence=seq)
        return asyncio.ensure_future(log.append(data))

    plog = service._partitions.local_log(TopicPartition(PHYS, 1))

    def last_sequence() -> int:
        entry = plog.producer_entry(PID)  # type: ignore[attr-defined]
        return entry.batches[-1].last_seq if entry is not None and entry.batches else -1

    first, second = produce(10), produce(12)
    (await gated.held.get()).set()  # the first request's read of the old producer state

    # the first batch is appended; the second is either appended too or reading the old state
    # (polled: nothing signals that an append has started)
    def settled() -> bool:
        return last_sequence() >= 11 and (last_sequence() >= 13 or not gated.held.empty())

    async with asyncio.timeout(10):
        while not settled():  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    third = produce(14)  # arrives now that the old producer state has been read once
    await asyncio.sleep(0.05)

    async def release() -> None:
        while True:
            (await gated.held.get()).set()

    releaser = asyncio.ensure_future(release())
    try:
        results = await asyncio.wait_for(asyncio.gather(first, second, third), 10)
    finally:
        releaser.cancel()
    assert [r.base_offset for r in results] == [10, 12, 14]
    assert not any(r.duplicate for r in results)
    assert (
        await log.append(batch(2, producer_id=PID, producer_epoch=0, base_sequence=16))
    ).base_offset == 16
