"""A broker the controller fenced gives up every partition (`release_all`) and registers again
as a new incarnation. Until then, metadata it still receives must not hand it back the
partitions at their old epochs.

It did: the controller crash test (tests/integration/cluster/test_controller_crash.py) read 50
records twice. Broker 0 was fenced while its partitions were open at epoch 1; the next
metadata batch (the acknowledged ends, "floors", of the partitions it had reported) named those
partitions again, and the fenced incarnation served them again at epoch 1: it took appends it
could no longer acknowledge (a batch of partition 330 at leader epoch 1, written 0.5 s after the
fence) and even reopened closed partitions at epoch 1 ("opened (clean, epoch 1 -> 1)"). A
partition that answers NOT_LEADER_OR_FOLLOWER to one batch (its wish gone) and then takes the
producer's next one finds that batch ahead of its sequence: OUT_OF_ORDER_SEQUENCE_NUMBER, on
which librdkafka bumps the producer's epoch ("skipped sequence numbers") and sends every
unacknowledged batch again as new records, including the two that broker 0 had made durable in
its last flush before the fence without acknowledging them (partitions 300 and 360: epoch 0
sequences 63-64 and 17-64, then again as epoch 1 sequences 0-1 and 0-47).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_broker.apis import KAFKA_APIS
from tidalmq_broker.broker import Broker
from tidalmq_broker.partitions import NotLeader
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import floors_record, partition_record, topic_record

from tests.support.partition_managers import apply_records, partition_manager
from tests.support.storage_helpers import idempotent_batch

TOPIC = "orders"
TOPIC_ID = "id-orders"
TP = TopicPartition(TOPIC, 0)
PRODUCER_ID = 1000


def batch(seq: int, n: int = 2) -> bytes:
    return idempotent_batch(PRODUCER_ID, seq, n)


async def test_a_fenced_broker_does_not_take_its_partitions_back_before_it_registers_again(
    tmp_path: Path,
) -> None:
    async with partition_manager(tmp_path / "objects") as (engine, manager):
        meta = ClusterMetadata(cluster_id="c", version=1)
        manager.apply(meta)

        def update(*batch_records: dict[str, object]) -> None:
            apply_records(manager, meta, *batch_records)

        led_here = [PartitionState(leader=0, leader_epoch=1, replicas=[0]) for _ in range(2)]
        update(topic_record(TopicInfo(TOPIC, TOPIC_ID, led_here)))
        assert await manager.wait_settled(30)
        log = manager.local_log(TP)
        assert log.leader_epoch == 1
        assert (await log.append(batch(0))).base_offset == 0  # acknowledged

        # fenced: every partition is given up; the producer's next batch is refused
        manager.release_all()
        with pytest.raises(NotLeader):
            manager.local_log(TP)
        # metadata still arrives while the broker registers again: the floors of what it had
        # reported, which name its partitions (still led by broker 0 at epoch 1)
        update(floors_record(TOPIC, TOPIC_ID, {0: 2, 1: 0}))
        # the batch after the refused one must be refused too (retriably), not taken by the
        # fenced incarnation, which found it ahead of the log: OUT_OF_ORDER_SEQUENCE_NUMBER
        with pytest.raises(NotLeader):
            served = manager.local_log(TP)
            await served.append(batch(4))
        assert await manager.wait_settled(30)
        assert engine.partitions() == [], "the fenced incarnation kept or reopened partitions"

        # registered again: the controller took the partitions back at epoch 2, and the new
        # incarnation serves them, the producer's retries in order (the first a duplicate)
        update(*(partition_record(TopicPartition(TOPIC, i), leader_epoch=2) for i in range(2)))
        manager.rejoin(meta)
        assert await manager.wait_settled(30)
        log = manager.local_log(TP)
        assert log.leader_epoch == 2
        assert (await log.append(batch(0))).duplicate
        assert (await log.append(batch(2))).base_offset == 2
        assert (await log.append(batch(4))).base_offset == 4


class Steps:
    """Stands in for the broker's PartitionManager: records the steps of a fence."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def release_all(self) -> None:
        self.steps.append("release_all")

    async def wait_settled(self, timeout_s: float) -> bool:
        self.steps.append("wait_settled")
        return True

    def rejoin(self, meta: ClusterMetadata) -> None:
        self.steps.append(f"rejoin at version {meta.version}")


async def test_the_broker_rejoins_its_partitions_only_once_registered_again() -> None:
    broker = Broker(BrokerSettings(broker_id=0), apis=KAFKA_APIS)
    steps = Steps()
    broker.partitions = steps  # type: ignore[assignment]
    broker.metadata = ClusterMetadata(cluster_id="c", version=7)
    fenced_incarnation = broker.incarnation

    async def register() -> None:
        assert broker.incarnation != fenced_incarnation  # a new incarnation registers
        steps.steps.append("registered")
        broker.metadata = ClusterMetadata(cluster_id="c", version=9)  # caught up meanwhile

    broker._register_until_done = register  # type: ignore[method-assign]
    await broker._on_fenced("fenced: a partition did not close in time")
    assert steps.steps == ["release_all", "wait_settled", "registered", "rejoin at version 9"]
