"""The offset index of a partition: which object holds which offsets.

Entries are contiguous in offset order and never overlap. Each covers whole batches in one
object's byte range; lookups by offset bisect the base offsets, lookups by timestamp bisect a
running maximum of the entries' max timestamps (the first offset whose timestamp is >= t lies in
the first entry whose running maximum reaches t).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tidalmq_broker.storage.empty import EMPTY_LIST
from tidalmq_broker.storage.keys import WAL_ROOT


@dataclass(frozen=True, slots=True)
class IndexEntry:
    base_offset: int
    last_offset: int
    key: str
    position: int
    size: int
    max_timestamp: int

    @property
    def in_wal(self) -> bool:
        return self.key.startswith(WAL_ROOT)

    @property
    def end_position(self) -> int:
        return self.position + self.size

    def to_json(self) -> list[object]:
        return [
            self.base_offset,
            self.last_offset,
            self.key,
            self.position,
            self.size,
            self.max_timestamp,
        ]

    @classmethod
    def from_json(cls, raw: list[Any]) -> IndexEntry:
        base, last, key, position, size, max_ts = raw
        return cls(int(base), int(last), str(key), int(position), int(size), int(max_ts))


class OffsetIndex:
    __slots__ = ("_bases", "_bytes", "_entries", "_max_ts")

    def __init__(self, entries: Iterable[IndexEntry] = ()) -> None:
        # the shared read-only empty list until the first entry (storage/empty.py)
        self._entries: list[IndexEntry] = EMPTY_LIST
        self._bases: list[int] = EMPTY_LIST
        self._max_ts: list[int] = EMPTY_LIST  # running maximum of max_timestamp
        self._bytes = 0
        for entry in entries:
            self.append(entry)

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, i: int) -> IndexEntry:
        return self._entries[i]

    @property
    def entries(self) -> list[IndexEntry]:
        return list(self._entries)

    def slice(self, start: int, stop: int) -> list[IndexEntry]:
        return self._entries[start:stop]

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def start_offset(self) -> int | None:
        return self._entries[0].base_offset if self._entries else None

    @property
    def end_offset(self) -> int | None:
        """One past the last offset indexed."""
        return self._entries[-1].last_offset + 1 if self._entries else None

    def find(self, offset: int) -> int | None:
        """Position of the entry holding `offset`, or None."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or self._entries[i].last_offset < offset:
            return None
        return i

    def find_timestamp(self, timestamp_ms: int) -> int | None:
        """Position of the first entry that may hold a batch with max timestamp >= t."""
        i = bisect.bisect_left(self._max_ts, timestamp_ms)
        return i if i < len(self._entries) else None

    def wal_keys(self) -> set[str]:
        return {e.key for e in self._entries if e.in_wal}

    def keys(self) -> set[str]:
        return {e.key for e in self._entries}

    def wal_ranges(self) -> int:
        return sum(1 for e in self._entries if e.in_wal)

    # ---------------------------------------------------------------- changes
    def append(self, entry: IndexEntry) -> None:
        if entry.last_offset < entry.base_offset or entry.size <= 0:
            raise ValueError(f"bad index entry {entry}")
        if not self._entries:  # the first entry: lists of its own
            self._entries, self._bases = [entry], [entry.base_offset]
            self._max_ts = [max(entry.max_timestamp, -1)]
            self._bytes += entry.size
            return
        if entry.base_offset != self._entries[-1].last_offset + 1:
            raise ValueError(
                f"index entry at {entry.base_offset} does not follow {self._entries[-1].last_offset}"
            )
        self._entries.append(entry)
        self._bases.append(entry.base_offset)
        self._max_ts.append(max(entry.max_timestamp, self._max_ts[-1]))
        self._bytes += entry.size

    def drop_before(self, offset: int) -> list[IndexEntry]:
        """Remove entries wholly below `offset`; returns them."""
        n = 0
        while n < len(self._entries) and self._entries[n].last_offset < offset:
            n += 1
        if n == 0:
            return []
        dropped = self._entries[:n]
        self._rebuild(self._entries[n:])
        return dropped

    def truncate_from(self, offset: int) -> list[IndexEntry]:
        """Remove entries at or after `offset` (they must start exactly there or later)."""
        n = len(self._entries)
        while n > 0 and self._entries[n - 1].base_offset >= offset:
            n -= 1
        dropped = self._entries[n:]
        if dropped:
            self._rebuild(self._entries[:n])
        return dropped

    def replace(self, old: list[IndexEntry], new: list[IndexEntry]) -> bool:
        """Swap a contiguous run `old` for `new` covering the same offsets (compaction).
        Returns False if the run is no longer present unchanged."""
        if not old:
            return False
        i = self.find(old[0].base_offset)
        if i is None or self._entries[i : i + len(old)] != old:
            return False
        if new[0].base_offset != old[0].base_offset or new[-1].last_offset != old[-1].last_offset:
            raise ValueError("replacement must cover the same offsets")
        self._rebuild([*self._entries[:i], *new, *self._entries[i + len(old) :]])
        return True

    def _rebuild(self, entries: list[IndexEntry]) -> None:
        self._entries, self._bases, self._max_ts, self._bytes = (
            EMPTY_LIST,
            EMPTY_LIST,
            EMPTY_LIST,
            0,
        )
        for entry in entries:
            self.append(entry)
