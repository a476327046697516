"""Helpers for storage tests: real object-store wrappers that count or fail requests."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from tidalmq_broker.protocol.records import build_batch, iter_headers
from tidalmq_broker.storage.objectstore.base import (
    ObjectInfo,
    ObjectStore,
    ObjectStoreUnavailable,
)


class CountingStore(ObjectStore):
    """Counts requests per operation (and WAL PUTs) on a real store."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.ops: Counter[str] = Counter()
        self.keys_put: list[str] = []

    def reset(self) -> None:
        self.ops.clear()
        self.keys_put.clear()

    async def put(self, key, data, *, if_none_match=False, if_match=None):  # type: ignore[no-untyped-def]
        self.ops["put"] += 1
        self.keys_put.append(key)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        self.ops["get"] += 1
        if start is not None or end is not None:
            self.ops["ranged_get"] += 1
        data = await self.inner.get(key, start, end)
        self.ops["bytes_read"] += len(data)
        return data

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        self.ops["get"] += 1
        return await self.inner.get_with_etag(key)

    async def head(self, key: str) -> ObjectInfo:
        self.ops["head"] += 1
        return await self.inner.head(key)

    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        self.ops["list"] += 1
        return await self.inner.list(prefix, start_after)

    async def delete(self, keys: list[str]) -> None:
        self.ops["delete"] += 1
        await self.inner.delete(keys)

    async def close(self) -> None:
        await self.inner.close()

    def wal_puts(self) -> int:
        return sum(1 for k in self.keys_put if k.startswith("wal/"))


class FaultyStore(CountingStore):
    """Fails PUTs whose key matches `fail_put` while it is set.

    mode "before": the PUT never reaches the store; mode "after": the first attempt writes the
    object but the caller is told it failed (an ambiguous timeout), and retries fail too. `gate`, when set, holds matching PUTs until
    it is opened.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.fail_put: Callable[[str], bool] | None = None
        self.mode = "before"
        self.gate: asyncio.Event | None = None
        self.landed: set[str] = set()
        self.gate_match: Callable[[str], bool] = lambda key: key.startswith("wal/")

    async def put(self, key, data, *, if_none_match=False, if_match=None):  # type: ignore[no-untyped-def]
        if self.gate is not None and self.gate_match(key):
            await self.gate.wait()
        if self.fail_put is not None and self.fail_put(key):
            self.ops["failed_put"] += 1
            if self.mode == "after" and key not in self.landed:
                await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
                self.landed.add(key)
            raise ObjectStoreUnavailable(f"injected failure of PUT {key}")
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


def batch(
    n: int = 1,
    *,
    value_size: int = 100,
    tag: bytes = b"",
    timestamp_ms: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    value = (tag + b"x" * value_size)[:value_size]
    return build_batch(
        [(b"key-%d" % i, value) for i in range(n)],
        timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def idempotent_batch(producer_id: int, base_sequence: int, n: int = 2, epoch: int = 0) -> bytes:
    """`n` records of an idempotent producer from `base_sequence`, at a fixed timestamp."""
    return batch(
        n,
        timestamp_ms=1_700_000_000_000,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
    )


def batches_of(records: bytes) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, bytes after the base offset field) of each batch; the tail
    is what the producer sent, untouched by the broker except the leader epoch."""
    view = memoryview(records)
    out = []
    for h in iter_headers(view, verify_crc=True):
        out.append(
            (h.base_offset, h.last_offset, bytes(view[h.position + 17 : h.position + h.size]))
        )
    return out


def payload(records: bytes) -> bytes:
    """What a producer sent, minus the header fields the broker patches."""
    return bytes(records[17:])


async def read_all(log, start: int = 0, max_bytes: int = 1 << 20) -> list[tuple[int, int, bytes]]:  # type: ignore[no-untyped-def]
    out: list[tuple[int, int, bytes]] = []
    offset = start
    while offset < log.high_watermark:
        result = await log.read(offset, max_bytes)
        got = batches_of(result.records)
        assert got, f"empty read at {offset} below high watermark {log.high_watermark}"
        for base, last, tail in got:
            if last >= offset:
                out.append((base, last, tail))
                offset = last + 1
    return out
