"""A broker process with all four kinds of listener, certificates made for the test, an admin
user bootstrapped as SCRAM-SHA-512, and the client settings of each way in.

These tests are about authentication: the broker enforces ACLs (its TLS and SASL listeners turn
authorization on) but opens every resource without any ACL to every client
(allow.everyone.if.no.acl.found), so each user may do anything. Authorization has its own tests
(test_acls.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from tidalmq_broker.security import certs

from tests.support.broker_process import BrokerProcess, free_port

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
# mTLS principals: CN of certificates of OU=Apps, lower-cased; anything else as its DN
MAPPING_RULES = "RULE:^CN=(.*?),OU=Apps,.*$/$1/L,DEFAULT"


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path  # clients trust this
    client_cert: Path  # CN=App1,OU=Apps,O=Acme: signed by the CA
    client_key: Path
    client_keystore: Path  # the same as one PEM file (key, then certificate), as Java reads it
    untrusted_cert: Path  # signed by another CA
    untrusted_key: Path


@dataclass(frozen=True)
class SecureBroker:
    process: BrokerProcess
    ports: dict[str, int]
    pki: Pki

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def confluent(self, listener: str, **extra: object) -> dict[str, object]:
        """confluent-kafka settings for a listener (SASL ones as admin, SSL with the client
        certificate)."""
        conf: dict[str, object] = {"bootstrap.servers": self.bootstrap(listener)}
        if listener in ("SSL", "SASL_SSL"):
            conf |= {"security.protocol": listener, "ssl.ca.location": str(self.pki.ca)}
        if listener == "SSL":
            conf |= {
                "ssl.certificate.location": str(self.pki.client_cert),
                "ssl.key.location": str(self.pki.client_key),
            }
        if listener in ("SASL_SSL", "SASL_PLAINTEXT"):
            conf |= {
                "security.protocol": listener,
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": ADMIN,
                "sasl.password": ADMIN_PASSWORD,
            }
        return conf | extra

    def java_properties(
        self,
        path: Path,
        *,
        user: str | None = None,
        password: str = "",
        mechanism: str = "SCRAM-SHA-512",
        mtls: bool = False,
    ) -> Path:
        """A client.properties for Kafka's tools and Java clients."""
        lines = ["ssl.truststore.type=PEM", f"ssl.truststore.location={self.pki.ca}"]
        if mtls:
            lines += [
                "security.protocol=SSL",
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={self.pki.client_keystore}",
            ]
        else:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            lines += [
                "security.protocol=SASL_SSL",
                f"sasl.mechanism={mechanism}",
                f'sasl.jaas.config={module} required username="{user or ADMIN}" '
                f'password="{password or ADMIN_PASSWORD}";',
            ]
        path.write_text("\n".join(lines) + "\n")
        return path


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = certs.new_ca("test CA"), certs.new_ca("a CA the broker does not trust")
    (directory / "ca.pem").write_bytes(ca.cert_pem())
    broker = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"])
    certs.write_keystore(directory / "broker.pem", broker, ca, password="broker-key-pw")
    client = certs.issue(ca, {"O": "Acme", "OU": "Apps", "CN": "App1"}, server=False, client=True)
    (directory / "client.crt").write_bytes(client.cert_pem())
    certs.write_private(directory / "client.key", client.key_pem())
    certs.write_keystore(directory / "client-keystore.pem", client)
    bad = certs.issue(
        other, {"O": "Acme", "OU": "Apps", "CN": "Mallory"}, server=False, client=True
    )
    (directory / "untrusted.crt").write_bytes(bad.cert_pem())
    certs.write_private(directory / "untrusted.key", bad.key_pem())
    return Pki(
        directory,
        directory / "ca.pem",
        directory / "client.crt",
        directory / "client.key",
        directory / "client-keystore.pem",
        directory / "untrusted.crt",
        directory / "untrusted.key",
    )


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    root = tmp_path_factory.mktemp("secure-broker")
    pki = make_pki(root / "pki")
    proc = BrokerProcess(f"file://{root / 'objects'}", root / "logs")
    ports = {
        "PLAINTEXT": proc.port,
        "SASL_SSL": free_port(),
        "SSL": free_port(),
        "SASL_PLAINTEXT": free_port(),
    }
    proc.args = [
        "--listeners",
        ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "--ssl-keystore-location",
        str(root / "pki" / "broker.pem"),
        "--ssl-truststore-location",
        str(pki.ca),
        "--ssl-client-auth",
        "required",
        "--ssl-principal-mapping-rules",
        MAPPING_RULES,
        "--sasl-enabled-mechanisms",
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "--allow-everyone-if-no-acl-found",
        "true",
    ]
    proc.env = {
        "TIDALMQ_SSL_KEY_PASSWORD": "broker-key-pw",
        "TIDALMQ_SCRAM_BOOTSTRAP": f"{ADMIN}:SCRAM-SHA-512:{ADMIN_PASSWORD}",
    }
    with proc:
        yield SecureBroker(proc, ports, pki)


def new_topic(broker: SecureBroker, partitions: int = 2) -> str:
    """A topic, created over the PLAINTEXT listener."""
    name = f"sec-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap("PLAINTEXT")})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name
