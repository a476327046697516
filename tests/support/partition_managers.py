"""A broker's partitions without the rest of the broker: an ObjectStreamEngine on a local store
and the PartitionManager that opens and closes partitions on it as metadata arrives, for the
unit tests of metadata deltas, fencing, loss reports and periodic upkeep."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import MetadataDelta, apply_batch


@asynccontextmanager
async def partition_manager(
    objects: Path, config: StorageConfig | None = None, broker_id: int = 0
) -> AsyncIterator[tuple[ObjectStreamEngine, PartitionManager]]:
    """A started engine on the local store at `objects` and a PartitionManager of broker
    `broker_id` on it; both stopped at the end (the manager first, as a broker does)."""
    engine = ObjectStreamEngine(LocalDirObjectStore(objects), broker_id, config or StorageConfig())
    await engine.start()
    manager = PartitionManager(engine, broker_id)
    try:
        yield engine, manager
    finally:
        await manager.stop()
        await engine.stop()


def apply_records(
    manager: PartitionManager, meta: ClusterMetadata, *records: dict[str, object]
) -> MetadataDelta:
    """Applies `records` to `meta` as its next version and hands the delta to `manager`, as a
    broker does with a pushed metadata batch."""
    delta = apply_batch(meta, list(records), meta.version + 1)
    manager.apply_delta(meta, delta)
    return delta
