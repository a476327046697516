"""User resources: spec validation, ACL bindings and their diff, the Secret's contents, client
certificates (users.py); and the handlers (user_handlers.py) against a real in-process
controller and an in-memory Kubernetes: credentials and ACLs land in the cluster metadata, a
second reconcile writes nothing, ACL changes are a diff, switching mechanism or to tls removes
the old credential, and deletion removes everything."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from tidalmq_controller import Controller, ControllerSettings
from tidalmq_core import scram
from tidalmq_core.acls import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from tidalmq_operator import clients_crl, user_handlers, users
from tidalmq_operator.kube import Conflict, NotFound
from tidalmq_operator.models import SpecError
from tidalmq_operator.settings import OperatorSettings

from tests.support.controllers import running_controller

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE


def acl(resource: dict[str, Any], *ops: str, **rest: Any) -> dict[str, Any]:
    return {"resource": resource, "operations": list(ops), **rest}


def spec(kind: str = "scram-sha-512", *acls: dict[str, Any], **auth: Any) -> dict[str, Any]:
    return {"authentication": {"type": kind, **auth}, "authorization": {"acls": list(acls)}}


# ---------------------------------------------------------------------------- spec
def test_bindings_of_a_spec() -> None:
    _, bindings = users.parse_user(
        "alice",
        spec(
            "scram-sha-512",
            acl({"type": "topic", "name": "orders"}, "Read", "Describe"),
            acl(
                {"type": "topic", "name": "logs-", "patternType": "prefixed"}, "Write", type="deny"
            ),
            acl({"type": "group", "name": "app"}, "Read", host="10.0.0.7"),
            acl({"type": "cluster"}, "IdempotentWrite", "describe_configs"),
            acl({"type": "transactionalId", "name": "*"}, "All"),
            acl({"type": "topic", "name": "orders"}, "Read"),  # a duplicate: one binding
        ),
    )
    p = "User:alice"
    assert bindings == [
        AclBinding(TOPIC, "orders", LITERAL, p, "*", READ, ALLOW),
        AclBinding(TOPIC, "orders", LITERAL, p, "*", DESCRIBE, ALLOW),
        AclBinding(TOPIC, "logs-", PREFIXED, p, "*", WRITE, DENY),
        AclBinding(GROUP, "app", LITERAL, p, "10.0.0.7", READ, ALLOW),
        AclBinding(CLUSTER, "kafka-cluster", LITERAL, p, "*", AclOperation.IDEMPOTENT_WRITE, ALLOW),
        AclBinding(CLUSTER, "kafka-cluster", LITERAL, p, "*", AclOperation.DESCRIBE_CONFIGS, ALLOW),
        AclBinding(ResourceType.TRANSACTIONAL_ID, "*", LITERAL, p, "*", AclOperation.ALL, ALLOW),
    ]


@pytest.mark.parametrize(
    "name, body, message",
    [
        ("alice", {}, "spec.authentication"),
        ("alice", {"authentication": {"type": "plain"}}, "spec.authentication.type"),
        ("Alice", spec(), "lower-case"),
        ("a,b", spec(), "lower-case"),
        (
            "alice",
            spec("tls", password={"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
            "a tls user has no password",
        ),
        ("alice", spec("tls", acl({"type": "topic"}, "Read")), "name: required for a topic"),
        ("alice", spec("tls", acl({"type": "topic", "name": "t"}, "Fly")), "unknown ACL operation"),
        (
            "alice",
            spec("tls", acl({"type": "group", "name": "g"}, "Write")),
            "Write does not apply to a group",
        ),
        ("alice", spec("tls", acl({"type": "cluster", "name": "other"}, "Alter")), "kafka-cluster"),
        (
            "alice",
            spec("tls", acl({"type": "cluster", "patternType": "prefixed"}, "Alter")),
            "literal",
        ),
        ("alice", spec("tls", acl({"type": "topic", "name": "t"}, "Read", type="maybe")), "type"),
        ("alice", spec("tls", acl({"type": "topic", "name": "t"})), "operations"),
    ],
)
def test_bad_specs(name: str, body: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        users.parse_user(name, body)


# ---------------------------------------------------------------------------- ACL diff
def b(name: str, op: AclOperation = READ, perm: PermissionType = ALLOW) -> AclBinding:
    return AclBinding(TOPIC, name, LITERAL, "User:alice", "*", op, perm)


def test_acl_diff_removes_what_is_gone_and_adds_what_is_new() -> None:
    diff = users.acl_diff([b("a"), b("b"), b("c", WRITE)], [b("a"), b("c"), b("d")])
    assert diff.create == [b("b"), b("c", WRITE)]
    assert diff.delete == [b("c"), b("d")]
    assert users.acl_diff([b("a")], [b("a")]).empty
    assert users.acl_diff([], [b("a")]).delete == [b("a")]
    # a permission change is a delete and a create (bindings are compared whole)
    flipped = users.acl_diff([b("a", perm=DENY)], [b("a")])
    assert flipped.create == [b("a", perm=DENY)] and flipped.delete == [b("a")]


def test_exact_filter_matches_one_binding_only() -> None:
    f = users.exact_filter(b("orders"))
    assert f.matches(b("orders"))
    for other in (
        b("orders", WRITE),
        b("orders", perm=DENY),
        b("order"),
        AclBinding(TOPIC, "orders", PREFIXED, "User:alice", "*", READ, ALLOW),
        AclBinding(TOPIC, "orders", LITERAL, "User:bob", "*", READ, ALLOW),
        AclBinding(TOPIC, "orders", LITERAL, "User:alice", "10.0.0.1", READ, ALLOW),
    ):
        assert not f.matches(other), other
    every = users.principal_filter("User:alice")
    assert every.matches(b("x")) and not every.matches(
        AclBinding(GROUP, "g", LITERAL, "User:bob", "*", READ, ALLOW)
    )


# ---------------------------------------------------------------------------- the Secret
def test_scram_secret_contents() -> None:
    data = users.scram_secret_data("alice", "SCRAM-SHA-512", 'pa"ss\\word')
    assert data == {
        "username": "alice",
        "password": 'pa"ss\\word',
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="pa\\"ss\\\\word";',
    }
    body = users.secret_body(
        "alice",
        "ns",
        {"apiVersion": "tidalmq.io/v1alpha1", "kind": "User", "name": "alice", "uid": "u-1"},
        data,
    )
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "User",
            "name": "alice",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert users.decoded(body["data"]) == data


def test_generated_passwords() -> None:
    a, b_ = users.new_password(), users.new_password()
    assert len(a) == users.PASSWORD_LENGTH and a != b_ and a.isalnum()


def test_client_certificate() -> None:
    ca = users.new_clients_ca()
    pair = users.issue_client_cert(ca, "alice")
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    assert cert.subject.rfc4514_string() == "CN=alice"
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    assert users.cert_still_good(pair.cert_pem.decode(), ca.cert_pem, "alice")
    assert not users.cert_still_good(pair.cert_pem.decode(), ca.cert_pem, "bob")
    assert not users.cert_still_good(
        pair.cert_pem.decode(), users.new_clients_ca().cert_pem, "alice"
    )
    assert not users.cert_still_good("", ca.cert_pem, "alice")
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=users.CERT_DAYS - 10)
    assert not users.cert_still_good(pair.cert_pem.decode(), ca.cert_pem, "alice", now=later)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"


# ---------------------------------------------------------------------------- the handlers
class FakeKube:
    """Secrets, status patches and Events in memory (the calls user_handlers makes). Like the
    API server, each write gives the Secret a new resourceVersion, and a patch naming another
    than the current one is refused with Conflict; `before_write(name)`, when set, runs at the
    start of each write (another writer coming first)."""

    def __init__(self) -> None:
        self.namespace = "ns"
        self.secrets: dict[str, dict[str, Any]] = {}
        self.status: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, bool]] = []
        self.writes = 0
        self.status_patches = 0
        self.versions = 0
        self.before_write: Callable[[str], Awaitable[None]] | None = None

    def _stored(self, name: str, body: dict[str, Any]) -> None:
        self.versions += 1
        body["metadata"]["resourceVersion"] = str(self.versions)
        self.secrets[name] = body
        self.writes += 1

    async def _writing(self, name: str) -> None:
        if self.before_write is not None:
            await self.before_write(name)

    async def get_secret(self, name: str) -> dict[str, Any]:
        if name not in self.secrets:
            raise NotFound(name)
        return copy.deepcopy(self.secrets[name])

    async def create_secret(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        await self._writing(name)
        if name in self.secrets:
            raise Conflict(name)
        self._stored(name, copy.deepcopy(body))

    def _current(self, name: str, version: str | None) -> dict[str, Any]:
        """The Secret to write over, if it is at `version` (None: any)."""
        if name not in self.secrets:
            raise NotFound(name)
        secret = copy.deepcopy(self.secrets[name])
        if version is not None and version != secret["metadata"].get("resourceVersion"):
            raise Conflict(name)
        return secret

    async def patch_secret(self, name: str, body: dict[str, Any]) -> None:
        await self._writing(name)
        secret = self._current(name, body.get("metadata", {}).get("resourceVersion"))
        data = secret.setdefault("data", {})
        for k, v in body.get("data", {}).items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v
        self._stored(name, secret)

    async def delete_secret(self, name: str) -> None:
        self.secrets.pop(name)

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.status[name] = status
        self.status_patches += 1

    async def event(
        self,
        involved: dict[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        **_: Any,
    ) -> None:
        self.events.append((reason, message, warning))


class FakeRuntime:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.kube = FakeKube()
        self.settings = OperatorSettings(clients_ca_secret="clients-ca")
        self._locks: dict[str, asyncio.Lock] = {}

    def require_controller(self) -> Controller:
        return self.controller

    def resource_lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    settings = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)
    async with running_controller(tmp_path, settings) as c:
        yield FakeRuntime(c)


META = {"generation": 1, "uid": "uid-alice"}


async def reconcile(rt: FakeRuntime, body: dict[str, Any], name: str = "alice") -> None:
    await user_handlers.reconcile_user(spec=body, name=name, meta=META, memo={"runtime": rt})


def secret_of(rt: FakeRuntime, name: str = "alice") -> dict[str, str]:
    return users.decoded(rt.kube.secrets[name]["data"])


def ready(rt: FakeRuntime, name: str = "alice") -> dict[str, Any]:
    (c,) = rt.kube.status[name]["conditions"]
    assert c["type"] == "Ready"
    return c


def acls_of(rt: FakeRuntime, principal: str = "User:alice") -> set[AclBinding]:
    return set(users.bindings_of_principal(rt.controller.metadata.acls, principal))


async def test_scram_user_lifecycle(rt: FakeRuntime) -> None:
    topic = acl({"type": "topic", "name": "orders"}, "Read", "Describe")
    await reconcile(rt, spec("scram-sha-512", topic))
    data = secret_of(rt)
    password = data["password"]
    assert (
        data["sasl.mechanism"] == "SCRAM-SHA-512"
        and f'password="{password}"' in data["sasl.jaas.config"]
    )
    cred = rt.controller.metadata.scram_credentials["alice"]["SCRAM-SHA-512"]
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, password)
    assert acls_of(rt) == {b("orders"), b("orders", DESCRIBE)}
    assert ready(rt)["status"] == "True" and rt.kube.status["alice"]["secret"] == "alice"
    assert [e[0] for e in rt.kube.events] == ["CredentialsWritten", "AclsUpdated"]

    # a resume: nothing is written again (same password, same credential, same ACLs)
    version = rt.controller.journal.committed_version
    writes, events = rt.kube.writes, len(rt.kube.events)
    await reconcile(rt, spec("scram-sha-512", topic))
    assert rt.controller.journal.committed_version == version
    assert rt.kube.writes == writes and len(rt.kube.events) == events
    assert secret_of(rt)["password"] == password

    # ACLs: a diff; the same password; SCRAM-SHA-256 replaces SCRAM-SHA-512
    group = acl({"type": "group", "name": "app"}, "Read")
    await reconcile(
        rt, spec("scram-sha-256", acl({"type": "topic", "name": "orders"}, "Read"), group)
    )
    assert acls_of(rt) == {
        b("orders"),
        AclBinding(GROUP, "app", LITERAL, "User:alice", "*", READ, ALLOW),
    }
    assert set(rt.controller.metadata.scram_credentials["alice"]) == {"SCRAM-SHA-256"}
    assert (
        secret_of(rt)["password"] == password and secret_of(rt)["sasl.mechanism"] == "SCRAM-SHA-256"
    )

    # delete: the credential, the ACLs and the Secret go; another user's ACLs stay
    other = AclBinding(TOPIC, "orders", LITERAL, "User:bob", "*", READ, ALLOW)
    await rt.controller.create_acls([other])
    await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    assert "alice" not in rt.controller.metadata.scram_credentials
    assert acls_of(rt) == set() and acls_of(rt, "User:bob") == {other}
    assert "alice" not in rt.kube.secrets


async def test_password_from_a_secret(rt: FakeRuntime) -> None:
    ref = {"valueFrom": {"secretKeyRef": {"name": "alice-pw", "key": "pw"}}}
    with pytest.raises(kopf.TemporaryError, match="PasswordSecretMissing"):
        await reconcile(rt, spec("scram-sha-512", password=ref))
    assert ready(rt)["reason"] == "PasswordSecretMissing" and ready(rt)["status"] == "False"
    assert rt.kube.events[-1][2] is True  # a Warning
    assert "alice" not in rt.controller.metadata.scram_credentials
    rt.kube.secrets["alice-pw"] = {"data": {"pw": base64.b64encode(b"chosen-secret").decode()}}
    await reconcile(rt, spec("scram-sha-512", password=ref))
    assert secret_of(rt)["password"] == "chosen-secret"
    cred = rt.controller.metadata.scram_credentials["alice"]["SCRAM-SHA-512"]
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, "chosen-secret")
    # the source changes: the credential follows
    rt.kube.secrets["alice-pw"]["data"]["pw"] = base64.b64encode(b"rotated").decode()
    await reconcile(rt, spec("scram-sha-512", password=ref))
    cred = rt.controller.metadata.scram_credentials["alice"]["SCRAM-SHA-512"]
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, "rotated")
    assert secret_of(rt)["password"] == "rotated"


async def test_tls_user(rt: FakeRuntime) -> None:
    await reconcile(rt, spec("scram-sha-512"))
    await reconcile(rt, spec("tls", acl({"type": "topic", "name": "orders"}, "Read")))
    data = secret_of(rt)
    assert set(data) == {"username", "user.key", "user.crt", "ca.crt", "security.protocol"}
    ca = users.decoded(rt.kube.secrets["clients-ca"]["data"])  # generated, since there was none
    assert data["ca.crt"] == ca["tls.crt"]
    cert = x509.load_pem_x509_certificate(data["user.crt"].encode())
    assert cert.subject.rfc4514_string() == "CN=alice"
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca["tls.crt"].encode()))
    assert "alice" not in rt.controller.metadata.scram_credentials  # SCRAM went with the switch
    assert acls_of(rt) == {b("orders")}
    # again: the same certificate is kept
    await reconcile(rt, spec("tls", acl({"type": "topic", "name": "orders"}, "Read")))
    assert secret_of(rt)["user.crt"] == data["user.crt"]


async def test_invalid_spec_and_foreign_secret(rt: FakeRuntime) -> None:
    with pytest.raises(kopf.PermanentError):
        await reconcile(rt, spec("tls", acl({"type": "group", "name": "g"}, "Write")))
    assert ready(rt)["reason"] == "InvalidSpec"
    rt.kube.secrets["bob"] = {"metadata": {"name": "bob"}, "data": {}}
    with pytest.raises(kopf.TemporaryError, match="SecretExists"):
        await reconcile(rt, spec("scram-sha-512"), name="bob")
    assert "bob" not in rt.controller.metadata.scram_credentials  # nothing written for bob
    assert rt.kube.secrets["bob"]["data"] == {}


async def test_resync_repairs_drift_and_writes_nothing_when_there_is_none(rt: FakeRuntime) -> None:
    body = spec("scram-sha-512", acl({"type": "topic", "name": "orders"}, "Read"))
    await reconcile(rt, body)
    password = secret_of(rt)["password"]
    current = copy.deepcopy(rt.kube.status["alice"])
    version = rt.controller.journal.committed_version
    patches, writes = rt.kube.status_patches, rt.kube.writes

    async def resync() -> None:
        await user_handlers.resync_user(
            spec=body, name="alice", meta=META, memo={"runtime": rt}, status=rt.kube.status["alice"]
        )

    await resync()  # nothing drifted: no commit, no Secret write, no status patch
    assert rt.controller.journal.committed_version == version
    assert (rt.kube.status_patches, rt.kube.writes) == (patches, writes)
    assert rt.kube.status["alice"] == current

    # drift: a binding added with kafka-acls, the granted one removed, the Secret deleted
    await rt.controller.create_acls([b("payroll")])
    await rt.controller.delete_acls([users.exact_filter(b("orders"))])
    del rt.kube.secrets["alice"]
    await resync()
    assert acls_of(rt) == {b("orders")}
    assert secret_of(rt)["password"] != password  # a new one: the old was only in the Secret
    cred = rt.controller.metadata.scram_credentials["alice"]["SCRAM-SHA-512"]
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, secret_of(rt)["password"])
    # Ready stayed True: its lastTransitionTime did not move
    (before,) = current["conditions"]
    (after,) = rt.kube.status["alice"]["conditions"]
    assert after["lastTransitionTime"] == before["lastTransitionTime"]

    # an invalid spec is the handlers' business: the timer leaves it
    bad = spec("tls", acl({"type": "group", "name": "g"}, "Write"))
    await user_handlers.resync_user(spec=bad, name="alice", meta=META, memo={"runtime": rt})
    assert ready(rt)["status"] == "True"


# ---------------------------------------------------------------------------- the clients CRL
def crl_state(rt: FakeRuntime) -> tuple[clients_crl.CrlState, set[int]]:
    """The CRL Secret's bookkeeping and the serials its signed CRL lists."""
    data = users.decoded(rt.kube.secrets["clients-crl"]["data"])
    ca = users.decoded(rt.kube.secrets["clients-ca"]["data"])["tls.crt"].encode()
    signed = clients_crl.crl_serials(data["crl.pem"].encode(), ca)
    assert signed is not None, "the CRL is signed by the clients CA"
    return clients_crl.loads(data["revoked.json"], ca), signed[1]


