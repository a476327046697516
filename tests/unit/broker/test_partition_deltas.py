"""[M1] A broker applies a topic's creation or deletion in O(the partitions it leads there).

Creating a topic of N partitions on B brokers used to make, on every broker, a TopicPartition
and two lookups for each of the N partitions (to find the ones wished or open here that must be
given up); when no partition of the topic is wished or open on the broker (a creation, a topic
it leads nothing of), only the partitions it leads are looked at (`PartitionMap.has_topic`).
The work is counted (function calls, sys.setprofile), not timed. The other tests check that
what must be given up still is: a replaced or deleted topic's open partitions are closed.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import sys
from pathlib import Path
from types import FrameType

import pytest
from tidalmq_broker import partitions
from tidalmq_broker.partitions import LeaderNotAvailable, PartitionManager
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import PartitionMap, TopicPartition
from tidalmq_core.records import (
    MetadataDelta,
    apply_batch,
    partition_record,
    topic_record,
    topic_removed_record,
)

from tests.support.partition_managers import apply_records, partition_manager

LED_HERE = 10


def led_by(partitions: int, here: set[int]) -> list[PartitionState]:
    """Broker 0 leads the partitions in `here`, broker 1 the others."""
    return [
        PartitionState(
            leader=0 if i in here else 1, leader_epoch=0, replicas=[0 if i in here else 1]
        )
        for i in range(partitions)
    ]


def count_calls(manager: PartitionManager, meta: ClusterMetadata, delta: MetadataDelta) -> int:
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(profile)
    try:
        manager.apply_delta(meta, delta)
    finally:
        sys.setprofile(None)
    return calls


async def test_creation_and_deletion_cost_the_partitions_led_here(tmp_path: Path) -> None:
    work: dict[int, tuple[int, int]] = {}
    for n in (1_000, 50_000):
        async with partition_manager(tmp_path / f"objects-{n}") as (engine, manager):
            meta = ClusterMetadata(cluster_id="c", version=1)
            manager.apply(meta)
            here = set(range(0, n, n // LED_HERE))
            topic = TopicInfo("orders", "id-orders", led_by(n, here))
            delta = apply_batch(meta, [topic_record(topic)], 2)
            created = count_calls(manager, meta, delta)
            assert await manager.wait_settled(60)
            assert sorted(engine.partitions()) == sorted(TopicPartition("orders", i) for i in here)
            # a topic this broker leads nothing of, deleted
            other = TopicInfo("payments", "id-payments", led_by(n, set()))
            apply_batch(meta, [topic_record(other)], 3)
            delta = apply_batch(meta, [topic_removed_record("payments")], 4)
            deleted = count_calls(manager, meta, delta)
            work[n] = (created, deleted)
    (small_created, small_deleted), (large_created, large_deleted) = work[1_000], work[50_000]
    # one call per partition of the topic would be 49,000 more
    assert large_created <= small_created + 100, work
    assert large_deleted <= small_deleted + 100, work


async def test_replaced_and_deleted_topics_still_close_what_is_open_here(tmp_path: Path) -> None:
    async with partition_manager(tmp_path / "objects") as (engine, manager):
        meta = ClusterMetadata(cluster_id="c", version=1)
        manager.apply(meta)

        def update(*records: dict[str, object]) -> None:
            apply_records(manager, meta, *records)

        def open_here(name: str) -> list[int]:
            return sorted(tp.partition for tp in engine.partitions() if tp.topic == name)

        update(topic_record(TopicInfo("orders", "id-1", led_by(100, {1, 2, 3}))))
        assert await manager.wait_settled(30)
        assert open_here("orders") == [1, 2, 3]
        # replaced by a new incarnation this broker leads only partition 2 of (and which is
        # shorter: partition 3 no longer exists)
        update(topic_record(TopicInfo("orders", "id-2", led_by(3, {2}))))
        assert await manager.wait_settled(30)
        assert open_here("orders") == [2]
        assert engine.get(TopicPartition("orders", 2)).topic_id == "id-2"  # type: ignore[union-attr]
        # deleted, and at once created again (the deletion's closes under way) led elsewhere
        update(topic_removed_record("orders"))
        update(topic_record(TopicInfo("orders", "id-3", led_by(10, set()))))
        assert await manager.wait_settled(30)
        assert open_here("orders") == []
        assert manager.leading_count() == 0


def test_partition_map_knows_its_topics() -> None:
    m: PartitionMap[int] = PartitionMap()
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    m[a0] = 1
    m[a0] = 2  # replaced: still one partition of a
    m[a1] = 3
    m.setdefault(b0, 4)
    assert m.has_topic("a") and m.has_topic("b") and not m.has_topic("c")
    del m[a0]
    assert m.has_topic("a")
    assert m.pop(a1) == 3
    assert m.pop(a1, None) is None
    assert not m.has_topic("a")
    m.update({a0: 5})
    m |= {a1: 6}
    assert m.has_topic("a") and dict(m) == {a0: 5, a1: 6, b0: 4}
    m.popitem()
    m.popitem()
    m.popitem()
    assert not m and not m.has_topic("a") and not m.has_topic("b")
    m[b0] = 7
    m.clear()
    assert not m.has_topic("b")


def test_a_copied_partition_map_has_its_own_count() -> None:
    """Copies (copy, deepcopy, pickle, .copy()) rebuild the per-topic count from the entries:
    changing a copy leaves the original's `has_topic` as it was, and the reverse."""
    m: PartitionMap[int] = PartitionMap()
    a0, b0 = TopicPartition("a", 0), TopicPartition("b", 0)
    m[a0] = 1
    for made in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m)), m.copy()):
        assert isinstance(made, PartitionMap) and dict(made) == {a0: 1}
        del made[a0]
        made[b0] = 2
        assert not made.has_topic("a") and made.has_topic("b")
        assert m.has_topic("a") and not m.has_topic("b"), "the copy's change is its own"


