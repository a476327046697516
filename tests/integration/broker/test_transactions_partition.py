"""The partition side of transactions against a real broker process and a real client, without
the transaction coordinator: transactional batches produced by hand (on a broker with KIP-890's
verification off, as Kafka's transaction.partition.verification.enable=false), markers written
with a raw WriteTxnMarkers request (as the coordinator sends it), and librdkafka's
read_committed consumer sees committed records only and nothing past the last stable offset,
also after a kill -9. Then the verification itself, with the coordinator: a transactional
batch for a partition not in the producer's ongoing transaction is refused, and so are
transactional offsets of a group not added to it (TxnOffsetCommit)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def unverified_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(
        f"file://{tmp_path / 'objects'}",
        tmp_path / "logs",
        args=["--transaction-partition-verification-enable", "false"],
    ) as proc:
        yield proc


def produce_answer(
    c: RawClient,
    topic: str,
    pid: int,
    value: bytes,
    *,
    txn: bool = True,
    tid: str | None = None,
    epoch: int = 0,
    sequence: int = 0,
    partition: int = 0,
    version: int = 9,
) -> Any:
    records = build_batch(
        [(None, value)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        attributes=TRANSACTIONAL_FLAG if txn else 0,
    )
    resp = c.call(
        0,
        version,
        {
            "transactional_id": (tid or f"tx-{pid}") if txn else None,
            "acks": -1,
            "timeout": 5000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": records}]}
            ],
        },
    )
    return resp.responses[0].partition_responses[0]  # type: ignore[attr-defined]


def produce(c: RawClient, topic: str, pid: int, value: bytes, *, txn: bool = True) -> int:
    part = produce_answer(c, topic, pid, value, txn=txn)
    assert part.error_code == ErrorCode.none, part
    return int(part.base_offset)


def marker(
    c: RawClient, topic: str, pid: int, commit: bool, partitions: tuple[int, ...] = (0,)
) -> list[ErrorCode]:
    resp = c.call(
        27,
        1,
        {
            "markers": [
                {
                    "producer_id": pid,
                    "producer_epoch": 0,
                    "transaction_result": commit,
                    "topics": [{"name": topic, "partition_indexes": list(partitions)}],
                    "coordinator_epoch": 0,
                }
            ]
        },
    )
    return [p.error_code for p in resp.markers[0].topics[0].partitions]  # type: ignore[attr-defined]


def latest(c: RawClient, topic: str, isolation: int) -> int:
    resp = c.call(
        2,
        7,
        {
            "replica_id": -1,
            "isolation_level": isolation,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}
                    ],
                }
            ],
        },
    )
    return int(resp.topics[0].partitions[0].offset)  # type: ignore[attr-defined]


def consume(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    """Everything the consumer gets from offset 0: until `expected` values arrived, then one
    more second in which nothing else may arrive."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.time_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
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
    unverified_broker: BrokerProcess,
) -> None:
    local_broker = unverified_broker
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    c = RawClient(local_broker.bootstrap)
    assert produce(c, topic, COMMITTED, b"committed") == 0
    assert produce(c, topic, ABORTED, b"aborted") == 1
    assert produce(c, topic, OPEN, b"open") == 2
    assert produce(c, topic, 6000, b"plain", txn=False) == 3
    assert marker(c, topic, COMMITTED, True) == [ErrorCode.none]  # offset 4
    assert marker(c, topic, ABORTED, False, (0, 9)) == [
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
    ]
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
        b"committed",
        b"open",
        b"plain",
    ]
    c.close()


def until_none(call: Any, what: str) -> Any:
    deadline = time.monotonic() + 20
    while True:
        answer = call()
        if answer.error_code == ErrorCode.none:
            return answer
        assert time.monotonic() < deadline, f"{what}: {answer}"
        time.sleep(0.2)


