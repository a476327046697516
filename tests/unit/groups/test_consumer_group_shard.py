"""Consumer groups (KIP-848) in a real `__consumer_offsets` partition: stored before answered,
rebuilt by a new coordinator (a move, kill -9), kept apart from classic groups of the same id as
Kafka does, and their members' offset commits checked against their epochs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.groups.consumer_groups import Heartbeat, TopicInfo
from tidalmq_broker.groups.coordinator import CommittedOffset, GroupSettings, GroupShard

from tests.unit.groups.test_snapshots import Offsets

SETTINGS = GroupSettings(min_session_timeout_ms=10, initial_rebalance_delay_ms=0)
T1 = str(uuid.uuid4())
TOPICS = {"orders": TopicInfo(T1, 3)}


@pytest.fixture
async def offsets(tmp_path: Path) -> AsyncIterator[Offsets]:
    o = Offsets(tmp_path / "objects")
    await o.engine.start()
    try:
        yield o
    finally:
        await o.engine.stop()


async def _shard(offsets: Offsets) -> GroupShard:
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    return shard


def _join(group: str, member: str) -> Heartbeat:
    return Heartbeat(
        group_id=group,
        member_id=member,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=("orders",),
        owned={},
    )


async def test_a_new_coordinator_carries_on_with_the_group(offsets: Offsets) -> None:
    shard = await _shard(offsets)
    joined = await shard.consumer_heartbeat(_join("g", "a"), TOPICS)
    assert joined.error == ErrorCode.none and joined.member_epoch == 1
    codes = await shard.commit(
        group_id="g",
        generation=1,
        member_id="a",
        offsets={("orders", 0): CommittedOffset(42, -1, None)},
    )
    assert codes == {("orders", 0): ErrorCode.none}
    stale = await shard.commit(
        group_id="g",
        generation=0,
        member_id="a",
        offsets={("orders", 0): CommittedOffset(1, -1, None)},
    )
    assert stale == {("orders", 0): ErrorCode.stale_member_epoch}
    shard.close()

    moved = await offsets.reload(SETTINGS)
    group = moved.consumer_group("g")
    assert group is not None and group.epoch == 1
    assert group.members["a"].assigned == {T1: frozenset({0, 1, 2})}
    assert moved.fetch_offsets("g", [("orders", 0)])[("orders", 0)].offset == 42
    again = await moved.consumer_heartbeat(
        Heartbeat(group_id="g", member_id="a", member_epoch=1), TOPICS
    )
    assert again.error == ErrorCode.none and again.member_epoch == 1
    assert moved.describe("g") is None  # DescribeGroups does not describe consumer groups
    moved.close()


async def test_classic_and_consumer_groups_do_not_mix(offsets: Offsets) -> None:
    shard = await _shard(offsets)
    # a classic group with a member: a consumer-protocol member is told it is not one of those
    join = shard.join(
        group_id="classic",
        member_id="",
        group_instance_id="c1",
        client_id="c",
        client_host="/h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=True,
    )
    assert (await join).error == ErrorCode.none
    refused = await shard.consumer_heartbeat(_join("classic", "x"), TOPICS)
    assert refused.error == ErrorCode.group_id_not_found
    # a consumer group with members: a classic JoinGroup is inconsistent
    await shard.consumer_heartbeat(_join("modern", "a"), TOPICS)
    classic_join = await shard.join(
        group_id="modern",
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="/h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=False,
    )
    assert classic_join.error == ErrorCode.inconsistent_group_protocol
    assert await shard.delete_group("modern") == ErrorCode.non_empty_group
    # once empty, the consumer group can be deleted
    await shard.consumer_heartbeat(
        Heartbeat(group_id="modern", member_id="a", member_epoch=-1), TOPICS
    )
    assert await shard.delete_group("modern") == ErrorCode.none
    assert shard.groups["classic"].members  # the classic group is as it was
    shard.close()
    reloaded = await offsets.reload(SETTINGS)
    assert reloaded.consumer_group("modern") is None
    reloaded.close()
