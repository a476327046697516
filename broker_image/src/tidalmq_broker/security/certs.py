"""Generated certificates kept in files: a CA, and server and client certificates it signs (PEM).

For `tidalmq local up` (`--security sasl_ssl`, and the control plane's mTLS) and for tests; production certificates come from the
operator's own PKI. Building them is tidalmq_core.certs (`Issued`, `new_ca`, `issue`, re-exported
here); this module owns keeping them in files (`ensure_ca`, `write_private`, `write_keystore`).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from tidalmq_core.certs import Issued, issue, new_ca

__all__ = ["Issued", "ensure_ca", "issue", "new_ca", "write_keystore", "write_private"]


def ensure_ca(cert_path: Path, key_path: Path, common_name: str) -> Issued:
    """The CA kept in `cert_path` and `key_path` (key readable by its owner only), made the
    first time."""
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        # the key this module wrote: an EC key (the loader's type admits any private key)
        return Issued(key, cert)  # type: ignore[arg-type]
    ca = new_ca(common_name)
    write_private(key_path, ca.key_pem())
    cert_path.write_bytes(ca.cert_pem())
    return ca


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read (keys, passwords)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_keystore(
    path: Path, issued: Issued, ca: Issued | None = None, password: str = ""
) -> None:
    """A PEM keystore as Kafka reads one (ssl.keystore.type=PEM): the private key, then the
    certificate chain (the CA's certificate last, when given)."""
    chain = issued.cert_pem() + (ca.cert_pem() if ca is not None else b"")
    write_private(path, issued.key_pem(password or None) + chain)
