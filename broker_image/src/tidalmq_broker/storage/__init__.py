"""Stream storage on object storage: object-store backends, WAL flushes, partition logs, compaction.

The broker builds its engine with `build_engine` (or `ObjectStreamEngine` around any
ObjectStore) and uses only the names of `storage.api` afterwards.
"""

from __future__ import annotations

from tidalmq_broker.storage.api import LeaseCheck, OnFenced, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import open_object_store
from tidalmq_broker.storage.settings import storage_config_from_env

__all__ = ["ObjectStreamEngine", "build_engine", "open_object_store", "storage_config_from_env"]


def build_engine(
    url: str,
    broker_id: int | str,
    config: StorageConfig | None = None,
    *,
    lease_check: LeaseCheck | None = None,
    on_fenced: OnFenced | None = None,
) -> ObjectStreamEngine:
    """An engine on the object store at `url` (file:///path or s3://bucket/prefix?...).
    Call `await engine.start()` before use and `await engine.stop()` at shutdown."""
    return ObjectStreamEngine(
        open_object_store(url),
        broker_id,
        config or storage_config_from_env(),
        lease_check=lease_check,
        on_fenced=on_fenced,
        owns_store=True,
    )
