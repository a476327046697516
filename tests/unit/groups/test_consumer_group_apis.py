"""ConsumerGroupHeartbeat, ConsumerGroupDescribe and the group APIs that meet consumer groups
(ListGroups, DescribeGroups, OffsetCommit v9, OffsetFetch v9), in-process against a group
coordinator on a real `__consumer_offsets` partition: each request and answer goes through kio's
schema both ways, as a client writes and reads them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.kafka_registry import supported_versions
from tidalmq_broker.groups.coordinator import GroupCoordinator, GroupSettings
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_core.metadata import OFFSETS_TOPIC, ClusterMetadata, PartitionState, TopicInfo

from tests.unit.groups.test_snapshots import TP, Offsets
from tests.unit.test_kafka_api_gaps import call

TOPIC_ID = uuid.UUID(int=7)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Any]:
    offsets = Offsets(tmp_path / "objects")
    await offsets.engine.start()
    groups = GroupCoordinator(GroupSettings(), lambda: 1)
    await groups.on_partition(TP, await offsets.open())
    for _ in range(200):
        if groups.shards():
            break
        await asyncio.sleep(0.01)
    meta = ClusterMetadata("c", version=1)
    meta.topics = {
        "orders": TopicInfo("orders", str(TOPIC_ID), [PartitionState(i, 0, [0]) for i in range(3)]),
        OFFSETS_TOPIC: TopicInfo(
            OFFSETS_TOPIC, str(uuid.UUID(int=3)), [PartitionState(0, 0, [0])], internal=True
        ),
    }
    try:
        yield SimpleNamespace(metadata=meta, authorizer=Authorizer(enabled=False), groups=groups)
    finally:
        await groups.close()
        await offsets.engine.stop()


def _join(member_id: str) -> dict[str, Any]:
    return {
        "group_id": "g",
        "member_id": member_id,
        "member_epoch": 0,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": 30_000,
        "subscribed_topic_names": ["orders"],
        "subscribed_topic_regex": None,
        "server_assignor": None,
        "topic_partitions": [],
    }


async def test_a_member_joins_and_the_group_is_described(broker: Any) -> None:
    assert supported_versions()[68] == (0, 1) and supported_versions()[69] == (0, 1)
    joined = await call(broker, 68, 1, _join("m1"))
    assert joined["error_code"] == ErrorCode.none and joined["member_epoch"] == 1
    assert joined["member_id"] == "m1"
    (owned,) = joined["assignment"]["topic_partitions"]
    assert owned["topic_id"] == TOPIC_ID and list(owned["partitions"]) == [0, 1, 2]
    # v0: the coordinator names the member
    named = await call(broker, 68, 0, {**_join(""), "group_id": "g0"})
    assert named["error_code"] == ErrorCode.none and uuid.UUID(named["member_id"])

    described = await call(
        broker, 69, 1, {"group_ids": ["g", "nope"], "include_authorized_operations": False}
    )
    g, nope = described["groups"]
    assert (g["error_code"], g["group_state"], g["group_epoch"], g["assignor_name"]) == (
        ErrorCode.none,
        "Stable",
        1,
        "uniform",
    )
    (member,) = g["members"]
    assert member["member_id"] == "m1" and member["member_epoch"] == 1
    assert member["subscribed_topic_names"] == ("orders",)
    (tp,) = member["assignment"]["topic_partitions"]
    assert tp["topic_name"] == "orders" and list(tp["partitions"]) == [0, 1, 2]
    assert nope["error_code"] == ErrorCode.group_id_not_found
    assert nope["error_message"] == "Group nope not found."

    listed = await call(broker, 16, 5, {"states_filter": [], "types_filter": ["consumer"]})
    assert {(x["group_id"], x["group_type"], x["group_state"]) for x in listed["groups"]} == {
        ("g", "consumer", "Stable"),
        ("g0", "consumer", "Stable"),
    }
    classic_only = await call(broker, 16, 5, {"states_filter": [], "types_filter": ["classic"]})
    assert classic_only["groups"] == ()
    old = await call(broker, 15, 6, {"groups": ["g"], "include_authorized_operations": False})
    (entry,) = old["groups"]
    assert entry["error_code"] == ErrorCode.group_id_not_found
    assert "not a classic group" in entry["error_message"]


async def test_members_commit_and_fetch_offsets_at_their_epoch(broker: Any) -> None:
    await call(broker, 68, 1, _join("m1"))

    def commit(epoch: int) -> dict[str, Any]:
        return {
            "group_id": "g",
            "generation_id_or_member_epoch": epoch,
            "member_id": "m1",
            "group_instance_id": None,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 5,
                            "committed_leader_epoch": -1,
                            "committed_metadata": None,
                        }
                    ],
                }
            ],
        }

    # an admin commit makes an (empty) classic group: not a consumer group, says Describe
    admin = {**commit(-1), "group_id": "classic", "member_id": ""}
    assert (await call(broker, 8, 9, admin))["topics"][0]["partitions"][0]["error_code"] == 0
    (classic,) = (
        await call(
            broker, 69, 1, {"group_ids": ["classic"], "include_authorized_operations": False}
        )
    )["groups"]
    assert classic["error_code"] == ErrorCode.group_id_not_found
    assert classic["error_message"] == "Group classic is not a consumer group"

    ok = await call(broker, 8, 9, commit(1))
    assert ok["topics"][0]["partitions"][0]["error_code"] == ErrorCode.none
    ahead = await call(broker, 8, 9, commit(2))
    assert ahead["topics"][0]["partitions"][0]["error_code"] == ErrorCode.stale_member_epoch

    def fetch(epoch: int) -> dict[str, Any]:
        return {
            "groups": [
                {
                    "group_id": "g",
                    "member_id": "m1",
                    "member_epoch": epoch,
                    "topics": [{"name": "orders", "partition_indexes": [0]}],
                }
            ],
            "require_stable": False,
        }

    fetched = (await call(broker, 9, 9, fetch(1)))["groups"][0]
    assert fetched["error_code"] == ErrorCode.none
    assert fetched["topics"][0]["partitions"][0]["committed_offset"] == 5
    stale = (await call(broker, 9, 9, fetch(0)))["groups"][0]
    assert stale["error_code"] == ErrorCode.stale_member_epoch


async def test_heartbeats_refused_as_kafka_refuses_them(broker: Any) -> None:
    await call(broker, 68, 1, _join("m1"))
    fenced = await call(
        broker,
        68,
        1,
        {
            **_join("m1"),
            "member_epoch": 5,
            "subscribed_topic_names": None,
            "topic_partitions": None,
        },
    )
    assert fenced["error_code"] == ErrorCode.fenced_member_epoch
    no_timeout = await call(broker, 68, 1, {**_join("m2"), "rebalance_timeout": -1})
    assert no_timeout["error_code"] == ErrorCode.invalid_request
    assert "RebalanceTimeoutMs" in no_timeout["error_message"]
    regex = await call(
        broker,
        68,
        1,
        {**_join("m3"), "subscribed_topic_names": None, "subscribed_topic_regex": "ord.*"},
    )
    assert regex["error_code"] == ErrorCode.invalid_regular_expression
    left = await call(
        broker,
        68,
        1,
        {
            **_join("m1"),
            "member_epoch": -1,
            "subscribed_topic_names": None,
            "topic_partitions": None,
        },
    )
    assert left["error_code"] == ErrorCode.none and left["member_epoch"] == -1
    gone = await call(
        broker,
        68,
        1,
        {
            **_join("m1"),
            "member_epoch": 1,
            "subscribed_topic_names": None,
            "topic_partitions": None,
        },
    )
    assert gone["error_code"] == ErrorCode.unknown_member_id
