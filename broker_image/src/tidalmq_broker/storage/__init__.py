"""Stream storage on object storage: object-store backends, WAL flushes, partition logs, compaction.

The broker builds its engine as `ObjectStreamEngine(open_object_store(url), broker_id,
settings.storage_config(), ...)` (every StorageConfig field is a broker flag and `TIDALMQ_*`
environment variable, see tidalmq_broker.settings) and uses only the names of `storage.api`
afterwards.
"""

from __future__ import annotations

from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import open_object_store

__all__ = ["ObjectStreamEngine", "open_object_store"]
