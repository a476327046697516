"""The authorizer decides as Kafka's StandardAuthorizer: the cases below are those of Kafka's
StandardAuthorizerTest (implication, principals, DENY over ALLOW, ALL, hosts, prefixes, the
wildcard resource, super users, allow.everyone.if.no.acl.found) and BaseAuthorizerTest
(authorizeByResourceType), written as tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from tidalmq_broker.security import SecurityConfigError
from tidalmq_broker.security.authorizer import Authorizer, canonical_host, parse_super_users
from tidalmq_broker.security.endpoints import (
    build_authorizer,
    describe_authorization,
    listeners_of,
)
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.acls import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TXN = ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
Op = AclOperation


@dataclass
class Client:
    principal: str
    host: str = "127.0.0.1"


def acl(
    rt: ResourceType,
    name: str,
    pt: PatternType,
    principal: str,
    op: AclOperation,
    perm: PermissionType,
    host: str = "*",
) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


def authorizer(*bindings: AclBinding, **kwargs: object) -> Authorizer:
    a = Authorizer(enabled=True, super_users={"User:superman"}, **kwargs)  # type: ignore[arg-type]
    a.load(list(bindings))
    return a


def foo(op: AclOperation, perm: PermissionType) -> AclBinding:
    """Kafka's newFooAcl: a PREFIXED topic binding foo_ for User:bob from any host."""
    return acl(TOPIC, "foo_", PREFIXED, "User:bob", op, perm)


BOB = Client("User:bob")

# StandardAuthorizerTest.testFindResultImplication: (binding, requested operation, allowed)
IMPLICATION = [
    *[
        (foo(op, ALLOW), Op.DESCRIBE, True)
        for op in (Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)
    ],
    (foo(Op.CREATE, ALLOW), Op.DESCRIBE, False),  # CREATE does not imply DESCRIBE
    *[(foo(op, DENY), Op.DESCRIBE, False) for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)],
    (foo(Op.DESCRIBE, DENY), Op.DESCRIBE, False),
    *[
        (foo(op, ALLOW), Op.DESCRIBE_CONFIGS, True)
        for op in (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
    ],
    (foo(Op.ALTER_CONFIGS, DENY), Op.DESCRIBE_CONFIGS, False),
    (foo(Op.ALTER_CONFIGS, DENY), Op.ALTER_CONFIGS, False),
    (foo(Op.ALL, ALLOW), Op.IDEMPOTENT_WRITE, True),  # ALL is every operation
    (foo(Op.READ, ALLOW), Op.WRITE, False),  # nothing else is implied
    (foo(Op.ALTER_CONFIGS, ALLOW), Op.ALTER, False),
]


@pytest.mark.parametrize(("binding", "op", "allowed"), IMPLICATION)
def test_implication(binding: AclBinding, op: AclOperation, allowed: bool) -> None:
    a = authorizer(binding)
    assert a.allows(BOB, op, TOPIC, "foo_bar") is allowed


def test_deny_implies_nothing_but_still_denies_its_own_operation() -> None:
    # a DENY READ does not deny DESCRIBE, and an ALLOW READ grants it: allowed
    a = authorizer(foo(Op.READ, DENY), foo(Op.READ, ALLOW))
    assert a.allows(BOB, Op.DESCRIBE, TOPIC, "foo_bar")
    assert not a.allows(BOB, Op.READ, TOPIC, "foo_bar")  # DENY wins over ALLOW


def test_principal_matching() -> None:
    a = authorizer(foo(Op.READ, ALLOW), acl(GROUP, "bar", LITERAL, "User:*", Op.READ, DENY))
    assert a.allows(BOB, Op.READ, TOPIC, "foo_bar")
    assert not a.allows(Client("User:alice"), Op.READ, TOPIC, "foo_bar")
    assert not a.allows(Client("User:alice"), Op.READ, GROUP, "bar")  # User:* matches alice
    assert not a.allows(Client("Group:bob"), Op.READ, TOPIC, "foo_bar")  # type and name
    assert not a.allows(Client("User:Bob"), Op.READ, TOPIC, "foo_bar")  # case-sensitive


