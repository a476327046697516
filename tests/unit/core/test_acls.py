"""ACL bindings in the metadata: Kafka's filter semantics (the cases of Kafka's
ResourcePatternFilterTest and AccessControlEntryFilter), the `acl`/`aclgone` records, snapshots
and documents, and their absence in what was written before ACLs existed."""

from __future__ import annotations

import json

import pytest
from tidalmq_core import snapshots
from tidalmq_core.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
    operation,
    parse_principal,
    pattern_type,
    permission_type,
    resource_type,
)
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import MetadataDelta, acl_record, acl_removed_record, apply_batch

TOPIC, GROUP, ANY_RT = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.ANY
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ANY, MATCH = PatternType.ANY, PatternType.MATCH


def binding(
    rt: ResourceType = TOPIC,
    name: str = "Name",
    pt: PatternType = LITERAL,
    principal: str = "User:alice",
    host: str = "*",
    op: AclOperation = AclOperation.READ,
    perm: PermissionType = PermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


# (filter resource type, name, pattern type) x (binding resource type, name, pattern type):
# Kafka's ResourcePatternFilterTest, case by case
PATTERN_CASES = [
    ((TOPIC, "Name", LITERAL), (GROUP, "Name", LITERAL), False),
    ((TOPIC, "Different", PREFIXED), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "NAME", LITERAL), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "Name", LITERAL), (TOPIC, "Name", PREFIXED), False),
    ((ANY_RT, "Name", PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, ANY), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, MATCH), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, "Name", LITERAL), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name", ANY), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name", MATCH), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name-something", MATCH), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "*", LITERAL), (TOPIC, "*", LITERAL), True),
    ((TOPIC, "Name", LITERAL), (TOPIC, "*", LITERAL), False),
    ((TOPIC, "*", LITERAL), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "Name", ANY), (TOPIC, "*", LITERAL), False),
    ((TOPIC, "Name", MATCH), (TOPIC, "*", LITERAL), True),
    ((TOPIC, "Name", PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, "Name", PREFIXED), (TOPIC, "Name-something", PREFIXED), False),
    ((TOPIC, "Name-something", PREFIXED), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "Name-something", ANY), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "Name-something", MATCH), (TOPIC, "Name", PREFIXED), True),
]


@pytest.mark.parametrize(("pattern", "bound", "expected"), PATTERN_CASES)
def test_resource_pattern_filters_as_kafka(
    pattern: tuple[ResourceType, str | None, PatternType],
    bound: tuple[ResourceType, str, PatternType],
    expected: bool,
) -> None:
    rt, name, pt = pattern
    f = AclBindingFilter(rt, name, pt)
    assert f.matches(binding(*bound)) is expected


def test_entry_filters_as_kafka() -> None:
    b = binding(
        principal="User:alice", host="10.0.0.1", op=AclOperation.WRITE, perm=PermissionType.DENY
    )
    assert AclBindingFilter().matches(b)  # everything ANY / null: matches all
    assert AclBindingFilter(principal="User:alice", host="10.0.0.1").matches(b)
    assert not AclBindingFilter(principal="User:bob").matches(b)
    assert not AclBindingFilter(principal="User:*").matches(b)  # a filter compares, no wildcard
    assert not AclBindingFilter(host="*").matches(b)
    assert AclBindingFilter(operation=AclOperation.WRITE).matches(b)
    assert not AclBindingFilter(operation=AclOperation.ALL).matches(b)
    assert not AclBindingFilter(operation=AclOperation.READ).matches(b)
    assert AclBindingFilter(permission=PermissionType.DENY).matches(b)
    assert not AclBindingFilter(permission=PermissionType.ALLOW).matches(b)


def test_unknown_filters_and_codes() -> None:
    assert AclBindingFilter().unknown() is None
    assert AclBindingFilter(ResourceType.UNKNOWN).unknown() == "Unknown patternFilter."
    assert AclBindingFilter(pattern_type=PatternType.UNKNOWN).unknown() == "Unknown patternFilter."
    assert AclBindingFilter(operation=AclOperation.UNKNOWN).unknown() == "Unknown entryFilter."
    assert AclBindingFilter(permission=PermissionType.UNKNOWN).unknown() == "Unknown entryFilter."
    # Kafka's fromCode: a code it does not know is UNKNOWN, never an error
    assert (
        resource_type(99) is ResourceType.UNKNOWN
        and resource_type(5) is ResourceType.TRANSACTIONAL_ID
    )
    assert pattern_type(-1) is PatternType.UNKNOWN and pattern_type(4) is PREFIXED
    assert operation(15) is AclOperation.UNKNOWN and operation(12) is AclOperation.IDEMPOTENT_WRITE
    assert (
        permission_type(4) is PermissionType.UNKNOWN and permission_type(2) is PermissionType.DENY
    )


def test_principals() -> None:
    assert parse_principal("User:alice") == ("User", "alice")
    assert parse_principal("User:CN=a,OU=b") == ("User", "CN=a,OU=b")
    for bad in ("alice", ":alice", ""):
        with pytest.raises(ValueError, match="Could not parse principal"):
            parse_principal(bad)


def test_records_create_and_delete_bindings_idempotently() -> None:
    meta = ClusterMetadata("c")
    a = binding(name="orders", pt=PREFIXED, op=AclOperation.WRITE)
    b = binding(GROUP, "g1", principal="User:*", perm=PermissionType.DENY)
    delta = MetadataDelta()
    apply_batch(meta, [json.loads(json.dumps(acl_record("1", a))), acl_record("2", b)], 1, delta)
    assert delta.acls and delta
    assert meta.acls == {"1": a, "2": b}
    apply_batch(meta, [acl_record("2", b)], 2)  # a replay sets it again
    assert meta.acls == {"1": a, "2": b}
    delta = MetadataDelta()
    apply_batch(meta, [acl_removed_record("1"), acl_removed_record("1")], 3, delta)
    assert meta.acls == {"2": b} and delta.acls
    other = MetadataDelta()
    other.merge(delta)
    assert other.acls
    # a record is the binding's codes and strings, nothing else
    assert acl_record("2", b) == {"t": "acl", "id": "2", "b": [3, "g1", 3, "User:*", "*", 3, 2]}


def test_bindings_in_snapshots_and_documents_and_their_absence() -> None:
    meta = ClusterMetadata("c", version=4)
    plain = snapshots.encode_bytes(meta)
    assert b"acls" not in plain  # no ACLs: the snapshot older readers knew
    assert "acls" not in meta.to_json()
    meta.acls = {
        "x": binding(name="a,b\n"),
        "y": binding(ResourceType.CLUSTER, "kafka-cluster", op=AclOperation.ALTER),
    }
    assert snapshots.decode(snapshots.encode_bytes(meta)).acls == meta.acls
    assert ClusterMetadata.from_json(json.loads(json.dumps(meta.to_json()))).acls == meta.acls
    assert meta.copy().acls == meta.acls
    assert snapshots.decode(plain).acls == {}
    rolled = snapshots.roll(plain, [(5, [acl_record("z", binding())])])
    assert snapshots.decode(rolled).acls == {"z": binding()}
