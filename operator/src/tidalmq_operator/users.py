"""User resources (like Strimzi's KafkaUser): the pure part, with no Kubernetes or controller I/O.

A User names a Kafka principal `User:<metadata.name>` and says how it authenticates and what it
may do:

- `spec.authentication.type`: `scram-sha-512` or `scram-sha-256` (a SCRAM credential in the
  cluster metadata, the password from `spec.authentication.password.valueFrom.secretKeyRef` or
  generated once and kept in the User's Secret), or `tls` (a client certificate with subject
  `CN=<name>`, signed by the cluster's clients CA; brokers map that DN to `User:<name>` with
  `ssl.principal.mapping.rules`, as the chart sets them).
- `spec.authorization.acls`: Kafka ACL bindings of that principal. The operator owns every
  binding of the principal: a reconcile makes the cluster's bindings equal to the spec's
  (`acl_diff`: what is gone is deleted, what is new is created, the rest is left alone).

The Kopf handlers are in `user_handlers.py`; this module is what they compute.
"""

from __future__ import annotations

import base64
import datetime
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tidalmq_core.acls import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from tidalmq_core.certs import new_ca, validity

from tidalmq_operator.models import SpecError

SCRAM_TYPES = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}
PASSWORD_LENGTH = 32
# a client certificate is issued again when it has less than this left (or a new CA signs)
RENEW_BEFORE = datetime.timedelta(days=30)
CERT_DAYS = 365
CA_DAYS = 3650
# Kafka user names the broker's SASL and the ACL principal both take: no ',' or '=' (SCRAM's
# saslname escapes them, which kafka-configs does not), Kubernetes names are a subset anyway
_USER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "cluster": ResourceType.CLUSTER,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
}
PATTERN_TYPES = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED}
PERMISSIONS = {"allow": PermissionType.ALLOW, "deny": PermissionType.DENY}


def operation_of(text: str) -> AclOperation:
    """`Read`, `DescribeConfigs`, `IdempotentWrite`, `All` (Strimzi's and kafka-acls' spelling;
    case and `_` are free) as Kafka's AclOperation."""
    key = re.sub(r"[^a-z]", "", text.lower())
    for op in AclOperation:
        if (
            op not in (AclOperation.UNKNOWN, AclOperation.ANY)
            and op.name.replace("_", "").lower() == key
        ):
            return op
    raise SpecError(f"unknown ACL operation {text!r}")


# ------------------------------------------------------------------------------ the spec
class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class SecretKeyRef(_Spec):
    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


class PasswordSource(_Spec):
    secret_key_ref: SecretKeyRef = Field(alias="secretKeyRef")


class Password(_Spec):
    value_from: PasswordSource = Field(alias="valueFrom")


class Authentication(_Spec):
    type: Literal["scram-sha-512", "scram-sha-256", "tls"]
    password: Password | None = None


class AclResource(_Spec):
    type: Literal["topic", "group", "cluster", "transactionalId"]
    name: str | None = None
    pattern_type: Literal["literal", "prefixed"] = Field(default="literal", alias="patternType")


class AclRule(_Spec):
    resource: AclResource
    operations: list[str] = Field(min_length=1)
    host: str = "*"
    type: Literal["allow", "deny"] = "allow"


class Authorization(_Spec):
    type: Literal["simple"] = "simple"
    acls: list[AclRule] = Field(default_factory=list)


class UserSpec(_Spec):
    authentication: Authentication
    authorization: Authorization | None = None

    @property
    def mechanism(self) -> str | None:
        """The SCRAM mechanism (`SCRAM-SHA-512`), None for tls."""
        return SCRAM_TYPES.get(self.authentication.type)

    def password_ref(self) -> SecretKeyRef | None:
        pw = self.authentication.password
        return pw.value_from.secret_key_ref if pw is not None else None


