"""A wrapper that counts requests, bytes and latency of any object store."""

from __future__ import annotations

import builtins
import time

from prometheus_client import Counter, Histogram

from tidalmq_broker.storage import metrics
from tidalmq_broker.storage.health import WriteHealth
from tidalmq_broker.storage.objectstore.base import (
    Content,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    PreconditionFailed,
    content_size,
)


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, ObjectNotFound):
        return "not_found"
    if isinstance(exc, PreconditionFailed):
        return "precondition_failed"
    return "error"


class MeteredObjectStore(ObjectStore):
    def __init__(self, inner: ObjectStore, broker: str, health: WriteHealth | None = None) -> None:
        self.inner = inner
        self.health = health  # told the outcome of every PUT (storage/health.py)
        self.kind = inner.kind
        self._broker = broker
        self._children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    def __repr__(self) -> str:
        return f"Metered({self.inner!r})"

    def _record(self, op: str, started: float, exc: BaseException | None) -> None:
        outcome = _outcome(exc)
        children = self._children.get((op, outcome))
        if children is None:
            children = (
                metrics.OBJECT_REQUESTS.labels(self._broker, op, outcome),
                metrics.OBJECT_LATENCY.labels(self._broker, op),
            )
            self._children[(op, outcome)] = children
        children[0].inc()
        children[1].observe(time.perf_counter() - started)

    async def put(
        self,
        key: str,
        data: Content,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        started = time.perf_counter()
        try:
            etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        except BaseException as exc:
            self._record("put", started, exc)
            if self.health is not None:
                if isinstance(exc, ObjectStoreUnavailable):
                    self.health.failed(exc)
                elif isinstance(exc, PreconditionFailed):
                    self.health.ok()  # an answer: the store works
            raise
        self._record("put", started, None)
        if self.health is not None:
            self.health.ok()
        metrics.OBJECT_BYTES.labels(self._broker, "put").inc(content_size(data))
        return etag

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        started = time.perf_counter()
        try:
            data = await self.inner.get(key, start, end)
        except BaseException as exc:
            self._record("get", started, exc)
            raise
        self._record("get", started, None)
        metrics.OBJECT_BYTES.labels(self._broker, "get").inc(len(data))
        return data

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        started = time.perf_counter()
        try:
            data, etag = await self.inner.get_with_etag(key)
        except BaseException as exc:
            self._record("get", started, exc)
            raise
        self._record("get", started, None)
        metrics.OBJECT_BYTES.labels(self._broker, "get").inc(len(data))
        return data, etag

    async def head(self, key: str) -> ObjectInfo:
        started = time.perf_counter()
        try:
            info = await self.inner.head(key)
        except BaseException as exc:
            self._record("head", started, exc)
            raise
        self._record("head", started, None)
        return info

    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        started = time.perf_counter()
        try:
            out = await self.inner.list(prefix, start_after)
        except BaseException as exc:
            self._record("list", started, exc)
            raise
        self._record("list", started, None)
        return out

    async def delete(self, keys: builtins.list[str]) -> None:
        started = time.perf_counter()
        try:
            await self.inner.delete(keys)
        except BaseException as exc:
            self._record("delete", started, exc)
            raise
        self._record("delete", started, None)

    async def close(self) -> None:
        await self.inner.close()
