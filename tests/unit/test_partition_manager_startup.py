"""A broker that has not applied the controller's first snapshot yet answers a partition it does
not lead with NOT_LEADER (retriable: the client refreshes its metadata and retries), not
UNKNOWN_TOPIC_OR_PARTITION as if the topic did not exist; once it has metadata, a topic it does
not know is unknown."""

from __future__ import annotations

import pytest
from tidalmq_broker.partitions import NotLeader, PartitionManager, UnknownPartition
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.model import TopicPartition


class NoPartitions:
    """An engine with nothing open."""

    def get(self, tp: TopicPartition) -> None:
        return None

    def partitions(self) -> list[TopicPartition]:
        return []

    def has_topic(self, name: str) -> bool:
        return False


def test_no_metadata_yet_is_not_leader_then_unknown() -> None:
    pm = PartitionManager(NoPartitions(), 0)  # type: ignore[arg-type]
    tp = TopicPartition("orders", 0)
    with pytest.raises(NotLeader):
        pm.local_log(tp)
    pm.apply(ClusterMetadata(cluster_id="c", controller_epoch=1, version=1))
    with pytest.raises(UnknownPartition):
        pm.local_log(tp)
