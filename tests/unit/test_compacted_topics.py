"""What a topic whose `cleanup.policy` has `compact` refuses, as Kafka 4.3.1 does: Produce of
records without a key (INVALID_RECORD, LogValidator.validateKey's message) and, when the
policy lacks `delete`, DeleteRecords (POLICY_VIOLATION). The topic validator still refuses
`compact` (docs/compaction.md section 12), so the metadata here is built directly."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.produce import INVALID_TIMESTAMP, record_refusal
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import AppendResult
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import PartitionState, TopicInfo

from tests.unit.security.test_api_authorization import call
from tests.unit.test_kafka_api_gaps import allow, broker

POLICIES = {"table": "compact", "window": "compact,delete", "orders": None}


class Log:
    """A partition log that records what reaches it."""

    def __init__(self, topic: str, seen: dict[str, Any]) -> None:
        self.topic, self.seen = topic, seen
        self.log_start_offset, self.high_watermark = 0, 9

    async def delete_records_before(self, offset: int) -> int:
        self.seen[self.topic] = offset
        return offset

    async def append(self, data: Any, *, acks: int = -1, owned: bool = False) -> AppendResult:
        self.seen[self.topic] = bytes(data)
        return AppendResult(9, 9, -1, 0)


def compacted_broker(seen: dict[str, Any]) -> Any:
    b = broker(allow(ResourceType.TOPIC, "*", AclOperation.ALL))
    for name, policy in POLICIES.items():
        info = TopicInfo(name, str(uuid.uuid4()), [PartitionState(0, 0, [0])])
        if policy is not None:
            info.configs["cleanup.policy"] = policy
        b.metadata.topics[name] = info
    b.partitions = SimpleNamespace(get_log=lambda tp: Log(tp.topic, seen))
    b.metrics = SimpleNamespace(
        produced_partition=lambda *a: None,
        produced_topic=lambda *a: None,
        produce_errors=lambda *a: None,
    )
    return b


def batch(keys: list[bytes | None], codec: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for i, key in enumerate(keys):
        builder.append(i, timestamp=1, key=key, value=b"v", headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [0, 1, 4])  # none, gzip, zstd
def test_keyless_records_are_found_in_compressed_batches_too(codec: int) -> None:
    assert records.keyless_records(batch([b"a", None, b"c", None], codec)) == [1, 3]
    assert records.keyless_records(batch([b"a"], codec)) == []


async def test_produce_refuses_records_without_a_key_on_a_compacted_topic() -> None:
    seen: dict[str, Any] = {}
    b = compacted_broker(seen)
    data = batch([b"k", None, None, None, None])
    answer = await call(
        b,
        0,
        9,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {"name": n, "partition_data": [{"index": 0, "records": data}]} for n in POLICIES
            ],
        },
    )
    out = {t["name"]: t["partition_responses"][0] for t in answer["responses"]}
    reason = "Compacted topic cannot accept message without key in topic partition table-0"
    assert out["table"]["error_code"] == ErrorCode.invalid_record
    assert out["table"]["error_message"] == (
        "One or more records have been rejected due to 4 record errors in total, and only "
        "showing the first three errors at most: ["
        + ", ".join(f"RecordError(batchIndex={i}, message='{reason}')" for i in (1, 2, 3))
        + "]"
    )
    # each keyless record is named with its own message (KIP-467), for the client to tell
    # them from the batch's other records
    named = out["table"]["record_errors"]
    assert [(e["batch_index"], e["batch_index_error_message"]) for e in named] == [
        (i, reason) for i in (1, 2, 3, 4)
    ]
    assert out["window"]["error_code"] == ErrorCode.invalid_record
    assert len(out["window"]["record_errors"]) == 4
    assert out["orders"]["error_code"] == ErrorCode.none
    assert not out["orders"]["record_errors"]
    assert set(seen) == {"orders"}  # nothing reached the compacted logs
    keyed = batch([b"k", b"j"])
    answer = await call(
        b,
        0,
        9,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [{"name": "table", "partition_data": [{"index": 0, "records": keyed}]}],
        },
    )
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.none
    assert seen["table"] == keyed


async def test_delete_records_is_refused_on_a_topic_whose_policy_lacks_delete() -> None:
    """Kafka's Partition.deleteRecordsOnLeader: POLICY_VIOLATION unless cleanup.policy has
    delete; checked after the partition lookup, so NOT_LEADER would come first."""
    seen: dict[str, Any] = {}
    b = compacted_broker(seen)
    answer = await call(
        b,
        21,
        2,
        {
            "timeout": 1000,
            "topics": [
                {"name": n, "partitions": [{"partition_index": 0, "offset": 4}]} for n in POLICIES
            ],
        },
    )
    codes = {t["name"]: t["partitions"][0]["error_code"] for t in answer["topics"]}
    assert codes == {"table": ErrorCode.policy_violation, "window": 0, "orders": 0}
    assert seen == {"window": 4, "orders": 4}  # the compact-only log was not touched


def test_only_the_first_batch_with_record_errors_is_named_as_kafka_does() -> None:
    """Kafka's LogValidator stops at the first batch with a record error: its records (indexed
    within that batch) are the ones named; a keyless record is one error even if its
    timestamp is out of bounds too, and any timestamp error makes the answer INVALID_TIMESTAMP."""
    reason = "Compacted topic cannot accept message without key in topic partition table-0"
    data = batch([b"a", None]) + batch([None, None, None])
    assert record_refusal("table", 0, data, True, None) == (
        ErrorCode.invalid_record,
        "One or more records have been rejected due to 1 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, message='{reason}')]",
        [(1, reason)],
    )
    assert record_refusal("table", 0, batch([b"a", b"b"]), True, None) is None
    now, hour = 1_800_000_000_000, 3_600_000
    refused = record_refusal("table", 0, batch([b"a", None]), True, (hour, hour), now)
    assert refused is not None
    assert refused[:2] == (ErrorCode.invalid_timestamp, INVALID_TIMESTAMP)
    assert refused[2] == [
        (
            0,
            "Timestamp 1 of message with offset 0 is out of range. The timestamp should be "
            f"within [{now - hour}, {now + hour}]",
        ),
        (1, reason),
    ]
