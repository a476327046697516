"""Which Kafka APIs the broker serves, at which versions, and by which handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidalmq_broker.protocol.codec import Request, schema_versions

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.listener import Connection

Handler = Callable[["Broker", Request, "Connection"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler


REGISTRY: dict[int, ApiSpec] = {}
_SUPPORTED: dict[int, tuple[int, int]] = {}  # derived from REGISTRY; read on every request


def api(key: int, name: str, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    """Register a handler for versions min..max of an API (capped by what kio can decode)."""

    def register(handler: Handler) -> Handler:
        known = schema_versions(key)
        if known is None:
            raise RuntimeError(f"kio has no schema for api {key} ({name})")
        low, high = max(min_version, known[0]), min(max_version, known[1])
        if low > high:
            raise RuntimeError(f"api {name}: versions {min_version}..{max_version} unavailable")
        if key in REGISTRY:
            raise RuntimeError(f"api {name} ({key}) registered twice")
        REGISTRY[key] = ApiSpec(key, name, low, high, handler)
        _SUPPORTED[key] = (low, high)
        return handler

    return register


def supported_versions() -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version served. The listener asks on every request, so this is
    one shared dict kept up to date by `api`: callers must not modify it."""
    return _SUPPORTED
