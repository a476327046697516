"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), versions 1-3 as Kafka 4 serves them.

As in Kafka (AclApis): DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls
ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED otherwise); a broker without an authorizer
answers SECURITY_DISABLED ("No Authorizer is configured."). Describe is answered from this
broker's metadata image, the bindings grouped by resource pattern. Create and delete go to the
controller (tidalmq_controller/_acls.py validates them as Kafka does and writes the records);
the answer waits until this broker holds the change, so its next request is decided by it and a
describe right after sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    ResourceType,
    operation,
    pattern_type,
    permission_type,
    resource_type,
)

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

_APPLIED_WAIT_S = 5.0  # how long an answer waits for this broker to hold the committed change
CLUSTER_DENIED = "Cluster authorization failed."
NO_AUTHORIZER = "No Authorizer is configured."


def _refusal(broker: Broker, conn: Connection, op: AclOperation) -> tuple[ErrorCode, str] | None:
    """Why this client may not use the ACL API that needs `op` on the cluster, or None."""
    if not broker.authorizer.allows(conn, op, ResourceType.CLUSTER, CLUSTER_NAME):
        return ErrorCode.cluster_authorization_failed, CLUSTER_DENIED
    if not broker.authorizer.enabled:
        return ErrorCode.security_disabled, NO_AUTHORIZER
    return None


def _filter(f: Any) -> AclBindingFilter:
    return AclBindingFilter(
        resource_type(f.resource_type_filter),
        f.resource_name_filter,
        pattern_type(f.pattern_type_filter),
        f.principal_filter,
        f.host_filter,
        operation(f.operation),
        permission_type(f.permission_type),
    )


@api(29, "DescribeAcls", 1, 3)
async def handle_describe_acls(broker: Broker, request: Request, conn: Connection) -> Any:
    refused = _refusal(broker, conn, AclOperation.DESCRIBE)
    if refused is not None:
        return _described(*refused)
    f = _filter(request.body)
    if f.unknown() is not None:
        return _described(
            ErrorCode.invalid_request, "DescribeAclsRequest contains UNKNOWN elements"
        )
    by_pattern: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for _, binding in sorted(broker.metadata.acls.items()):
        if f.matches(binding):
            key = (binding.resource_type, binding.name, binding.pattern_type)
            by_pattern.setdefault(key, []).append(binding)
    resources = [
        {
            "resource_type": rt,
            "resource_name": name,
            "pattern_type": pt,
            "acls": [
                {
                    "principal": b.principal,
                    "host": b.host,
                    "operation": b.operation,
                    "permission_type": b.permission,
                }
                for b in bindings
            ],
        }
        for (rt, name, pt), bindings in sorted(by_pattern.items())
    ]
    return _described(ErrorCode.none, None, resources)


def _described(
    code: ErrorCode, message: str | None, resources: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": message,
        "resources": resources or [],
    }


@api(30, "CreateAcls", 1, 3)
async def handle_create_acls(broker: Broker, request: Request, conn: Connection) -> Any:
    creations = request.body.creations
    refused = _refusal(broker, conn, AclOperation.ALTER)
    if refused is not None:
        return _created([refused] * len(creations))
    bindings = [
        AclBinding(
            resource_type(c.resource_type),
            c.resource_name,
            pattern_type(c.resource_pattern_type),
            c.principal,
            c.host,
            operation(c.operation),
            permission_type(c.permission_type),
        )
        for c in creations
    ]
    if not bindings:
        return _created([])
    try:
        results, version = await broker.controller.create_acls(bindings)
    except Exception as exc:  # the controller unreachable or not active: every one fails
        return _created([(error_code(exc), error_message(exc))] * len(bindings))
    await broker.wait_metadata(version, _APPLIED_WAIT_S)
    return _created([(ErrorCode(r.error_code), r.error_message) for r in results])


def _created(results: list[tuple[ErrorCode, str | None]]) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "results": [{"error_code": code, "error_message": message} for code, message in results],
    }


@api(31, "DeleteAcls", 1, 3)
async def handle_delete_acls(broker: Broker, request: Request, conn: Connection) -> Any:
    filters = [_filter(f) for f in request.body.filters]
    refused = _refusal(broker, conn, AclOperation.ALTER)
    if refused is not None:
        return _deleted([_filter_failed(*refused)] * len(filters))
    if not filters:
        return _deleted([])
    try:
        results, version = await broker.controller.delete_acls(filters)
    except Exception as exc:
        return _deleted([_filter_failed(error_code(exc), error_message(exc))] * len(filters))
    await broker.wait_metadata(version, _APPLIED_WAIT_S)
    return _deleted(
        [
            {
                "error_code": ErrorCode(r.error_code),
                "error_message": r.error_message,
                "matching_acls": [_matching(b) for b in r.deleted],
            }
            for r in results
        ]
    )


def _filter_failed(code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "matching_acls": []}


def _matching(b: AclBinding) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "error_message": None,
        "resource_type": b.resource_type,
        "resource_name": b.name,
        "pattern_type": b.pattern_type,
        "principal": b.principal,
        "host": b.host,
        "operation": b.operation,
        "permission_type": b.permission,
    }


def _deleted(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"throttle_time": 0, "filter_results": results}
