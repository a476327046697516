"""SCRAM credentials (RFC 5802, RFC 7677), as Kafka stores and checks them.

A credential is what a server keeps to check a password without knowing it: the salt, the
iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey =
HMAC(SaltedPassword, "Server Key"), where SaltedPassword = PBKDF2-HMAC(password, salt,
iterations). Kafka's AlterUserScramCredentials request (KIP-554) carries the salted password,
never the password: the client salts it, the controller derives the two keys and keeps only those.

Mechanisms by Kafka's names and wire type bytes (ScramMechanism): SCRAM-SHA-256 (1) and
SCRAM-SHA-512 (2), both with Kafka's bounds of 4,096..16,384 iterations.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations (both mechanisms)
MAX_ITERATIONS = 16384  # Kafka's ScramControlManager.MAX_ITERATIONS
DEFAULT_ITERATIONS = 4096  # what kafka-configs uses when no iterations= is given


@dataclass(frozen=True, slots=True)
class Mechanism:
    name: str  # the SASL mechanism name
    type: int  # Kafka's wire type byte (AlterUserScramCredentials, DescribeUserScramCredentials)
    hash: str  # hashlib name


SCRAM_SHA_256 = Mechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = Mechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE: dict[int, Mechanism] = {m.type: m for m in MECHANISMS.values()}


def mechanism(name: str) -> Mechanism:
    """The mechanism of this SASL name; KeyError for any other."""
    return MECHANISMS[name]


# ------------------------------------------------------------------------------ the math
def hi(password: bytes, salt: bytes, iterations: int, hash_name: str) -> bytes:
    """RFC 5802 Hi(): PBKDF2 with HMAC of `hash_name`, one block (the hash's size)."""
    return hashlib.pbkdf2_hmac(hash_name, password, salt, iterations)


def hmac_digest(key: bytes, message: bytes, hash_name: str) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def client_key(salted_password: bytes, hash_name: str) -> bytes:
    return hmac_digest(salted_password, b"Client Key", hash_name)


def server_key(salted_password: bytes, hash_name: str) -> bytes:
    return hmac_digest(salted_password, b"Server Key", hash_name)


def stored_key(client_key_: bytes, hash_name: str) -> bytes:
    return hashlib.new(hash_name, client_key_).digest()


def xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("operands of different lengths")
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------ credentials
@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the cluster metadata keeps of one user's password for one mechanism."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScramCredential:
        return cls(
            salt=base64.b64decode(data["salt"]),
            stored_key=base64.b64decode(data["stored_key"]),
            server_key=base64.b64decode(data["server_key"]),
            iterations=int(data["iterations"]),
        )

    def __repr__(self) -> str:  # never print key material in logs or test failures
        return f"ScramCredential(iterations={self.iterations})"


def credential_from_salted(
    mech: Mechanism, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The credential of a salted password (what AlterUserScramCredentials carries)."""
    return ScramCredential(
        salt=salt,
        stored_key=stored_key(client_key(salted_password, mech.hash), mech.hash),
        server_key=server_key(salted_password, mech.hash),
        iterations=iterations,
    )


def new_credential(
    mech: Mechanism,
    password: str,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """A credential for a password (bootstrap users, tests); a random salt by default."""
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = hi(password.encode(), salt, iterations, mech.hash)
    return credential_from_salted(mech, salt, salted, iterations)


def password_matches(mech: Mechanism, credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from (SASL/PLAIN checks a password
    this way: one PBKDF2, as costly as a SCRAM client's, so run it off the event loop)."""
    salted = hi(password.encode(), credential.salt, credential.iterations, mech.hash)
    computed = stored_key(client_key(salted, mech.hash), mech.hash)
    return hmac.compare_digest(computed, credential.stored_key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ------------------------------------------------------------------------------ the client side
class ScramClient:
    """A SCRAM client's exchange (RFC 5802, no channel binding), for the project's own Kafka
    clients (`tidalmq reassign` with --command-config): `first()`, `final(server_first)`, then
    `verify(server_final)`, which raises ValueError unless the server proved it knows the key."""

    def __init__(self, mech: Mechanism, username: str, password: str, nonce: str = "") -> None:
        self._mech = mech
        self._password = password.encode()
        name = username.replace("=", "=3D").replace(",", "=2C")
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={name},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", errors="replace")
        fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        nonce, salt, iterations = fields.get("r", ""), fields.get("s", ""), fields.get("i", "")
        if "e" in fields:
            raise ValueError(f"the server refused: {fields['e']}")
        if not nonce.startswith(self._nonce) or not salt or not iterations.isdigit():
            raise ValueError("the server's first message is not SCRAM's")
        count = int(iterations)
        if not MIN_ITERATIONS <= count <= 10 * MAX_ITERATIONS:
            raise ValueError(f"the server asks for {count} iterations")
        salted = hi(self._password, base64.b64decode(salt), count, self._mech.hash)
        key = client_key(salted, self._mech.hash)
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac_digest(stored_key(key, self._mech.hash), auth_message, self._mech.hash)
        self._server_signature = hmac_digest(
            server_key(salted, self._mech.hash), auth_message, self._mech.hash
        )
        return f"{without_proof},p={_b64(xor(key, signature))}".encode()

    def verify(self, server_final: bytes) -> None:
        text = server_final.decode("utf-8", errors="replace")
        if text.startswith("e="):
            raise ValueError(f"the server refused: {text[2:]}")
        expected = "v=" + _b64(self._server_signature)
        if not self._server_signature or not hmac.compare_digest(text.encode(), expected.encode()):
            raise ValueError("the server's signature is wrong: it does not know the credential")
