"""The principal of a client certificate: its subject DN exactly as Java's
X500Principal.getName() writes it (the expected strings were printed by Java 17 for these same
names), and the server contexts of the TLS settings."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tidalmq_broker.security import certs
from tidalmq_broker.security.tls import TlsConfigError, TlsSettings, server_context, subject_dn


def _der(name: x509.Name) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


A = x509.NameAttribute
CASES = [
    (
        x509.Name(
            [
                A(NameOID.COUNTRY_NAME, "US"),
                A(NameOID.ORGANIZATION_NAME, "Acme, Inc."),
                A(NameOID.ORGANIZATIONAL_UNIT_NAME, "Service+Users"),
                A(NameOID.COMMON_NAME, 'alice "the" <admin>; #1 '),
            ]
        ),
        'CN=alice \\"the\\" \\<admin\\>\\; \\#1\\ ,OU=Service\\+Users,O=Acme\\, Inc.,C=US',
    ),
    (
        x509.Name(
            [
                A(NameOID.DOMAIN_COMPONENT, "com"),
                A(NameOID.DOMAIN_COMPONENT, "example"),
                A(NameOID.COMMON_NAME, "bob"),
                A(NameOID.EMAIL_ADDRESS, "bob@example.com"),
                A(NameOID.SERIAL_NUMBER, "1234"),
                A(NameOID.USER_ID, "u1"),
                A(NameOID.LOCALITY_NAME, "Zürich"),
                A(NameOID.STATE_OR_PROVINCE_NAME, "ZH"),
                A(NameOID.STREET_ADDRESS, "Main St 1"),
            ]
        ),
        "STREET=Main St 1,ST=ZH,L=Zürich,UID=u1,2.5.4.5=#130431323334,"
        "1.2.840.113549.1.9.1=#160f626f62406578616d706c652e636f6d,CN=bob,DC=example,DC=com",
    ),
    (
        x509.Name(
            [
                x509.RelativeDistinguishedName(
                    [A(NameOID.COMMON_NAME, "carol"), A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops")]
                ),
                x509.RelativeDistinguishedName([A(NameOID.ORGANIZATION_NAME, "Acme")]),
            ]
        ),
        "O=Acme,OU=ops+CN=carol",
    ),
    (x509.Name([A(NameOID.COMMON_NAME, " #spaced\\back=eq")]), "CN=\\ \\#spaced\\\\back\\=eq"),
]


@pytest.mark.parametrize(("name", "java"), CASES)
def test_subject_dn_as_java_writes_it(name: x509.Name, java: str) -> None:
    assert subject_dn(_der(name)) == java


def test_server_contexts(tmp_path: Path) -> None:
    ca = certs.new_ca()
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    certs.write_keystore(
        tmp_path / "ks.pem", certs.issue(ca, "b", hosts=["localhost"]), ca, password="kpw"
    )
    ks, ts = str(tmp_path / "ks.pem"), str(tmp_path / "ca.pem")
    ctx = server_context(TlsSettings(ks, "kpw", ts, "required"))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert (
        server_context(TlsSettings(ks, "kpw", ts, "required"), client_auth="none").verify_mode
        == ssl.CERT_NONE
    )
    assert server_context(TlsSettings(ks, "kpw", ts, "requested")).verify_mode == ssl.CERT_OPTIONAL
    only13 = server_context(TlsSettings(ks, "kpw", enabled_protocols="TLSv1.3"))
    assert only13.minimum_version == ssl.TLSVersion.TLSv1_3
    for bad, message in [
        (TlsSettings(), "needs ssl.keystore.location"),
        (TlsSettings(ks, "wrong"), "cannot load a private key"),
        (TlsSettings(ks, "kpw", client_auth="required"), "needs ssl.truststore.location"),
        (TlsSettings(ks, "kpw", client_auth="maybe"), "must be none, requested or required"),
        (TlsSettings(ks, "kpw", enabled_protocols="TLSv1.1"), "not offered"),
        (TlsSettings(ks, "kpw", str(tmp_path / "none.pem")), "cannot load CA"),
    ]:
        with pytest.raises(TlsConfigError, match=message):
            server_context(bad)
