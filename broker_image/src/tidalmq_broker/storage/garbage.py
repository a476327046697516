"""Which objects nobody needs any more.

A WAL object may go when (1) no checkpoint's index references it, (2) no checkpoint owned by its
incarnation has a WAL position below its sequence (that partition might still need it to
recover), and (3) it is older than the grace period (protects objects being written and
checkpoints being committed). A segment may go when its partition's checkpoint does not
reference it and it is older than the grace period (orphans of a compaction whose commit lost).

`OwnWalTracker` is the fast path for this broker's own WAL objects: it knows which partitions
have data in each object and drops an object as soon as every such partition has committed a
checkpoint that no longer needs it. Objects whose partitions left this broker before that are
handed to the periodic sweep.

The sweep lists the store and needs every checkpoint's references. `CheckpointRefs` keeps what
it needs of one checkpoint between sweeps under the etag the listing showed: a sweep reads only
the checkpoints written since the last one (O(partitions written), not one GET per partition of
the cluster every interval on every broker). An unchanged etag is unchanged content, so a kept
entry is never older than the checkpoint it stands for.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.keys import parse_partition_key, parse_wal_key
from tidalmq_broker.storage.objectstore.base import ObjectInfo


@dataclass(frozen=True, slots=True)
class CheckpointRefs:
    """What the sweep needs of one checkpoint: the objects its index references and its
    owner's WAL position."""

    wal: frozenset[str]
    segments: frozenset[str]
    owner: tuple[str, str]  # (broker, incarnation)
    wal_position: int

    @classmethod
    def of(cls, cp: Checkpoint) -> CheckpointRefs:
        return cls(
            frozenset(e.key for e in cp.index if e.in_wal),
            frozenset(e.key for e in cp.index if not e.in_wal),
            (cp.owner_broker, cp.owner_incarnation),
            cp.wal_position,
        )


class CheckpointRefsCache:
    """Checkpoint key -> (the etag it was listed with, its references), from sweep to sweep."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, CheckpointRefs]] = {}
        self.loaded = 0  # checkpoints read by the sweeps (tests, the benchmark)

    def __len__(self) -> int:
        return len(self._entries)

    def to_load(self, listed: Iterable[ObjectInfo]) -> list[ObjectInfo]:
        """The listed checkpoints to read: new or written since; forgets unlisted ones."""
        listed = list(listed)
        present = {o.key for o in listed}
        for key in [k for k in self._entries if k not in present]:
            del self._entries[key]
        out = []
        for o in listed:
            kept = self._entries.get(o.key)
            if kept is None or kept[0] != o.etag:
                out.append(o)
        return out

    def put(self, listed: ObjectInfo, cp: Checkpoint | None) -> None:
        """`cp`: the checkpoint read after `listed` (None: it was gone)."""
        self.loaded += 1
        if cp is None:
            self._entries.pop(listed.key, None)
        else:
            self._entries[listed.key] = (listed.etag, CheckpointRefs.of(cp))

    def refs(self) -> list[CheckpointRefs]:
        return [refs for _, refs in self._entries.values()]


def wal_garbage(
    wal_objects: Iterable[ObjectInfo],
    checkpoints: Iterable[CheckpointRefs],
    *,
    now_s: float,
    grace_s: float,
    keep: AbstractSet[str] = frozenset(),
) -> list[str]:
    referenced: set[str] = set()
    min_position: dict[tuple[str, str], int] = {}
    for cp in checkpoints:
        referenced.update(cp.wal)
        owner = cp.owner
        min_position[owner] = min(min_position.get(owner, cp.wal_position), cp.wal_position)
    out = []
    for obj in wal_objects:
        wk = parse_wal_key(obj.key)
        if wk is None or obj.key in referenced or obj.key in keep:
            continue
        if now_s - obj.last_modified < grace_s:
            continue
        position = min_position.get((wk.broker, wk.incarnation))
        if position is not None and position < wk.seq:
            continue
        out.append(obj.key)
    return out


def segment_garbage(
    partition_objects: Iterable[ObjectInfo],
    checkpoints: Iterable[CheckpointRefs],
    *,
    now_s: float,
    grace_s: float,
) -> list[str]:
    """`checkpoints`: the references of every checkpoint listed."""
    referenced: set[str] = set()
    for cp in checkpoints:
        referenced.update(cp.segments)
    out = []
    for obj in partition_objects:
        pk = parse_partition_key(obj.key)
        if pk is None or pk.kind != "segment" or obj.key in referenced:
            continue
        if now_s - obj.last_modified < grace_s:
            continue
        out.append(obj.key)
    return out


@dataclass(slots=True)
class _Tracked:
    key: str
    partitions: set[str] = field(default_factory=set)


class OwnWalTracker:
    def __init__(self) -> None:
        self._objects: dict[int, _Tracked] = {}
        self._by_partition: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def keys(self) -> set[str]:
        return {t.key for t in self._objects.values()}

    def written(self, seq: int, key: str, partitions: Iterable[str]) -> None:
        tracked = _Tracked(key, set(partitions))
        if not tracked.partitions:
            return
        self._objects[seq] = tracked
        for p in tracked.partitions:
            self._by_partition.setdefault(p, []).append(seq)

    def committed(self, partition: str, position: int, referenced: set[str]) -> list[str]:
        """`partition` committed a checkpoint at WAL `position` referencing `referenced`.
        Returns the keys of objects nobody needs any more."""
        seqs = self._by_partition.get(partition)
        if not seqs:
            return []
        free: list[str] = []
        keep: list[int] = []
        for seq in seqs:
            tracked = self._objects.get(seq)
            if tracked is None:
                continue
            if seq > position or tracked.key in referenced:
                keep.append(seq)
                continue
            tracked.partitions.discard(partition)
            if not tracked.partitions:
                del self._objects[seq]
                free.append(tracked.key)
        if keep:
            self._by_partition[partition] = keep
        else:
            del self._by_partition[partition]
        return free

    def released(self, partition: str) -> None:
        """The partition left this broker: its objects are the sweep's business now."""
        for seq in self._by_partition.pop(partition, []):
            tracked = self._objects.pop(seq, None)
            if tracked is None:
                continue
            for other in tracked.partitions - {partition}:
                seqs = self._by_partition.get(other)
                if seqs and seq in seqs:
                    seqs.remove(seq)
