"""StaticTopic resources against a real kube-apiserver, with the operator and three broker
processes (the fixtures of test_operator.py): create, produce through Kafka, remap by spec,
change the broker set, a refused totalQueues change, delete."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tests.integration.operator.test_operator import (  # noqa: F401  (fixtures)
    api_with_crds,
    apply,
    condition,
    deployment,
    get,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def static_topic(name: str, queues: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "StaticTopic",
        "metadata": {"name": name},
        "spec": {"totalQueues": queues, **spec},
    }


def status_of(d: dict[str, Any], name: str) -> dict[str, Any]:
    return get(d, "statictopic", name).get("status") or {}


def ready(d: dict[str, Any], name: str) -> bool:
    c = condition(get(d, "statictopic", name), "Ready")
    return c is not None and c["status"] == "True"


def test_static_topic_lifecycle(deployment: dict[str, Any]) -> None:  # noqa: F811
    d = deployment
    apply(d, static_topic("events", 6))
    wait_for(lambda: ready(d, "events"), what="StaticTopic Ready")
    status = status_of(d, "events")
    assert status["epoch"] == 0 and len(status["queues"]) == 6
    assert {q["broker"] for q in status["queues"]} == {0, 1, 2}
    assert all(q["gen"] == 0 and q["items"] == 1 for q in status["queues"])
    assert sorted(status["mapping"]) == [str(q) for q in range(6)]

    # a Kafka client sees a 6-partition topic and writes keyed records to it
    bootstrap = d["brokers"][0].bootstrap
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(120):
        producer.produce("events", key=b"k%d" % (i % 11), value=b"%d" % i)
    assert producer.flush(30) == 0

    # an explicit remap request (spec.remap) switches the queue to the requested broker
    queue0 = status["queues"][0]
    target = (queue0["broker"] + 1) % 3
    remap = [
        {"queue": 0, "broker": target, "mode": "strict"},
        {"queue": 1, "broker": (status["queues"][1]["broker"] + 1) % 3},
    ]
    apply(d, static_topic("events", 6, remap=remap))

    def unmet(resource: dict[str, Any]) -> list[str]:
        """What the remap has not reached yet, by name (empty: done)."""
        qs = (resource.get("status") or {}).get("queues", [])
        c = condition(resource, "Ready")
        if len(qs) != 6:
            return [f"{len(qs)} queues"]
        checks = {
            "queue 0 broker": qs[0]["broker"] == target,
            "queue 0 gen": qs[0]["gen"] == 1,
            "queue 0 items": qs[0]["items"] == 2,
            "queue 1 gen": qs[1]["gen"] == 1,
            "Ready": c is not None and c["status"] == "True",
        }
        return [what for what, ok in checks.items() if not ok]

    def remap_state() -> str:
        resource = get(d, "statictopic", "events")
        return f"unmet {unmet(resource)}; status {json.dumps(resource.get('status'))}"

    wait_for(
        lambda: not unmet(get(d, "statictopic", "events")),
        what="queues 0 and 1 remapped",
        detail=remap_state,
    )
    mapping = status_of(d, "events")["mapping"]["0"]
    assert mapping[0]["endOffset"] >= 0 and mapping[1]["logicOffset"] == (
        mapping[0]["logicOffset"] + mapping[0]["endOffset"] - mapping[0]["startOffset"]
    )
    for i in range(120, 240):
        producer.produce("events", key=b"k%d" % (i % 11), value=b"%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(["events"])
    values: set[int] = set()
    wait_for(lambda: _poll(consumer, values) >= 240, what="every record read back")
    consumer.close()
    assert values == set(range(240))

    # totalQueues is fixed: another value (larger or smaller) is admitted and refused by the
    # operator with a clear condition; the topic keeps its queues; setting it back clears it
    for wrong in (8, 4):
        apply(d, static_topic("events", wrong, remap=[r for r in remap if r["queue"] < wrong]))

        def refused(wrong: int = wrong) -> bool:
            c = condition(get(d, "statictopic", "events"), "Error")
            return (
                c is not None
                and c["status"] == "True"
                and c["reason"] == "TotalQueuesImmutable"
                and f"asked for {wrong}" in c["message"]
            )

        wait_for(refused, what=f"TotalQueuesImmutable condition for {wrong}")
        assert len(status_of(d, "events")["queues"]) == 6
    c = condition(get(d, "statictopic", "events"), "Error")
    assert c is not None and "never change" in c["message"]
    meta = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    assert len(meta.list_topics("events", timeout=10).topics["events"].partitions) == 6
    meta.close()

    # a new broker set: the queues leave broker 2 and spread over 0 and 1
    apply(d, static_topic("events", 6, brokers=[0, 1]))

    def off_broker_2() -> bool:
        s = status_of(d, "events")
        qs = s.get("queues", [])
        error = condition(get(d, "statictopic", "events"), "Error")
        return (
            len(qs) == 6
            and all(q["broker"] in (0, 1) for q in qs)
            and ready(d, "events")
            and error is not None
            and error["status"] == "False"
        )

    wait_for(off_broker_2, timeout_s=90, what="queues off broker 2")
    assert status_of(d, "events")["epoch"] >= 2

    # delete: the finalizer removes the topic and its physical queues
    d["api"].kubectl("-n", d["ns"], "delete", "statictopic", "events", "--timeout=60s")
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    wait_for(lambda: "events" not in probe.list_topics(timeout=10).topics, what="topic gone")
    probe.close()


def _poll(consumer: Consumer, values: set[int]) -> int:
    for m in consumer.consume(500, 1.0):
        if m.error() is None:
            values.add(int(m.value()))
    return len(values)
