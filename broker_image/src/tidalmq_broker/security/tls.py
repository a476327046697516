"""TLS on the Kafka listeners: the server context, client authentication, the client's DN.

Certificates are PEM files, as Kafka reads them with `ssl.keystore.type=PEM`:
`ssl.keystore.location` holds the broker's private key and its certificate chain (one file),
`ssl.key.password` decrypts the key if it is encrypted, `ssl.truststore.location` holds the CA
certificates client certificates are checked against. `ssl.enabled.protocols` is TLSv1.2 and
TLSv1.3 by default (nothing older is offered whatever it says). `ssl.client.auth` is
none | requested | required; as in Kafka (KIP-684) it applies to SSL listeners, while SASL_SSL
listeners authenticate clients by SASL and ask for no certificate.

Certificates are reloaded without a restart (`listener_context`, a
tidalmq_core.tls_reload.FollowingContext, the mechanism the control plane reloads by too): every
`ssl.reload.interval.ms` (default 60 s), and at once on an AlterConfigs of the keystore's or
truststore's path (apis/configs.py), the broker looks at the keystore, truststore and CRL files,
and when one changed (a renewal by cert-manager, a Kubernetes Secret updated under its mount)
a new context is built from them; new connections get it, open ones keep theirs. A file that
cannot be loaded keeps the old context and is reported (log, metric) until it can.

A client certificate's principal is `User:` and its subject DN as Java's
X500Principal.getName() writes it (RFC 2253: most specific attribute first, the keywords CN, C,
L, ST, O, OU, DC, UID and STREET, any other attribute as its OID and `#` and the hex of its DER
value), mapped by `ssl.principal.mapping.rules` (security/principal.py).

Revocation (a TidalMQ setting: Kafka leaves it to the JVM's own properties):
`ssl.crl.location` names a PEM file of certificate revocation lists, one per CA whose client
certificates are accepted; a client certificate one of them revokes fails the handshake
(OpenSSL's leaf check). A CRL past its nextUpdate refuses every client of its CA, so the file
must be refreshed before then: it is reloaded like the keystore. The loading is
tidalmq_core.revocation, which the control plane's `--control-tls-crl-file` uses too.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID
from tidalmq_core.revocation import RevocationListError, check_revocation
from tidalmq_core.tls_reload import FollowingContext

from tidalmq_broker.security import SecurityConfigError

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(SecurityConfigError):
    """TLS settings that cannot be used (the broker does not start)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    keystore_location: str = ""  # PEM: private key and certificate chain
    key_password: str = ""
    truststore_location: str = ""  # PEM: CA certificates
    client_auth: str = "none"  # none | requested | required
    enabled_protocols: str = "TLSv1.2,TLSv1.3"
    cipher_suites: str = ""  # OpenSSL cipher list for TLSv1.2 (empty: OpenSSL's defaults)
    # the private key in a file of its own (a Kubernetes TLS Secret's tls.key); the keystore
    # then holds the certificate chain only
    key_location: str = ""
    # PEM file of certificate revocation lists: client certificates they revoke are refused
    crl_location: str = ""


def server_context(settings: TlsSettings, *, client_auth: str | None = None) -> ssl.SSLContext:
    """The server context of a listener (`client_auth` overrides the setting: SASL_SSL)."""
    auth = (client_auth or settings.client_auth).strip().lower()
    if auth not in CLIENT_AUTH:
        raise TlsConfigError(f"ssl.client.auth must be none, requested or required, not {auth!r}")
    if not settings.keystore_location:
        raise TlsConfigError(
            "an SSL or SASL_SSL listener needs ssl.keystore.location (a PEM file with the "
            "broker's private key and certificate chain)"
        )
    versions = []
    for name in (p.strip() for p in settings.enabled_protocols.split(",")):
        if not name:
            continue
        if name not in _PROTOCOLS:
            raise TlsConfigError(
                f"ssl.enabled.protocols: {name!r} is not offered (only TLSv1.2 and TLSv1.3)"
            )
        versions.append(_PROTOCOLS[name])
    if not versions:
        raise TlsConfigError("ssl.enabled.protocols: no protocol given")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = min(versions)
    ctx.maximum_version = max(versions)
    if settings.cipher_suites:
        try:
            ctx.set_ciphers(settings.cipher_suites)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"ssl.cipher.suites: {exc}") from exc
    try:
        ctx.load_cert_chain(
            settings.keystore_location,
            settings.key_location or None,
            password=settings.key_password or None,
        )
    except (OSError, ssl.SSLError) as exc:
        where = f"ssl.keystore.location {settings.keystore_location!r}"
        if settings.key_location:
            where += f" with ssl.keystore.key.location {settings.key_location!r}"
        raise TlsConfigError(
            f"{where}: cannot load a private key and certificate chain from it ({exc})"
        ) from exc
    if settings.truststore_location:
        try:
            ctx.load_verify_locations(cafile=settings.truststore_location)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"ssl.truststore.location {settings.truststore_location!r}: cannot load CA "
                f"certificates from it ({exc})"
            ) from exc
    elif auth != "none":
        raise TlsConfigError(
            f"ssl.client.auth={auth} needs ssl.truststore.location (the CA certificates client "
            "certificates are checked against)"
        )
    if settings.crl_location:
        if auth == "none":
            raise TlsConfigError(
                "ssl.crl.location checks client certificates: it needs ssl.client.auth "
                "requested or required"
            )
        try:  # the control plane's CRLs are loaded by the same code (tidalmq_core.revocation)
            check_revocation(ctx, settings.crl_location, "ssl.crl.location")
        except RevocationListError as exc:
            raise TlsConfigError(str(exc)) from exc
    ctx.verify_mode = CLIENT_AUTH[auth]
    return ctx


