"""User resources against a real kube-apiserver, with the operator (its controller) and a real
broker that authenticates with SASL/SCRAM and enforces ACLs: a User yields a Secret whose
password works on the SASL listener, its ACLs are what the broker enforces (a topic it may not
read answers TOPIC_AUTHORIZATION_FAILED), a spec change is applied as an ACL diff, and deleting
the User revokes its credential, its ACLs and its Secret.

The broker has a PLAINTEXT listener for the test's own admin work, whose `User:ANONYMOUS` is a
super user (what an internal listener of a Kafka cluster is sometimes given), a SASL_PLAINTEXT
listener for SCRAM Users' clients, and an SSL listener that requires client certificates from
the clients CA, with the chart's principal mapping (CN=NAME is User:NAME), for tls Users. The
clients CA is the Secret the operator signs with, made before the broker starts (as the chart
makes it). The operator keeps the CA's CRL in a Secret (as the chart has it do); the broker
starts once that exists and loads it as ssl.crl.location, which the test copies from the Secret
as the kubelet updates a Secret volume (there is no kubelet here)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import struct
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
from tidalmq_broker.security import certs
from tidalmq_operator import users

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
CLIENTS_CA = "test-clients-ca"
CLIENTS_CRL = "test-clients-crl"


@pytest.fixture
def secured(api_with_crds: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    """A namespace with the operator and one broker: PLAINTEXT (the test's admin) and
    SASL_PLAINTEXT (the Users' clients), ACLs enforced."""
    api_with_crds.kubectl(
        "wait", "--for=condition=Established", "crd/users.tidalmq.io", "--timeout=60s"
    )
    ns = f"u-{uuid.uuid4().hex[:8]}"
    api_with_crds.kubectl("create", "namespace", ns)
    storage = f"file://{tmp_path / 'objects'}"
    # the clients CA (the chart's FULLNAME-clients-ca) and the broker's own certificate
    clients_ca = users.new_clients_ca()
    api_with_crds.kubectl(
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        CLIENTS_CA,
        f"--from-literal=tls.crt={clients_ca.cert_pem.decode()}",
        f"--from-literal=tls.key={clients_ca.key_pem.decode()}",
    )
    (tmp_path / "clients-ca.pem").write_bytes(clients_ca.cert_pem)
    server_ca = certs.new_ca("server CA")
    (tmp_path / "server-ca.pem").write_bytes(server_ca.cert_pem())
    certs.write_keystore(
        tmp_path / "broker.pem", certs.issue(server_ca, "broker", hosts=["127.0.0.1"]), server_ca
    )
    op = OperatorProcess(
        api_with_crds,
        ns,
        storage,
        tmp_path,
        env={"TIDALMQ_CLIENTS_CA_SECRET": CLIENTS_CA, "TIDALMQ_CLIENTS_CRL_SECRET": CLIENTS_CRL},
    )
    op.start()
    d: dict[str, Any] = {"ns": ns, "operator": op, "api": api_with_crds, "tmp": tmp_path}
    # the broker pod waits for the CRL Secret (a volume that is not optional): made at start
    wait_for(lambda: sync_crl(d) is not None, what=f"Secret {CLIENTS_CRL} made by the operator")
    broker = BrokerProcess(storage, tmp_path / "logs", env=BROKER_ENV)
    sasl_port, ssl_port = free_port(), free_port()
    broker.args = [
        "--controller-url",
        op.controller_url,
        "--listeners",
        f"PLAINTEXT://127.0.0.1:{broker.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
        f"SSL://127.0.0.1:{ssl_port}",
        "--sasl-enabled-mechanisms",
        "SCRAM-SHA-512,SCRAM-SHA-256",
        "--ssl-keystore-location",
        str(tmp_path / "broker.pem"),
        "--ssl-truststore-location",
        str(tmp_path / "clients-ca.pem"),
        "--ssl-client-auth",
        "required",
        "--ssl-principal-mapping-rules",
        "RULE:^CN=([^,]+)$/$1/,DEFAULT",  # the chart's
        "--ssl-crl-location",
        str(tmp_path / "crl.pem"),
        "--ssl-reload-interval-ms",
        "200",
        "--authorizer",
        "acl",
        "--super-users",
        "User:ANONYMOUS",
    ]
    broker.start()
    d.update(broker=broker, sasl=f"127.0.0.1:{sasl_port}", ssl=f"127.0.0.1:{ssl_port}")
    try:
        yield d
    finally:
        if broker.alive():
            os.kill(broker.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        broker.kill()
        op.stop()
        api_with_crds.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def user(name: str, acls: list[dict[str, Any]], kind: str = "scram-sha-512") -> dict[str, Any]:
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "User",
        "metadata": {"name": name},
        "spec": {"authentication": {"type": kind}, "authorization": {"acls": acls}},
    }


def sync_crl(d: dict[str, Any]) -> bytes | None:
    """The CRL Secret's crl.pem written to the broker's ssl.crl.location when it changed (as
    the kubelet does: whole, by a rename); None while there is no Secret."""
    r = d["api"].kubectl("-n", d["ns"], "get", "secret", CLIENTS_CRL, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    crl = base64.b64decode(json.loads(r.stdout)["data"]["crl.pem"])
    path: Path = d["tmp"] / "crl.pem"
    if not path.exists() or path.read_bytes() != crl:
        (d["tmp"] / "crl.pem.new").write_bytes(crl)
        (d["tmp"] / "crl.pem.new").rename(path)
    return crl


def tls_client(d: dict[str, Any], files: Path) -> str:
    """A new TLS connection to the SSL listener with a User's certificate: 'accepted' when the
    broker answers an ApiVersions request on it, else the TLS error it ended with."""
    ctx = ssl.create_default_context(cafile=str(d["tmp"] / "server-ca.pem"))
    ctx.load_cert_chain(str(files / "user.crt"), str(files / "user.key"))
    host, port = d["ssl"].split(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            # ApiVersions v0; with TLS 1.3 a refused client certificate shows on reading
            tls.sendall(struct.pack(">ihhih", 10, 18, 0, 1, -1))
            size = tls.recv(4)
            return "accepted" if len(size) == 4 else "closed"
    except (ssl.SSLError, OSError) as exc:
        return str(exc)


def write_certificate(d: dict[str, Any], name: str) -> Path:
    creds = secret(d, name)
    files = d["tmp"] / name
    files.mkdir()
    for key in ("user.crt", "user.key", "ca.crt"):
        (files / key).write_text(creds[key])
    return files


def read(topic: str) -> dict[str, Any]:
    return {"resource": {"type": "topic", "name": topic}, "operations": ["Read", "Describe"]}


def group_read(group: str) -> dict[str, Any]:
    return {
        "resource": {"type": "group", "name": group, "patternType": "prefixed"},
        "operations": ["Read"],
    }


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
    return {
        "bootstrap.servers": d["sasl"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": creds["sasl.mechanism"],
        "sasl.username": creds["username"],
        "sasl.password": creds["password"],
        **extra,
    }


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
    f = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
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
    assert acls_of(admin, "User:alice") == {
        ("allowed", "READ"),
        ("allowed", "DESCRIBE"),
        ("alice-", "READ"),
    }

    # a spec change is a diff: `denied` becomes readable, `allowed` is no longer
    apply(d, user("alice", [read("denied"), group_read("alice-")]))
    gen = get(d, "user", "alice")["metadata"]["generation"]
    wait_for(lambda: ready(d, "alice", gen), what="User alice reconciled again")
    assert acls_of(admin, "User:alice") == {
        ("denied", "READ"),
        ("denied", "DESCRIBE"),
        ("alice-", "READ"),
    }
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


def test_tls_user_certificate_on_a_real_broker(secured: dict[str, Any]) -> None:
    d = secured
    plain = {"bootstrap.servers": d["broker"].bootstrap}
    admin = AdminClient(plain)
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in ("certs", "secrets")]).values():
        f.result(30)
    producer = Producer(plain)
    for t in ("certs", "secrets"):
        producer.produce(t, b"hello " + t.encode())
    assert producer.flush(30) == 0

    apply(d, user("carol", [read("certs"), group_read("carol-")], kind="tls"))
    apply(d, user("dave", [read("certs"), group_read("dave-")], kind="tls"))
    wait_for(lambda: ready(d, "carol") and ready(d, "dave"), what="Users carol and dave Ready")
    files, dave = write_certificate(d, "carol"), write_certificate(d, "dave")
    # the CA it was given
    assert (files / "ca.crt").read_text() == (d["tmp"] / "clients-ca.pem").read_text()
    conf = {
        "bootstrap.servers": d["ssl"],
        "security.protocol": "SSL",
        "ssl.ca.location": str(d["tmp"] / "server-ca.pem"),
        "ssl.certificate.location": str(files / "user.crt"),
        "ssl.key.location": str(files / "user.key"),
    }
    # the certificate is User:carol on the broker (CN=carol, the chart's mapping rule)
    assert consume(conf, "certs", "carol-1") == b"hello certs"
    assert consume(conf, "secrets", "carol-2") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert acls_of(admin, "User:carol") == {
        ("certs", "READ"),
        ("certs", "DESCRIBE"),
        ("carol-", "READ"),
    }

    assert tls_client(d, files) == "accepted"
    # deleting the User removes its ACLs
    d["api"].kubectl("-n", d["ns"], "delete", "user", "carol", "--timeout=60s")
    assert acls_of(admin, "User:carol") == set()

    # and revokes its certificate: the CRL the operator signed before the finalizer went
    # lists it, and once the broker has the file (the kubelet's sync, here at once) a new
    # connection with it fails the TLS handshake, while another User's still connects
    def refused() -> str | None:
        sync_crl(d)
        outcome = tls_client(d, files)
        return outcome if "revoked" in outcome else None

    revoked = wait_for(refused, timeout_s=30, what="carol's certificate refused")
    assert "CERTIFICATE_REVOKED" in revoked.upper()
    assert tls_client(d, dave) == "accepted"
    dave_conf = dict(conf)
    dave_conf["ssl.certificate.location"] = str(dave / "user.crt")
    dave_conf["ssl.key.location"] = str(dave / "user.key")
    assert consume(dave_conf, "certs", "dave-1") == b"hello certs"


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
    out = (
        d["api"]
        .kubectl(
            "-n",
            d["ns"],
            "get",
            "events",
            "--field-selector",
            f"involvedObject.name={name},involvedObject.kind=User",
            "-o",
            "json",
        )
        .stdout
    )
    return list(json.loads(out)["items"])


def _gone(d: dict[str, Any], kind: str, name: str) -> bool:
    r = d["api"].kubectl("-n", d["ns"], "get", kind, name, check=False)
    return r.returncode != 0 and "NotFound" in r.stderr
