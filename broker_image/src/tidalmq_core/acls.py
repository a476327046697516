"""ACL bindings as Kafka defines them (AclBinding, AclBindingFilter), stored in the metadata log.

An ACL binding is a resource pattern (resource type, name, pattern type) and an access control
entry (principal, host, operation, permission type), with Kafka's wire codes for every enum
(org.apache.kafka.common.acl.AclOperation, AclPermissionType, resource.ResourceType,
resource.PatternType): the codes are what CreateAcls, DescribeAcls and DeleteAcls carry and what
the `acl` records keep.

Filters are Kafka's too (ResourcePatternFilter.matches, AccessControlEntryFilter.matches): a
filter with pattern type MATCH matches the LITERAL and PREFIXED bindings that would apply to the
filter's name (the wildcard `*` included); ANY matches every pattern type by exact name; a null
name, principal or host matches any. How bindings authorize a request is the broker's authorizer
(tidalmq_broker/security/authorizer.py); which bindings may be stored is the controller's
(tidalmq_controller/_acls.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar

# a resource name or host that matches any (Kafka's ResourcePattern.WILDCARD_RESOURCE)
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"  # a principal that matches any user
CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_Code = TypeVar("_Code", bound=enum.IntEnum)


def _code(kind: type[_Code], value: int) -> _Code:
    """Kafka's fromCode: a code outside the enum is UNKNOWN."""
    try:
        return kind(value)
    except ValueError:
        return kind(0)


def resource_type(code: int) -> ResourceType:
    return _code(ResourceType, code)


def pattern_type(code: int) -> PatternType:
    return _code(PatternType, code)


def operation(code: int) -> AclOperation:
    return _code(AclOperation, code)


def permission_type(code: int) -> PermissionType:
    return _code(PermissionType, code)


# The operations of each resource type (Kafka's AclEntry.supportedOperations): what the
# authorized-operations bit fields of Metadata, DescribeGroups, DescribeCluster and
# DescribeTopicPartitions are made of.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}


def parse_principal(text: str) -> tuple[str, str]:
    """(type, name) of a principal such as `User:alice` (Kafka's
    SecurityUtils.parseKafkaPrincipal). Raises ValueError without a type."""
    kind, sep, name = text.partition(":")
    if not sep or not kind:
        raise ValueError(
            f"Could not parse principal from `{text}` (no colon is present separating the "
            "principal type from the principal name)"
        )
    return kind, name


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry (Kafka's AclBinding)."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str  # "User:alice"; "User:*" matches every user
    host: str  # an IP address, or "*" for any host
    operation: AclOperation
    permission: PermissionType

    def to_json(self) -> list[Any]:
        return [
            int(self.resource_type),
            self.name,
            int(self.pattern_type),
            self.principal,
            self.host,
            int(self.operation),
            int(self.permission),
        ]

    @classmethod
    def from_json(cls, data: list[Any]) -> AclBinding:
        rt, name, pt, principal, host, op, perm = data
        return cls(
            resource_type(int(rt)),
            str(name),
            pattern_type(int(pt)),
            str(principal),
            str(host),
            operation(int(op)),
            permission_type(int(perm)),
        )

    def __str__(self) -> str:
        return (
            f"{self.permission.name} {self.principal} {self.operation.name} from {self.host} on "
            f"{self.resource_type.name}:{self.pattern_type.name}:{self.name}"
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings a DescribeAcls or DeleteAcls means (Kafka's AclBindingFilter). None
    matches any name, principal or host; ANY any enum value; pattern type MATCH the patterns
    that would apply to `name`."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: PermissionType = PermissionType.ANY

    def unknown(self) -> str | None:
        """Why the filter cannot be used (an UNKNOWN element), or None."""
        if self.pattern_type == PatternType.UNKNOWN or self.resource_type == ResourceType.UNKNOWN:
            return "Unknown patternFilter."
        if self.operation == AclOperation.UNKNOWN or self.permission == PermissionType.UNKNOWN:
            return "Unknown entryFilter."
        return None

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b) and self.matches_entry(b)

    def matches_pattern(self, b: AclBinding) -> bool:
        """ResourcePatternFilter.matches."""
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        pt = self.pattern_type
        if pt not in (PatternType.ANY, PatternType.MATCH) and pt != b.pattern_type:
            return False
        if self.name is None:
            return True
        if pt == PatternType.ANY or pt == b.pattern_type:
            return self.name == b.name
        # MATCH: the bindings that apply to this name
        if b.pattern_type == PatternType.LITERAL:
            return self.name == b.name or b.name == WILDCARD
        if b.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(b.name)
        return False

    def matches_entry(self, b: AclBinding) -> bool:
        """AccessControlEntryFilter.matches."""
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return self.permission == PermissionType.ANY or self.permission == b.permission


def acls_json(acls: dict[str, AclBinding]) -> list[list[Any]]:
    """The image's ACLs as JSON: [[id, resource type, name, pattern type, principal, host,
    operation, permission], ...] in id order."""
    return [[acl_id, *b.to_json()] for acl_id, b in sorted(acls.items())]


def acls_from(data: list[list[Any]]) -> dict[str, AclBinding]:
    return {str(row[0]): AclBinding.from_json(row[1:]) for row in data}