def listener_context(
    name: str, settings: TlsSettings, *, client_auth: str | None = None
) -> FollowingContext:
    """A TLS listener's context, following its files (tidalmq_core.tls_reload): the keystore,
    its key, the truststore and the CRL file (CRLs are reissued before their nextUpdate). The
    broker looks at them every `ssl.reload.interval.ms` and on an AlterConfigs of their paths
    (`check()`); raises TlsConfigError now when they cannot be used."""
    return FollowingContext(
        ssl.PROTOCOL_TLS_SERVER,
        f"listener {name}",
        (
            settings.keystore_location,
            settings.key_location,
            settings.truststore_location,
            settings.crl_location,
        ),
        lambda: server_context(settings, client_auth=client_auth),
        certificate_file=settings.keystore_location,
    )


# Java's X500Principal RFC 2253 keywords (sun.security.x509.AVAKeyword, RFC2253 standard)
_KEYWORDS = {
    NameOID.COMMON_NAME: "CN",
    NameOID.COUNTRY_NAME: "C",
    NameOID.LOCALITY_NAME: "L",
    NameOID.STATE_OR_PROVINCE_NAME: "ST",
    NameOID.ORGANIZATION_NAME: "O",
    NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
    NameOID.DOMAIN_COMPONENT: "DC",
    NameOID.USER_ID: "UID",
    NameOID.STREET_ADDRESS: "STREET",
}
_ESCAPED = set(',=+<>#;"\\')  # escaped anywhere, as Java's AVA.toRFC2253String does


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in _ESCAPED or (ch == " " and (i == 0 or i == len(value) - 1)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _der_value(attr: x509.NameAttribute[str | bytes]) -> str:
    """`#` and the hex of the attribute value's DER (how RFC 2253 writes unknown types)."""
    value = attr.value if isinstance(attr.value, bytes) else attr.value.encode()
    tag = getattr(getattr(attr, "_type", None), "value", 12)  # UTF8String unless told
    length = len(value)
    if length < 0x80:
        head = bytes([tag, length])
    else:
        size = length.to_bytes((length.bit_length() + 7) // 8, "big")
        head = bytes([tag, 0x80 | len(size)]) + size
    return "#" + (head + value).hex()


def subject_dn(certificate_der: bytes) -> str:
    """The subject DN of a DER certificate as Java's X500Principal.getName() writes it."""
    cert = x509.load_der_x509_certificate(certificate_der)
    rdns = []
    for rdn in reversed(list(cert.subject.rdns)):
        avas = []
        for attr in rdn:
            keyword = _KEYWORDS.get(attr.oid)
            if keyword is not None and isinstance(attr.value, str):
                avas.append(f"{keyword}={_escape(attr.value)}")
            else:
                avas.append(f"{attr.oid.dotted_string}={_der_value(attr)}")
        rdns.append("+".join(avas))
    return ",".join(rdns)


# OpenSSL's reasons for a first record that is no TLS at all (a plaintext Kafka request, an HTTP
# request): it writes no alert for these, so the connection can go at once.
NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL"}
)


def handshake_reporting(
    listener: str, report: Callable[[str, ssl.SSLError], None]
) -> type[ssl.SSLObject]:
    """An SSLObject class (SSLContext.sslobject_class) whose failed handshakes are reported
    with `report(listener, error)` (the event loop's TLS layer drops them silently), and whose
    TLS alert reaches the client, as Kafka's does. A client that speaks no TLS at all is
    dropped at once, as by Kafka: it gets no alert, and waiting for its next move to send one
    would hold a plaintext client, which waits for its answer, until the handshake timeout."""

    class ReportingSSLObject(ssl.SSLObject):
        _failed: ssl.SSLError | None = None

        def do_handshake(self) -> None:
            if self._failed is not None:
                raise self._failed
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # the handshake goes on
            except ssl.SSLError as exc:
                report(listener, exc)
                if exc.reason in NOT_TLS_REASONS:
                    raise
                # The event loop's TLS layer drops the connection on this error at once, and
                # the TLS alert OpenSSL wrote for the client (unknown_ca, certificate_required,
                # ...) with it: clients then see a connection closed during authentication
                # instead of why. Answered "want read" once, the layer sends what is pending
                # (the alert) and fails on the next call: when the client closes, sends more,
                # or the handshake times out.
                self._failed = exc
                raise ssl.SSLWantReadError("handshake failed; sending the alert") from exc

    return ReportingSSLObject
