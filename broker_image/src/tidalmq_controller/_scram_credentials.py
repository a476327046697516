"""SCRAM credentials in the cluster metadata: AlterUserScramCredentials and the bootstrap users.

The controller turns an AlterUserScramCredentials request (KIP-554; the client sends the salted
password, never the password) into `scram` / `scramgone` records, validated as Kafka's
controller does (ScramControlManager): one alteration per user and request (DUPLICATE_RESOURCE
for every later one, and the earlier one is dropped), a non-empty user name, a known mechanism
(UNSUPPORTED_SASL_MECHANISM), 4,096..16,384 iterations (UNACCEPTABLE_CREDENTIAL "Too few/many
iterations"), and deleting only what exists (RESOURCE_NOT_FOUND). The records keep the salt,
the iterations, StoredKey and ServerKey (tidalmq_core.scram).

Bootstrap users (`--scram-bootstrap`, like `kafka-storage format --add-scram`): the first admin
must exist before anyone can authenticate to create users. Each entry `user:MECHANISM:password`
is written by the controller when it starts, if that user has no credential of that mechanism
yet; an existing credential (a password changed since with kafka-configs) is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode
from tidalmq_core import scram
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import Record, scram_record, scram_removed_record


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    name: str
    mechanism: int  # Kafka's type byte: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class ScramDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ScramAlterResult:
    user: str
    error_code: int = 0
    error_message: str | None = None


_DUPLICATE = (
    ErrorCode.duplicate_resource,
    "A user credential cannot be altered twice in the same request",
)


def _check_name_and_mechanism(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in scram.BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def alter(
    image: ClusterMetadata, deletions: Iterable[ScramDeletion], upsertions: Iterable[ScramUpsertion]
) -> tuple[list[ScramAlterResult], list[Record]]:
    """The results (one per user named) and the records of an AlterUserScramCredentials."""
    errors: dict[str, tuple[ErrorCode, str]] = {}
    deleting: dict[str, ScramDeletion] = {}
    upserting: dict[str, ScramUpsertion] = {}
    for d in deletions:
        if d.name in errors:
            continue
        if deleting.pop(d.name, None) is not None:
            errors[d.name] = _DUPLICATE
            continue
        error = _check_name_and_mechanism(d.name, d.mechanism)
        if error is None:
            mechanism = scram.BY_TYPE[d.mechanism].name
            if mechanism not in image.scram_credentials.get(d.name, {}):
                error = (
                    ErrorCode.resource_not_found,
                    "Attempt to delete a user credential that does not exist",
                )
        if error is not None:
            errors[d.name] = error
            continue
        deleting[d.name] = d
    for u in upsertions:
        if u.name in errors:
            continue
        if deleting.pop(u.name, None) is not None or upserting.pop(u.name, None) is not None:
            errors[u.name] = _DUPLICATE
            continue
        error = _check_name_and_mechanism(u.name, u.mechanism)
        if error is None and u.iterations < scram.MIN_ITERATIONS:
            error = ErrorCode.unacceptable_credential, "Too few iterations"
        elif error is None and u.iterations > scram.MAX_ITERATIONS:
            error = ErrorCode.unacceptable_credential, "Too many iterations"
        if error is not None:
            errors[u.name] = error
            continue
        upserting[u.name] = u
    results: list[ScramAlterResult] = []
    records: list[Record] = []
    for d in deleting.values():
        results.append(ScramAlterResult(d.name))
        records.append(scram_removed_record(d.name, scram.BY_TYPE[d.mechanism].name))
    for u in upserting.values():
        mech = scram.BY_TYPE[u.mechanism]
        credential = scram.credential_from_salted(mech, u.salt, u.salted_password, u.iterations)
        results.append(ScramAlterResult(u.name))
        records.append(scram_record(u.name, mech.name, credential))
    for user, (code, message) in errors.items():
        results.append(ScramAlterResult(user, int(code), message))
    return results, records


# ------------------------------------------------------------------------------ bootstrap
@dataclass(frozen=True, slots=True)
class BootstrapUser:
    user: str
    mechanism: str
    password: str

    def __repr__(self) -> str:  # never the password
        return f"BootstrapUser({self.user!r}, {self.mechanism})"


def parse_bootstrap(text: str, file: str = "") -> list[BootstrapUser]:
    """`user:MECHANISM:password` entries, one per line (the password is the rest of the line:
    it may hold colons and commas), from `text` and from the file `file` if given. Blank lines
    and lines starting with # are skipped. Raises ValueError naming the bad line's user."""
    lines = text.splitlines()
    if file:
        try:
            lines += Path(file).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"scram bootstrap file {file!r}: {exc}") from exc
    users = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, sep, rest = line.partition(":")
        mechanism, sep2, password = rest.partition(":")
        user, mechanism = user.strip(), mechanism.strip().upper()
        if not (sep and sep2 and user and password):
            raise ValueError(f"scram bootstrap entry {number}: expected user:MECHANISM:password")
        if mechanism not in scram.MECHANISMS:
            raise ValueError(
                f"scram bootstrap entry {number} ({user}): mechanism {mechanism!r} is not one of "
                f"{', '.join(scram.MECHANISMS)}"
            )
        users.append(BootstrapUser(user, mechanism, password))
    return users


def bootstrap(image: ClusterMetadata, users: Iterable[BootstrapUser]) -> list[Record]:
    """The records creating the bootstrap users that have no credential of their mechanism."""
    records: list[Record] = []
    seen: set[tuple[str, str]] = set()
    for u in users:
        key = (u.user, u.mechanism)
        if key in seen or u.mechanism in image.scram_credentials.get(u.user, {}):
            continue
        seen.add(key)
        credential = scram.new_credential(scram.mechanism(u.mechanism), u.password)
        records.append(scram_record(u.user, u.mechanism, credential))
    return records
