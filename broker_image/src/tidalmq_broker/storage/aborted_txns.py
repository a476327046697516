"""The aborted-transactions index of one partition (Kafka's transaction index, KIP-98).

One entry per aborted transaction that wrote data here: (producer id, first offset, offset of
its abort marker), appended in marker order (so sorted by last offset). A read_committed Fetch
returns the (producer id, first offset) of the entries overlapping the offsets it returns; the
client drops those producers' records from the first offset up to the marker. Persisted in the
partition checkpoint (`aborted_txns`) and rebuilt from the WAL index by recovery.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tidalmq_broker.storage.empty import EMPTY_LIST


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    last_offset: int  # the abort marker's offset (first: the list is sorted by it)
    producer_id: int
    first_offset: int


class AbortedTxns:
    __slots__ = ("_entries", "_lasts")

    def __init__(self, entries: list[AbortedTxn] | None = None) -> None:
        # most partitions never see an aborted transaction: the shared read-only empty list
        # until the first one (storage/empty.py)
        self._entries: list[AbortedTxn] = EMPTY_LIST
        self._lasts: list[int] = EMPTY_LIST
        if entries:
            self._entries = sorted(entries)
            self._lasts = [e.last_offset for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def add(self, producer_id: int, first_offset: int, last_offset: int) -> None:
        entry = AbortedTxn(last_offset, producer_id, first_offset)
        if not self._entries:
            self._entries, self._lasts = [entry], [last_offset]
            return
        if last_offset < self._entries[-1].last_offset:
            i = bisect.bisect_right(self._lasts, last_offset)  # recovery never does this
            self._entries.insert(i, entry)
            self._lasts.insert(i, last_offset)
            return
        self._entries.append(entry)
        self._lasts.append(last_offset)

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with data in
        [start, end], by first offset (what FetchResponse.AbortedTransactions carries)."""
        found = [(e.producer_id, e.first_offset) for e in self.overlapping_entries(start, end)]
        found.sort(key=lambda pf: (pf[1], pf[0]))
        return found

    def overlapping_entries(self, start: int, end: int) -> list[AbortedTxn]:
        """The entries of the aborted transactions with data or marker in [start, end], by
        marker offset (what the log cleaner's transaction tracker reads)."""
        i = bisect.bisect_left(self._lasts, start)
        return [e for e in self._entries[i:] if e.first_offset <= end]

    def remove(self, entries: list[AbortedTxn]) -> int:
        """Forget `entries` (transactions whose abort marker the log cleaner removed, or kept
        with no data left to filter); returns how many were present."""
        gone = set(entries)
        kept = [e for e in self._entries if e not in gone]
        removed = len(self._entries) - len(kept)
        if removed:
            self._entries = kept
            self._lasts = [e.last_offset for e in kept]
        return removed

    def drop_before(self, offset: int) -> int:
        """Forget the transactions that ended below `offset` (the new log start)."""
        i = bisect.bisect_left(self._lasts, offset)
        if i == 0:
            return 0  # nothing to forget (and the shared empty list takes no del)
        del self._entries[:i]
        del self._lasts[:i]
        return i

    def copy(self) -> AbortedTxns:
        return AbortedTxns(self._entries)

    def to_json(self) -> list[list[int]]:
        return [[e.producer_id, e.first_offset, e.last_offset] for e in self._entries]

    @classmethod
    def from_json(cls, raw: list[list[int]]) -> AbortedTxns:
        return cls([AbortedTxn(int(last), int(pid), int(first)) for pid, first, last in raw])