def serial_of(rt: FakeRuntime, name: str = "alice") -> int:
    return x509.load_pem_x509_certificate(secret_of(rt, name)["user.crt"].encode()).serial_number


class Stopper:
    """Kopf's daemon flag: stopped after the first wait."""

    def __init__(self) -> None:
        self.waits = 0

    def __bool__(self) -> bool:
        return self.waits > 0

    async def wait(self, delay: float) -> None:  # Kopf's parameter is positional
        self.waits += 1


async def test_the_clients_crl_lists_deleted_and_replaced_certificates(rt: FakeRuntime) -> None:
    rt.settings = OperatorSettings(clients_ca_secret="clients-ca", clients_crl_secret="clients-crl")
    # at start: an empty CRL (and the clients CA it is of)
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    state, listed = crl_state(rt)
    assert listed == set() and state.issued == {} and state.number == 1
    writes = rt.kube.writes
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    assert rt.kube.writes == writes  # not due: not signed again

    await reconcile(rt, spec("tls"))
    first = serial_of(rt)
    state, listed = crl_state(rt)
    assert state.issued["alice"].serial == first and listed == set()
    # the Secret lost: a new certificate, the lost one revoked at once
    del rt.kube.secrets["alice"]
    await reconcile(rt, spec("tls"))
    second = serial_of(rt)
    state, listed = crl_state(rt)
    assert second != first and listed == {first} and state.issued["alice"].serial == second

    # a routine renewal: the old one listed after the grace only
    ca = users.decoded(rt.kube.secrets["clients-ca"]["data"])
    ca_pair = users.KeyPair(ca["tls.key"].encode(), ca["tls.crt"].encode())
    due = users.issue_client_cert(ca_pair, "alice", days=20)
    rt.kube.secrets["alice"]["data"]["user.crt"] = base64.b64encode(due.cert_pem).decode()
    rt.kube.secrets["alice"]["data"]["user.key"] = base64.b64encode(due.key_pem).decode()
    await reconcile(rt, spec("tls"))
    due_serial = x509.load_pem_x509_certificate(due.cert_pem).serial_number
    state, listed = crl_state(rt)
    # the recorded `second` was not in the Secret any more: revoked at once; `due` with a grace
    assert listed == {first, second}
    assert state.revoked[due_serial].revoked_at > datetime.datetime.now(datetime.UTC)

    # deletion: the current certificate listed before the finalizer returns
    third = serial_of(rt)
    await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    state, listed = crl_state(rt)
    assert third in listed and "alice" not in state.issued

    # a tls User made SCRAM: its certificate would still be User:bob, so it is revoked
    await reconcile(rt, spec("tls"), name="bob")
    bob = serial_of(rt, "bob")
    await reconcile(rt, spec("scram-sha-512"), name="bob")
    state, listed = crl_state(rt)
    assert bob in listed and "bob" not in state.issued
    # the same with its Secret gone meanwhile: the certificate recorded as issued is revoked
    await reconcile(rt, spec("tls"), name="carol")
    carol = serial_of(rt, "carol")
    del rt.kube.secrets["carol"]
    await reconcile(rt, spec("scram-sha-512"), name="carol")
    assert carol in crl_state(rt)[1]


