"""The chart with TLS and SCRAM on, on the session's Kubernetes cluster ([R1] acceptance).

`listeners.tls.enabled` and `listeners.sasl.enabled` make the brokers' Kafka listener SASL_SSL
(SCRAM-SHA-512) with certificates the chart generates, and the authorizer on; the control plane
between the operator and the brokers runs with mTLS (`controlPlane.tls.enabled`). A `User` resource
gives a client its Secret: its password works, its ACLs are enforced (a topic outside them is
TOPIC_AUTHORIZATION_FAILED), and deleting the User revokes it. A client without credentials, or
speaking PLAINTEXT, is refused; the NetworkPolicies are there.

The clients run on the host and reach the brokers by their pod IPs (broker.advertise=podIP),
which the generated certificate does not name (it names the brokers' DNS names): they verify
the chain against the chart's CA but not the host name. This cluster's network plugin does
not enforce NetworkPolicy, so only their presence is checked."""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from e2e.kube import Cluster, wait_until
from e2e.tidalmq_release import (
    FULL,
    bootstrap,
    installed_release,
    ready,
    topic_status,
)

pytestmark = pytest.mark.timeout(1200)

TOPIC = "orders"
HIDDEN = "payroll"


def secret_data(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    body = cluster.kubectl_json("-n", ns, "get", "secret", name)
    return {k: base64.b64decode(v).decode() for k, v in body["data"].items()}


def user(name: str, acls: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "User",
            "metadata": {"name": name},
            "spec": {"authentication": {"type": "scram-sha-512"}, "authorization": {"acls": acls}},
        }
    )


def user_ready(cluster: Cluster, ns: str, name: str) -> bool:
    return ready(cluster.kubectl_json("-n", ns, "get", "user", name).get("status") or {})


def create_topic(cluster: Cluster, ns: str, name: str) -> None:
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": name},
                "spec": {"partitions": 3},
            }
        ),
        ns,
    )
    wait_until(f"Topic {name} Ready", lambda: ready(topic_status(cluster, ns, name)), timeout=180)


def control_call_without_certificate(cluster: Cluster, ns: str) -> tuple[int, str]:
    """A GET of the controller's data-loss report, with the cluster's admin token but no client
    certificate, through the controller Service from the host: (HTTP status, body)."""
    svc = cluster.kubectl_json("-n", ns, "get", "service", f"{FULL}-operator")
    assert svc["spec"]["selector"].get("tidalmq.io/controller") == "active", svc["spec"]
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "controller")
    token = secret_data(cluster, ns, f"{FULL}-control")["admin-token"]
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # not the client under test
    request = urllib.request.Request(
        f"https://{svc['spec']['clusterIP']}:{port}/v1/data-loss",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=ctx) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def refused(conf: dict[str, Any]) -> list[int]:
    """The error codes a client with `conf` gets trying to list the topics (none: it got in)."""
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append, "socket.timeout.ms": 5000})
    try:
        admin.list_topics(timeout=10)
    except KafkaException as exc:
        errors.append(exc.args[0])
    admin.poll(1)
    del admin
    return [e.code() for e in errors]


def consume_first(conf: dict[str, Any], topic: str, group: str) -> bytes | int:
    """The first record's value, or the error code the consumer got."""
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                return int(m.error().code())
            return bytes(m.value())
        return -1
    finally:
        consumer.close()


def test_tls_and_scram_with_user_resources(
    cluster: Cluster, namespace: str, minio: str, tmp_path: Path
) -> None:
    ns = namespace
    values = [
        "--set",
        "listeners.tls.enabled=true",
        "--set",
        "listeners.sasl.enabled=true",
        "--set",
        "authorization.superUsers={User:admin}",
        "--set",
        "controlPlane.tls.enabled=true",
    ]
    with installed_release(cluster, ns, minio, *values):
        servers = bootstrap(cluster, ns)
        # the control plane speaks mTLS (controlPlane.tls): the brokers registered and serve
        # through it (the release is Ready), and the controller refuses a control call from a
        # client without a certificate of the control plane's CA, even with the admin token
        status, body = control_call_without_certificate(cluster, ns)
        assert status in (401, 403) and "certificate" in body, (status, body)
        ca = tmp_path / "ca.crt"
        ca.write_text(secret_data(cluster, ns, f"{FULL}-broker-tls")["ca.crt"])
        tls = {
            "bootstrap.servers": servers,
            "ssl.ca.location": str(ca),
            "ssl.endpoint.identification.algorithm": "none",
        }

        # NetworkPolicies ship with the release (not enforced by this cluster's network plugin)
        policies = cluster.kubectl("-n", ns, "get", "networkpolicy", "-o", "name").split()
        assert len(policies) >= 2, policies

        cluster.apply(user("admin", []), ns)
        cluster.apply(
            user(
                "alice",
                [
                    {
                        "resource": {"type": "topic", "name": TOPIC},
                        "operations": ["Read", "Write", "Describe"],
                    },
                    {
                        "resource": {"type": "group", "name": "alice-", "patternType": "prefixed"},
                        "operations": ["Read"],
                    },
                ],
            ),
            ns,
        )
        for name in ("admin", "alice"):
            wait_until(f"User {name} Ready", lambda n=name: user_ready(cluster, ns, n), timeout=180)
        create_topic(cluster, ns, TOPIC)
        create_topic(cluster, ns, HIDDEN)

        def sasl(name: str) -> dict[str, Any]:
            creds = secret_data(cluster, ns, name)
            assert creds["sasl.mechanism"] == "SCRAM-SHA-512", sorted(creds)
            return {
                **tls,
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": creds["username"],
                "sasl.password": creds["password"],
            }

        alice, admin = sasl("alice"), sasl("admin")
        # the super user writes to both topics; alice reads hers and is refused the other
        producer = Producer({**admin, "acks": "all"})
        for topic in (TOPIC, HIDDEN):
            producer.produce(topic, f"hello {topic}".encode(), partition=0)
        assert producer.flush(60) == 0
        producer = Producer({**alice, "acks": "all", "enable.idempotence": True})
        delivered: list[Any] = []
        producer.produce(
            TOPIC, b"from alice", partition=1, on_delivery=lambda err, _m: delivered.append(err)
        )
        assert producer.flush(60) == 0 and delivered == [None], delivered
        assert consume_first(alice, TOPIC, "alice-1") in (b"hello orders", b"from alice")
        assert consume_first(alice, HIDDEN, "alice-2") == KafkaError.TOPIC_AUTHORIZATION_FAILED

        # no credentials, a wrong password, or PLAINTEXT: refused
        assert KafkaError._AUTHENTICATION in refused({**alice, "sasl.password": "wrong"})
        assert refused({**tls, "security.protocol": "SSL"})
        assert refused({"bootstrap.servers": servers})

        # deleting the User revokes it
        cluster.kubectl("-n", ns, "delete", "user", "alice", "--wait=true", "--timeout=120s")
        wait_until(
            "alice refused",
            lambda: KafkaError._AUTHENTICATION in refused(alice),
            timeout=60,
            interval=2,
        )
