"""Raw Fetch request bodies for tests that speak the protocol directly (kio's field names)."""

from __future__ import annotations

import datetime
import uuid


def fetch_body(
    version: int,
    topic: str | uuid.UUID,
    *,
    leader_epoch: int = -1,
    replica_id: int = -1,
) -> dict[str, object]:
    """A consumer's Fetch of partition 0 from offset 0: the topic by name up to v12, by id from
    v13; `leader_epoch` is the leader epoch the client knows (-1: none); `replica_id` sets a
    follower's id (ReplicaId up to v14, ReplicaState from v15)."""
    wanted = {"topic_id": topic} if version >= 13 else {"topic": topic}
    partition = {
        "partition": 0,
        "current_leader_epoch": leader_epoch,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 20,
    }
    body: dict[str, object] = {
        "max_wait": datetime.timedelta(milliseconds=100),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{**wanted, "partitions": [partition]}],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    if version >= 15:
        body["replica_state"] = {"replica_id": replica_id, "replica_epoch": -1}
    else:
        body["replica_id"] = replica_id
    return body