def parse_user(name: str, spec: dict[str, Any]) -> tuple[UserSpec, list[AclBinding]]:
    """The typed spec and its ACL bindings; SpecError says what is wrong."""
    if not _USER_NAME.match(name) or len(name) > 253:
        raise SpecError(f"user name {name!r}: lower-case letters, digits, '-' and '.' only")
    try:
        user = UserSpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpecError(f"spec.{where}: {first['msg']}") from exc
    if user.authentication.type == "tls" and user.authentication.password is not None:
        raise SpecError("spec.authentication.password: a tls user has no password")
    return user, bindings_of(name, user)


def principal_of(name: str) -> str:
    return f"User:{name}"


def bindings_of(name: str, user: UserSpec) -> list[AclBinding]:
    """The spec's ACL rules as Kafka bindings (one per operation), in spec order, no duplicates."""
    out: dict[AclBinding, None] = {}
    rules = user.authorization.acls if user.authorization is not None else []
    for i, rule in enumerate(rules):
        where = f"spec.authorization.acls[{i}]"
        rtype = RESOURCE_TYPES[rule.resource.type]
        if rtype == ResourceType.CLUSTER:
            if rule.resource.name not in (None, CLUSTER_NAME):
                raise SpecError(f"{where}.resource.name: the cluster resource is {CLUSTER_NAME!r}")
            if rule.resource.pattern_type != "literal":
                raise SpecError(f"{where}.resource.patternType: the cluster resource is literal")
            resource_name = CLUSTER_NAME
        else:
            if not rule.resource.name:
                raise SpecError(f"{where}.resource.name: required for a {rule.resource.type}")
            resource_name = rule.resource.name
        if not rule.host:
            raise SpecError(f"{where}.host: '*' or an IP address")
        for text in rule.operations:
            op = operation_of(text)
            if op != AclOperation.ALL and op not in SUPPORTED_OPERATIONS[rtype]:
                raise SpecError(
                    f"{where}.operations: {text} does not apply to a {rule.resource.type}"
                )
            binding = AclBinding(
                rtype,
                resource_name,
                PATTERN_TYPES[rule.resource.pattern_type],
                principal_of(name),
                rule.host,
                op,
                PERMISSIONS[rule.type],
            )
            out[binding] = None
    return list(out)


# ------------------------------------------------------------------------------ ACL diff
@dataclass(frozen=True, slots=True)
class AclDiff:
    create: list[AclBinding]
    delete: list[AclBinding]

    @property
    def empty(self) -> bool:
        return not self.create and not self.delete


def acl_diff(desired: list[AclBinding], current: list[AclBinding]) -> AclDiff:
    """What to create and delete so that the principal's bindings are exactly `desired`."""
    have = set(current)
    want = set(desired)
    return AclDiff(
        create=[b for b in desired if b not in have],
        delete=[b for b in dict.fromkeys(current) if b not in want],
    )


def bindings_of_principal(acls: dict[str, AclBinding], principal: str) -> list[AclBinding]:
    return [b for b in acls.values() if b.principal == principal]


def exact_filter(b: AclBinding) -> AclBindingFilter:
    """A DeleteAcls filter that matches this one binding and nothing else."""
    return AclBindingFilter(
        b.resource_type, b.name, b.pattern_type, b.principal, b.host, b.operation, b.permission
    )


def principal_filter(principal: str) -> AclBindingFilter:
    """Every binding of a principal (a User's deletion)."""
    return AclBindingFilter(principal=principal)


# ------------------------------------------------------------------------------ the Secret
def new_password() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(PASSWORD_LENGTH))


