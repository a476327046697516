"""User resources against a real kube-apiserver, with the operator (its controller) and a real
broker that authenticates with SASL/SCRAM and enforces ACLs: a User yields a Secret whose
password works on the SASL listener, its ACLs are what the broker enforces (a topic it may not
read answers TOPIC_AUTHORIZATION_FAILED), a spec change is applied as an ACL diff, and deleting
the User revokes its credential, its ACLs and its Secret.

The broker has a PLAINTEXT listener for the test's own admin work, whose `User:ANONYMOUS` is a
super user (what an internal listener of a Kafka cluster is sometimes given), and a
SASL_PLAINTEXT listener for the User's clients (TLS is the security suite's business)."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.operator.test_operator import (  # noqa: F401  (fixtures)
    BROKER_ENV,
    OperatorProcess,
    api_with_crds,
    apply,
    condition,
    get,
    wait_for,
)
from tests.support.broker_process import BrokerProcess, free_port
from tests.support.kube_apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture
def secured(api_with_crds: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    """A namespace with the operator and one broker: PLAINTEXT (the test's admin) and
    SASL_PLAINTEXT (the Users' clients), ACLs enforced."""
    api_with_crds.kubectl("wait", "--for=condition=Established", "crd/users.tidalmq.io",
                          "--timeout=60s")  # fmt: skip
    ns = f"u-{uuid.uuid4().hex[:8]}"
    api_with_crds.kubectl("create", "namespace", ns)
    storage = f"file://{tmp_path / 'objects'}"
    op = OperatorProcess(api_with_crds, ns, storage, tmp_path)
    op.start()
    broker = BrokerProcess(storage, tmp_path / "logs", env=BROKER_ENV)
    sasl_port = free_port()
    broker.args = [
        "--controller-url", op.controller_url,
        "--listeners", f"PLAINTEXT://127.0.0.1:{broker.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "--sasl-enabled-mechanisms", "SCRAM-SHA-512,SCRAM-SHA-256",
        "--authorizer", "acl", "--super-users", "User:ANONYMOUS",
    ]  # fmt: skip
    broker.start()
    d = {"ns": ns, "operator": op, "broker": broker, "api": api_with_crds, "tmp": tmp_path,
         "sasl": f"127.0.0.1:{sasl_port}"}  # fmt: skip
    try:
        yield d
    finally:
        if broker.alive():
            os.kill(broker.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        broker.kill()
        op.stop()
        api_with_crds.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def user(name: str, acls: list[dict[str, Any]], kind: str = "scram-sha-512") -> dict[str, Any]:
    return {"apiVersion": "tidalmq.io/v1alpha1", "kind": "User", "metadata": {"name": name},
            "spec": {"authentication": {"type": kind}, "authorization": {"acls": acls}}}  # fmt: skip


def read(topic: str) -> dict[str, Any]:
    return {"resource": {"type": "topic", "name": topic}, "operations": ["Read", "Describe"]}


def group_read(group: str) -> dict[str, Any]:
    return {"resource": {"type": "group", "name": group, "patternType": "prefixed"},
            "operations": ["Read"]}  # fmt: skip


def secret(d: dict[str, Any], name: str) -> dict[str, str]:
    body = get(d, "secret", name)
    return {k: base64.b64decode(v).decode() for k, v in body["data"].items()}


def ready(d: dict[str, Any], name: str, generation: int | None = None) -> bool:
    obj = get(d, "user", name)
    c = condition(obj, "Ready")
    if generation is not None and (obj.get("status") or {}).get("observedGeneration") != generation:
        return False
    return c is not None and c["status"] == "True"


def sasl_conf(d: dict[str, Any], creds: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": d["sasl"], "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": creds["sasl.mechanism"], "sasl.username": creds["username"],
            "sasl.password": creds["password"], **extra}  # fmt: skip


def consume(conf: dict[str, Any], topic: str, group: str) -> int | bytes:
    """The first record's value, or the error code the consumer got."""
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
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


def authentication_fails(conf: dict[str, Any]) -> bool:
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append})
    try:
        admin.list_topics(timeout=8)
    except KafkaException:
        pass
    admin.poll(1)
    del admin
    return any(e.code() == KafkaError._AUTHENTICATION for e in errors)


def acls_of(admin: AdminClient, principal: str) -> set[tuple[str, str]]:
    f = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                         AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    return {(b.name, b.operation.name) for b in admin.describe_acls(f).result(30)}


def test_user_credentials_and_acls_on_a_real_broker(secured: dict[str, Any]) -> None:
    d = secured
    plain = {"bootstrap.servers": d["broker"].bootstrap}
    admin = AdminClient(plain)
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in ("allowed", "denied")]).values():
        f.result(30)
    producer = Producer(plain)
    for t in ("allowed", "denied"):
        producer.produce(t, b"hello " + t.encode())
    assert producer.flush(30) == 0

    apply(d, user("alice", [read("allowed"), group_read("alice-")]))
    wait_for(lambda: ready(d, "alice"), what="User alice Ready")
    creds = secret(d, "alice")
    assert creds["sasl.mechanism"] == "SCRAM-SHA-512" and len(creds["password"]) == 32
    assert f'password="{creds["password"]}"' in creds["sasl.jaas.config"]
    owner = get(d, "secret", "alice")["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "User" and owner["uid"] == get(d, "user", "alice")["metadata"]["uid"]
    status = get(d, "user", "alice")["status"]
    assert status["secret"] == "alice" and status["principal"] == "User:alice"

    conf = sasl_conf(d, creds)
    # the Secret's password works on the SASL listener, and the ACLs are enforced
    assert consume(conf, "allowed", "alice-1") == b"hello allowed"
    assert consume(conf, "denied", "alice-2") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert authentication_fails({**conf, "sasl.password": "wrong"})
    assert acls_of(admin, "User:alice") == {("allowed", "READ"), ("allowed", "DESCRIBE"),
                                            ("alice-", "READ")}  # fmt: skip

    # a spec change is a diff: `denied` becomes readable, `allowed` is no longer
    apply(d, user("alice", [read("denied"), group_read("alice-")]))
    gen = get(d, "user", "alice")["metadata"]["generation"]
    wait_for(lambda: ready(d, "alice", gen), what="User alice reconciled again")
    assert acls_of(admin, "User:alice") == {("denied", "READ"), ("denied", "DESCRIBE"),
                                            ("alice-", "READ")}  # fmt: skip
    assert secret(d, "alice")["password"] == creds["password"]  # the same password, kept
    assert consume(conf, "denied", "alice-3") == b"hello denied"
    assert consume(conf, "allowed", "alice-4") == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Events say what happened
    reasons = {e["reason"] for e in _events(d, "alice")}
    assert {"CredentialsWritten", "AclsUpdated"} <= reasons, reasons

    # deleting the User revokes it: no more authentication, no ACLs, no Secret
    d["api"].kubectl("-n", d["ns"], "delete", "user", "alice", "--timeout=60s")
    assert acls_of(admin, "User:alice") == set()
    assert authentication_fails(conf)
    wait_for(lambda: _gone(d, "secret", "alice"), what="Secret alice deleted")


def test_invalid_user_is_not_ready(secured: dict[str, Any]) -> None:
    d = secured
    bad = user("bob", [{"resource": {"type": "group", "name": "g"}, "operations": ["Write"]}])
    apply(d, bad)

    def refused() -> bool:
        c = condition(get(d, "user", "bob"), "Ready")
        return c is not None and c["status"] == "False" and c["reason"] == "InvalidSpec"

    wait_for(refused, what="User bob InvalidSpec")
    assert "Write does not apply to a group" in condition(get(d, "user", "bob"), "Ready")["message"]  # type: ignore[index]
    assert _gone(d, "secret", "bob")
    d["api"].kubectl("-n", d["ns"], "delete", "user", "bob", "--timeout=60s")


def _events(d: dict[str, Any], name: str) -> list[dict[str, Any]]:
    out = d["api"].kubectl("-n", d["ns"], "get", "events", "--field-selector",
                           f"involvedObject.name={name},involvedObject.kind=User", "-o", "json").stdout  # fmt: skip
    return list(json.loads(out)["items"])


def _gone(d: dict[str, Any], kind: str, name: str) -> bool:
    r = d["api"].kubectl("-n", d["ns"], "get", kind, name, check=False)
    return r.returncode != 0 and "NotFound" in r.stderr
