"""Certificate revocation lists for tests: a CA's CRL revoking some of its certificates (PEM), as
the Kafka listeners' `ssl.crl.location` and the control plane's `--control-tls-crl-file` read it
(tidalmq_core.revocation)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from tidalmq_core.certs import Issued


def crl_pem(
    ca: Issued, revoked: Iterable[Issued | x509.Certificate], *, next_update_s: float = 86400
) -> bytes:
    """A PEM CRL of `ca` revoking `revoked` (valid from a minute ago, `next_update_s` on)."""
    now = datetime.now(UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(now - timedelta(minutes=1))
        .next_update(now + timedelta(seconds=next_update_s))
    )
    for each in revoked:
        cert = each.cert if isinstance(each, Issued) else each
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(cert.serial_number)
            .revocation_date(now - timedelta(minutes=1))
            .build()
        )
    return builder.sign(ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
