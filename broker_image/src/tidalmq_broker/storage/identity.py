"""The object store's identity marker: `cluster/identity`, JSON {"cluster_id", "created_ms"}.

The controller writes it (If-None-Match) when it creates a cluster, or once when it loads
metadata older than the marker (an upgrade), and then records `store_marker` in the metadata.
From then on a missing marker means the store was emptied or replaced, and a marker naming
another cluster means the broker or controller points at the wrong store. Either way nothing is
read from or written into the store until the marker is back and right: a wiped store must never
be served as empty partitions, and a foreign store must never be written into.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed

IDENTITY_KEY = "cluster/identity"
MISSING = "store identity marker missing: the object store was emptied or replaced"


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    cluster_id: str
    created_ms: int


async def read_identity(store: ObjectStore) -> StoreIdentity | None:
    """The marker, or None when the store has none. Store failures propagate (the caller keeps
    its last verdict: an unreachable store is not a wiped one)."""
    try:
        data = await store.get(IDENTITY_KEY)
    except ObjectNotFound:
        return None
    try:
        doc = json.loads(data)
        return StoreIdentity(str(doc["cluster_id"]), int(doc.get("created_ms", 0)))
    except (ValueError, KeyError, TypeError):
        return StoreIdentity("<unreadable identity marker>", 0)


async def write_identity(
    store: ObjectStore, cluster_id: str, *, replace: bool = False
) -> StoreIdentity:
    """Write the marker for `cluster_id` (only if absent, unless `replace`). Returns the marker
    the store holds afterwards: another cluster's if one got there first."""
    body = json.dumps(
        {"cluster_id": cluster_id, "created_ms": int(time.time() * 1000)}, separators=(",", ":")
    ).encode()
    try:
        if replace:
            await store.put(IDENTITY_KEY, body)
        else:
            await store.put(IDENTITY_KEY, body, if_none_match=True)
    except PreconditionFailed:
        found = await read_identity(store)
        if found is not None:
            return found
        await store.put(IDENTITY_KEY, body, if_none_match=True)
    return StoreIdentity(cluster_id, int(time.time() * 1000))


def identity_problem(found: StoreIdentity | None, cluster_id: str, expected: bool) -> str | None:
    """Why the store must not be used, or None when it may. `expected`: the metadata records
    that the marker was written (`store_marker`)."""
    if found is None:
        return MISSING if expected else None
    if found.cluster_id != cluster_id:
        return f"the object store belongs to cluster {found.cluster_id}, not {cluster_id}"
    return None
