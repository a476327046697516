"""The tail cache: recent durable batches of all partitions, bounded in bytes.

Each partition keeps its cached chunks (the batches of one append, as read-only views of the
append's own buffer: the request frame it arrived in or its own copy, from which the WAL object
that made it durable was written) in offset order; the cache evicts globally oldest-first, which
for every partition is its lowest offsets, so a partition's cached data is always one contiguous
offset range ending at its high watermark. A chunk counts its own length; a request frame shared
by several partitions' chunks is freed with the last of them.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from tidalmq_broker.storage.empty import EMPTY_LIST


@dataclass(slots=True)
class _Chunk:
    base_offset: int
    last_offset: int
    data: memoryview


class PartitionCache:
    __slots__ = ("_bases", "_chunks", "_head", "_owner", "bytes")

    # True for TailCache.empty, the one every partition shares until it caches something
    shared: ClassVar[bool] = False

    def __init__(self, owner: TailCache) -> None:
        self._owner = owner
        # the shared read-only empty list until the first chunk (storage/empty.py)
        self._chunks: list[_Chunk] = EMPTY_LIST
        self._bases: list[int] = EMPTY_LIST
        self._head = 0  # index of the oldest live chunk (evicted ones are trimmed lazily)
        self.bytes = 0

    @property
    def start_offset(self) -> int | None:
        return self._chunks[self._head].base_offset if self._head < len(self._chunks) else None

    def add(self, base_offset: int, last_offset: int, data: memoryview) -> None:
        if self._head < len(self._chunks) and base_offset != self._chunks[-1].last_offset + 1:
            self.clear()  # not contiguous (e.g. after a rollback): start again
        if self._chunks is EMPTY_LIST:
            self._chunks, self._bases = [], []
        self._chunks.append(_Chunk(base_offset, last_offset, data))
        self._bases.append(base_offset)
        self.bytes += len(data)
        self._owner._added(self, base_offset, len(data))

    def lookup(self, offset: int, max_bytes: int) -> list[memoryview] | None:
        """Chunks from the one holding `offset` while they fit max_bytes (at least one), or
        None if `offset` is not cached. The first view may start before `offset`."""
        i = bisect.bisect_right(self._bases, offset, lo=self._head) - 1
        if i < self._head or self._chunks[i].last_offset < offset:
            return None
        out = [self._chunks[i].data]
        total = len(out[0])
        for chunk in self._chunks[i + 1 :]:
            if total + len(chunk.data) > max_bytes:
                break
            out.append(chunk.data)
            total += len(chunk.data)
        return out

    def exact(self, base_offset: int, last_offset: int) -> list[memoryview] | None:
        """The cached chunks covering exactly [base_offset, last_offset], or None."""
        i = bisect.bisect_left(self._bases, base_offset, lo=self._head)
        if i >= len(self._chunks) or self._bases[i] != base_offset:
            return None
        out = []
        for chunk in self._chunks[i:]:
            out.append(chunk.data)
            if chunk.last_offset >= last_offset:
                return out if chunk.last_offset == last_offset else None
        return None

    def _evict_head(self, base_offset: int) -> int:
        """Drop the oldest chunk if it is still the one the cache queued; returns bytes freed."""
        if self._head >= len(self._chunks) or self._chunks[self._head].base_offset != base_offset:
            return 0
        size = len(self._chunks[self._head].data)
        self._chunks[self._head] = _Chunk(0, -1, memoryview(b""))
        self._head += 1
        self.bytes -= size
        if self._head > 64 and self._head * 2 > len(self._chunks):
            del self._chunks[: self._head]
            del self._bases[: self._head]
            self._head = 0
        return size

    def holds(self, base_offset: int) -> bool:
        i = bisect.bisect_left(self._bases, base_offset, lo=self._head)
        return i < len(self._bases) and self._bases[i] == base_offset

    def drop_before(self, offset: int) -> None:
        n = 0
        while self._head < len(self._chunks) and self._chunks[self._head].last_offset < offset:
            self._owner._freed(self._evict_head(self._chunks[self._head].base_offset))
            n += 1
        self._owner._stale(n)

    def clear(self) -> None:
        self._owner._freed(self.bytes)
        self._owner._stale(len(self._chunks) - self._head)
        self._chunks, self._bases, self._head, self.bytes = EMPTY_LIST, EMPTY_LIST, 0, 0


class _EmptyPartitionCache(PartitionCache):
    """The cache of every partition that has cached nothing yet (TailCache.empty): it finds
    nothing, has nothing to free and refuses chunks, so that no partition's data can land in
    what all of them share; a partition takes its own (TailCache.partition) before its first."""

    __slots__ = ()
    shared: ClassVar[bool] = True

    def add(self, base_offset: int, last_offset: int, data: memoryview) -> None:
        raise TypeError("the shared empty partition cache takes no chunks: make one of your own")

    def clear(self) -> None:
        pass  # nothing cached, nothing to free


class TailCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.bytes = 0
        self._fifo: deque[tuple[PartitionCache, int]] = deque()
        self._stale_entries = 0
        # shared by the partitions with nothing cached yet: a creation opens thousands, each
        # cache of their own one more object for the garbage collector (docs/control-plane.md)
        self.empty: PartitionCache = _EmptyPartitionCache(self)

    def partition(self) -> PartitionCache:
        return PartitionCache(self)

    def _added(self, pc: PartitionCache, base_offset: int, size: int) -> None:
        self._fifo.append((pc, base_offset))
        self.bytes += size
        while self.bytes > self.capacity and self._fifo:
            victim, base = self._fifo.popleft()
            self.bytes -= victim._evict_head(base)

    def _freed(self, size: int) -> None:
        self.bytes -= size

    def _stale(self, n: int) -> None:
        """`n` queued entries no longer refer to cached chunks; purge them now and then so
        the queue stays proportional to what is cached."""
        self._stale_entries += n
        if self._stale_entries > 1024 and self._stale_entries * 2 > len(self._fifo):
            self._fifo = deque((pc, base) for pc, base in self._fifo if pc.holds(base))
            self._stale_entries = 0
