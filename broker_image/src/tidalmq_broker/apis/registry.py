"""Which Kafka APIs the broker serves, at which versions, and by which handler.

The registry sits below the broker: it names no Broker (a handler's first argument is the broker
serving the request, `Any` here; each handler annotates it). The broker is handed the table
(`ApiTable`, `tidalmq_broker.apis.KAFKA_APIS`) by whoever builds it, so broker.py imports no
handler (docs/import-graph.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tidalmq_broker.protocol.codec import Request, schema_versions

if TYPE_CHECKING:
    from tidalmq_broker.server.connection import Connection

# The broker is `Any` on purpose. Naming the Broker here, even under TYPE_CHECKING, makes a
# cycle (broker.py imports ApiTable from this module) and breaks the `registry-names-no-broker`
# contract (import-linter counts type-only imports). A Protocol of the broker does not fit
# either: every handler is annotated `broker: Broker`, and a callable taking a Broker is not a
# callable taking a Protocol (parameters are contravariant), so each handler would have to take
# a Protocol as wide as everything the handlers use of the Broker. The handlers' own annotations
# are what mypy checks; `api` keeps each handler's type.
Handler = Callable[[Any, Request, "Connection"], Awaitable[Any]]
"""(the broker serving the request, the request, its connection) -> the response body."""
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler


REGISTRY: dict[int, ApiSpec] = {}
_SUPPORTED: dict[int, tuple[int, int]] = {}  # derived from REGISTRY; read on every request


def api(key: int, name: str, min_version: int, max_version: int) -> Callable[[H], H]:
    """Register a handler for versions min..max of an API (capped by what kio can decode)."""

    def register(handler: H) -> H:
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


@dataclass(frozen=True, slots=True)
class ApiTable:
    """What a broker serves on its Kafka listeners: the handlers by API key, the versions of each
    (asked on every request), and ApiVersions' answer to a version it does not serve."""

    specs: Mapping[int, ApiSpec]
    supported_versions: Callable[[], dict[int, tuple[int, int]]]
    api_versions_error_body: Callable[[], dict[str, Any]]
