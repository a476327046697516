"""Who may call the control plane: the cluster's control token and the brokers' own tokens.

The controller's HTTP server and every broker's HTTP server take control calls (registration,
heartbeats, reports, metadata pushes, drains, topic changes, ...). Each call carries a bearer
token (`Authorization: Bearer <token>`); only `/healthz`, `/livez`, `/readyz` and `/metrics` are
served without one (docs/security.md, "The control plane").

Two kinds of token:

- **The cluster's control token** (the admin token): a random secret of at least 32 characters
  (`generate_token`). Its holder may make any control call: the controller's owner (`tidalmq local
  up`, the operator) and the admin commands (`tidalmq local status`, `recover`, `static-topic`).
- **A broker's token**, `broker-<id>.<hex HMAC-SHA256(secret, "tidalmq-control-broker:<id>")>`:
  derived from the brokers' secret (by default the cluster's control token itself; the Helm chart
  gives brokers a secret of their own, so that a broker pod never holds the admin token). It
  vouches for one broker id: the controller lets it register, heartbeat, report and drain as that
  broker only, and make the calls a broker forwards for its Kafka clients (topics, configs,
  producer ids, reassignments, SCRAM credentials); and it is what the controller presents to that
  broker when it pushes metadata. The controller verifies it by computing the HMAC again: it keeps
  no list of broker tokens.

A token file holds one token per line (blank lines and `#` comments ignored): the first is the one
sent, and every line is accepted, so a token is rotated without downtime in three rolling
restarts (add the new one second, move it first, drop the old one).

Tokens are compared with `hmac.compare_digest` (constant time). This module does no I/O besides
reading a token file, and imports nothing of ours.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_SECRET_CHARS = 32
MAX_HEADER_CHARS = 1024  # an Authorization header longer than this is refused unread
_BROKER_TOKEN = re.compile(r"broker-(\d{1,9})\.([0-9a-f]{64})")
_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
ENV_TOKEN = "TIDALMQ_CONTROL_TOKEN"
ENV_TOKEN_FILE = "TIDALMQ_CONTROL_TOKEN_FILE"


class TokenError(ValueError):
    """A token setting that cannot be used (one line naming it)."""


def generate_token() -> str:
    """A new cluster control token: 256 random bits, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def broker_token(secret: str, broker_id: int) -> str:
    """Broker `broker_id`'s token, derived from the brokers' secret."""
    mac = hmac.digest(secret.encode(), f"tidalmq-control-broker:{broker_id}".encode(), "sha256")
    return f"broker-{broker_id}.{mac.hex()}"


def broker_id_of(token: str) -> int | None:
    """The broker id a token in the broker-token form names (None: not that form)."""
    match = _BROKER_TOKEN.fullmatch(token)
    return int(match.group(1)) if match else None


