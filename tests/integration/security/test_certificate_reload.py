"""A renewed broker certificate is served without a restart: a broker with an SSL listener whose
keystore is replaced (as a Kubernetes Secret under its mount, or cert-manager, renews it) serves
the new certificate to new clients within `ssl.reload.interval.ms`, says so in its metrics, and
keeps serving the old one while the new files cannot be loaded."""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from cryptography import x509
from tidalmq_broker.security import certs

from tests.support.broker_process import BrokerProcess, free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration]


def served_serial(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        ctx.wrap_socket(sock, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def metric(proc: BrokerProcess, name: str, **labels: str) -> float:
    wanted = "".join(rf'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    pattern = re.compile(rf"^{name}{{{wanted}[^}}]*}} (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(proc.metrics()))


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    ca = certs.new_ca("reload CA")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem())
    keystore = tmp_path / "broker.pem"
    first = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"], days=30)
    certs.write_keystore(keystore, first, ca)
    proc = BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs")
    ssl_port = free_port()
    proc.args = [
        "--listeners",
        f"PLAINTEXT://127.0.0.1:{proc.port},SSL://127.0.0.1:{ssl_port}",
        "--ssl-keystore-location",
        str(keystore),
        "--allow-everyone-if-no-acl-found",
        "true",
    ]
    proc.env = {"TIDALMQ_SSL_RELOAD_INTERVAL_MS": "200"}
    client = {
        "bootstrap.servers": f"127.0.0.1:{ssl_port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(ca_file),
    }
    with proc:
        AdminClient(client).list_topics(timeout=20)
        assert served_serial(ssl_port, ca_file) == first.cert.serial_number
        expiry = "tidalmq_tls_certificate_expiry_timestamp_seconds"
        assert metric(proc, expiry, listener="SSL") == pytest.approx(
            first.cert.not_valid_after_utc.timestamp()
        )

        renewed = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"], days=90)
        staged = tmp_path / "broker.pem.new"
        certs.write_keystore(staged, renewed, ca)
        staged.replace(keystore)
        reloads = "tidalmq_tls_certificate_reloads_total"
        wait_for(
            "a reload",
            lambda: metric(proc, reloads, listener="SSL", result="ok") == 1,
            timeout_s=20,
        )
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert metric(proc, expiry, listener="SSL") == pytest.approx(
            renewed.cert.not_valid_after_utc.timestamp()
        )
        AdminClient(client).list_topics(timeout=20)  # librdkafka takes the renewed one too

        # a half-written renewal (no key): counted, logged, and the broker keeps serving
        keystore.write_bytes(certs.issue(ca, "broker", hosts=["localhost"]).cert_pem())
        wait_for(
            "a failed reload",
            lambda: metric(proc, reloads, listener="SSL", result="failed") >= 1,
            timeout_s=20,
        )
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert "TLS files changed but cannot be loaded" in proc.log_path.read_text()
        assert proc.alive()


def _alter(admin: AdminClient, name: str, value: str) -> KafkaError | None:
    """IncrementalAlterConfigs SET `name`=`value` on a broker; the error answered, or None."""
    resource = ConfigResource(
        "BROKER",
        "0",
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def test_altering_the_keystore_to_its_path_reloads_it_at_once(tmp_path: Path) -> None:
    """As Kafka: an AlterConfigs of a broker's keystore path, or a listener's, to the path it
    has reloads the files then, not at the next ssl.reload.interval.ms (never, here); another
    path, a listener without TLS or unloadable files are refused and change nothing."""
    ca = certs.new_ca("alter CA")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem())
    keystore = tmp_path / "broker.pem"
    first = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"])
    certs.write_keystore(keystore, first, ca)
    proc = BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs")
    ssl_port = free_port()
    proc.args = [
        *("--listeners", f"PLAINTEXT://127.0.0.1:{proc.port},SSL://127.0.0.1:{ssl_port}"),
        *("--ssl-keystore-location", str(keystore)),
        *("--allow-everyone-if-no-acl-found", "true"),
    ]
    proc.env = {"TIDALMQ_SSL_RELOAD_INTERVAL_MS": "0"}  # no periodic look at the files
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{proc.port}"})
    reloads = "tidalmq_tls_certificate_reloads_total"
    with proc:
        admin.list_topics(timeout=20)
        renewed = certs.issue(ca, "broker", hosts=["127.0.0.1", "localhost"])
        staged = tmp_path / "broker.pem.new"
        certs.write_keystore(staged, renewed, ca)
        staged.replace(keystore)
        assert served_serial(ssl_port, ca_file) == first.cert.serial_number  # not looked at

        refused = {
            "another path": _alter(admin, "ssl.keystore.location", str(tmp_path / "other.pem")),
            "no such listener": _alter(
                admin, "listener.name.plaintext.ssl.keystore.location", str(keystore)
            ),
        }
        assert {k: e.code() if e else None for k, e in refused.items()} == {
            "another path": KafkaError.INVALID_CONFIG,
            "no such listener": KafkaError.INVALID_CONFIG,
        }, {k: str(e) for k, e in refused.items()}
        assert served_serial(ssl_port, ca_file) == first.cert.serial_number

        # the listener's own config, lower-case as kafka-configs writes it, same path: at once
        assert _alter(admin, "listener.name.ssl.ssl.keystore.location", str(keystore)) is None
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert metric(proc, reloads, listener="SSL", result="ok") == 1
        assert _alter(admin, "ssl.keystore.location", str(keystore)) is None  # unchanged: no-op
        assert metric(proc, reloads, listener="SSL", result="ok") == 1

        # with a dynamic config in the same request: that one reaches the controller, the path
        # is not stored (the keystore stays a static setting)
        both = ConfigResource(
            "BROKER",
            "0",
            incremental_configs=[
                ConfigEntry(
                    "leader.replication.throttled.rate",
                    "1000",
                    incremental_operation=AlterConfigOpType.SET,
                ),
                ConfigEntry(
                    "ssl.keystore.location",
                    str(keystore),
                    incremental_operation=AlterConfigOpType.SET,
                ),
            ],
        )
        admin.incremental_alter_configs([both])[both].result(timeout=20)
        described = admin.describe_configs([ConfigResource("BROKER", "0")])
        configs = next(iter(described.values())).result(timeout=20)
        assert configs["leader.replication.throttled.rate"].value == "1000"
        assert configs["ssl.keystore.location"].source == ConfigSource.STATIC_BROKER_CONFIG.value

        # a half-written renewal: the client is told why, the broker keeps its certificate
        keystore.write_bytes(certs.issue(ca, "broker", hosts=["localhost"]).cert_pem())
        failed = _alter(admin, "ssl.keystore.location", str(keystore))
        assert failed is not None and failed.code() == KafkaError.INVALID_CONFIG
        assert "listener SSL" in failed.str() and "cannot load" in failed.str()
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert metric(proc, reloads, listener="SSL", result="failed") == 1
