"""Stream storage on object storage: object-store backends, WAL flushes, partition logs, compaction.

The broker builds its engine as `ObjectStreamEngine(open_object_store(url), broker_id,
settings.storage_config(), ...)` (every StorageConfig field is a broker flag and `TIDALMQ_*`
environment variable, see tidalmq_broker.settings) and uses only the names of `storage.api`
afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidalmq_broker.storage.engine import ObjectStreamEngine
    from tidalmq_broker.storage.objectstore import open_object_store

__all__ = ["ObjectStreamEngine", "open_object_store"]


def __getattr__(name: str) -> Any:
    """The engine and the object stores (boto3 among them) are imported at their first use, not
    with the package: `tidalmq_broker.settings` reads `storage.api` for the engine's defaults,
    and every `tidalmq` command builds the `broker` command's flags from them (docs/cli.md)."""
    if name == "ObjectStreamEngine":
        from tidalmq_broker.storage.engine import ObjectStreamEngine

        return ObjectStreamEngine
    if name == "open_object_store":
        from tidalmq_broker.storage.objectstore import open_object_store

        return open_object_store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
