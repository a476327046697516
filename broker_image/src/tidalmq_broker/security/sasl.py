"""SASL on the Kafka listeners: one connection's exchange, as Kafka's SaslServerAuthenticator.

A connection on a SASL_PLAINTEXT or SASL_SSL listener must authenticate before anything else is
served: ApiVersions (any number), then SaslHandshake naming a mechanism of
`sasl.enabled.mechanisms`, then the mechanism's tokens. With SaslHandshake v1 the tokens travel
in SaslAuthenticate requests (KIP-152, v0-2); with v0 (older clients) they follow as raw frames,
a 4-byte size and the token each way. Any other request before the end closes the connection;
so does a failed authentication, after its SASL_AUTHENTICATION_FAILED answer (v1) or at once
(v0: no answer can carry an error), as Kafka does.

Mechanisms, checked against the SCRAM credentials in the cluster metadata (nothing else holds
users or passwords):
- SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802/7677): the server never sees the password; it checks
  the client's proof against StoredKey and proves itself with ServerKey. No channel binding
  (gs2 `n` or `y`), no delegation tokens (`tokenauth`).
- PLAIN (RFC 4616): the password is checked against the user's SCRAM credentials (SCRAM-SHA-512
  first, then SCRAM-SHA-256): one PBKDF2 of it with the credential's salt and iterations must
  give its StoredKey. A user gets PLAIN access by having a SCRAM credential. Send PLAIN only
  over TLS (SASL_SSL): the password crosses the wire as it is.

Error messages are Kafka's: SCRAM failures answer "Authentication failed during authentication
due to invalid credentials with SASL mechanism SCRAM-SHA-512", PLAIN ones "Authentication
failed: Invalid username or password". Sessions do not expire (KIP-368 re-authentication is not
offered: SaslAuthenticate answers a session lifetime of 0, which tells clients not to).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from tidalmq_core import scram
from tidalmq_core.scram import ScramCredential

from tidalmq_broker.security import failures

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, scram.SCRAM_SHA_256.name, scram.SCRAM_SHA_512.name)
ANONYMOUS = "User:ANONYMOUS"

# a credential lookup: (user, mechanism name) -> the credential, or None
Credentials = Callable[[str, str], ScramCredential | None]


class SaslFailure(Exception):
    """Authentication failed. `client_message` is what the client is told (Kafka's wording),
    `reason` what the broker logs (never a password or key)."""

    def __init__(self, client_message: str, reason: str) -> None:
        super().__init__(reason)
        self.client_message = client_message
        self.reason = reason


class SaslStateError(Exception):
    """A request the exchange does not expect now (the connection is closed)."""


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """`sasl.enabled.mechanisms`; ValueError for one TidalMQ does not offer."""
    names = tuple(dict.fromkeys(m.strip().upper() for m in text.split(",") if m.strip()))
    unknown = [m for m in names if m not in SUPPORTED_MECHANISMS]
    if unknown:
        raise ValueError(
            f"sasl.enabled.mechanisms: {', '.join(unknown)} not offered (TidalMQ offers "
            f"{', '.join(SUPPORTED_MECHANISMS)}; GSSAPI and OAUTHBEARER are not implemented)"
        )
    if not names:
        raise ValueError("sasl.enabled.mechanisms: no mechanism given")
    return names


@dataclass(frozen=True, slots=True)
class SaslConfig:
    mechanisms: tuple[str, ...]
    credentials: Credentials


# ------------------------------------------------------------------------------ mechanisms
class _Mechanism:
    name: str
    complete = False
    user: str | None = None

    async def step(self, token: bytes) -> bytes:
        raise NotImplementedError


class PlainServer(_Mechanism):
    """RFC 4616: one message, `authzid NUL authcid NUL password`."""

    name = PLAIN
    _INVALID = "Authentication failed: Invalid username or password"

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    async def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslStateError("PLAIN exchange already complete")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure(
                "Invalid SASL/PLAIN response: expected 3 tokens, got " + str(len(parts)),
                "malformed PLAIN message",
            )
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslFailure(self._INVALID, "PLAIN message is not UTF-8") from None
        if not user:
            raise SaslFailure("Authentication failed: username not specified", "no username")
        if not password:
            raise SaslFailure("Authentication failed: password not specified", "no password")
        self.user = user
        found = False
        for mech in (scram.SCRAM_SHA_512, scram.SCRAM_SHA_256):
            credential = self._credentials(user, mech.name)
            if credential is None:
                continue
            found = True
            # one PBKDF2 (4,096+ iterations): on a thread, the event loop keeps serving
            if await asyncio.to_thread(scram.password_matches, mech, credential, password):
                break
        else:
            reason = "wrong password" if found else "unknown user (no SCRAM credential)"
            raise SaslFailure(self._INVALID, reason)
        if authzid and authzid != user:
            raise SaslFailure(
                "Authentication failed: Client requested an authorization id that is different "
                "from username",
                f"authorization id {authzid!r} is not the user",
            )
        self.complete = True
        return b""


# RFC 5802 syntax, as Kafka's ScramMessages reads it
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_PRINTABLE = r"[\x21-\x2B\x2D-\x7E]+"
_VALUE = r"[\x01-\x2B\x2D-\x7F]+"
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>[ny],(?:a=(?P<authzid>{_SASLNAME}))?,)(?:m={_VALUE},)?"
    rf"(?P<bare>n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<ext>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_BASE64})"
)


def _sasl_name_to_user(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer(_Mechanism):
    """RFC 5802 server: client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: scram.Mechanism, credentials: Credentials) -> None:
        self.name = mechanism.name
        self._mech = mechanism
        self._credentials = credentials
        self._invalid = (
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {mechanism.name}"
        )
        self._state = "first"
        self._credential: ScramCredential | None = None
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def _fail(self, reason: str) -> SaslFailure:
        self._state = "failed"
        return SaslFailure(self._invalid, reason)

    async def step(self, token: bytes) -> bytes:
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            raise self._fail("SCRAM message is not ASCII") from None
        if self._state == "first":
            return self._client_first(text)
        if self._state == "final":
            return self._client_final(text)
        raise SaslStateError(f"SCRAM exchange in state {self._state}")

    def _client_first(self, text: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(text)
        if m is None:
            if text.startswith("p="):
                raise self._fail("channel binding requested (not supported)")
            raise self._fail("invalid client-first message")
        user = _sasl_name_to_user(m.group("saslname"))
        self.user = user
        extensions = dict(item.split("=", 1) for item in m.group("ext").split(",") if "=" in item)
        if extensions.get("tokenauth", "").lower() == "true":
            raise self._fail("delegation token authentication (not supported)")
        authzid = m.group("authzid")
        if authzid is not None and _sasl_name_to_user(authzid) != user:
            self._state = "failed"
            raise SaslFailure(
                "Authentication failed: Client requested an authorization id that is different "
                "from username",
                f"authorization id {authzid!r} is not the user",
            )
        credential = self._credentials(user, self._mech.name)
        if credential is None:
            raise self._fail(f"no {self._mech.name} credential for the user")
        if credential.iterations < scram.MIN_ITERATIONS:
            raise self._fail(f"credential of {credential.iterations} iterations (too few)")
        self._credential = credential
        self._gs2 = m.group("gs2")
        self._client_first_bare = m.group("bare")
        self._nonce = m.group("nonce") + secrets.token_urlsafe(24)
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(text)
        if m is None:
            raise self._fail("invalid client-final message")
        if m.group("nonce") != self._nonce:
            raise self._fail("invalid client nonce in the final client message")
        if base64.b64decode(m.group("channel")) != self._gs2.encode():
            raise self._fail("channel binding data does not match the GS2 header")
        credential = self._credential
        assert credential is not None
        auth_message = (
            f"{self._client_first_bare},{self._server_first},{m.group('without_proof')}".encode()
        )
        h = self._mech.hash
        signature = scram.hmac_digest(credential.stored_key, auth_message, h)
        proof = base64.b64decode(m.group("proof"))
        if len(proof) != len(signature):
            raise self._fail("client proof of the wrong length")
        client_key = scram.xor(proof, signature)
        if not hmac.compare_digest(scram.stored_key(client_key, h), credential.stored_key):
            raise self._fail("invalid client proof (wrong password)")
        server_signature = scram.hmac_digest(credential.server_key, auth_message, h)
        self._state = "done"
        self.complete = True
        return b"v=" + base64.b64encode(server_signature)


def new_mechanism(name: str, credentials: Credentials) -> _Mechanism:
    if name == PLAIN:
        return PlainServer(credentials)
    return ScramServer(scram.mechanism(name), credentials)


# ------------------------------------------------------------------------------ a connection
class SaslAuthenticator:
    """One connection's SASL state: handshake, tokens, done (or failed)."""

    HANDSHAKE = "handshake"  # waiting for SaslHandshake
    AUTHENTICATE = "authenticate"  # v1 handshake done: tokens in SaslAuthenticate requests
    RAW = "raw"  # v0 handshake done: tokens in raw frames
    DONE = "done"
    FAILED = "failed"

    def __init__(self, config: SaslConfig) -> None:
        self.config = config
        self.state = self.HANDSHAKE
        self.mechanism: _Mechanism | None = None
        self.principal: str | None = None

    @property
    def mechanism_name(self) -> str:
        return self.mechanism.name if self.mechanism is not None else "-"

    @property
    def user(self) -> str | None:
        return self.mechanism.user if self.mechanism is not None else None

    def handshake(self, mechanism: str, version: int) -> bool:
        """SaslHandshake: True when the mechanism is enabled (the exchange starts)."""
        if self.state != self.HANDSHAKE:
            raise SaslStateError(f"SaslHandshake in state {self.state}")
        if mechanism not in self.config.mechanisms:
            self.state = self.FAILED
            return False
        self.mechanism = new_mechanism(mechanism, self.config.credentials)
        self.state = self.RAW if version == 0 else self.AUTHENTICATE
        return True

    async def authenticate(self, token: bytes) -> bytes:
        """One client token -> the server's; raises SaslFailure or SaslStateError."""
        if self.state not in (self.AUTHENTICATE, self.RAW) or self.mechanism is None:
            raise SaslStateError(f"SASL token in state {self.state}")
        try:
            challenge = await self.mechanism.step(token)
        except SaslFailure:
            self.state = self.FAILED
            raise
        if self.mechanism.complete:
            self.state = self.DONE
            self.principal = f"User:{self.mechanism.user}"
        return challenge


def log_failure(peer: str, listener: str, sasl: SaslAuthenticator, reason: str) -> None:
    """One rate-limited line per failed authentication (who, from where, why)."""
    who = f" of {sasl.user!r}" if sasl.user is not None else ""
    failures.record(
        listener,
        "sasl",
        "SASL/%s authentication%s from %s on listener %s failed: %s",
        sasl.mechanism_name,
        who,
        peer,
        listener,
        reason,
    )