def jaas_config(user: str, password: str) -> str:
    """What Kafka's Java clients take as sasl.jaas.config for SCRAM (quotes escaped)."""

    def quoted(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return (
        f"org.apache.kafka.common.security.scram.ScramLoginModule required "
        f"username={quoted(user)} password={quoted(password)};"
    )


def scram_secret_data(user: str, mechanism: str, password: str) -> dict[str, str]:
    """The User's Secret for a SCRAM user (string values; the handler base64-encodes them)."""
    return {
        "username": user,
        "password": password,
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": jaas_config(user, password),
    }


def tls_secret_data(user: str, key_pem: bytes, cert_pem: bytes, ca_pem: bytes) -> dict[str, str]:
    """The User's Secret for a tls user: its key and certificate, and the clients CA."""
    return {
        "username": user,
        "user.key": key_pem.decode(),
        "user.crt": cert_pem.decode(),
        "ca.crt": ca_pem.decode(),
        "security.protocol": "SSL",
    }


def secret_body(
    name: str,
    namespace: str,
    owner: dict[str, Any],
    data: dict[str, str],
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Secret owned by the User (ownerReferences: it is deleted with it)."""
    labels = {
        "app.kubernetes.io/managed-by": "tidalmq-operator",
        "tidalmq.io/user": name,
        **(labels or {}),
    }
    owner_ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["name"],
        "uid": owner["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_ref],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def operator_secret_body(
    name: str, namespace: str, data: dict[str, str], secret_type: str = "Opaque"
) -> dict[str, Any]:
    """A Secret of the operator's own that no User owns (the clients CA, its CRL); `data` is
    already base64, as a patch of the same Secret sends it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": secret_type,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "tidalmq-operator"},
        },
        "data": data,
    }


def decoded(secret_data: dict[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret_data or {}).items()}


# ------------------------------------------------------------------------------ certificates
@dataclass(frozen=True, slots=True)
class KeyPair:
    key_pem: bytes
    cert_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_clients_ca(common_name: str = "TidalMQ clients CA") -> KeyPair:
    """The CA that signs the tls Users' certificates (ECDSA P-256, SHA-256; tidalmq_core.certs)."""
    ca = new_ca(common_name, days=CA_DAYS)
    return KeyPair(ca.key_pem(), ca.cert_pem())


def issue_client_cert(ca: KeyPair, user: str, days: int = CERT_DAYS) -> KeyPair:
    """A client certificate with subject CN=<user>, signed by the clients CA."""
    # a CA's key signs (new_clients_ca makes an EC one); the loaders' types also admit keys that
    # cannot (DH, X25519), whence the two ignores below
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return KeyPair(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def _issued(cert_pem: str, ca_pem: bytes) -> x509.Certificate | None:
    """The certificate, if this CA signed it; None on any parse or signature failure."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except Exception:  # any parse or signature failure
        return None
    return cert


def _users_cert(cert_pem: str, ca_pem: bytes, user: str) -> x509.Certificate | None:
    """The certificate, if it is this CA's and names the User alone (CN=<user>)."""
    cert = _issued(cert_pem, ca_pem)
    if cert is None:
        return None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return cert if [a.value for a in cns] == [user] else None


def issued_by(cert_pem: str, ca_pem: bytes) -> bool:
    """Whether a PEM certificate is signed by this CA (what the CA's CRL can revoke)."""
    return _issued(cert_pem, ca_pem) is not None


def cert_still_good(
    cert_pem: str, ca_pem: bytes, user: str, now: datetime.datetime | None = None
) -> bool:
    """Whether a User's certificate can be kept: CN=<user>, issued by this CA, not due."""
    cert = _users_cert(cert_pem, ca_pem, user)
    now = now or datetime.datetime.now(datetime.UTC)
    return cert is not None and cert.not_valid_after_utc - now > RENEW_BEFORE


def coming_due(
    cert_pem: str, ca_pem: bytes, user: str, now: datetime.datetime | None = None
) -> bool:
    """Whether a User's certificate is replaced only because its end is near (CN=<user>, this
    CA's, not expired): a routine renewal, after which the old one is revoked with a grace."""
    cert = _users_cert(cert_pem, ca_pem, user)
    now = now or datetime.datetime.now(datetime.UTC)
    return cert is not None and cert.not_valid_after_utc > now
