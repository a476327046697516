"""Kafka's StandardAuthorizer over the ACL bindings of the cluster metadata.

A request is authorized as (principal, client host, operation, resource type, resource name),
with Kafka's rules (StandardAuthorizerData):

- a super user (`super.users`, e.g. `User:admin;User:ops`) may do anything;
- the bindings that apply are those of the resource's type whose pattern matches its name: a
  LITERAL binding of that name, a PREFIXED binding whose name starts it, and a LITERAL binding
  named `*` (every resource); among those, a binding applies to the request if its principal is
  the client's or `User:*`, its host is the client's address or `*`, and its operation is the
  request's, or ALL, or, for an ALLOW binding only, one that implies it: READ, WRITE, DELETE
  and ALTER imply DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS;
- any applying DENY refuses, whatever ALLOWs there are; else any applying ALLOW allows;
- no applying binding refuses, except when the resource has no binding at all and
  `allow.everyone.if.no.acl.found` is true.

`authorize_by_resource_type` is Kafka's Authorizer.authorizeByResourceType (may the client do
the operation on at least one resource of the type?), which InitProducerId asks for WRITE on
any topic. `authorized_operations` is the bit field Metadata, DescribeGroups, DescribeCluster
and DescribeTopicPartitions report (AuthHelper.authorizedOperations).

Decisions are cached per (principal, host, operation, resource type, name): Produce and Fetch
ask for every topic of every request, and a cached decision is one dict lookup. The cache is
dropped whenever the bindings change (`load`, on every metadata batch holding `acl` or
`aclgone` records) and when it holds CACHE_ENTRIES decisions.

Client hosts and binding hosts are compared as IP addresses when both are ones (`::1` is
`0:0:0:0:0:0:0:1`, as Java writes it in Kafka's own bindings), otherwise as strings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tidalmq_core.acls import (
    SUPPORTED_OPERATIONS,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
    parse_principal,
)

CACHE_ENTRIES = 100_000
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

_IMPLIES_DESCRIBE = frozenset(
    {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
_HARDCODE = "hardcode"  # the name Kafka's authorizeByResourceType tries first


class Client(Protocol):
    """Who asks: a listener connection (server/connection.py's Connection)."""

    principal: str
    host: str


def canonical_host(host: str) -> str:
    """An IP address in one form (IPv4-mapped IPv6 as IPv4, as Java reports it), anything else
    as it is."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's super.users: principals separated by `;`. Raises ValueError for one without a
    type (`alice` instead of `User:alice`)."""
    users = set()
    for part in text.split(";"):
        principal = part.strip()
        if principal:
            parse_principal(principal)
            users.add(principal)
    return frozenset(users)


@dataclass(frozen=True, slots=True)
class _Entry:
    principal: str
    host: str  # canonical_host, or "*"
    operation: AclOperation
    allow: bool


@dataclass(slots=True)
class _ByType:
    literal: dict[str, list[_Entry]]
    prefixed: dict[str, list[_Entry]]
    prefix_lengths: tuple[int, ...]  # the lengths of the prefixed names, ascending


def _applies(entry: _Entry, op: AclOperation, principal: str, host: str) -> bool | None:
    """True (allow) or False (deny) when the entry applies to the request, None when not
    (StandardAuthorizerData.findResult)."""
    if entry.principal != principal and entry.principal != WILDCARD_PRINCIPAL:
        return None
    if entry.host != WILDCARD and entry.host != host:
        return None
    granted = entry.operation
    if granted != AclOperation.ALL and granted != op:
        if not entry.allow:
            return None
        if op == AclOperation.DESCRIBE:
            if granted not in _IMPLIES_DESCRIBE:
                return None
        elif op == AclOperation.DESCRIBE_CONFIGS:
            if granted not in _IMPLIES_DESCRIBE_CONFIGS:
                return None
        else:
            return None
    return entry.allow


class Authorizer:
    def __init__(
        self,
        *,
        enabled: bool,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._cache_entries = cache_entries
        self._cache: dict[tuple[str, str, int, int, str], bool] = {}
        self._index: dict[ResourceType, _ByType] = {}
        self._bindings: list[AclBinding] = []
        self.loads = 0  # how many times the bindings were (re)loaded

    # ------------------------------------------------------------------ the bindings
    def load(self, acls: Mapping[str, AclBinding] | Iterable[AclBinding]) -> None:
        """Take the current bindings (all of them) and forget every cached decision."""
        bindings = list(acls.values()) if isinstance(acls, Mapping) else list(acls)
        literal: dict[ResourceType, dict[str, list[_Entry]]] = {}
        prefixed: dict[ResourceType, dict[str, list[_Entry]]] = {}
        for b in bindings:
            if b.permission not in (PermissionType.ALLOW, PermissionType.DENY):
                continue
            entry = _Entry(
                b.principal,
                b.host if b.host == WILDCARD else canonical_host(b.host),
                b.operation,
                b.permission == PermissionType.ALLOW,
            )
            if b.pattern_type == PatternType.LITERAL:
                literal.setdefault(b.resource_type, {}).setdefault(b.name, []).append(entry)
            elif b.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(b.resource_type, {}).setdefault(b.name, []).append(entry)
        index = {}
        for rt in set(literal) | set(prefixed):
            by_prefix = prefixed.get(rt, {})
            index[rt] = _ByType(
                literal.get(rt, {}), by_prefix, tuple(sorted({len(n) for n in by_prefix}))
            )
        self._index = index
        self._bindings = bindings
        self._cache = {}
        self.loads += 1

    # ------------------------------------------------------------------ decisions
    def allows(self, client: Client, op: AclOperation, rt: ResourceType, name: str) -> bool:
        """May this client do `op` on the resource? (True whenever authorization is off.)"""
        if not self.enabled:
            return True
        key = (client.principal, client.host, op, rt, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self.authorize(client.principal, client.host, op, rt, name)
            if len(self._cache) >= self._cache_entries:
                self._cache = {}
            self._cache[key] = decision
        return decision

    def authorize(
        self, principal: str, host: str, op: AclOperation, rt: ResourceType, name: str
    ) -> bool:
        """The decision itself, uncached (`host` as canonical_host gives it)."""
        if principal in self.super_users:
            return True
        by_type = self._index.get(rt)
        if by_type is None:
            return self.allow_everyone_if_no_acl_found
        found = False
        allowed = False
        for entries in self._candidates(by_type, name):
            found = True
            for entry in entries:
                result = _applies(entry, op, principal, host)
                if result is False:
                    return False
                if result:
                    allowed = True
        if allowed:
            return True
        return not found and self.allow_everyone_if_no_acl_found

    @staticmethod
    def _candidates(by_type: _ByType, name: str) -> Iterable[list[_Entry]]:
        """The entries of every binding whose pattern matches `name`."""
        exact = by_type.literal.get(name)
        if exact:
            yield exact
        if name != WILDCARD:
            every = by_type.literal.get(WILDCARD)
            if every:
                yield every
        for length in by_type.prefix_lengths:
            if length > len(name):
                break
            entries = by_type.prefixed.get(name[:length])
            if entries:
                yield entries

    def allows_by_resource_type(self, client: Client, op: AclOperation, rt: ResourceType) -> bool:
        """May the client do `op` on at least one resource of type `rt`? (Kafka's default
        Authorizer.authorizeByResourceType.)"""
        if not self.enabled:
            return True
        principal, host = client.principal, client.host
        if self.authorize(principal, host, op, rt, _HARDCODE):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefixed: set[str] = set()
        allow_every = False
        for b in self._bindings:
            if b.resource_type != rt:
                continue
            if b.host != WILDCARD and canonical_host(b.host) != host:
                continue
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.operation != op and b.operation != AclOperation.ALL:
                continue
            literal = b.pattern_type == PatternType.LITERAL
            if b.permission == PermissionType.DENY:
                if literal and b.name == WILDCARD:
                    return False
                (deny_literal if literal else deny_prefixed).add(b.name)
            elif b.permission == PermissionType.ALLOW:
                if literal and b.name == WILDCARD:
                    allow_every = True  # unless a DENY of every resource comes later
                    continue
                (allow_literal if literal else allow_prefixed).add(b.name)
        if allow_every:
            return True

        # an allowed literal not denied as a literal, or an allowed prefix, each unless a
        # denied prefix covers it
        def dominated(name: str) -> bool:
            return any(name[:i] in deny_prefixed for i in range(1, len(name) + 1))

        if any(n not in deny_literal and not dominated(n) for n in allow_literal):
            return True
        return any(not dominated(n) for n in allow_prefixed)

    def authorized_operations(self, client: Client, rt: ResourceType, name: str) -> int:
        """The bit field of the operations the client may do on the resource (every operation
        of its type when authorization is off), as Kafka's Utils.to32BitField."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(rt, ()):
            if self.allows(client, op, rt, name):
                bits |= 1 << int(op)
        return bits

    def describe(self) -> str:
        """For the broker's start line."""
        if not self.enabled:
            return "off"
        users = ",".join(sorted(self.super_users)) or "none"
        return (
            f"on (ACLs; super users {users}; allow.everyone.if.no.acl.found="
            f"{str(self.allow_everyone_if_no_acl_found).lower()})"
        )