def replica_of(rt: FakeRuntime) -> FakeRuntime:
    """A second operator replica (during a rollout, or a peering handover): the same API
    server and cluster, its own process, so none of the first one's locks."""
    other = FakeRuntime(rt.controller)
    other.kube = rt.kube
    other.settings = rt.settings
    return other


def first_write_of_crl(rt: FakeRuntime, writer: Callable[[], Awaitable[None]]) -> list[int]:
    """Have `writer` (the other replica) write the CRL Secret once, just before this replica's
    next write of it, after this replica read it; the list counts the times that happened."""
    ran: list[int] = []

    async def before_write(name: str) -> None:
        if name == "clients-crl" and not ran:
            ran.append(1)
            await writer()

    rt.kube.before_write = before_write
    return ran


async def test_concurrent_crl_writers_lose_no_revocation(rt: FakeRuntime) -> None:
    """Two writers of the CRL Secret, each between the other's read and write: a User deleted
    on one replica while another deletes another User, or signs the CRL again. Each write is a
    compare-and-swap, so the second writer reads again and both revocations stay; a blind
    overwrite would un-revoke the first one's certificate."""
    rt.settings = OperatorSettings(clients_ca_secret="clients-ca", clients_crl_secret="clients-crl")
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    for name in ("alice", "bob", "carol"):
        await reconcile(rt, spec("tls"), name=name)
    alice, bob, carol = (serial_of(rt, n) for n in ("alice", "bob", "carol"))
    other = replica_of(rt)

    # alice deleted here; bob deleted on the other replica between our read and our write
    ran = first_write_of_crl(
        rt,
        lambda: user_handlers.delete_user(
            name="bob", meta={"uid": "uid-bob"}, memo={"runtime": other}
        ),
    )
    await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    assert ran == [1]
    state, listed = crl_state(rt)
    assert {alice, bob} <= listed and {alice, bob} <= set(state.revoked)
    assert set(state.issued) == {"carol"}

    # the daemon here signs the CRL again (due: the one in the Secret is unreadable) while
    # carol is deleted on the other replica: the daemon's write must not drop carol's entry
    rt.kube.secrets["clients-crl"]["data"]["crl.pem"] = ""
    number = state.number
    ran = first_write_of_crl(
        rt,
        lambda: user_handlers.delete_user(
            name="carol", meta={"uid": "uid-carol"}, memo={"runtime": other}
        ),
    )
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    assert ran == [1]
    state, listed = crl_state(rt)
    assert {alice, bob, carol} <= listed and state.issued == {}
    # carol's deletion signed a fresh CRL; the daemon, reading again, found nothing left to do
    assert state.number == number + 1


