"""Which Kafka APIs the broker serves, at which versions, and by which handler: the registry's
kind, generic in the broker a handler serves.

The registry sits below the broker: it names no Broker. `ApiRegistry[B]` keeps handlers that
take a `B`; apis/kafka_registry.py makes the one registry of the Kafka APIs, an
`ApiRegistry[Broker]` (it may name the Broker: broker.py never imports it), so mypy checks each
handler's signature when it is registered. The broker is handed the table (`ApiTable[Broker]`,
`tidalmq_broker.apis.KAFKA_APIS`) by whoever builds it, so broker.py imports no handler
(docs/import-graph.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tidalmq_broker.protocol.codec import Request, schema_versions

if TYPE_CHECKING:
    from tidalmq_broker.server.connection import Connection

# The broker a handler serves. Not a Protocol of the Broker: every handler is annotated
# `broker: Broker`, and a callable taking a Broker is not a callable taking a wider Protocol
# (parameters are contravariant); the registry is made for the Broker itself where it may be
# named (apis/kafka_registry.py).
B = TypeVar("B")

Handler = Callable[[B, Request, "Connection"], Awaitable[Any]]
"""(the broker serving the request, the request, its connection) -> the response body."""


@dataclass(frozen=True, slots=True)
class ApiSpec(Generic[B]):
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler[B]


class ApiRegistry(Generic[B]):
    """The handlers by API key, filled by `api` as the handler modules are imported, and the
    versions served (derived from the handlers; read on every request)."""

    def __init__(self) -> None:
        self.specs: dict[int, ApiSpec[B]] = {}
        self._supported: dict[int, tuple[int, int]] = {}

    def api(
        self, key: int, name: str, min_version: int, max_version: int
    ) -> Callable[[Handler[B]], Handler[B]]:
        """Register a handler for versions min..max of an API (capped by what kio can
        decode)."""

        def register(handler: Handler[B]) -> Handler[B]:
            known = schema_versions(key)
            if known is None:
                raise RuntimeError(f"kio has no schema for api {key} ({name})")
            low, high = max(min_version, known[0]), min(max_version, known[1])
            if low > high:
                raise RuntimeError(f"api {name}: versions {min_version}..{max_version} unavailable")
            if key in self.specs:
                raise RuntimeError(f"api {name} ({key}) registered twice")
            self.specs[key] = ApiSpec(key, name, low, high, handler)
            self._supported[key] = (low, high)
            return handler

        return register

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        """api key -> (min, max) version served. The listener asks on every request, so this
        is one shared dict kept up to date by `api`: callers must not modify it."""
        return self._supported


@dataclass(frozen=True, slots=True)
class ApiTable(Generic[B]):
    """What a broker serves on its Kafka listeners: the handlers by API key, the versions of each
    (asked on every request), and ApiVersions' answer to a version it does not serve."""

    specs: Mapping[int, ApiSpec[B]]
    supported_versions: Callable[[], dict[int, tuple[int, int]]]
    api_versions_error_body: Callable[[], dict[str, Any]]