# (bindings, [(principal, op, rt, name, allowed), ...]): testDenyPrecedenceWithOperationAll,
# testTopicAclWithOperationAll, testAuthorizationWithManyAcls, testSimpleAuthorizations
SCENARIOS = [
    (
        [
            acl(TOPIC, "foo", LITERAL, "User:alice", Op.ALL, DENY),
            acl(TOPIC, "foo", PREFIXED, "User:alice", Op.READ, ALLOW),
            acl(TOPIC, "foo", LITERAL, "User:*", Op.ALL, DENY),
            acl(TOPIC, "foo", PREFIXED, "User:*", Op.DESCRIBE, ALLOW),
        ],
        [
            ("alice", Op.WRITE, TOPIC, "foo", False),
            ("alice", Op.READ, TOPIC, "foo", False),
            ("alice", Op.DESCRIBE, TOPIC, "foo", False),
            ("alice", Op.READ, TOPIC, "foobar", True),
            ("bob", Op.DESCRIBE, TOPIC, "foo", False),
            ("bob", Op.READ, TOPIC, "foo", False),
            ("bob", Op.WRITE, TOPIC, "foo", False),
            ("bob", Op.DESCRIBE, TOPIC, "foobaz", True),
            ("bob", Op.READ, TOPIC, "foobaz", False),
        ],
    ),
    (
        [
            acl(TOPIC, "foo", LITERAL, "User:*", Op.ALL, ALLOW),
            acl(TOPIC, "bar", PREFIXED, "User:alice", Op.ALL, ALLOW),
            acl(TOPIC, "baz", LITERAL, "User:bob", Op.ALL, ALLOW),
        ],
        [
            ("alice", Op.WRITE, TOPIC, "foo", True),
            ("alice", Op.DESCRIBE_CONFIGS, TOPIC, "bar", True),
            ("alice", Op.DESCRIBE, TOPIC, "baz", False),
            ("bob", Op.WRITE, TOPIC, "foo", True),
            ("bob", Op.READ, TOPIC, "bar", False),
            ("bob", Op.DESCRIBE, TOPIC, "baz", True),
            ("malory", Op.DESCRIBE, TOPIC, "foo", True),
            ("malory", Op.WRITE, TOPIC, "bar", False),
            ("malory", Op.READ, TOPIC, "baz", False),
        ],
    ),
    (
        [
            acl(TOPIC, "green2", LITERAL, "User:*", Op.READ, ALLOW),
            acl(TOPIC, "green", PREFIXED, "User:bob", Op.READ, ALLOW),
            acl(TOPIC, "betamax4", LITERAL, "User:bob", Op.READ, ALLOW),
            acl(TOPIC, "betamax", LITERAL, "User:bob", Op.READ, ALLOW),
            acl(TOPIC, "beta", PREFIXED, "User:*", Op.READ, ALLOW),
            acl(TOPIC, "alpha", PREFIXED, "User:*", Op.READ, ALLOW),
            acl(TOPIC, "alp", PREFIXED, "User:bob", Op.READ, DENY),
            acl(GROUP, "*", LITERAL, "User:bob", Op.WRITE, ALLOW),
            acl(GROUP, "wheel", LITERAL, "User:*", Op.WRITE, DENY),
        ],
        [
            ("bob", Op.READ, TOPIC, "green1", True),
            ("bob", Op.WRITE, GROUP, "wheel", False),
            ("bob", Op.READ, TOPIC, "alpha", False),
            ("bob", Op.WRITE, GROUP, "arbitrary", True),
            ("bob", Op.READ, TOPIC, "ala", False),
            ("alice", Op.READ, TOPIC, "alpha1", True),
            ("alice", Op.READ, TOPIC, "betamax", True),  # beta is a prefix of it
            ("alice", Op.READ, TOPIC, "green1", False),
            ("alice", Op.READ, TOPIC, "green2", True),
            ("alice", Op.WRITE, GROUP, "arbitrary", False),
        ],
    ),
    (
        [
            foo(Op.READ, ALLOW),
            foo(Op.WRITE, ALLOW),
            acl(GROUP, "bar", LITERAL, "User:*", Op.DESCRIBE_CONFIGS, ALLOW),
            acl(GROUP, "bar", LITERAL, "User:*", Op.ALTER_CONFIGS, ALLOW),
        ],
        [
            ("bob", Op.READ, TOPIC, "foo_", True),
            ("fred", Op.ALTER_CONFIGS, GROUP, "bar", True),
            ("fred", Op.READ, GROUP, "bar", False),
            ("bob", Op.READ, TOPIC, "foo", False),
        ],
    ),
]


@pytest.mark.parametrize(("bindings", "checks"), SCENARIOS)
def test_scenarios(
    bindings: list[AclBinding], checks: list[tuple[str, AclOperation, ResourceType, str, bool]]
) -> None:
    a = authorizer(*bindings)
    got = [a.allows(Client(f"User:{p}"), op, rt, name) for p, op, rt, name, _ in checks]
    assert got == [c[4] for c in checks]


