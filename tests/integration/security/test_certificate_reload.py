"""A renewed broker certificate is served without a restart: a broker with an SSL listener whose
keystore is replaced (as a Kubernetes Secret under its mount, or cert-manager, renews it) serves
the new certificate to new clients within `ssl.reload.interval.ms`, says so in its metrics, and
keeps serving the old one while the new files cannot be loaded."""

from __future__ import annotations

import re
import socket
import ssl
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from cryptography import x509
from tidalmq_broker.security import certs

from tests.support.broker_process import BrokerProcess, free_port

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


def wait_for(what: str, check: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s")


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
        "--listeners", f"PLAINTEXT://127.0.0.1:{proc.port},SSL://127.0.0.1:{ssl_port}",
        "--ssl-keystore-location", str(keystore),
        "--allow-everyone-if-no-acl-found", "true",
    ]  # fmt: skip
    proc.env = {"TIDALMQ_SSL_RELOAD_INTERVAL_MS": "200"}
    client = {"bootstrap.servers": f"127.0.0.1:{ssl_port}", "security.protocol": "SSL",
              "ssl.ca.location": str(ca_file)}  # fmt: skip
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
        wait_for("a reload", lambda: metric(proc, reloads, listener="SSL", result="ok") == 1)
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert metric(proc, expiry, listener="SSL") == pytest.approx(
            renewed.cert.not_valid_after_utc.timestamp()
        )
        AdminClient(client).list_topics(timeout=20)  # librdkafka takes the renewed one too

        # a half-written renewal (no key): counted, logged, and the broker keeps serving
        keystore.write_bytes(certs.issue(ca, "broker", hosts=["localhost"]).cert_pem())
        wait_for(
            "a failed reload", lambda: metric(proc, reloads, listener="SSL", result="failed") >= 1
        )
        assert served_serial(ssl_port, ca_file) == renewed.cert.serial_number
        assert "TLS files changed but cannot be loaded" in proc.log_path.read_text()
        assert proc.alive()
