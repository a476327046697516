"""Certificates made in code: a CA, and certificates it signs (ECDSA P-256, SHA-256).

Owns: building a CA (`new_ca`), issuing server and client certificates (`issue`) and the
validity window they share. The one place a CA is built: the local cluster and tests
(tidalmq_broker.security.certs, which adds writing them to files) and the operator's clients CA
for tls Users (tidalmq_operator.users) both use it.

Must not touch: files or Kubernetes Secrets (its callers keep what it makes); production
certificates for brokers come from the operator's own PKI.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def key_pem(self, password: str | None = None) -> bytes:
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password.encode())
            if password
            else serialization.NoEncryption()
        )
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _name(dn: dict[str, str] | str) -> x509.Name:
    if isinstance(dn, str):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dn)])
    oids = {
        "CN": NameOID.COMMON_NAME,
        "O": NameOID.ORGANIZATION_NAME,
        "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
        "C": NameOID.COUNTRY_NAME,
        "L": NameOID.LOCALITY_NAME,
        "ST": NameOID.STATE_OR_PROVINCE_NAME,
    }
    # written most general first (C, O, OU, CN), as certificates usually are
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in dn.items()])


def validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    """From five minutes ago (clocks differ a little) to `days` from now."""
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def new_ca(common_name: str = "TidalMQ local CA", days: int = 3650) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    start, end = validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, cert)


def issue(
    ca: Issued,
    subject: dict[str, str] | str,
    *,
    hosts: list[str] | None = None,
    server: bool = True,
    client: bool = False,
    days: int = 825,
) -> Issued:
    """A certificate for `subject` signed by `ca`; `hosts` (names or IP addresses) become its
    subject alternative names, which clients check the server's address against."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = validity(days)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in dict.fromkeys(hosts):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))
