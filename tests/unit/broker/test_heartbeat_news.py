"""[M1] 4: a heartbeat carries a bounded share of what changed, oldest first.

A topic's creation opens thousands of partitions on each broker at once; the heartbeat that
reported all of them (1 MB of JSON at 11,000) was the slowest one to be answered. The share per
heartbeat is capped (`NEWS_PER_HEARTBEAT`), the rest goes in the next heartbeats, and nothing is
starved: partitions left for later go before any that changed since.
"""

from __future__ import annotations

from pathlib import Path

from tidalmq_broker.heartbeat_news import PendingLooks
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import topic_record

from tests.support.partition_managers import apply_records, partition_manager


def tps(topic: str, n: int) -> list[TopicPartition]:
    return [TopicPartition(topic, i) for i in range(n)]


def test_each_heartbeat_looks_at_a_bounded_share_until_all_are_done() -> None:
    looks = PendingLooks(per_heartbeat=100)
    looks.add(tps("orders", 250))
    seen: list[set[TopicPartition]] = []
    while len(looks):
        share = looks.next()
        assert 0 < len(share) <= 100
        seen.append(share)
        looks.done(share)
    assert [len(s) for s in seen] == [100, 100, 50]
    assert set().union(*seen) == set(tps("orders", 250))


def test_partitions_changing_all_the_time_do_not_starve_the_others() -> None:
    looks = PendingLooks(per_heartbeat=100)
    # written to between every two heartbeats, and first in any fixed order (a set's, by name)
    hot = tps("a-hot", 100)
    cold = tps("b-cold", 150)
    looks.add(hot)
    looks.add(cold)
    for _ in range(3):
        share = looks.next()
        looks.done(share)
        looks.add(hot)  # changed again since
    # the cold ones were reached within the heartbeats that followed: none is left
    assert looks.all() == set(hot)


def test_an_answer_that_never_came_leaves_the_share_for_the_next_heartbeat() -> None:
    looks = PendingLooks(per_heartbeat=10)
    looks.add(tps("orders", 30))
    first = looks.next()
    assert looks.next() == first  # no answer: the same share again
    looks.add(first)  # changed again meanwhile: still first in line
    assert looks.next() == first


async def test_open_changes_are_handed_out_oldest_first_within_the_limit(tmp_path: Path) -> None:
    async with partition_manager(tmp_path / "objects") as (_engine, manager):
        meta = ClusterMetadata(cluster_id="c", version=1)
        manager.apply(meta)
        states = [PartitionState(leader=0, leader_epoch=0, replicas=[0]) for _ in range(25)]
        apply_records(manager, meta, topic_record(TopicInfo("orders", "id-orders", states)))
        assert await manager.wait_settled(30)
        assert len(manager.open_changes()) == 25
        first = manager.open_changes(limit=10)
        assert len(first) == 10
        manager.ack_open_changes(first)
        rest = manager.open_changes(limit=10)
        assert len(rest) == 10 and not set(rest) & set(first)
        manager.ack_open_changes(rest)
        assert len(manager.open_changes(limit=10)) == 5
