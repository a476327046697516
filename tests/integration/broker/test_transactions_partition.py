"""The partition side of transactions against a real broker process and a real client, without
the transaction coordinator: transactional batches produced by hand, markers written with a raw
WriteTxnMarkers request (as the coordinator sends it), and librdkafka's read_committed consumer
sees committed records only and nothing past the last stable offset, also after a kill -9."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.records import TRANSACTIONAL_FLAG, build_batch

from tests.integration.broker.clients import create_topic
from tests.integration.broker.conftest import topic_name
from tests.integration.broker.test_bad_input import RawClient
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

COMMITTED, OPEN, ABORTED = 5000, 5001, 5002  # producer ids


def produce(c: RawClient, topic: str, pid: int, value: bytes, *, txn: bool = True) -> int:
    records = build_batch([(None, value)], producer_id=pid, producer_epoch=0, base_sequence=0,
                          attributes=TRANSACTIONAL_FLAG if txn else 0)  # fmt: skip
    resp = c.call(0, 9, {
        "transactional_id": f"tx-{pid}" if txn else None, "acks": -1, "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    })  # fmt: skip
    part = resp.responses[0].partition_responses[0]  # type: ignore[attr-defined]
    assert part.error_code == ErrorCode.none, part
    return int(part.base_offset)


def marker(
    c: RawClient, topic: str, pid: int, commit: bool, partitions: tuple[int, ...] = (0,)
) -> list[ErrorCode]:
    resp = c.call(27, 1, {"markers": [{
        "producer_id": pid, "producer_epoch": 0, "transaction_result": commit,
        "topics": [{"name": topic, "partition_indexes": list(partitions)}], "coordinator_epoch": 0,
    }]})  # fmt: skip
    return [p.error_code for p in resp.markers[0].topics[0].partitions]  # type: ignore[attr-defined]


def latest(c: RawClient, topic: str, isolation: int) -> int:
    resp = c.call(2, 7, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                        "timestamp": -1}]}]})  # fmt: skip
    return int(resp.topics[0].partitions[0].offset)  # type: ignore[attr-defined]


def consume(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    """Everything the consumer gets from offset 0: until `expected` values arrived, then one
    more second in which nothing else may arrive."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.time_ns()}",
                         "isolation.level": isolation, "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 20
    quiet_until = None
    try:
        while time.monotonic() < (quiet_until or deadline):
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append(msg.value())
            if len(out) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return out


def test_read_committed_sees_committed_records_only_before_and_after_a_kill_9(
    local_broker: BrokerProcess,
) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    c = RawClient(local_broker.bootstrap)
    assert produce(c, topic, COMMITTED, b"committed") == 0
    assert produce(c, topic, ABORTED, b"aborted") == 1
    assert produce(c, topic, OPEN, b"open") == 2
    assert produce(c, topic, 6000, b"plain", txn=False) == 3
    assert marker(c, topic, COMMITTED, True) == [ErrorCode.none]  # offset 4
    assert marker(c, topic, ABORTED, False, (0, 9)) == [
        ErrorCode.none, ErrorCode.unknown_topic_or_partition
    ]  # fmt: skip
    assert (latest(c, topic, 0), latest(c, topic, 1)) == (6, 2)
    everything = [b"committed", b"aborted", b"open", b"plain"]
    assert consume(local_broker.bootstrap, topic, "read_uncommitted", 4) == everything
    assert consume(local_broker.bootstrap, topic, "read_committed", 1) == [b"committed"]
    c.close()

    local_broker.restart(crash=True)  # kill -9 mid-transaction: the WAL is replayed
    c = RawClient(local_broker.bootstrap)
    assert (latest(c, topic, 0), latest(c, topic, 1)) == (6, 2)
    assert marker(c, topic, OPEN, True) == [ErrorCode.none]  # offset 6
    assert latest(c, topic, 1) == 7
    # the recovered aborted index still hides the aborted record
    assert consume(local_broker.bootstrap, topic, "read_committed", 3) == [
        b"committed", b"open", b"plain"
    ]  # fmt: skip
    c.close()
