"""The clients CA's certificate revocation list: the pure part (no Kubernetes I/O).

The operator signs tls Users' certificates with the clients CA; it also keeps a CRL of that CA
(docs/security.md, "Revoked tls Users' certificates"), which the brokers load as
`ssl.crl.location` and reload when it changes. Both live in one Secret (the chart's
`FULLNAME-clients-crl`): `crl.pem`, the signed CRL the brokers mount, and `revoked.json`, the
bookkeeping it is made from and read back from (the Secret is the only durable store):

- `issued`: the certificate the operator last issued to each tls User (serial, notAfter), so
  that a certificate is revoked even when the User's Secret is gone (deleted by hand, or by a
  foreground deletion before the finalizer ran);
- `revoked`: serials no longer valid, each with the certificate's notAfter (the entry is
  dropped once that has passed: an expired certificate is refused anyway, so the list stays
  bounded) and when it counts as revoked: at once for a deleted User, a certificate replaced
  because its Secret was lost or changed, or a User no longer `tls`; `RENEWAL_GRACE` after its
  successor was issued for a routine renewal (30 days before the end), so that clients have
  time to pick up the new certificate;
- `ca`: the fingerprint of the CA the bookkeeping belongs to (a new CA starts afresh: the old
  CA's certificates are not trusted any more anyway), and `number`, the CRL number.

The CRL is valid `CRL_DAYS` and signed again when `REFRESH_AFTER` has passed since it was, or
when what it must list changed (a revocation, a grace ending, an entry expiring).

Every change is a function of the bookkeeping read (`revoke`, `record_issued`, `revoke_user`,
`drop_expired`), so a writer that lost a compare-and-swap of the Secret to another applies the
same change again to what that one wrote (user_handlers._update_crl): `revoked` only grows,
but for entries past their notAfter.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

CRL_KEY = "crl.pem"
STATE_KEY = "revoked.json"
CRL_DAYS = 7
REFRESH_AFTER = datetime.timedelta(days=1)
RENEWAL_GRACE = datetime.timedelta(days=7)
# lastUpdate is backdated a little: a broker whose clock is behind must not see a CRL that is
# "not yet valid" (OpenSSL refuses every client of the CA then)
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class CertRef:
    """A certificate the operator issued: its serial and when it expires."""

    serial: int
    not_after: datetime.datetime


@dataclass(frozen=True, slots=True)
class Revocation:
    serial: int
    not_after: datetime.datetime
    revoked_at: datetime.datetime  # listed from then on (later than now: a renewal's grace)
    user: str


@dataclass(slots=True)
class CrlState:
    ca: str = ""  # fingerprint of the CA's certificate
    number: int = 0  # the last CRL's number
    issued: dict[str, CertRef] = field(default_factory=dict)
    revoked: dict[int, Revocation] = field(default_factory=dict)


def _utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(datetime.UTC)


def ca_fingerprint(ca_cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(ca_cert_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def cert_ref(cert_pem: str) -> CertRef | None:
    """The serial and notAfter of a PEM certificate; None when it does not parse."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError:
        return None
    return CertRef(cert.serial_number, cert.not_valid_after_utc)


def dumps(state: CrlState) -> str:
    return json.dumps(
        {
            "ca": state.ca,
            "number": state.number,
            "issued": {
                u: {"serial": format(c.serial, "x"), "notAfter": c.not_after.isoformat()}
                for u, c in sorted(state.issued.items())
            },
            "revoked": [
                {
                    "serial": format(r.serial, "x"),
                    "notAfter": r.not_after.isoformat(),
                    "revokedAt": r.revoked_at.isoformat(),
                    "user": r.user,
                }
                for r in sorted(state.revoked.values(), key=lambda r: r.serial)
            ],
        },
        indent=1,
    )


def loads(text: str, ca_cert_pem: bytes) -> CrlState:
    """The bookkeeping read back from the Secret; empty (for this CA) when there is none, when
    it does not parse, or when it belongs to another CA."""
    fingerprint = ca_fingerprint(ca_cert_pem)
    fresh = CrlState(ca=fingerprint)
    if not text:
        return fresh
    try:
        raw: dict[str, Any] = json.loads(text)
        if raw.get("ca") != fingerprint:
            return fresh
        issued = {
            str(u): CertRef(int(c["serial"], 16), _utc(c["notAfter"]))
            for u, c in raw.get("issued", {}).items()
        }
        revoked = {}
        for r in raw.get("revoked", []):
            serial = int(r["serial"], 16)
            revoked[serial] = Revocation(
                serial, _utc(r["notAfter"]), _utc(r["revokedAt"]), str(r.get("user", ""))
            )
        return CrlState(fingerprint, int(raw.get("number", 0)), issued, revoked)
    except (ValueError, KeyError, TypeError, AttributeError):
        return fresh


