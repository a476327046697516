"""Clients that fail to authenticate: one rate-limited log line each, and a counter.

The log line says who, from where and why (never a password or key); the budget of such lines
is its own (server/ratelog.py AUTH_FAILURES), so a password guesser neither floods the log nor
hides other errors. `tidalmq_authentication_failures_total` counts every failure, logged or not,
by listener and kind:
- `sasl`: a SASL exchange failed (wrong password, unknown user, unsupported mechanism, a token
  out of turn);
- `tls`: a TLS handshake failed (an untrusted or missing client certificate, no common
  protocol, not TLS at all);
- `principal`: no ssl.principal.mapping.rules rule applies to a client certificate;
- `unauthenticated_request`: a request other than ApiVersions/SaslHandshake/SaslAuthenticate, or
  a frame larger than 512 KiB, before the connection authenticated.

Each listener's series of the kinds that can happen on it are exported at 0 from its start
(`expected`): a rate or an increase over the first failure then sees it (a series that first
appears at 1 shows no increase), and a dashboard shows 0 rather than nothing. A PLAINTEXT
listener has none.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from tidalmq_broker.server.ratelog import AUTH_FAILURES

log = logging.getLogger("tidalmq_broker.security")

AUTHENTICATION_FAILURES = Counter(
    "tidalmq_authentication_failures_total",
    "Connections refused for failing to authenticate, by listener and kind "
    "(sasl, tls, principal, unauthenticated_request)",
    ["listener", "kind"],
)


def expected(listener: str, *, tls: bool, sasl: bool) -> None:
    """The series of the kinds of failure a listener can have, at 0: `tls` on a TLS listener,
    `principal` where a client certificate names the principal (TLS without SASL), `sasl` and
    `unauthenticated_request` on a SASL listener."""
    kinds = (["tls"] if tls else []) + (["principal"] if tls and not sasl else [])
    kinds += ["sasl", "unauthenticated_request"] if sasl else []
    for kind in kinds:
        AUTHENTICATION_FAILURES.labels(listener, kind)


def record(listener: str, kind: str, msg: str, *args: object) -> None:
    AUTHENTICATION_FAILURES.labels(listener, kind).inc()
    AUTH_FAILURES.warning(log, msg, *args)