async def half_of_orders_open(manager: PartitionManager) -> tuple[ClusterMetadata, set[int]]:
    """Topic "orders" of 1,000 partitions, the even ones led (and opened) here: the metadata
    and the partitions led here."""
    meta = ClusterMetadata(cluster_id="c", version=1)
    manager.apply(meta)
    here = set(range(0, 1_000, 2))
    apply_records(manager, meta, topic_record(TopicInfo("orders", "id", led_by(1_000, here))))
    assert await manager.wait_settled(30)
    return meta, here


async def test_a_delta_parses_each_topics_configs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta naming hundreds of partitions of one topic (a wave of moves, or of first
    checkpoints stored marking them created) parses the topic's configs once, not once per
    partition (about 0.15 ms each: most of a new broker's metadata work while its moved
    partitions took their first writes)."""
    async with partition_manager(tmp_path / "objects") as (_engine, manager):
        meta, here = await half_of_orders_open(manager)
        parsed = 0
        real = partitions.partition_config

        def counting(topic: TopicInfo) -> PartitionConfig:
            nonlocal parsed
            parsed += 1
            return real(topic)

        monkeypatch.setattr(partitions, "partition_config", counting)
        delta = apply_batch(
            meta,
            [partition_record(TopicPartition("orders", i), created=True) for i in sorted(here)],
            3,
        )
        manager.apply_delta(meta, delta)
        assert parsed == 1
        assert await manager.wait_settled(30)


async def test_open_partitions_marked_created_are_not_looked_at_again(tmp_path: Path) -> None:
    """The controller marks a partition created once its first checkpoint is stored (its
    first write): for a partition open here at its epoch that changes nothing, so no worker
    looks at it again (a wave of first writes marked hundreds at once, on every broker). One
    not open yet still is, and one whose epoch changed is reopened."""
    async with partition_manager(tmp_path / "objects") as (engine, manager):
        meta, here = await half_of_orders_open(manager)
        woken: list[TopicPartition] = []
        wake = manager._wake

        def counting(tp: TopicPartition) -> None:
            woken.append(tp)
            wake(tp)

        manager._wake = counting  # type: ignore[method-assign]
        records = [partition_record(TopicPartition("orders", i), created=True) for i in here]
        apply_records(manager, meta, *records)
        assert woken == []
        assert manager.is_settled()
        moved = TopicPartition("orders", 0)
        apply_records(manager, meta, partition_record(moved, leader_epoch=1, created=False))
        assert woken == [moved]
        assert await manager.wait_settled(30)
        assert engine.get(moved).leader_epoch == 1  # type: ignore[union-attr]


async def test_a_partition_a_client_asks_for_opens_before_those_nobody_asked_for(
    tmp_path: Path,
) -> None:
    """Thousands of partitions arriving at once (a new broker's moves) open one after the
    other; a client's request for one still waiting is answered LEADER_NOT_AVAILABLE and that
    partition goes to the front, so the client's retry finds it open, not still behind the
    others."""
    async with partition_manager(tmp_path / "objects") as (engine, manager):
        meta = ClusterMetadata(cluster_id="c", version=1)
        manager.apply(meta)
        n = 3_000
        apply_records(
            manager, meta, topic_record(TopicInfo("orders", "id", led_by(n, set(range(n)))))
        )
        last = TopicPartition("orders", n - 1)
        with pytest.raises(LeaderNotAvailable):
            manager.get_log(last)
        for _ in range(100_000):  # loop turns, until the workers opened it
            if engine.get(last) is not None:
                break
            await asyncio.sleep(0)
        assert engine.get(last) is not None
        assert len(engine.partitions()) < n // 2
        assert await manager.wait_settled(30)