async def test_a_certificate_another_replica_revoked_is_not_kept(rt: FakeRuntime) -> None:
    """Two replicas issue alice a certificate at once: ours is recorded, the other's is
    recorded after it (revoking ours as never delivered), then our Secret write lands first
    (the other's will conflict). The next reconcile must not keep the certificate the CRL
    lists: it issues another, which nothing lists."""
    rt.settings = OperatorSettings(clients_ca_secret="clients-ca", clients_crl_secret="clients-crl")
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    other = replica_of(rt)
    ca = users.decoded(rt.kube.secrets["clients-ca"]["data"])
    ca_pair = users.KeyPair(ca["tls.key"].encode(), ca["tls.crt"].encode())
    theirs: list[int] = []

    async def other_issues(name: str) -> None:
        if name != "alice" or theirs:
            return
        cert = clients_crl.cert_ref(users.issue_client_cert(ca_pair, "alice").cert_pem.decode())
        assert cert is not None
        theirs.append(cert.serial)
        await user_handlers._update_crl(
            other,
            ca_pair,
            lambda s, now: clients_crl.record_issued(s, "alice", cert, None, False, now),
        )

    rt.kube.before_write = other_issues
    await reconcile(rt, spec("tls"))
    ours = serial_of(rt)
    state, listed = crl_state(rt)
    assert theirs and ours in listed and state.issued["alice"].serial == theirs[0]

    rt.kube.before_write = None
    await reconcile(rt, spec("tls"))
    state, listed = crl_state(rt)
    held = serial_of(rt)
    assert held not in listed and held not in state.revoked and state.issued["alice"].serial == held
    assert {ours, theirs[0]} <= listed


