"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554; and
DescribeClientQuotas (48), which `kafka-configs --describe --entity-type users` asks first.

Describe is answered from this broker's metadata image, as Kafka's ScramImage.describe: every
user with a credential when none is named; a named user without one gets RESOURCE_NOT_FOUND, a
user named twice DUPLICATE_RESOURCE. Only mechanisms and iteration counts are ever returned.
Alter goes to the controller (tidalmq_controller/_scram_credentials.py validates it as Kafka
does); the answer waits until this broker holds the change too, so a describe or a login on this
broker right after sees it.

TidalMQ has no client quotas: DescribeClientQuotas answers that there are none (no entries),
which is what kafka-configs prints for users then, followed by their SCRAM credentials.

Authorized as Kafka does: describing credentials needs DESCRIBE on the cluster, altering them
ALTER on the cluster, describing quotas DESCRIBE_CONFIGS on the cluster
(CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_controller import ScramDeletion, ScramUpsertion
from tidalmq_core import scram
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

# how long an alteration's answer waits for this broker to hold the committed change
_APPLIED_WAIT_S = 5.0
_DENIED = "Cluster authorization failed."


@api(50, "DescribeUserScramCredentials", 0, 0)
async def handle_describe_user_scram_credentials(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    if not broker.authorizer.allows(
        conn, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": _DENIED,
            "results": [],
        }
    credentials = broker.metadata.scram_credentials
    users = request.body.users
    duplicate: dict[str, bool] = {}
    if not users:
        for user in credentials:
            duplicate[user] = False
    else:
        for u in users:
            duplicate[u.name] = u.name in duplicate
    results = []
    for user, twice in duplicate.items():
        if twice:
            results.append(
                _described(
                    user,
                    ErrorCode.duplicate_resource,
                    "Cannot describe SCRAM credentials for the same user twice "
                    f"in a single request: {user}",
                )
            )
            continue
        infos = [
            {"mechanism": scram.MECHANISMS[m].type, "iterations": c.iterations}
            for m, c in sorted(credentials.get(user, {}).items(), key=lambda i: i[0])
            if m in scram.MECHANISMS
        ]
        if infos:
            results.append(_described(user, ErrorCode.none, None, infos))
        else:
            results.append(
                _described(
                    user,
                    ErrorCode.resource_not_found,
                    f"Attempt to describe a user credential that does not exist: {user}",
                )
            )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "results": results,
    }


def _described(
    user: str, code: ErrorCode, message: str | None, infos: list[dict[str, int]] | None = None
) -> dict[str, Any]:
    return {
        "user": user,
        "error_code": code,
        "error_message": message,
        "credential_infos": infos or [],
    }


@api(51, "AlterUserScramCredentials", 0, 0)
async def handle_alter_user_scram_credentials(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    body = request.body
    deletions = [ScramDeletion(d.name, int(d.mechanism)) for d in body.deletions]
    upsertions = [
        ScramUpsertion(
            u.name, int(u.mechanism), int(u.iterations), bytes(u.salt), bytes(u.salted_password)
        )
        for u in body.upsertions
    ]
    if not deletions and not upsertions:
        return {"throttle_time": 0, "results": []}
    if not broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        names = dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions])
        return {
            "throttle_time": 0,
            "results": [
                {
                    "user": n,
                    "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": _DENIED,
                }
                for n in names
            ],
        }
    try:
        results, version = await broker.controller.alter_scram_credentials(deletions, upsertions)
    except Exception as exc:  # the controller unreachable or not active: every user fails
        code, message = error_code(exc), error_message(exc)
        names = dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions])
        return {
            "throttle_time": 0,
            "results": [{"user": n, "error_code": code, "error_message": message} for n in names],
        }
    await broker.wait_metadata(version, _APPLIED_WAIT_S)
    return {
        "throttle_time": 0,
        "results": [
            {
                "user": r.user,
                "error_code": ErrorCode(r.error_code),
                "error_message": r.error_message,
            }
            for r in results
        ],
    }


@api(48, "DescribeClientQuotas", 0, 1)
async def handle_describe_client_quotas(broker: Broker, request: Request, conn: Connection) -> Any:
    if not broker.authorizer.allows(
        conn, AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": _DENIED,
            "entries": None,
        }
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": []}
