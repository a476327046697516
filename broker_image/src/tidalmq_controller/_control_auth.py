"""The controller's HTTP server lets in only callers with a control token (tidalmq_core.control_auth).

Checked first, before the request's body is read or anything else is looked at, on the liveness
thread (a heartbeat pays one constant-time comparison, or one HMAC for a broker's token: a few
microseconds). What each token may do:

- open, no token: `/healthz` (the metadata version) and `/metrics`;
- a broker's token: the calls in BROKER_SELF for its own broker id only (the handler checks the
  id the body names, `refuse_other_broker`), and those in BROKER_FORWARDED (what a broker asks
  for itself or forwards for its Kafka clients, who are authorized there);
- the cluster token: everything, including every path not listed here (the local cluster's
  `/v1/local/*`, static topics, data-loss recovery, rebalance, moves, and any route added later:
  new routes are admin-only until listed).

With control-plane mTLS (tidalmq_core.control_tls), every call but the open ones also needs a
client certificate of the cluster CA whose role allows what the token claims: the cluster token
only with an administrator's certificate (CN=controller, operator or admin), a broker's token only
with that broker's (CN=broker-N, or CN=broker). No certificate answers 401, a certificate whose
role does not allow the token 403.

A missing or wrong token answers 401, a broker's token on a call it may not make 403; each
refusal is one rate-limited log line (never the token) and a count in
`tidalmq_controller_control_refusals_total{reason}`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter
from tidalmq_broker.server.http import refuse_control_call
from tidalmq_broker.server.ratelog import RateLimitedLog
from tidalmq_core.control_auth import ControlAuth, Principal
from tidalmq_core.control_tls import NO_CERTIFICATE, peercert_of, permits, role_of

log = logging.getLogger(__name__)

OPEN = frozenset({"/healthz", "/metrics"})
# the body names a broker id: a broker's token acts for its own id only
BROKER_SELF = frozenset(
    {
        "/v1/brokers/register",
        "/v1/brokers/heartbeat",
        "/v1/brokers/drain",
        "/v1/brokers/remove",
        "/v1/partitions/reports",
        "/v1/partitions/closed",
        "/v1/partitions/opened",
        "/v1/partitions/lost",
    }
)
# a broker's own needs and the admin requests it forwards for its Kafka clients
BROKER_FORWARDED = frozenset(
    {
        "/v1/metadata",
        "/v1/metadata/updates",
        "/v1/producer-ids",
        "/v1/topics/create",
        "/v1/topics/delete",
        "/v1/topics/partitions",
        "/v1/topics/configs",
        "/v1/brokers/configs",
        "/v1/scram-credentials/alter",
        "/v1/acls/create",
        "/v1/acls/delete",
        "/v1/features/update",
        "/v1/reassignments/alter",
        "/v1/reassignments/list",
        "/v1/transactions/state-topic",
        "/v1/transactions/markers",
        "/v1/transactions/verify",
    }
)

# the request key of who called (aiohttp's typed key where it has one: 3.12 and later)
PRINCIPAL: Any = (
    web.RequestKey("tidalmq_principal", Principal)
    if hasattr(web, "RequestKey")
    else "tidalmq_principal"
)

REFUSALS = Counter(
    "tidalmq_controller_control_refusals_total",
    "Control calls the controller refused: no or a wrong token, no client certificate (401), a "
    "token or certificate on a call it may not make (403)",
    ["reason"],
)
REFUSAL_LOG = RateLimitedLog()
"""The controller process's budget of lines about refused control calls."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _refuse(request: Any, status: int, reason: str, why: str) -> web.Response:
    # REFUSAL_LOG is read at each call: a test may give the module a budget of its own
    return refuse_control_call(
        request,
        status,
        reason,
        why,
        refusals=REFUSALS,
        budget=REFUSAL_LOG,
        logger=log,
        token="the control token",
    )


def middleware(auth: ControlAuth, *, require_certificate: bool = False) -> Any:
    """The aiohttp middleware that checks every request but the open ones (outermost); with
    `require_certificate` (control-plane mTLS), also the client certificate's role."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in OPEN:
            return await handler(request)
        role = None
        if require_certificate:
            role, why = role_of(peercert_of(request.transport))
            if role is None:  # none: 401; one of the cluster CA naming no role: 403
                if why == NO_CERTIFICATE:
                    return _refuse(request, 401, "no_certificate", why)
                return _refuse(request, 403, "forbidden", why)
        principal, why = auth.authenticate(request.headers.get("Authorization"))
        if principal is None:
            return _refuse(request, 401, "no_token" if why.startswith("no") else "wrong_token", why)
        if role is not None and (why := permits(role, principal.broker_id)):
            return _refuse(request, 403, "forbidden", why)
        if not principal.is_admin and path not in BROKER_SELF and path not in BROKER_FORWARDED:
            return _refuse(request, 403, "forbidden", f"{principal} may not call {path}")
        request[PRINCIPAL] = principal
        return await handler(request)

    return check


def refuse_other_broker(request: Any, broker_id: int) -> web.Response | None:
    """In the handler of a BROKER_SELF call: a 403 answer when a broker's token names another
    broker in the body, else None (the cluster token may act for any broker)."""
    principal: Principal | None = request.get(PRINCIPAL)
    if principal is None:  # not through the middleware: never let it pass
        return _refuse(request, 403, "forbidden", "no principal")
    if principal.is_admin or principal.broker_id == broker_id:
        return None
    return _refuse(request, 403, "forbidden", f"{principal} may not act for broker {broker_id}")
