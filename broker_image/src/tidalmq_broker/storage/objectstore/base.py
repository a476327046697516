"""The object-store interface every backend implements, and its errors.

Keys are '/'-separated strings. Conditional writes are the only synchronisation primitive the
engine uses: `if_none_match=True` creates a key only if it does not exist, `if_match=etag`
replaces it only if it still holds that version. Either failing raises PreconditionFailed,
which means "lost the race"; the engine translates it in one place (checkpoint.py).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from tidalmq_broker.storage.api import ObjectStoreUnavailable, StorageError

__all__ = [
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "PreconditionFailed",
    "validate_key",
]


class ObjectStoreError(StorageError):
    """A definite answer from the store that is not a transient failure."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write lost: the key exists (if_none_match) or changed (if_match)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: float  # seconds since the epoch


def validate_key(key: str) -> str:
    if not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"invalid object key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith(".tidalmq"):
            raise ValueError(f"invalid object key {key!r}")
    return key


class ObjectStore(abc.ABC):
    """Async object store. Every method may raise ObjectStoreUnavailable after its retries."""

    #: a short name for logs and metrics ("localdir", "s3")
    kind: str = "object-store"

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Store `data` under `key`; returns the new etag."""

    @abc.abstractmethod
    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes [start, end) of the object (end exclusive; None = to the end)."""

    @abc.abstractmethod
    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The whole object and the etag of exactly that version."""

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        """Every key starting with `prefix` (and greater than start_after), in key order."""

    @abc.abstractmethod
    async def delete(self, keys: list[str]) -> None:
        """Delete the keys; missing keys are not an error."""

    async def close(self) -> None:  # noqa: B027 - optional for backends
        """Release threads and connections."""
