"""ApiVersions: the APIs and versions this broker serves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from tidalmq_broker.apis.registry import REGISTRY, api
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


@api(18, "ApiVersions", 0, 3)
async def handle_api_versions(broker: Broker, request: Request, conn: Connection) -> Any:
    return api_versions_body()
