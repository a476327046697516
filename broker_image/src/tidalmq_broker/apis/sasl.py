"""SaslHandshake (v0-1, KIP-43) and SaslAuthenticate (v0-2, KIP-152).

The exchange itself is security/sasl.py; the listener serves these (and ApiVersions) alone, one
at a time, until the connection has authenticated. On a listener without SASL, or once
authenticated, they answer ILLEGAL_SASL_STATE, as Kafka's KafkaApis does (no re-authentication:
the session lifetime is 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.security.sasl import SaslFailure, SaslStateError, log_failure

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


@api(17, "SaslHandshake", 0, 1)
async def handle_sasl_handshake(broker: Broker, request: Request, conn: Connection) -> Any:
    sasl = conn.sasl
    if sasl is None or conn.authenticated:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    mechanism = request.body.mechanism
    enabled = list(sasl.config.mechanisms)
    try:
        started = sasl.handshake(mechanism, request.api_version)
    except SaslStateError as exc:
        log_failure(conn.peer, conn.listener, sasl, str(exc))
        conn.close_after_response = True
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
    if not started:
        log_failure(
            conn.peer,
            conn.listener,
            sasl,
            f"mechanism {mechanism!r} is not enabled (sasl.enabled.mechanisms)",
        )
        conn.close_after_response = True  # Kafka answers, then closes
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
    return {"error_code": ErrorCode.none, "mechanisms": enabled}


@api(36, "SaslAuthenticate", 0, 2)
async def handle_sasl_authenticate(broker: Broker, request: Request, conn: Connection) -> Any:
    sasl = conn.sasl
    if sasl is None or conn.authenticated:
        return _answer(
            ErrorCode.illegal_sasl_state,
            "SaslAuthenticate request received after successful authentication",
        )
    if sasl.state != sasl.AUTHENTICATE:
        # before a v1 SaslHandshake (or after a v0 one): Kafka closes without an answer
        log_failure(
            conn.peer, conn.listener, sasl, f"unexpected SaslAuthenticate in state {sasl.state}"
        )
        conn.close_after_response = True
        return None
    try:
        token = await sasl.authenticate(bytes(request.body.auth_bytes))
    except SaslFailure as exc:
        log_failure(conn.peer, conn.listener, sasl, exc.reason)
        conn.close_after_response = True
        return _answer(ErrorCode.sasl_authentication_failed, exc.client_message)
    except SaslStateError as exc:
        log_failure(conn.peer, conn.listener, sasl, str(exc))
        conn.close_after_response = True
        return _answer(ErrorCode.illegal_sasl_state, str(exc))
    if sasl.state == sasl.DONE:
        assert sasl.principal is not None
        conn.principal = sasl.principal
        conn.authenticated = True
    return _answer(ErrorCode.none, None, token)


def _answer(code: ErrorCode, message: str | None, token: bytes = b"") -> dict[str, Any]:
    # session_lifetime 0: the session never expires, so clients never re-authenticate (KIP-368)
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": token,
        "session_lifetime": 0,
    }
