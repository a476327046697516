"""UpdateFeatures (57), versions 0-2 as Kafka 4 serves them: `kafka-features upgrade`,
`downgrade` and `disable` (docs/transactions-v2.md). `kafka-features describe` reads
ApiVersions (apis/api_versions.py).

As in Kafka: the request needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED otherwise,
for every feature); the controller checks it whole (tidalmq_controller/_features.py) and either
refuses it with one top-level INVALID_UPDATE_VERSION ("The update failed for all features
since the following feature had an error: ...") or writes the new levels as `feature`
records. A success lists every feature with NONE up to v1; v2 answers only the top-level
NONE (Kafka's QuorumController). Version 0's `allow_downgrade` is a safe downgrade (Kafka's
UpdateFeaturesRequest). `validate_only` checks without writing. The answer waits until this
broker holds the new levels, so its ApiVersions shows them at once; the other brokers get
them through the metadata as every change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_controller import FeatureUpdate, UpgradeType
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

_APPLIED_WAIT_S = 5.0  # how long an answer waits for this broker to hold the committed change
CLUSTER_DENIED = "Cluster authorization failed."
ALL_FAILED = "The update failed for all features since the following feature had an error: "


def _update(request: Request, u: Any) -> FeatureUpdate:
    if request.api_version == 0:
        kind = UpgradeType.SAFE_DOWNGRADE if u.allow_downgrade else UpgradeType.UPGRADE
        return FeatureUpdate(u.feature, int(u.max_version_level), kind)
    return FeatureUpdate(u.feature, int(u.max_version_level), int(u.upgrade_type))


@api(57, "UpdateFeatures", 0, 2)
async def handle_update_features(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    if not broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return _answer(ErrorCode.cluster_authorization_failed, CLUSTER_DENIED)
    updates = [_update(request, u) for u in body.feature_updates]
    validate_only = bool(getattr(body, "validate_only", False))  # v1+
    try:
        refused, version = await broker.controller.update_features(
            updates, validate_only=validate_only
        )
    except Exception as exc:  # the controller unreachable or not active
        return _answer(error_code(exc), error_message(exc))
    if refused is not None:
        return _answer(ErrorCode.invalid_update_version, ALL_FAILED + refused)
    await broker.wait_metadata(version, _APPLIED_WAIT_S)
    names = [u.name for u in updates] if request.api_version <= 1 else []
    return _answer(ErrorCode.none, None, names)


def _answer(code: ErrorCode, message: str | None, succeeded: list[str] | None = None) -> Any:
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": message,
        "results": [
            {"feature": name, "error_code": ErrorCode.none, "error_message": None}
            for name in succeeded or []
        ],
    }
