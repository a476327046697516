"""The data-loss fields of the cluster metadata ([O2]): they round-trip through JSON, and a
document written before they existed still loads (an upgrade, not a lost store)."""

from __future__ import annotations

import json

from tidalmq_core.metadata import ClusterMetadata, DataLoss, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition


def test_partition_state_and_cluster_fields_round_trip() -> None:
    loss = DataLoss(
        expected_end=3000,
        found_end=120,
        detected_ms=17,
        broker=2,
        reason="checkpoint ends at 120, expected at least 3000",
    )
    meta = ClusterMetadata(cluster_id="c", store_marker=True)
    meta.topics["t"] = TopicInfo(
        "t",
        "id-1",
        [
            PartitionState(0, 3, [0], created=True, end_offset_floor=3000, lost=loss),
            PartitionState(1, 1, [1], created=True, end_offset_floor=50, accepted_from=50),
            PartitionState(0, 0, [0]),
        ],
    )
    doc = json.loads(json.dumps(meta.to_json()))
    back = ClusterMetadata.from_json(doc)
    assert back.to_json() == meta.to_json()
    assert back.store_marker is True
    p0, p1, p2 = back.topics["t"].partitions
    assert p0.lost == loss and p0.lost.missing_offsets == 2880
    assert (p0.created, p0.end_offset_floor, p0.accepted_from) == (True, 3000, None)
    assert (p1.lost, p1.accepted_from, p1.end_offset_floor) == (None, 50, 50)
    assert (p2.created, p2.end_offset_floor, p2.lost) == (False, 0, None)
    assert back.lost_partitions() == {TopicPartition("t", 0): loss}
    assert back.lost_partitions("other") == {}
    assert back.copy().topics["t"].partitions[0].lost == loss


def test_a_document_older_than_the_fields_loads_with_their_defaults() -> None:
    old = {
        "cluster_id": "old-cluster",
        "controller_epoch": 4,
        "version": 99,
        "brokers": {},
        "topics": {
            "t": {
                "name": "t",
                "topic_id": "id-1",
                "partitions": [
                    {
                        "leader": 0,
                        "leader_epoch": 2,
                        "replicas": [0],
                        "original_replicas": None,
                        "target_replicas": None,
                        "move_started_ms": None,
                    },
                ],
                "configs": {},
            }
        },
    }
    meta = ClusterMetadata.from_json(old)
    assert meta.store_marker is False  # "write the marker now", not "store lost"
    p = meta.topics["t"].partitions[0]
    assert (p.created, p.end_offset_floor, p.lost, p.accepted_from) == (False, 0, None, None)
    assert meta.lost_partitions() == {}


def test_missing_offsets_is_never_negative() -> None:
    assert DataLoss(10, 20, 0, 0, "x").missing_offsets == 0
    assert DataLoss(3000, 0, 0, 0, "checkpoint missing").missing_offsets == 3000
