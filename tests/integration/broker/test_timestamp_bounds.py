"""KIP-937's timestamp bounds on a TidalMQ broker, with a real producer: the cases of
tests/support/timestamp_bounds.py, which tests/integration/apache_kafka/test_timestamp_bounds.py
runs on Apache Kafka 4.3.1, and a change of the bounds seen by the produces after it (the
broker derives them once per config change, docs/topic-configs.md)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.support.broker_process import BrokerProcess
from tests.support.timestamp_bounds import HOUR_MS, _produce, check_timestamp_bounds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_records_out_of_the_topics_timestamp_bounds_are_refused(
    local_broker: BrokerProcess,
) -> None:
    check_timestamp_bounds(local_broker.bootstrap)


def test_a_change_of_the_bounds_is_seen_by_later_produces(local_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": local_broker.bootstrap})
    topic = f"timestamps-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(20)
    producer = Producer(
        {"bootstrap.servers": local_broker.bootstrap, "linger.ms": 0, "message.timeout.ms": 20000}
    )

    def day_old_refused() -> bool:
        error = _produce(producer, topic, int(time.time() * 1000) - 24 * HOUR_MS)
        assert error is None or error.code() == KafkaError.INVALID_TIMESTAMP, error
        return error is not None

    def alter(op: AlterConfigOpType, value: str | None) -> None:
        entry = ConfigEntry("message.timestamp.before.max.ms", value, incremental_operation=op)
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        admin.incremental_alter_configs([resource])[resource].result(20)

    def until(refused: bool) -> None:
        # the change reaches the broker as a metadata update, after AlterConfigs answered
        deadline = time.monotonic() + 20
        while day_old_refused() != refused:
            assert time.monotonic() < deadline, f"still {not refused} 20 s after the change"
            time.sleep(0.05)

    try:
        assert not day_old_refused()  # Kafka's default: any age
        alter(AlterConfigOpType.SET, str(HOUR_MS))
        until(refused=True)
        alter(AlterConfigOpType.DELETE, None)
        until(refused=False)
    finally:
        producer.flush(5)
