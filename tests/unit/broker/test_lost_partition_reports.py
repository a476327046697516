"""A broker that refuses a partition whose data is missing tells the controller at every epoch
it refuses it at, not only the first time.

The controller records a loss only at the partition's current epoch (an older one is a stale
report, ignored). A restarted broker's registration bumps the epochs of its partitions, and a
push of an earlier committed version can reach it first: it then refuses each partition at the
old epoch (a report the controller ignores) and at once at the new one. Reporting the same loss
only once left such a partition unrecorded: `local status` never listed it (a CI failure of
tests/integration/cluster/test_data_loss.py). A slow retry at the same epoch is still not news.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.partitions import PartitionStorageError
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import topic_record

from tests.support.partition_managers import apply_records, partition_manager

TP = TopicPartition("orders", 0)


def orders(epoch: int) -> TopicInfo:
    """Led by broker 0 at `epoch`; created, 1,000 offsets acknowledged (its data is gone: the
    store is empty)."""
    part = PartitionState(
        leader=0, leader_epoch=epoch, replicas=[0], created=True, end_offset_floor=1000
    )
    return TopicInfo("orders", "id-orders", [part])


async def test_the_same_loss_is_reported_again_at_a_new_epoch(tmp_path: Path) -> None:
    reports: list[tuple[str, int, Any]] = []

    async def report(kind: str, tp: TopicPartition, epoch: int, **detail: Any) -> None:
        if tp == TP:
            reports.append((kind, epoch, detail.get("loss")))

    async with partition_manager(tmp_path / "objects") as (_engine, manager):
        manager.add_report(report)
        meta = ClusterMetadata(cluster_id="c", version=1)
        manager.apply(meta)

        def update(epoch: int) -> None:
            apply_records(manager, meta, topic_record(orders(epoch)))

        update(1)  # the pushed version from before the registration
        assert await manager.wait_settled(30)
        update(2)  # the registration's: the epoch bumped
        assert await manager.wait_settled(30)
        assert [(kind, epoch) for kind, epoch, _ in reports] == [("lost", 1), ("lost", 2)]
        first, again = reports[0][2], reports[1][2]
        assert (again.expected_end, again.found_end, again.reason) == (
            1000,
            0,
            "checkpoint missing",
        )
        assert again.detected_ms == first.detected_ms  # the same loss, found when first found
        with pytest.raises(PartitionStorageError):
            manager.get_log(TP)

        # a retry at the same epoch (the store looked at again) finds the same: not news
        manager.wake_all()
        assert await manager.wait_settled(30)
        assert len(reports) == 2
