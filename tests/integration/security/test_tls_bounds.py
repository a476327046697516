"""The listener's bounds ([R1] item 2) on the TLS listeners of the security suite's broker
process (SASL_SSL, SSL, SASL_PLAINTEXT and PLAINTEXT listeners, every bound at its default).

With the bounds merged, the SASL_SSL clients of test_acls.py stopped being answered (their
metadata requests timed out): the listener asked the transport to report every flush with a
write-buffer high water of 0, which the TLS layer, comparing with >= where plain transports use
>, took as "paused" with nothing buffered; a connection whose next request was read before the
previous answer was written then waited for a read that never came (tests/unit/server/
test_listener_bounds.py has the deterministic case). Here real clients do what those tests did,
many times over: mTLS and SASL_SSL clients come and go, each asks for metadata, ACLs and
configs, produces and consumes, and every call is answered within its timeout.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.security.conftest import SecureBroker, new_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROUNDS = 20
CALL_TIMEOUT_S = 10  # an answer takes milliseconds; a stalled connection waits 30 s and more
ANY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def admin_calls(conf: dict[str, Any], topic: str) -> None:
    """What kafka-acls and an admin do over one connection: metadata, ACLs, configs."""
    admin = AdminClient(conf)
    assert topic in admin.list_topics(timeout=CALL_TIMEOUT_S).topics
    admin.describe_acls(ANY_ACL).result(CALL_TIMEOUT_S)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin.describe_configs([resource])[resource].result(CALL_TIMEOUT_S)


def produce_and_consume(conf: dict[str, Any], topic: str, tag: str) -> None:
    producer = Producer(
        {**conf, "acks": "all", "linger.ms": 2, "message.timeout.ms": CALL_TIMEOUT_S * 1000}
    )
    for i in range(20):
        producer.produce(topic, f"{tag}-{i}".encode() * 50)
    assert producer.flush(CALL_TIMEOUT_S) == 0
    consumer = Consumer(
        {
            **conf,
            "group.id": f"g-{tag}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + CALL_TIMEOUT_S * 2
    while got < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got += 1
    consumer.close()
    assert got >= 20, f"round {tag}: {got} records consumed"


def test_tls_clients_come_and_go_and_every_call_is_answered(secure_broker: SecureBroker) -> None:
    topic = new_topic(secure_broker)
    slowest = 0.0
    for round_ in range(ROUNDS):
        tag = f"{round_}-{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        for _ in range(3):  # mTLS and SASL_SSL clients connect, ask, and close
            admin_calls(secure_broker.confluent("SSL"), topic)
            admin_calls(secure_broker.confluent("SASL_SSL"), topic)
        produce_and_consume(secure_broker.confluent("SASL_SSL"), topic, tag)
        slowest = max(slowest, time.monotonic() - started)
    print(f"\n{ROUNDS} rounds over SSL and SASL_SSL, the slowest {slowest:.1f} s")
