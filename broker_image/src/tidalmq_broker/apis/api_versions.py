"""ApiVersions: the APIs and versions this broker serves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import SUPPORTED_FEATURES, ClusterMetadata

from tidalmq_broker.apis.kafka_registry import REGISTRY, api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


def api_versions_body(error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": s.key, "min_version": s.min_version, "max_version": s.max_version}
            for s in sorted(REGISTRY.values(), key=lambda s: s.key)
        ],
        "throttle_time": 0,
    }


def feature_fields(meta: ClusterMetadata, version: int) -> dict[str, Any]:
    """ApiVersions v3+'s features (KIP-584): the levels this broker supports and the cluster's
    finalized levels, with the metadata version as their epoch (it grows with every change,
    so a client that saw a level re-reads it). As Kafka (KAFKA-17492, KIP-1022), a feature
    whose lowest supported level is 0 is listed in `supported_features` only from v4: older
    clients cannot read it (so `kafka-features describe`, which lists the supported features,
    needs v4 to show `transaction.version`). The finalized levels are what clients act on (a
    Java producer runs transaction version 2 when `transaction.version` >= 2,
    docs/transactions-v2.md); `kafka-features upgrade` changes them (apis/features.py)."""
    if version < 3 or meta.version < 0:
        return {}
    return {
        "supported_features": [
            {"name": name, "min_version": low, "max_version": high}
            for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
            if version >= 4 or low > 0
        ],
        "finalized_features_epoch": meta.version,
        "finalized_features": [
            {"name": name, "max_version_level": level, "min_version_level": level}
            for name in sorted(SUPPORTED_FEATURES)
            if (level := meta.feature_level(name)) > 0
        ],
    }


@api(18, "ApiVersions", 0, 4)
async def handle_api_versions(broker: Broker, request: Request, conn: Connection) -> Any:
    return api_versions_body() | feature_fields(broker.metadata, request.api_version)