def test_hosts() -> None:
    """testHostAddressAclValidation, with 127.0.0.1 as the local host."""
    a = authorizer(
        acl(TOPIC, "foo", LITERAL, "User:alice", Op.READ, DENY, host="192.168.1.1"),
        acl(TOPIC, "foo", LITERAL, "User:alice", Op.READ, ALLOW),
        acl(TOPIC, "bar", LITERAL, "User:bob", Op.READ, ALLOW, host="192.168.1.2"),
        acl(TOPIC, "bar", LITERAL, "User:*", Op.DESCRIBE, ALLOW, host="127.0.0.1"),
    )
    actions = [(Op.READ, "foo"), (Op.READ, "bar"), (Op.DESCRIBE, "bar")]
    expected = {
        ("alice", "127.0.0.1"): [True, False, True],
        ("alice", "192.168.1.1"): [False, False, False],
        ("alice", "192.168.1.2"): [True, False, False],
        ("bob", "127.0.0.1"): [False, False, True],
        ("bob", "192.168.1.1"): [False, False, False],
        ("bob", "192.168.1.2"): [False, True, True],
    }
    for (user, host), wanted in expected.items():
        client = Client(f"User:{user}", host)
        assert [a.allows(client, op, TOPIC, name) for op, name in actions] == wanted, (user, host)
    # IPv6 as Java writes it in a binding, the client's as Python reads it off the socket
    v6 = authorizer(acl(TOPIC, "t", LITERAL, "User:a", Op.READ, ALLOW, host="0:0:0:0:0:0:0:1"))
    assert v6.allows(Client("User:a", canonical_host("::1")), Op.READ, TOPIC, "t")
    assert canonical_host("::ffff:10.1.2.3") == "10.1.2.3"  # IPv4 on a dual-stack socket
    assert canonical_host("not-an-ip") == "not-an-ip"


def test_super_users_and_allow_everyone_if_no_acl_found() -> None:
    deny_all = acl(TOPIC, "*", LITERAL, "User:*", Op.ALL, DENY)
    a = authorizer(deny_all)
    assert a.allows(Client("User:superman"), Op.WRITE, TOPIC, "t")  # whatever the ACLs
    assert not a.allows(Client("User:bob"), Op.WRITE, TOPIC, "t")
    only_alice = acl(TOPIC, "topic1", LITERAL, "User:Alice", Op.READ, ALLOW)
    closed = authorizer(only_alice)
    assert not closed.allows(Client("User:Bob"), Op.READ, TOPIC, "topic1")
    assert not closed.allows(Client("User:Bob"), Op.READ, TOPIC, "topic2")  # deny by default
    assert not closed.allows(Client("User:Bob"), Op.READ, GROUP, "g")
    open_ = authorizer(only_alice, allow_everyone_if_no_acl_found=True)
    assert not open_.allows(Client("User:Bob"), Op.READ, TOPIC, "topic1")  # it has ACLs
    assert open_.allows(Client("User:Bob"), Op.READ, TOPIC, "topic2")  # no ACL at all
    assert open_.allows(Client("User:Bob"), Op.READ, GROUP, "g")
    # any ACL of the resource counts, even one for somebody else
    assert not authorizer(
        acl(TOPIC, "t", PREFIXED, "User:x", Op.READ, ALLOW), allow_everyone_if_no_acl_found=True
    ).allows(Client("User:Bob"), Op.WRITE, TOPIC, "t1")


def test_super_users_setting() -> None:
    assert parse_super_users("") == frozenset() == parse_super_users(" ")
    assert parse_super_users(";  User:bob  ;  User:alice ") == {"User:bob", "User:alice"}
    with pytest.raises(ValueError, match="bob"):
        parse_super_users("bob;User:alice")


