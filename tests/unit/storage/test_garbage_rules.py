from __future__ import annotations

from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.garbage import (
    CheckpointRefs,
    CheckpointRefsCache,
    OwnWalTracker,
    segment_garbage,
    wal_garbage,
)
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore.base import ObjectInfo


def obj(key: str, age: float = 100.0) -> ObjectInfo:
    return ObjectInfo(key, 10, "e", 1000.0 - age)


def checkpoint(
    owner: tuple[str, str], position: int, refs: list[str] = (), partition: int = 0
) -> Checkpoint:  # type: ignore[assignment]
    return Checkpoint(
        "t",
        "id",
        partition,
        1,
        owner[0],
        owner[1],
        position,
        index=[IndexEntry(i, i, k, 0, 1, 0) for i, k in enumerate(refs)],
    )


def cp(
    owner: tuple[str, str], position: int, refs: list[str] = (), partition: int = 0
) -> CheckpointRefs:  # type: ignore[assignment]
    return CheckpointRefs.of(checkpoint(owner, position, refs, partition))


def test_wal_object_rules() -> None:
    objects = [obj(f"wal/1/a/{s:012d}") for s in range(5)] + [obj("wal/2/b/000000000000")]
    checkpoints = [
        cp(("1", "a"), 2, refs=["wal/1/a/000000000001"]),  # needs seq 3, 4 for recovery; refs 1
        cp(("1", "a"), 3, partition=1),  # a second partition of the same owner: min position 2
    ]
    deletable = wal_garbage(objects, checkpoints, now_s=1000, grace_s=10)
    # 0 and 2: unreferenced and at or below every position of their incarnation;
    # 1 referenced; 3, 4 may be needed to recover; wal/2/b: no checkpoint mentions it any more
    assert deletable == ["wal/1/a/000000000000", "wal/1/a/000000000002", "wal/2/b/000000000000"]


def test_grace_and_keep_protect_objects() -> None:
    objects = [obj("wal/1/a/000000000000", age=5), obj("wal/1/a/000000000001")]
    assert wal_garbage(objects, [], now_s=1000, grace_s=10) == ["wal/1/a/000000000001"]
    assert wal_garbage(objects, [], now_s=1000, grace_s=10, keep={"wal/1/a/000000000001"}) == []


def test_segment_rules() -> None:
    prefix = "partitions/t/id/0/"
    objects = [
        obj(prefix + "checkpoint"),
        obj(prefix + "segments/1-a"),
        obj(prefix + "segments/2-b"),
        obj(prefix + "segments/3-c", age=1),
    ]
    checkpoints = [cp(("1", "a"), 0, refs=[prefix + "segments/1-a"])]
    assert segment_garbage(objects, checkpoints, now_s=1000, grace_s=10) == [
        prefix + "segments/2-b"
    ]


def test_own_tracker_frees_objects_when_every_partition_moved_past_them() -> None:
    t = OwnWalTracker()
    t.written(0, "wal/1/a/000000000000", {"p0", "p1"})
    t.written(1, "wal/1/a/000000000001", {"p0"})
    assert t.committed("p0", 1, {"wal/1/a/000000000001"}) == []  # p1 still needs seq 0
    assert t.committed("p1", 0, set()) == ["wal/1/a/000000000000"]
    assert t.committed("p0", 0, set()) == []  # position below seq 1: still needed
    assert t.committed("p0", 5, set()) == ["wal/1/a/000000000001"]
    assert len(t) == 0


def test_own_tracker_hands_released_partitions_to_the_sweep() -> None:
    t = OwnWalTracker()
    t.written(0, "wal/1/a/000000000000", {"p0", "p1"})
    t.released("p0")
    assert len(t) == 0
    assert t.committed("p1", 9, set()) == []


def test_the_sweep_reads_only_checkpoints_written_since_the_last_one() -> None:
    """A checkpoint listed with the etag it had at the last sweep is not read again; a new or
    rewritten one is; one no longer listed is forgotten."""
    cache = CheckpointRefsCache()
    a = ObjectInfo("partitions/t/id/0/checkpoint", 10, "a1", 0.0)
    b = ObjectInfo("partitions/t/id/1/checkpoint", 10, "b1", 0.0)
    assert cache.to_load([a, b]) == [a, b]
    cache.put(a, checkpoint(("1", "x"), 3, refs=["wal/1/x/000000000003"]))
    cache.put(b, checkpoint(("1", "x"), 5, partition=1))
    assert cache.to_load([a, b]) == []  # nothing written: nothing read
    a2 = ObjectInfo(a.key, 10, "a2", 1.0)
    assert cache.to_load([a2, b]) == [a2]
    cache.put(a2, checkpoint(("1", "x"), 4))
    assert sorted(r.wal_position for r in cache.refs()) == [4, 5]
    assert [r.wal for r in cache.refs() if r.wal_position == 4] == [frozenset()]
    assert cache.to_load([b]) == [] and len(cache) == 1  # partition 0's checkpoint deleted
    cache.put(b, None)  # gone between the listing and the read
    assert cache.refs() == [] and cache.loaded == 4
