"""Certificate revocation lists in a TLS context: the one place they are loaded.

Owns: putting a PEM file of CRLs into an SSLContext and turning the check on, for both users:
the Kafka listeners (`ssl.crl.location`, tidalmq_broker.security.tls: client certificates) and
the control plane (`--control-tls-crl-file`, tidalmq_core.control_tls: the peer's certificate on
either side, client or server).

The file's CRLs join the context's trust store (OpenSSL's X509_load_cert_crl_file) and the peer's
own certificate (the leaf; not the CAs above it) is checked against them in every handshake: one
its CA's CRL revokes fails the handshake. A CA of the trust store without a CRL in the file fails
its certificates too, and so does a CRL past its nextUpdate (OpenSSL: "CRL has expired"): the
file must hold a CRL of every CA whose certificates are accepted, refreshed before nextUpdate.
A file that is missing, empty or half written (a PEM block cut short) cannot be loaded and says
so; the contexts that follow their files (tidalmq_core.tls_reload) then keep the last CRL that
could be, and refuse to start without one.

Must not: know which setting named the file beyond the name its caller passes for messages.
Stdlib only (ssl).
"""

from __future__ import annotations

import ssl


class RevocationListError(ValueError):
    """A CRL file that cannot be loaded: the setting that names it, its path and why."""


def check_revocation(ctx: ssl.SSLContext, crl_file: str, setting: str) -> None:
    """Load the CRLs of the PEM file `crl_file` (named by `setting`, in the message) into `ctx`
    and check every peer certificate against them; RevocationListError when it cannot be
    loaded."""
    try:
        ctx.load_verify_locations(cafile=crl_file)
    except (OSError, ssl.SSLError) as exc:
        raise RevocationListError(
            f"{setting} {crl_file!r}: cannot load revocation lists from it ({exc})"
        ) from exc
    ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
