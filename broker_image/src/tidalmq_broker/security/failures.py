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


def record(listener: str, kind: str, msg: str, *args: object) -> None:
    AUTHENTICATION_FAILURES.labels(listener, kind).inc()
    AUTH_FAILURES.warning(log, msg, *args)
