"""An idempotent producer against a partition whose owner keeps failing: WAL flushes refused, or
written and reported failed (an ambiguous timeout), and owners killed with appends in flight,
the next owner (epoch + 1) recovering from the WAL. The producer behaves as librdkafka does: up
to five batches in flight, each failed batch retried with the same sequence numbers, in order,
at the current owner. Whatever happens, the log holds every sequence number exactly once, in
order, every acknowledged batch among them, and the broker never answers a retry with
OUT_OF_ORDER_SEQUENCE or UNKNOWN_PRODUCER_ID (librdkafka bumps its epoch on those and may then
write a batch twice).

Seeded rounds, so a failure names its seed; on the local-directory store and on the real S3
server."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable

import pytest
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    AppendResult,
    OutOfOrderSequence,
    PartitionConfig,
    PartitionLog,
    StorageError,
    UnknownProducerId,
)
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_core.model import TopicPartition

from tests.integration.storage.conftest import Cluster
from tests.support.storage_helpers import batch

pytestmark = pytest.mark.integration

TP = TopicPartition("events", 0)
TOPIC_ID = "6a1f0c3e-0000-4000-8000-0000000000e1"
CFG = PartitionConfig()
PID, EPOCH = 7, 0
IN_FLIGHT = 5


class Owner:
    """The partition's current owner: an engine of its own (broker id = epoch) and the log."""

    def __init__(self, engine: ObjectStreamEngine, log: PartitionLog, epoch: int) -> None:
        self.engine, self.log, self.epoch = engine, log, epoch


async def take_over(cluster: Cluster, epoch: int) -> Owner:
    engine = await cluster.engine(epoch)
    log = await engine.open_partition(TP, TOPIC_ID, epoch, CFG)
    return Owner(engine, log, epoch)


async def run_producer(cluster: Cluster, seed: int, rounds: int = 30) -> None:
    rng = random.Random(seed)
    owner = await take_over(cluster, 1)
    next_seq = 0
    unacked: list[tuple[int, int]] = []  # (first seq, record count), in sequence order
    acked: set[int] = set()
    for round_ in range(rounds):
        # what goes out this round: the unacknowledged batches again, in order, then new ones
        out = list(unacked[:IN_FLIGHT])
        while len(out) < IN_FLIGHT:
            n = rng.randint(1, 3)
            unacked.append((next_seq, n))
            out.append((next_seq, n))
            next_seq += n
        store = cluster.stores[-1]
        kill = rng.random() < 0.15
        if rng.random() < 0.2:
            store.mode = rng.choice(["before", "after"])
            store.fail_put = lambda key: key.startswith("wal/")
        pending: list[tuple[tuple[int, int], Awaitable[AppendResult] | None]] = []
        for first, n in out:
            data = batch(n, producer_id=PID, producer_epoch=EPOCH, base_sequence=first)
            try:
                pending.append(((first, n), owner.log.start_append(data)))
            except (OutOfOrderSequence, UnknownProducerId) as exc:
                raise AssertionError(f"seed {seed} round {round_}: {exc!r}") from exc
            except StorageError:
                pending.append(((first, n), None))  # refused at once: retried next round
        if kill:
            # kill -9 with these appends in flight (their flush may or may not land)
            await asyncio.sleep(rng.choice([0, 0.001, 0.003, 0.01]))
            await owner.engine.abandon()
            for _, fut in pending:
                if fut is not None:
                    await asyncio.gather(fut, return_exceptions=True)
            owner = await take_over(cluster, owner.epoch + 1)
            continue
        for (first, _n), fut in pending:
            if fut is None:
                continue
            try:
                await fut
            except (OutOfOrderSequence, UnknownProducerId) as exc:
                raise AssertionError(f"seed {seed} round {round_}: {exc!r}") from exc
            except StorageError:
                continue
            acked.add(first)
        unacked = [(f, n) for f, n in unacked if f not in acked]
        store.fail_put = None
        # a partition rolling back after a failed flush refuses appends for a moment
        for _ in range(200):
            if not getattr(owner.log, "state", None) or owner.log.state.name == "OPEN":
                break
            await asyncio.sleep(0.005)
    # the last retries, with no faults, until everything is acknowledged
    cluster.stores[-1].fail_put = None
    for _ in range(50):
        if not unacked:
            break
        for first, n in list(unacked):
            data = batch(n, producer_id=PID, producer_epoch=EPOCH, base_sequence=first)
            try:
                await owner.log.append(data)
            except (OutOfOrderSequence, UnknownProducerId) as exc:
                raise AssertionError(f"seed {seed} final retries: {exc!r}") from exc
            except StorageError:
                await asyncio.sleep(0.02)
                break
            acked.add(first)
            unacked.remove((first, n))
    assert not unacked, f"seed {seed}: never acknowledged: {unacked[:5]}"

    # the log: every sequence number once, in order along the offsets
    seqs: list[int] = []
    offset = 0
    while offset < owner.log.high_watermark:
        result = await owner.log.read(offset, 1 << 20)
        view = memoryview(result.records)
        for h in records.iter_headers(view, verify_crc=True):
            if h.last_offset < offset:
                continue
            seqs.extend(range(h.base_sequence, h.last_sequence + 1))
            offset = h.last_offset + 1
    assert seqs == list(range(next_seq)), (
        f"seed {seed}: the log's sequence numbers are not 0..{next_seq - 1} once each "
        f"(duplicates: {sorted({s for s in seqs if seqs.count(s) > 1})[:10]})"
    )


@pytest.mark.parametrize("seed", range(4))
async def test_every_batch_once_through_failed_flushes_and_kills(
    cluster: Cluster, seed: int
) -> None:
    await run_producer(cluster, seed)
