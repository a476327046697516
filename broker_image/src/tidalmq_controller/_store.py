"""Where the controller keeps cluster metadata: a small versioned, fenced store.

Every write names the version token it read; a write based on anything older fails with
StaleMetadata, so a controller that lost its role can never overwrite its successor. The local
cluster keeps the document in the object store (conditional PUT on its ETag); the operator adds a
store backed by custom resources.
"""

from __future__ import annotations

import json
from typing import Protocol

from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from tidalmq_core.metadata import ClusterMetadata


class StaleMetadata(Exception):
    """Someone committed a newer version since this controller last read the store."""


class MetadataStore(Protocol):
    async def load(self) -> tuple[ClusterMetadata | None, str | None]:
        """The current document and its version token, or (None, None) if there is none."""
        ...

    async def save(self, metadata: ClusterMetadata, token: str | None) -> str:
        """Replace the document if its token is still `token` (None: create). Returns the new
        token; raises StaleMetadata otherwise."""
        ...


class ObjectStoreMetadataStore:
    """The metadata document as one object, replaced with If-Match on its ETag."""

    def __init__(self, store: ObjectStore, key: str = "cluster/metadata.json") -> None:
        self._store = store
        self._key = key

    async def load(self) -> tuple[ClusterMetadata | None, str | None]:
        try:
            data, etag = await self._store.get_with_etag(self._key)
        except ObjectNotFound:
            return None, None
        return ClusterMetadata.from_json(json.loads(data)), etag

    async def save(self, metadata: ClusterMetadata, token: str | None) -> str:
        body = json.dumps(metadata.to_json(), separators=(",", ":")).encode()
        try:
            if token is None:
                return await self._store.put(self._key, body, if_none_match=True)
            return await self._store.put(self._key, body, if_match=token)
        except PreconditionFailed as exc:
            raise StaleMetadata(
                f"cluster metadata changed since version {metadata.version - 1} was read"
            ) from exc