def test_off_allows_everything_and_reports_every_operation() -> None:
    a = Authorizer(enabled=False)
    a.load([acl(TOPIC, "*", LITERAL, "User:*", Op.ALL, DENY)])
    assert a.allows(BOB, Op.WRITE, TOPIC, "t")
    assert a.allows_by_resource_type(BOB, Op.WRITE, TOPIC)
    assert a.authorized_operations(BOB, GROUP, "g") == sum(
        1 << op for op in (Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
    )


def test_authorized_operations_bit_field() -> None:
    a = authorizer(
        acl(TOPIC, "t", LITERAL, "User:bob", Op.WRITE, ALLOW),
        acl(TOPIC, "t", LITERAL, "User:bob", Op.ALTER_CONFIGS, ALLOW),
    )
    bits = a.authorized_operations(BOB, TOPIC, "t")
    assert bits == (1 << Op.WRITE) | (1 << Op.DESCRIBE) | (1 << Op.ALTER_CONFIGS) | (
        1 << Op.DESCRIBE_CONFIGS
    )
    assert a.authorized_operations(Client("User:superman"), CLUSTER, "kafka-cluster") == sum(
        1 << op
        for op in (
            Op.CREATE,
            Op.CLUSTER_ACTION,
            Op.DESCRIBE_CONFIGS,
            Op.ALTER_CONFIGS,
            Op.IDEMPOTENT_WRITE,
            Op.ALTER,
            Op.DESCRIBE,
        )
    )


# BaseAuthorizerTest's authorizeByResourceType cases: (bindings, client, op, rt, allowed)
U1H1 = Client("User:user1", "192.168.1.1")
U1H2 = Client("User:user1", "192.168.1.2")
U2H1 = Client("User:user2", "192.168.1.1")


def u1(
    name: str,
    pt: PatternType,
    op: AclOperation,
    perm: PermissionType,
    rt: ResourceType = TOPIC,
    host: str = "192.168.1.1",
    principal: str = "User:user1",
) -> AclBinding:
    return acl(rt, name, pt, principal, op, perm, host=host)


BY_TYPE = [
    ([], U1H1, Op.READ, TOPIC, False),
    ([u1("sb1", LITERAL, Op.READ, ALLOW)], U1H1, Op.READ, TOPIC, True),
    (
        [u1("sb1", LITERAL, Op.READ, ALLOW), u1("sb1", LITERAL, Op.READ, DENY)],
        U1H1,
        Op.READ,
        TOPIC,
        False,
    ),
    # unrelated denials do not dominate an allow
    (
        [
            u1("sb1", LITERAL, Op.READ, DENY),
            u1("sb1", LITERAL, Op.READ, DENY, principal="User:user2"),
            u1("sb1", LITERAL, Op.WRITE, DENY, host="192.168.1.2"),
            u1("sb1", LITERAL, Op.READ, ALLOW, host="192.168.1.2"),
            u1("sb2", LITERAL, Op.READ, DENY, host="192.168.1.2"),
            u1("s", PREFIXED, Op.READ, DENY, GROUP, host="192.168.1.2"),
        ],
        U1H2,
        Op.READ,
        TOPIC,
        True,
    ),
    ([u1("sb1", LITERAL, Op.READ, DENY)], U1H1, Op.READ, GROUP, False),
    # a denied prefix dominates the allowed names it starts
    ([u1("abcde", PREFIXED, Op.READ, ALLOW, GROUP)], U1H1, Op.READ, GROUP, True),
    (
        [u1("abcde", PREFIXED, Op.READ, ALLOW, GROUP), u1("abcd", PREFIXED, Op.READ, DENY, GROUP)],
        U1H1,
        Op.READ,
        GROUP,
        False,
    ),
    (
        [
            u1("abcde", PREFIXED, Op.READ, ALLOW, GROUP),
            u1("abcd", PREFIXED, Op.READ, DENY, GROUP),
            u1("abc", PREFIXED, Op.READ, ALLOW, GROUP),
        ],
        U1H1,
        Op.READ,
        GROUP,
        True,
    ),
    (
        [
            u1("abcde", PREFIXED, Op.READ, ALLOW, GROUP),
            u1("abcd", PREFIXED, Op.READ, DENY, GROUP),
            u1("abc", PREFIXED, Op.READ, ALLOW, GROUP),
            u1("a", PREFIXED, Op.READ, DENY, GROUP),
            u1("ab", PREFIXED, Op.READ, ALLOW, GROUP),
        ],
        U1H1,
        Op.READ,
        GROUP,
        False,
    ),
    # a denial of every resource dominates, before or after an allowance of every resource
    (
        [u1("hello", PREFIXED, Op.WRITE, ALLOW, GROUP), u1("*", LITERAL, Op.WRITE, DENY, GROUP)],
        U1H1,
        Op.WRITE,
        GROUP,
        False,
    ),
    (
        [
            u1("*", LITERAL, Op.WRITE, ALLOW, GROUP),
            u1("*", LITERAL, Op.WRITE, DENY, GROUP),
            u1("aloha", LITERAL, Op.WRITE, ALLOW, GROUP),
        ],
        U1H1,
        Op.WRITE,
        GROUP,
        False,
    ),
    ([u1("*", LITERAL, Op.WRITE, ALLOW, GROUP)], U1H1, Op.WRITE, GROUP, True),
    # ALL
    (
        [u1("sb1", LITERAL, Op.WRITE, DENY), u1("sb1", LITERAL, Op.ALL, ALLOW)],
        U1H1,
        Op.READ,
        TOPIC,
        True,
    ),
    (
        [
            u1("sb1", LITERAL, Op.WRITE, DENY),
            u1("sb1", LITERAL, Op.ALL, ALLOW),
            u1("sb1", LITERAL, Op.ALL, DENY),
        ],
        U1H1,
        Op.READ,
        TOPIC,
        False,
    ),
    # hosts and principals
    (
        [u1("sb1", LITERAL, Op.READ, ALLOW), u1("sb1", LITERAL, Op.READ, DENY, host="*")],
        U1H1,
        Op.READ,
        TOPIC,
        False,
    ),
    (
        [
            u1("sb1", LITERAL, Op.READ, ALLOW),
            u1("sb1", LITERAL, Op.READ, DENY, host="*"),
            u1("sb2", LITERAL, Op.READ, ALLOW, host="*"),
        ],
        U1H2,
        Op.READ,
        TOPIC,
        True,
    ),
    (
        [
            u1("sb1", LITERAL, Op.READ, ALLOW),
            u1("sb1", LITERAL, Op.READ, DENY, principal="User:*"),
            u1("sb2", LITERAL, Op.READ, ALLOW, principal="User:*"),
        ],
        U2H1,
        Op.READ,
        TOPIC,
        True,
    ),
    (
        [
            u1("sb2", LITERAL, Op.READ, ALLOW, principal="User:*"),
            u1("sb2", LITERAL, Op.READ, DENY, principal="User:*"),
        ],
        U2H1,
        Op.READ,
        TOPIC,
        False,
    ),
    # a super user, whatever the ACLs
    (
        [acl(rt, "*", LITERAL, "User:*", Op.ALL, DENY) for rt in (TOPIC, CLUSTER, GROUP, TXN)],
        Client("User:superman", "192.0.4.4"),
        Op.READ,
        TXN,
        True,
    ),
]


@pytest.mark.parametrize(("bindings", "client", "op", "rt", "allowed"), BY_TYPE)
def test_authorize_by_resource_type(
    bindings: list[AclBinding], client: Client, op: AclOperation, rt: ResourceType, allowed: bool
) -> None:
    assert authorizer(*bindings).allows_by_resource_type(client, op, rt) is allowed


def test_decisions_are_cached_until_the_bindings_change() -> None:
    a = authorizer(acl(TOPIC, "t", LITERAL, "User:bob", Op.WRITE, ALLOW), cache_entries=3)
    assert a.allows(BOB, Op.WRITE, TOPIC, "t")
    assert a._cache  # the decision is kept...
    a.load([acl(TOPIC, "t", LITERAL, "User:bob", Op.WRITE, DENY)])
    assert not a.allows(BOB, Op.WRITE, TOPIC, "t")  # ...and dropped when the bindings change
    for i in range(10):  # bounded: a full cache starts again
        a.allows(BOB, Op.READ, TOPIC, f"t{i}")
        assert len(a._cache) <= 3


@pytest.mark.parametrize(
    ("listeners", "mode", "enabled"),
    [
        ("", "auto", False),  # the one PLAINTEXT listener: off, as every existing setup
        ("PLAINTEXT://127.0.0.1:9092", "auto", False),
        ("PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093", "auto", True),
        ("SSL://127.0.0.1:9094", "auto", True),
        ("SASL_PLAINTEXT://127.0.0.1:9095", "AUTO", True),
        ("", "acl", True),
        ("SASL_SSL://127.0.0.1:9093", "none", False),
    ],
)
def test_when_authorization_is_on(listeners: str, mode: str, enabled: bool) -> None:
    s = BrokerSettings(listeners=listeners, authorizer=mode, super_users="User:ops")
    a = build_authorizer(s, listeners_of(s), ["admin"])
    assert a.enabled is enabled
    assert a.super_users == {"User:ops", "User:admin"}  # the SCRAM bootstrap users are added
    line = describe_authorization(s, a)
    assert ("authorization on" in line) if enabled else ("authorization OFF" in line)


def test_bad_authorization_settings_stop_the_broker() -> None:
    for s, message in [
        (BrokerSettings(authorizer="kafka.security.authorizer.AclAuthorizer"), "authorizer:"),
        (BrokerSettings(super_users="admin"), "super.users"),
    ]:
        with pytest.raises(SecurityConfigError, match=message):
            build_authorizer(s, listeners_of(s), [])