async def test_a_crl_secret_that_keeps_changing_fails_loudly_and_keeps_the_finalizer(
    rt: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer ahead at every attempt: after CRL_WRITE_ATTEMPTS the deletion is retried
    (kopf.TemporaryError, the finalizer stays) and the daemon says so in a Warning Event; the
    other writer's revocations are all there, and ours is written once the contention ends."""
    monkeypatch.setattr(user_handlers.random, "uniform", lambda a, b: 0.0)  # no backoff here
    rt.settings = OperatorSettings(clients_ca_secret="clients-ca", clients_crl_secret="clients-crl")
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    await reconcile(rt, spec("tls"))
    alice = serial_of(rt)
    other = replica_of(rt)
    ca = users.decoded(rt.kube.secrets["clients-ca"]["data"])
    ca_pair = users.KeyPair(ca["tls.key"].encode(), ca["tls.crt"].encode())
    theirs: list[int] = []

    async def another_revocation(name: str) -> None:
        if name != "clients-crl":
            return
        rt.kube.before_write = None  # its own write goes through
        cert = clients_crl.cert_ref(users.issue_client_cert(ca_pair, "eve").cert_pem.decode())
        assert cert is not None
        theirs.append(cert.serial)
        await user_handlers._update_crl(
            other, ca_pair, lambda s, now: clients_crl.revoke(s, cert, "eve", now, now)
        )
        rt.kube.before_write = another_revocation

    rt.kube.before_write = another_revocation
    with pytest.raises(kopf.TemporaryError, match="changed under each of"):
        await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    assert len(theirs) == user_handlers.CRL_WRITE_ATTEMPTS
    state, listed = crl_state(rt)
    assert set(theirs) <= listed  # every one of the other writer's revocations kept
    assert alice not in listed and state.issued["alice"].serial == alice  # not yet: retried

    # the daemon has a CRL to sign, and the Secret changes under each of its writes (a writer
    # that leaves the CRL stale: kubectl annotate, say): a Warning Event on the ClusterState
    rt.kube.secrets["clients-crl"]["data"]["crl.pem"] = ""

    async def touched(name: str) -> None:
        rt.kube._stored(name, copy.deepcopy(rt.kube.secrets[name]))

    rt.kube.before_write = touched
    await user_handlers.clients_crl_daemon(stopped=Stopper(), memo={"runtime": rt})
    assert ("ClientsCrlConflict", True) in {(r, w) for r, _, w in rt.kube.events}

    rt.kube.before_write = None
    await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    assert set(theirs) | {alice} <= crl_state(rt)[1]


async def test_no_crl_is_kept_without_its_secret_setting(rt: FakeRuntime) -> None:
    await reconcile(rt, spec("tls"))
    await user_handlers.delete_user(name="alice", meta=META, memo={"runtime": rt})
    assert set(rt.kube.secrets) == {"clients-ca"}
