"""The object-store interface every backend implements, and its errors.

Keys are '/'-separated strings. Conditional writes are the only synchronisation primitive the
engine uses: `if_none_match=True` creates a key only if it does not exist, `if_match=etag`
replaces it only if it still holds that version. Either failing raises PreconditionFailed,
which means "lost the race"; the engine translates it in one place (checkpoint.py).

An object's content is one buffer or a sequence of buffers stored concatenated (`Content`), so
callers that assemble an object from pieces (a WAL object from its appends, a segment from WAL
ranges) hand the pieces over instead of copying them into one blob on the event loop.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Sequence
from dataclasses import dataclass

from tidalmq_broker.storage.api import ObjectStoreUnavailable, StorageError

Buffer = bytes | bytearray | memoryview
Content = Buffer | Sequence[Buffer]
"""What `ObjectStore.put` stores: one buffer, or buffers stored one after the other."""

__all__ = [
    "Buffer",
    "Content",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "PreconditionFailed",
    "content_parts",
    "content_size",
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


def content_parts(data: Content) -> list[memoryview]:
    """The content as flat byte views in order, without copying (empty parts dropped)."""
    parts: Sequence[Buffer] = (data,) if isinstance(data, bytes | bytearray | memoryview) else data
    out = []
    for part in parts:
        if not isinstance(part, bytes | bytearray | memoryview):
            raise TypeError(f"object content must be bytes-like, not {type(part).__name__}")
        view = memoryview(part)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if len(view):
            out.append(view)
    return out


def content_size(data: Content) -> int:
    """The size in bytes of the object `data` makes."""
    if isinstance(data, bytes | bytearray):
        return len(data)
    if isinstance(data, memoryview):
        return data.nbytes
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in data)


class ObjectStore(abc.ABC):
    """Async object store. Every method may raise ObjectStoreUnavailable after its retries."""

    #: a short name for logs and metrics ("localdir", "s3")
    kind: str = "object-store"

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        data: Content,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """Store `data` (one buffer, or a sequence of buffers concatenated) under `key`;
        returns the new etag. The buffers must not change until the put returns."""

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
    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete the keys; missing keys are not an error."""

    async def close(self) -> None:  # noqa: B027 - optional for backends
        """Release threads and connections."""