def test_a_batch_for_a_partition_not_in_the_transaction_is_refused(
    local_broker: BrokerProcess,
) -> None:
    """KIP-890 part 1 with the coordinator in the same broker: the partition asks it before
    taking a batch that would open the producer's transaction there."""
    topic, tid = topic_name(), f"verified-{time.time_ns()}"
    create_topic(local_broker.bootstrap, topic, 2)
    c = RawClient(local_broker.bootstrap)
    until_none(lambda: c.call(10, 3, {"key": tid, "key_type": 1}), "FindCoordinator")
    for _incarnation in range(2):  # the second fences the first's epoch (checked below)
        init = until_none(
            lambda: c.call(
                22,
                4,
                {
                    "transactional_id": tid,
                    "transaction_timeout": 60000,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            ),
            "InitProducerId",
        )
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    assert epoch == 1

    def send(value: bytes, sequence: int, partition: int = 0, version: int = 9) -> Any:
        return produce_answer(
            c,
            topic,
            pid,
            value,
            tid=tid,
            epoch=epoch,
            sequence=sequence,
            partition=partition,
            version=version,
        )

    # no AddPartitionsToTxn yet: refused, INVALID_TXN_STATE before Produce v11, then
    # TRANSACTION_ABORTABLE (as Kafka 4.3.1 answers)
    assert send(b"early", 0).error_code == ErrorCode.invalid_txn_state
    assert send(b"early", 0, version=11).error_code == ErrorCode.transaction_abortable
    add = c.call(
        24,
        3,
        {
            "v3_and_below_transactional_id": tid,
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [0]}],
        },
    )
    assert add.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    # TxnOffsetCommit is verified too (Kafka 4.x's group coordinator): refused until
    # AddOffsetsToTxn adds the group, by version as Kafka answers, and at a stale epoch
    group = f"group-{tid}"
    until_none(lambda: c.call(10, 3, {"key": group, "key_type": 0}), "FindCoordinator (group)")

    def commit_offset(version: int, producer_epoch: int = epoch) -> int:
        answer = c.call(
            28,
            version,
            {
                "transactional_id": tid,
                "group_id": group,
                "producer_id": pid,
                "producer_epoch": producer_epoch,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 2,
                                "committed_metadata": None,
                            }
                        ],
                    }
                ],
            },
        )
        return int(answer.topics[0].partitions[0].error_code)

    assert commit_offset(3) == ErrorCode.invalid_txn_state
    assert commit_offset(4) == ErrorCode.transaction_abortable
    assert commit_offset(4, epoch - 1) == ErrorCode.invalid_producer_epoch
    add_offsets = c.call(
        25,
        3,
        {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "group_id": group},
    )
    assert add_offsets.error_code == ErrorCode.none
    assert commit_offset(4) == ErrorCode.none
    first = send(b"in", 0)
    assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
    assert send(b"in too", 1).error_code == ErrorCode.none  # the transaction is going on there
    assert send(b"elsewhere", 0, partition=1).error_code == ErrorCode.invalid_txn_state
    end = c.call(
        26,
        3,
        {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "committed": True},
    )
    assert end.error_code == ErrorCode.none
    # a late batch of the ended transaction would open one that no marker closes, holding
    # the last stable offset: refused (once the commit marker landed; before, it is part of
    # the transaction being committed and Kafka takes it too)
    deadline = time.monotonic() + 20
    while latest(c, topic, 1) < 3:  # two records and the commit marker
        assert time.monotonic() < deadline, "the commit marker did not land"
        time.sleep(0.1)
    assert send(b"late", 2).error_code == ErrorCode.invalid_txn_state
    assert latest(c, topic, 1) == latest(c, topic, 0) == 3  # nothing left open
    # the transaction's offset became the group's at its commit marker, and a late commit of
    # offsets in the ended transaction is refused
    fetch = {
        "group_id": group,
        "topics": [{"name": topic, "partition_indexes": [0]}],
        "require_stable": True,
    }
    committed = until_none(lambda: c.call(9, 7, fetch).topics[0].partitions[0], "OffsetFetch")
    assert committed.committed_offset == 2
    assert commit_offset(4) == ErrorCode.transaction_abortable
    c.close()