def parse_tokens(text: str, what: str = "control token") -> list[str]:
    """The tokens of a token file's text: one per line, blank lines and `#` comments ignored.
    A secret (anything but a broker's token) must have at least MIN_SECRET_CHARS characters."""
    tokens = []
    for line in text.splitlines():
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if not _TOKEN_CHARS.fullmatch(token):
            raise TokenError(f"{what}: a token is printable ASCII without spaces")
        if broker_id_of(token) is None and len(token) < MIN_SECRET_CHARS:
            raise TokenError(
                f"{what}: too short ({len(token)} characters; at least {MIN_SECRET_CHARS}, e.g. "
                "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        tokens.append(token)
    return tokens


def read_tokens(value: str = "", file: str = "", what: str = "control token") -> list[str]:
    """Tokens from a value (an environment variable) or a file; [] when neither is given."""
    if value and file:
        raise TokenError(f"{what}: give the token or its file, not both")
    if file:
        try:
            text = Path(file).read_text()
        except OSError as exc:
            raise TokenError(f"{what}: cannot read {file}: {exc.strerror or exc}") from exc
        tokens = parse_tokens(text, what)
        if not tokens:
            raise TokenError(f"{what}: {file} holds no token")
        return tokens
    return parse_tokens(value, what) if value else []


def tokens_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The tokens of TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN (what the commands that
    call a controller use when given --controller-url)."""
    env = os.environ if env is None else env
    return read_tokens(env.get(ENV_TOKEN, ""), env.get(ENV_TOKEN_FILE, ""))


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None: none, or another scheme)."""
    if not header or len(header) > MAX_HEADER_CHARS:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def authorization(token: str) -> dict[str, str]:
    """The header that presents `token`."""
    return {"Authorization": f"Bearer {token}"}


def _matches_any(presented: bytes, expected: Sequence[bytes]) -> bool:
    ok = False
    for candidate in expected:  # no early exit: the time does not tell which one matched
        ok |= hmac.compare_digest(presented, candidate)
    return ok


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a control call: the cluster token's holder (`broker_id` None) or one broker."""

    broker_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.broker_id is None

    def __str__(self) -> str:
        return "the cluster token" if self.broker_id is None else f"broker {self.broker_id}'s token"


ADMIN = Principal()


class ControlAuth:
    """The controller's check of control calls: the cluster tokens (any line of the token file)
    and the brokers' tokens derived from the brokers' secrets (default: the cluster tokens)."""

    def __init__(self, tokens: Sequence[str], broker_secrets: Sequence[str] = ()) -> None:
        if not tokens:
            raise TokenError("the controller needs a control token")
        for token in (*tokens, *broker_secrets):
            if broker_id_of(token) is not None:
                raise TokenError("a broker's token cannot be the cluster's control token")
        self.token = tokens[0]  # what the admin commands present
        self._admin = [t.encode() for t in tokens]
        self._secrets = list(broker_secrets or tokens)
        # the tokens of the brokers that presented a valid one (a heartbeat then costs a dict
        # lookup, not an HMAC); only valid ones are kept, so its size is the cluster's
        self._known: dict[int, list[bytes]] = {}

    def broker_token(self, broker_id: int) -> str:
        """The token the controller presents to broker `broker_id` (and that broker presents)."""
        return broker_token(self._secrets[0], broker_id)

    def authenticate(self, header: str | None) -> tuple[Principal | None, str]:
        """(who, "") for a valid token, else (None, why it is refused)."""
        token = bearer(header)
        if token is None:
            return None, "no bearer token" if not header else "not a bearer token"
        presented = token.encode()
        if _matches_any(presented, self._admin):
            return ADMIN, ""
        broker_id = broker_id_of(token)
        if broker_id is not None:
            expected = self._known.get(broker_id)
            if expected is None:
                expected = [broker_token(s, broker_id).encode() for s in self._secrets]
            if _matches_any(presented, expected):
                self._known[broker_id] = expected
                return Principal(broker_id), ""
        return None, "wrong token"


class BrokerCredentials:
    """A broker's control credentials, from its token setting: either its own broker token (the
    local cluster hands each broker only its own), or a secret it derives its token from (the
    brokers' secret, or the cluster token).

    `token` is what the broker presents to the controller. Calls into the broker's control
    endpoints are accepted with its own token (the controller's pushes) or with a line of its
    setting (its preStop `tidalmq drain`, which reads the same setting)."""

    def __init__(self, tokens: Sequence[str], broker_id: int) -> None:
        if not tokens:
            raise TokenError("no control token")
        accepted: list[str] = []
        own: list[str] = []
        for token in tokens:
            named = broker_id_of(token)
            if named is None:
                own.append(broker_token(token, broker_id))
                accepted += [token, own[-1]]
            elif named != broker_id:
                raise TokenError(
                    f"control token: that is broker {named}'s token, and this is broker {broker_id}"
                )
            else:
                own.append(token)
                accepted.append(token)
        self.broker_id = broker_id
        self.token = own[0]
        self._accepted = [t.encode() for t in accepted]

    def authenticate(self, header: str | None) -> tuple[bool, str]:
        token = bearer(header)
        if token is None:
            return False, "no bearer token" if not header else "not a bearer token"
        if _matches_any(token.encode(), self._accepted):
            return True, ""
        return False, "wrong token"
