"""KIP-937's bounds on record timestamps (message.timestamp.before.max.ms and after.max.ms),
checked with a real producer, on TidalMQ (tests/integration/broker/test_timestamp_bounds.py)
and on Apache Kafka 4.3.1 (tests/integration/apache_kafka/test_timestamp_bounds.py): a
CreateTime record out of range is refused with INVALID_TIMESTAMP, one within is appended, and a
LogAppendTime topic takes any."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

HOUR_MS = 3600 * 1000
# Kafka's message (LogValidator.processRecordErrors)
INVALID_TIMESTAMP = "One or more records have been rejected due to invalid timestamp"


def _produce(producer: Producer, topic: str, timestamp_ms: int) -> KafkaError | None:
    """One record with this timestamp, waited for: its delivery error, None if appended."""
    outcome: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        outcome.append(error)

    producer.produce(topic, b"record", timestamp=timestamp_ms, on_delivery=delivered)
    producer.flush(20)
    assert outcome, f"no delivery report for the record at {timestamp_ms} within 20 s"
    return outcome[0]


def check_timestamp_bounds(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    bounded, default, log_append = (f"timestamps-{uuid.uuid4().hex[:8]}" for _ in range(3))
    topics = [
        NewTopic(
            bounded,
            1,
            1,
            config={
                "message.timestamp.before.max.ms": str(HOUR_MS),
                "message.timestamp.after.max.ms": "60000",
            },
        ),
        NewTopic(default, 1, 1),
        NewTopic(
            log_append,
            1,
            1,
            config={
                "message.timestamp.type": "LogAppendTime",
                "message.timestamp.before.max.ms": "0",
                "message.timestamp.after.max.ms": "0",
            },
        ),
    ]
    for future in admin.create_topics(topics).values():
        future.result(20)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 20000}
    )
    try:
        now = int(time.time() * 1000)
        day_ms = 24 * HOUR_MS
        cases = [
            (bounded, now - 2 * HOUR_MS, False),  # older than an hour
            (bounded, now - 10 * 60000, True),
            (bounded, now, True),
            (bounded, now + 10 * 60000, False),  # more than a minute ahead
            (default, now - 365 * day_ms, True),  # Kafka's default: any age...
            (default, now + 10 * 60000, True),
            (default, now + 2 * HOUR_MS, False),  # ...at most an hour ahead
            (log_append, now - 365 * day_ms, True),  # the broker's time: not checked
            (log_append, now + 2 * HOUR_MS, True),
        ]
        wrong = []
        for topic, timestamp, appended in cases:
            error = _produce(producer, topic, timestamp)
            if appended and error is not None:
                wrong.append(f"{topic} at {timestamp - now:+d} ms: refused with {error}")
            if not appended and (error is None or error.code() != KafkaError.INVALID_TIMESTAMP):
                wrong.append(f"{topic} at {timestamp - now:+d} ms: {error}, not INVALID_TIMESTAMP")
        assert not wrong, "\n".join(wrong)
    finally:
        producer.flush(5)
