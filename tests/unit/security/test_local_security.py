"""`local up --security sasl_ssl`: what it makes in the data dir, and keeps across restarts."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

from cryptography import x509
from tidalmq_broker.local.security import prepare


def test_made_once_kept_after_and_private(tmp_path: Path) -> None:
    first = prepare(tmp_path, "10.1.2.3")
    files = {p.name for p in first.directory.iterdir()}
    assert files == {"ca.pem", "ca-key.pem", "broker.pem", "admin-password", "client.properties"}
    for private in ("ca-key.pem", "broker.pem", "admin-password", "client.properties"):
        assert stat.S_IMODE((first.directory / private).stat().st_mode) == 0o600, private
    props = dict(
        line.split("=", 1)
        for line in first.client_properties.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert f'username="admin" password="{first.password}";' in props["sasl.jaas.config"]
    assert props["ssl.truststore.location"] == str(first.ca)
    # the broker certificate is for the addresses clients use, signed by the CA
    ctx = ssl.create_default_context(cafile=str(first.ca))
    ctx.load_cert_chain(str(first.keystore))  # key and chain in one PEM file
    chain = x509.load_pem_x509_certificates(
        first.keystore.read_bytes().split(b"-----END PRIVATE KEY-----")[1]
    )
    sans = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.1.2.3"}
    assert chain[0].issuer == x509.load_pem_x509_certificate(first.ca.read_bytes()).subject
    assert first.broker_args("127.0.0.1", 9092)[:2] == ["--listeners", "SASL_SSL://127.0.0.1:9092"]
    # the next start keeps the CA and the password (clients keep working)
    ca_before = first.ca.read_bytes()
    again = prepare(tmp_path, "127.0.0.1")
    assert again.password == first.password
    assert again.ca.read_bytes() == ca_before
    assert [u.user for u in again.bootstrap_users()] == ["admin"]
