"""Consumer groups of the pure-Python clients (kafka-python, aiokafka), not only librdkafka:
each group consumes part of a topic, commits, the broker restarts, and each resumes exactly
where it committed."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer
from kafka.structs import TopicPartition as KafkaPythonTopicPartition

from tests.integration.broker.clients import create_topic, producer
from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

TOTAL = 300
PARTITIONS = 3
Record = tuple[int, int, bytes]  # partition, offset, value


def kafka_python_session(
    bootstrap: str, topic: str, group: str, want: int
) -> tuple[dict[int, int], list[Record]]:
    """Join `group`, read the committed offsets, consume `want` records, commit, leave."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1000,
    )
    consumer.subscribe([topic])
    committed = {
        p: consumer.committed(KafkaPythonTopicPartition(topic, p)) or 0 for p in range(PARTITIONS)
    }
    records: list[Record] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < want and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500, max_records=50).values():
                records += [(m.partition, m.offset, m.value) for m in msgs]
        consumer.commit()
    finally:
        consumer.close()
    return committed, records


async def aiokafka_session(
    bootstrap: str, topic: str, group: str, want: int
) -> tuple[dict[int, int], list[Record]]:
    """The same with aiokafka."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1000,
    )
    await consumer.start()
    records: list[Record] = []
    try:
        committed = {
            p: await consumer.committed(AioTopicPartition(topic, p)) or 0 for p in range(PARTITIONS)
        }
        deadline = time.monotonic() + 60
        while len(records) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=50)
            for msgs in batch.values():
                records += [(m.partition, m.offset, m.value) for m in msgs]
        await consumer.commit()
    finally:
        await consumer.stop()
    return committed, records


SESSIONS = {
    "kafka-python": kafka_python_session,
    "aiokafka": lambda *args: asyncio.run(aiokafka_session(*args)),
}


def test_python_client_groups_commit_and_resume_after_a_restart(
    local_broker: BrokerProcess,
) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, PARTITIONS)
    p = producer(local_broker.bootstrap)
    for i in range(TOTAL):
        p.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0

    first: dict[str, list[Record]] = {}
    for client, session in SESSIONS.items():
        committed, records = session(local_broker.bootstrap, topic, f"{client}-group", TOTAL // 2)
        assert committed == dict.fromkeys(range(PARTITIONS), 0), client
        assert TOTAL // 2 <= len(records) < TOTAL, (client, len(records))
        first[client] = records

    local_broker.restart()

    for client, session in SESSIONS.items():
        where = dict.fromkeys(range(PARTITIONS), 0)  # the next offset of each partition
        for partition, offset, _ in first[client]:
            where[partition] = max(where[partition], offset + 1)
        rest_count = TOTAL - len(first[client])
        committed, rest = session(local_broker.bootstrap, topic, f"{client}-group", rest_count)
        assert committed == where, (client, "resumes from what it committed before the restart")
        values = sorted(int(v) for _, _, v in first[client] + rest)
        assert values == list(range(TOTAL)), (client, "nothing lost, nothing read twice")
