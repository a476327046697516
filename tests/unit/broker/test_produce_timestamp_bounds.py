"""KIP-937's bounds on a CreateTime record's timestamp, as Kafka 4.3's LogValidator checks them
(read from the configs in tidalmq_core/topics.py, checked in tidalmq_broker/apis/produce.py);
tests/integration/broker/test_timestamp_bounds.py checks them
with a real producer, on TidalMQ and on Kafka."""

from __future__ import annotations

import struct
import time
import uuid
from types import SimpleNamespace
from typing import Any

import crc32c
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.produce import INVALID_TIMESTAMP, record_refusal
from tidalmq_broker.protocol import records
from tidalmq_broker.protocol.primitives import varint
from tidalmq_broker.storage.api import AppendResult
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import PartitionState, TopicInfo
from tidalmq_core.records import apply_batch, topic_configs_record
from tidalmq_core.topics import TOPIC_CONFIG_DEFAULTS, ProduceRules, timestamp_bounds

from tests.unit.security.test_api_authorization import call
from tests.unit.test_kafka_api_gaps import allow, broker

NOW = 1_800_000_000_000
HOUR = 3_600_000
LONG_MAX = 2**63 - 1


def _batch(timestamps: list[int], *, max_timestamp: int | None = None) -> bytes:
    """An uncompressed v2 batch of records with these timestamps (the first is the batch's
    base timestamp), declaring `max_timestamp` (the records' max unless given)."""
    base = timestamps[0]
    body = bytearray()
    for delta, timestamp in enumerate(timestamps):
        record = b"\x00" + varint(timestamp - base) + varint(delta) + varint(-1)
        record += varint(1) + b"v" + varint(0)
        body += varint(len(record)) + record
    declared = max(timestamps) if max_timestamp is None else max_timestamp
    count = len(timestamps)
    after_crc = struct.pack(">hiqqqhii", 0, count - 1, base, declared, -1, -1, -1, count)
    after_crc += bytes(body)
    length = 4 + 1 + 4 + len(after_crc)
    crc = crc32c.crc32c(after_crc)
    return struct.pack(">qiibI", 0, length, -1, records.MAGIC_V2, crc) + after_crc


def _timestamp_refusal(data: bytes, before_ms: int, after_ms: int, now_ms: int) -> bool:
    return record_refusal("t", 0, data, False, (before_ms, after_ms), now_ms) is not None


def test_a_refusal_names_each_record_out_of_bounds_as_kafka_does() -> None:
    refused = record_refusal(
        "t", 0, _batch([NOW, NOW - 2 * HOUR, NOW + 2 * HOUR]), False, (HOUR, 60_000), NOW
    )
    assert refused is not None
    code, message, errors = refused
    assert (code, message) == (ErrorCode.invalid_timestamp, INVALID_TIMESTAMP)
    bounds = f"[{NOW - HOUR}, {NOW + 60_000}]"
    assert errors == [
        (
            1,
            f"Timestamp {NOW - 2 * HOUR} of message with offset 1 is out of range. "
            f"The timestamp should be within {bounds}",
        ),
        (
            2,
            f"Timestamp {NOW + 2 * HOUR} of message with offset 2 is out of range. "
            f"The timestamp should be within {bounds}",
        ),
    ]


def test_records_within_the_bounds_are_taken() -> None:
    batch = _batch([NOW - HOUR, NOW, NOW + 60_000])
    assert not _timestamp_refusal(batch, HOUR, 60_000, NOW)


def test_a_record_older_than_before_max_is_refused_wherever_it_is_in_the_batch() -> None:
    assert _timestamp_refusal(_batch([NOW - HOUR - 1]), HOUR, HOUR, NOW)
    # neither the base timestamp nor the max shows it
    assert _timestamp_refusal(_batch([NOW, NOW - 2 * HOUR, NOW]), HOUR, HOUR, NOW)


def test_a_record_further_ahead_than_after_max_is_refused() -> None:
    assert _timestamp_refusal(_batch([NOW, NOW + HOUR + 1]), LONG_MAX, HOUR, NOW)
    assert not _timestamp_refusal(_batch([NOW, NOW + HOUR]), LONG_MAX, HOUR, NOW)
    # with a bound on age the records are read: a max timestamp understated is no way round
    assert _timestamp_refusal(_batch([NOW, NOW + 2 * HOUR], max_timestamp=NOW), HOUR, HOUR, NOW)


