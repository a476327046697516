"""ACL bindings in the cluster metadata: CreateAcls and DeleteAcls, validated as Kafka does.

The controller turns a CreateAcls request into `acl` records (one per new binding, each with an
id of its own that is never reused) and a DeleteAcls request into `aclgone` records, as Kafka's
controller does (AclControlManager), with the checks Kafka's broker makes before forwarding
(AclApis.handleCreateAcls):

- a CLUSTER binding must name `kafka-cluster` ("The only valid name for the CLUSTER resource is
  kafka-cluster"), and no binding may have an empty name ("Invalid empty resource name");
- resource type, pattern type (LITERAL or PREFIXED), operation and permission (ALLOW or DENY)
  must be concrete ("Invalid resourceType ANY", ...), all INVALID_REQUEST;
- the principal must be `Type:name` (what Kafka's authorizer parses);
- a binding that exists already is a success that writes nothing (so is one named twice);
- a DeleteAcls filter with an UNKNOWN element is refused ("Unknown patternFilter." /
  "Unknown entryFilter."); each filter's result lists every binding it matched, and the
  bindings go in one batch (atomic, as Kafka's);
- at most 10,000 records per request (Kafka's MAX_RECORDS_PER_USER_OP).

One departure, because TidalMQ has no delegation tokens: bindings on DELEGATION_TOKEN and USER
resources (which only authorize the delegation token APIs) are refused with INVALID_REQUEST
instead of being stored and never enforced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
    parse_principal,
)
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import Record, acl_record, acl_removed_record

MAX_RECORDS_PER_REQUEST = 10_000  # Kafka's QuorumController MAX_RECORDS_PER_USER_OP
UNSUPPORTED_RESOURCE_TYPES = (ResourceType.DELEGATION_TOKEN, ResourceType.USER)


@dataclass(frozen=True, slots=True)
class AclCreateResult:
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AclDeleteResult:
    error_code: int = 0
    error_message: str | None = None
    deleted: list[AclBinding] = field(default_factory=list)


class TooManyAcls(ValueError):
    """A request that would write more than MAX_RECORDS_PER_REQUEST records."""


def check(binding: AclBinding) -> str | None:
    """Why `binding` cannot be stored (Kafka's INVALID_REQUEST message), or None."""
    if binding.resource_type == ResourceType.CLUSTER and binding.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not binding.name:
        return "Invalid empty resource name"
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {binding.resource_type.name}"
    if binding.resource_type in UNSUPPORTED_RESOURCE_TYPES:
        return (
            f"ACLs on {binding.resource_type.name} resources are not supported: TidalMQ has no "
            "delegation tokens"
        )
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {binding.operation.name}"
    if binding.permission not in (PermissionType.ALLOW, PermissionType.DENY):
        return f"Invalid permissionType {binding.permission.name}"
    try:
        parse_principal(binding.principal)
    except ValueError as exc:
        return str(exc)
    return None


def _new_id(taken: dict[str, AclBinding], fresh: set[str]) -> str:
    while True:
        acl_id = uuid.uuid4().hex
        if acl_id not in taken and acl_id not in fresh:
            return acl_id


def create(
    image: ClusterMetadata, bindings: Iterable[AclBinding]
) -> tuple[list[AclCreateResult], list[Record]]:
    """One result per binding, in order, and the records creating the new ones. Raises
    TooManyAcls."""
    existing = set(image.acls.values())
    results: list[AclCreateResult] = []
    records: list[Record] = []
    fresh: set[str] = set()
    for binding in bindings:
        problem = check(binding)
        if problem is not None:
            results.append(AclCreateResult(int(ErrorCode.invalid_request), problem))
            continue
        if binding not in existing:
            existing.add(binding)
            acl_id = _new_id(image.acls, fresh)
            fresh.add(acl_id)
            records.append(acl_record(acl_id, binding))
            if len(records) > MAX_RECORDS_PER_REQUEST:
                raise TooManyAcls(
                    f"Cannot create more than {MAX_RECORDS_PER_REQUEST} acls in a single request"
                )
        results.append(AclCreateResult())
    return results, records


def delete(
    image: ClusterMetadata, filters: Iterable[AclBindingFilter]
) -> tuple[list[AclDeleteResult], list[Record]]:
    """One result per filter, in order (each with every binding it matched), and the records
    removing them all. Raises TooManyAcls."""
    results: list[AclDeleteResult] = []
    doomed: dict[str, None] = {}  # ids, in order, once
    for f in filters:
        problem = f.unknown()
        if problem is not None:
            results.append(AclDeleteResult(int(ErrorCode.invalid_request), problem))
            continue
        deleted = []
        for acl_id, binding in sorted(image.acls.items()):
            if f.matches(binding):
                deleted.append(binding)
                doomed[acl_id] = None
                if len(doomed) > MAX_RECORDS_PER_REQUEST:
                    raise TooManyAcls(
                        f"Cannot remove more than {MAX_RECORDS_PER_REQUEST} acls in a single "
                        "delete operation."
                    )
        results.append(AclDeleteResult(deleted=deleted))
    return results, [acl_removed_record(acl_id) for acl_id in doomed]