def revoke(
    state: CrlState, ref: CertRef, user: str, at: datetime.datetime, now: datetime.datetime
) -> bool:
    """List `ref` from `at` on (an earlier date kept if it is listed already); False when that
    changes nothing or the certificate has expired anyway."""
    if ref.not_after <= now:
        return False
    old = state.revoked.get(ref.serial)
    if old is not None and old.revoked_at <= at:
        return False
    state.revoked[ref.serial] = Revocation(ref.serial, ref.not_after, at, user)
    return True


def record_issued(
    state: CrlState,
    user: str,
    new: CertRef,
    replaced: CertRef | None,
    renewal: bool,
    now: datetime.datetime,
) -> bool:
    """A new certificate for `user`: the one it replaces (the User's Secret's, `renewal` when
    that was only coming due) and the one issued before if another (never delivered, or its
    Secret lost) are revoked; True when the bookkeeping changed."""
    changed = False
    if replaced is not None and replaced.serial != new.serial:
        at = now + RENEWAL_GRACE if renewal else now
        changed |= revoke(state, replaced, user, at, now)
    before = state.issued.get(user)
    if (
        before is not None
        and before.serial != new.serial
        and (replaced is None or before.serial != replaced.serial)
    ):
        changed |= revoke(state, before, user, now, now)
    if before != new:
        state.issued[user] = new
        changed = True
    return changed


def revoke_user(
    state: CrlState, user: str, current: CertRef | None, now: datetime.datetime
) -> bool:
    """A User deleted, or no longer tls: its certificates (the recorded one and `current`, the
    one its Secret holds) are revoked at once; True when the bookkeeping changed."""
    changed = False
    before = state.issued.pop(user, None)
    for ref in {r for r in (before, current) if r is not None}:
        changed |= revoke(state, ref, user, now, now)
    return changed or before is not None


def drop_expired(state: CrlState, now: datetime.datetime) -> bool:
    """Forget revoked certificates that have expired (refused anyway) and issued ones too."""
    gone = [s for s, r in state.revoked.items() if r.not_after <= now]
    for s in gone:
        del state.revoked[s]
    old = [u for u, c in state.issued.items() if c.not_after <= now]
    for u in old:
        del state.issued[u]
    return bool(gone or old)


def listed(state: CrlState, now: datetime.datetime) -> list[Revocation]:
    """What the CRL lists at `now`: revoked, its grace over, not yet expired."""
    return sorted(
        (r for r in state.revoked.values() if r.revoked_at <= now < r.not_after),
        key=lambda r: r.serial,
    )


def sign_crl(
    state: CrlState, ca_cert_pem: bytes, ca_key_pem: bytes, now: datetime.datetime
) -> bytes:
    """A new CRL (PEM) of what is listed at `now`, valid CRL_DAYS; bumps the CRL number."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    state.number += 1
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - BACKDATE)
        .next_update(now + datetime.timedelta(days=CRL_DAYS))
        .add_extension(x509.CRLNumber(state.number), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    for r in listed(state, now):
        revoked_at = min(r.revoked_at, now)
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(r.serial)
            .revocation_date(revoked_at)
            .build()
        )
    # a CA's key signs (the clients CA is EC); the loader's type also admits keys that cannot
    crl = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return crl.public_bytes(serialization.Encoding.PEM)


def crl_serials(crl_pem: bytes, ca_cert_pem: bytes) -> tuple[datetime.datetime, set[int]] | None:
    """The lastUpdate and listed serials of a CRL the CA signed; None when it does not parse,
    is another CA's or its signature does not verify."""
    try:
        crl = x509.load_pem_x509_crl(crl_pem)
        ca = x509.load_pem_x509_certificate(ca_cert_pem)
        if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
            return None
    except ValueError:
        return None
    return crl.last_update_utc + BACKDATE, {r.serial_number for r in crl}


def refresh_due(
    state: CrlState, crl_pem: bytes, ca_cert_pem: bytes, now: datetime.datetime
) -> bool:
    """Whether the CRL must be signed again: missing, not this CA's, signed REFRESH_AFTER ago
    or more (it is valid CRL_DAYS), or not listing exactly what it must at `now`."""
    current = crl_serials(crl_pem, ca_cert_pem)
    if current is None:
        return True
    signed_at, serials = current
    if now - signed_at >= REFRESH_AFTER or signed_at > now + BACKDATE:
        return True
    return serials != {r.serial for r in listed(state, now)}