def test_kafkas_defaults_take_any_age_and_an_hour_ahead() -> None:
    before, after = timestamp_bounds(TOPIC_CONFIG_DEFAULTS) or (0, 0)
    assert (before, after) == (LONG_MAX, HOUR)
    assert not _timestamp_refusal(_batch([0, NOW - 50 * 365 * 24 * HOUR]), before, after, NOW)
    assert _timestamp_refusal(_batch([NOW + HOUR + 1]), before, after, NOW)


def test_a_record_without_timestamp_is_not_checked() -> None:
    assert not _timestamp_refusal(_batch([-1]), 0, 0, NOW)


def test_kafkas_long_arithmetic_is_kept() -> None:
    # now - timestamp wraps on Java longs: a record at Long.MIN_VALUE is "in the future" and an
    # after bound of Long.MAX_VALUE takes it
    assert not _timestamp_refusal(_batch([-(2**63)]), 0, LONG_MAX, NOW)


def test_log_append_time_topics_are_not_checked() -> None:
    configs = {**TOPIC_CONFIG_DEFAULTS, "message.timestamp.type": "LogAppendTime"}
    assert timestamp_bounds(configs) is None
    configs = {**TOPIC_CONFIG_DEFAULTS, "message.timestamp.before.max.ms": " +5 "}
    assert timestamp_bounds(configs) == (5, HOUR)


def test_a_malformed_batch_is_left_to_the_append() -> None:
    assert not _timestamp_refusal(b"\x00" * 30, 0, 0, NOW)


def _bounded_broker(seen: list[bytes]) -> Any:
    """A broker leading `clicks`-0 with Kafka's default bounds; its log keeps what it takes."""

    class Log:
        log_start_offset, high_watermark = 0, 0

        async def append(self, data: Any, *, acks: int = -1, owned: bool = False) -> AppendResult:
            seen.append(bytes(data))
            return AppendResult(0, 0, -1, 0)

    b = broker(allow(ResourceType.TOPIC, "*", AclOperation.ALL))
    b.metadata.topics["clicks"] = TopicInfo(
        "clicks", str(uuid.uuid4()), [PartitionState(0, 0, [0])]
    )
    b.partitions = SimpleNamespace(get_log=lambda tp: Log())
    b.metrics = SimpleNamespace(
        produced_partition=lambda *a: None,
        produced_topic=lambda *a: None,
        produce_errors=lambda *a: None,
    )
    return b


async def _produce_code(b: Any, data: bytes) -> int:
    answer = await call(
        b,
        0,
        9,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [{"name": "clicks", "partition_data": [{"index": 0, "records": data}]}],
        },
    )
    return int(answer["responses"][0]["partition_responses"][0]["error_code"])


async def test_a_config_change_is_seen_by_the_next_produce() -> None:
    """The bounds are derived once per config change (TopicInfo.produce_rules), not per request: a
    change through a metadata update (how AlterConfigs reaches every broker), and even one
    made in place, is what the next produce checks against."""
    seen: list[bytes] = []
    b = _bounded_broker(seen)
    day_old = _batch([int(time.time() * 1000) - 24 * HOUR])
    assert await _produce_code(b, day_old) == ErrorCode.none  # any age by default
    topic = b.metadata.topics["clicks"]
    assert topic.produce_rules() is topic.produce_rules()  # derived by that produce, kept
    bound = {"message.timestamp.before.max.ms": str(HOUR)}
    apply_batch(b.metadata, [topic_configs_record("clicks", bound)], b.metadata.version + 1)
    assert await _produce_code(b, day_old) == ErrorCode.invalid_timestamp
    b.metadata.topics["clicks"].configs["message.timestamp.type"] = "LogAppendTime"
    assert await _produce_code(b, day_old) == ErrorCode.none  # not checked on LogAppendTime
    apply_batch(b.metadata, [topic_configs_record("clicks", {})], b.metadata.version + 1)
    assert await _produce_code(b, _batch([int(time.time() * 1000) + 2 * HOUR])) == (
        ErrorCode.invalid_timestamp  # back to Kafka's default upper bound
    )
    assert len(seen) == 2


def test_produce_rules_are_kept_until_the_configs_change() -> None:
    topic = TopicInfo("clicks", str(uuid.uuid4()), [PartitionState(0, 0, [0])])
    rules = topic.produce_rules()
    assert rules == ProduceRules(False, (LONG_MAX, HOUR), log_append_time=False)
    assert topic.produce_rules() is rules  # not derived again
    topic.configs = {"cleanup.policy": "compact,delete"}
    assert topic.produce_rules() == ProduceRules(True, (LONG_MAX, HOUR), log_append_time=False)
    topic.configs["message.timestamp.type"] = "LogAppendTime"  # a change made in place
    assert topic.produce_rules() == ProduceRules(True, None, log_append_time=True)
