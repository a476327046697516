"""message.timestamp.type, read back with a real consumer, on TidalMQ
(tests/integration/broker/test_log_append_time.py) and on Apache Kafka 4.3.1
(tests/integration/apache_kafka/test_log_append_time.py):

- a LogAppendTime topic: a real producer's records, sent with a year-old timestamp, are read as
  LogAppendTime at the broker's clock (the batch's attribute bit and max timestamp set on append);
- a CreateTime topic: they keep the producer's timestamp, as CreateTime;
- a batch its producer marked LogAppendTime (attribute bit 3; no client does it, so it is sent
  as a raw Produce v9): on a CreateTime topic, with a max timestamp within the bounds, it is
  appended and read as CreateTime with its records' own timestamps; without a max timestamp
  (-1), or on a LogAppendTime topic, every record is refused with INVALID_TIMESTAMP and Kafka's
  "Producer should not set timestamp type to LogAppendTime." (Kafka's LogValidator)."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    Producer,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from tidalmq_broker.admin_client import AdminClient as WireClient
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.batch_bytes import set_log_append_time

DAY_MS = 24 * 3600 * 1000
# Kafka's messages (LogValidator.processRecordErrors, validateTimestamp)
INVALID_TIMESTAMP = "One or more records have been rejected due to invalid timestamp"
MISDATED = re.compile(
    r"Invalid timestamp type in message DefaultRecord\(offset=(\d+), timestamp=(-?\d+), "
    r"key=(\d+) bytes, value=(\d+) bytes\)\. Producer should not set timestamp type to "
    r"LogAppendTime\."
)


def _produce(producer: Producer, topic: str, value: bytes, timestamp_ms: int) -> None:
    outcome: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        outcome.append(error)

    producer.produce(topic, value, key=b"k", timestamp=timestamp_ms, on_delivery=delivered)
    producer.flush(20)
    assert outcome == [None], f"{topic}: {value!r} not appended within 20 s: {outcome}"


def _marked_batch(base_ms: int, max_ms: int) -> bytes:
    """Two keyed records at `base_ms`, the batch marked LogAppendTime by its producer with
    `max_ms` as its max timestamp."""
    buf = bytearray(
        records.build_batch([(b"k", b"marked-1"), (b"k", b"marked-2")], timestamp_ms=base_ms)
    )
    set_log_append_time(buf, records.read_header(buf), max_ms)
    return bytes(buf)


def _raw_produce(bootstrap: str, topic: str, batch: bytes) -> Any:
    """Produce v9 of one batch to partition 0, acks=all: the partition's response."""
    with WireClient(bootstrap, timeout_s=30) as wire:
        answer = wire.call(
            0,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 20000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
    (topic_response,) = answer.responses
    (partition,) = topic_response.partition_responses
    return partition


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, int, int]]:
    """The first `count` records of the topic's partition 0: (value, timestamp type, timestamp)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[bytes, int, int]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(out) < count:
            assert time.monotonic() < deadline, f"{topic}: only {out} read within 30 s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            kind, timestamp = message.timestamp()
            out.append((message.value() or b"", kind, timestamp))
    finally:
        consumer.close()
    return out


def _refused_as_misdated(partition: Any, timestamp_ms: int) -> None:
    assert partition.error_code == ErrorCode.invalid_timestamp, partition
    assert partition.error_message == INVALID_TIMESTAMP, partition
    errors = [(e.batch_index, e.batch_index_error_message) for e in partition.record_errors]
    assert [i for i, _ in errors] == [0, 1], errors
    for index, message in errors:
        match = MISDATED.fullmatch(message or "")
        assert match is not None, message
        assert match.groups() == (str(index), str(timestamp_ms), "1", "8"), message


def check_log_append_time(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_time, log_append = (f"timestamps-{uuid.uuid4().hex[:8]}" for _ in range(2))
    topics = [
        NewTopic(create_time, 1, 1),
        NewTopic(log_append, 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result(20)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 20000}
    )
    year_old = int(time.time() * 1000) - 365 * DAY_MS
    before = int(time.time() * 1000)
    _produce(producer, log_append, b"client", year_old)
    _produce(producer, create_time, b"client", year_old)
    after = int(time.time() * 1000)

    # a producer's LogAppendTime batch on a CreateTime topic: its max timestamp (now) is within
    # the bounds, so it is appended, as CreateTime
    day_old = before - DAY_MS
    taken = _raw_produce(bootstrap, create_time, _marked_batch(day_old, before))
    assert taken.error_code == ErrorCode.none, taken
    assert taken.log_append_time is None, taken  # -1: a CreateTime topic's answer
    # without a max timestamp it is refused, as on a LogAppendTime topic
    _refused_as_misdated(_raw_produce(bootstrap, create_time, _marked_batch(day_old, -1)), -1)
    _refused_as_misdated(
        _raw_produce(bootstrap, log_append, _marked_batch(day_old, before)), before
    )

    (appended,) = _read(bootstrap, log_append, 1)
    value, kind, timestamp = appended
    assert (value, kind) == (b"client", TIMESTAMP_LOG_APPEND_TIME), appended
    # the broker's clock at the append (the broker runs on this machine's clock)
    assert before - 1000 <= timestamp <= after + 1000, (before, appended, after)

    assert _read(bootstrap, create_time, 3) == [
        (b"client", TIMESTAMP_CREATE_TIME, year_old),
        # the records' own timestamps, not the batch's max timestamp
        (b"marked-1", TIMESTAMP_CREATE_TIME, day_old),
        (b"marked-2", TIMESTAMP_CREATE_TIME, day_old),
    ]
