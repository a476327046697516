"""The registry of the Kafka APIs a broker serves: an `ApiRegistry[Broker]`, filled by the
handler modules' `@api(...)` as they are imported (importing `tidalmq_broker.apis` imports them
all). Owns nothing but that one registry; must not import a handler.

It names the Broker, for the type checker only, so that mypy checks every handler's signature
against `(Broker, Request, Connection)` when it is registered. No cycle: broker.py imports the
generic registry (apis/registry.py) and is handed the table, never this module
(docs/import-graph.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidalmq_broker.apis.registry import ApiRegistry

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker

KAFKA: ApiRegistry[Broker] = ApiRegistry()

REGISTRY = KAFKA.specs
"""api key -> ApiSpec of its handler."""
api = KAFKA.api
supported_versions = KAFKA.supported_versions
