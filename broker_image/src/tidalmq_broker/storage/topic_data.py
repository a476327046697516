"""Deleting a topic's data: every checkpoint and segment under its (name, id) prefix.

Called by the controller once a deleted topic's partitions are closed everywhere. WAL objects
that still hold some of its batches become unreferenced with the checkpoints and are removed by
the engines' garbage collection.
"""

from __future__ import annotations

from tidalmq_core.model import TopicPartition

from tidalmq_broker.storage import keys
from tidalmq_broker.storage.objectstore.base import ObjectStore


async def delete_topic_data(store: ObjectStore, topic: str, topic_id: str) -> int:
    """Delete everything stored for one topic incarnation; returns the number of objects."""
    prefix = f"{keys.PARTITIONS_ROOT}{topic}/{topic_id}/"
    deleted = 0
    while True:
        objects = await store.list(prefix)
        if not objects:
            return deleted
        batch = [o.key for o in objects[:1000]]
        await store.delete(batch)
        deleted += len(batch)


async def delete_partition_data(store: ObjectStore, tp: TopicPartition, topic_id: str) -> int:
    """Delete one partition's checkpoint and segments (a static topic's expired physical
    queue); its WAL ranges go with the garbage collection as for a deleted topic."""
    objects = await store.list(keys.partition_prefix(tp, topic_id))
    if objects:
        await store.delete([o.key for o in objects])
    return len(objects)
