"""Group timeouts on the broker's one timer (groups/coordinator/deadlines.py): an idle coordinator
runs no task per `__consumer_offsets` partition and wakes up for no group until one of its
deadlines comes; each timeout still fires as Kafka's do (a member's session, a KIP-394 pending
member's, a rebalance's, the initial rebalance delay, a consumer-group member's session), and
never before its deadline. Real partition logs on a local-directory store, the event loop's
own clock."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.groups.consumer_group import ConsumerGroup, ConsumerMember
from tidalmq_broker.groups.consumer_groups import (
    ConsumerGroups,
    ConsumerGroupSettings,
    Heartbeat,
    TopicInfo,
)
from tidalmq_broker.groups.coordinator import GroupCoordinator, GroupSettings, GroupShard
from tidalmq_broker.groups.group import Group, GroupState, JoinResult, Member
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

from tests.unit.groups.test_snapshots import Offsets

SETTINGS = GroupSettings(min_session_timeout_ms=10, initial_rebalance_delay_ms=0)
LONG = 60_000  # ms: a session or rebalance timeout no test waits for


@pytest.fixture
async def offsets(tmp_path: Path) -> AsyncIterator[Offsets]:
    o = Offsets(tmp_path / "objects")
    await o.engine.start()
    try:
        yield o
    finally:
        await o.engine.stop()


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> float:
    """Wait for `condition`; returns the loop time it was first seen true (at or after the
    moment it became true)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)
    return _now()


def _join(
    shard: GroupShard,
    group_id: str,
    member_id: str = "",
    *,
    session_ms: int = LONG,
    rebalance_ms: int = LONG,
    require_known_member_id: bool = False,
) -> Awaitable[JoinResult]:
    return shard.join(
        group_id=group_id,
        member_id=member_id,
        group_instance_id=None,
        client_id="c",
        client_host="/h",
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type="consumer",
        protocols=[("range", b"")],
        require_known_member_id=require_known_member_id,
    )


async def _stable(shard: GroupShard, group_id: str, **kw: int) -> str:
    """A group of one member, stable; the member's id."""
    joined = await _join(shard, group_id, **kw)
    assert joined.error == ErrorCode.none
    code, _, _, _ = await shard.sync(
        group_id=group_id,
        generation=joined.generation,
        member_id=joined.member_id,
        protocol_type="consumer",
        protocol_name="range",
        assignments={joined.member_id: b"a"},
    )
    assert code == ErrorCode.none
    return joined.member_id


async def test_an_idle_coordinator_runs_no_task_per_partition_and_no_wakeup(
    offsets: Offsets,
) -> None:
    partitions, n_groups = 8, 400
    logs = [
        await offsets.engine.open_partition(
            TopicPartition(OFFSETS_TOPIC, i), "offsets-id", 1, PartitionConfig()
        )
        for i in range(partitions)
    ]
    before = asyncio.all_tasks()
    coordinator = GroupCoordinator(SETTINGS, lambda: partitions)
    for i, plog in enumerate(logs):
        await coordinator.on_partition(TopicPartition(OFFSETS_TOPIC, i), plog)
    await _until(lambda: len(coordinator.shards()) == partitions)
    ids = [f"g{i}" for i in range(n_groups)]
    await asyncio.gather(*(_stable(coordinator.shard(g), g) for g in ids))
    assert len({coordinator.partition_for(g) for g in ids}) == partitions

    # nothing of the coordinator's keeps running: no loop a partition (or a group)
    current = asyncio.current_task()
    await _until(lambda: not (asyncio.all_tasks() - before - {current}))
    # one queued deadline a group, the timer set for the earliest session's end
    deadlines = coordinator.deadlines
    assert len(deadlines) == n_groups
    wakeup = deadlines.next_wakeup()
    assert wakeup is not None and wakeup > _now() + LONG / 1000 - 30
    wakeups, checks = deadlines.wakeups, deadlines.checks
    await asyncio.sleep(0.5)  # idle: no timer fires, no group is looked at
    assert (deadlines.wakeups, deadlines.checks) == (wakeups, checks)

    await coordinator.close()
    assert len(deadlines) == 0 and deadlines.next_wakeup() is None


async def test_a_session_runs_out_at_its_deadline_and_a_heartbeat_extends_it(
    offsets: Offsets,
) -> None:
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    member = await _stable(shard, "g", session_ms=600)
    group = shard.groups["g"]
    first_deadline = group.members[member].heartbeat_deadline
    await asyncio.sleep(0.2)
    generation = group.generation
    assert shard.heartbeat("g", generation, member) == ErrorCode.none
    extended = group.members[member].heartbeat_deadline
    assert extended > first_deadline
    gone = await _until(lambda: member not in group.members)
    assert gone >= extended  # not at the first deadline: the heartbeat moved it
    assert group.state is GroupState.EMPTY
    assert len(shard._deadlines) == 0  # an empty group has no timeout to wait for
    shard.close()


async def test_a_shorter_session_after_a_rejoin_is_honoured(offsets: Offsets) -> None:
    """A deadline that moves earlier: the member first had a minute, then rejoins with 0.3 s;
    the timer queued for the minute must not be the only one."""
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    member = await _stable(shard, "g", session_ms=LONG)
    rejoined = await _join(shard, "g", member, session_ms=300)
    assert rejoined.error == ErrorCode.none and rejoined.member_id == member
    deadline = shard.groups["g"].members[member].heartbeat_deadline
    gone = await _until(lambda: member not in shard.groups["g"].members)
    assert gone >= deadline
    shard.close()


async def test_a_pending_member_that_never_returns_stops_holding_the_rebalance(
    offsets: Offsets,
) -> None:
    """KIP-394: a member id handed out is awaited by a rebalance for that member's session
    (not the rebalance timeout), then forgotten."""
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    a = await _stable(shard, "g")
    pending = await _join(shard, "g", session_ms=400, require_known_member_id=True)
    assert pending.error == ErrorCode.member_id_required
    pending_deadline = shard.groups["g"].pending_members[pending.member_id]
    rejoined = await asyncio.wait_for(_join(shard, "g", a), 10)  # waits for the pending one
    assert _now() >= pending_deadline
    assert rejoined.error == ErrorCode.none and rejoined.generation == 2
    assert [m["member_id"] for m in rejoined.members] == [a]
    assert not shard.groups["g"].pending_members
    shard.close()


async def test_a_rebalance_completes_without_members_that_do_not_rejoin_in_time(
    offsets: Offsets,
) -> None:
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    a = (await _join(shard, "g", rebalance_ms=500)).member_id
    b_join = asyncio.create_task(_join(shard, "g", rebalance_ms=500))
    await _until(lambda: len(shard.groups["g"].members) == 2)
    generation_2 = await asyncio.gather(b_join, _join(shard, "g", a, rebalance_ms=500))
    assert [r.generation for r in generation_2] == [2, 2]
    b = generation_2[0].member_id
    # a rejoins; b keeps heartbeating (its session is a minute) but never rejoins
    rejoin = asyncio.create_task(_join(shard, "g", a, rebalance_ms=500))
    await _until(lambda: shard.groups["g"].state is GroupState.PREPARING_REBALANCE)
    deadline = shard.groups["g"].rebalance_deadline
    result = await asyncio.wait_for(rejoin, 10)
    assert _now() >= deadline
    assert result.error == ErrorCode.none and result.generation == 3
    assert [m["member_id"] for m in result.members] == [a]
    assert list(shard.groups["g"].members) == [a] and b not in shard.groups["g"].members
    shard.close()


async def test_the_first_join_waits_out_the_initial_rebalance_delay(offsets: Offsets) -> None:
    settings = GroupSettings(min_session_timeout_ms=10, initial_rebalance_delay_ms=400)
    shard = GroupShard(0, await offsets.open(), settings)
    await shard.load()
    started = _now()
    joined = await asyncio.wait_for(_join(shard, "g"), 10)
    assert joined.error == ErrorCode.none and joined.generation == 1
    assert _now() >= started + 0.4
    shard.close()


class MillisecondClock:
    """The shard's clock around the end of an initial rebalance delay as uvloop's (which counts
    milliseconds) reads it: the timer runs its handle in the deadline's millisecond, so the
    first reading is a hair before the deadline (the delay as a float, 1 ulp above that
    millisecond's float, say); the clock ticks to the next millisecond before the check is
    over, every later reading is past the deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        if self.readings == 1:
            return self.deadline - 1e-9
        return max(_now(), self.deadline + 0.001)


async def test_the_initial_delay_ends_the_join_even_if_the_clock_ticks_during_the_check(
    offsets: Offsets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI failure of tests/integration/compat/test_streams.py: the test's librdkafka reader
    was the only member of its group, the check at the end of the 200 ms delay found the clock
    a hair short of it, and the clock had moved past it when the check queued the group's next
    timeout: the group waited for its rebalance timeout (librdkafka's 5 min), the reader never
    got the output topic. The join completes at the delay's end."""
    settings = GroupSettings(min_session_timeout_ms=10, initial_rebalance_delay_ms=300)
    shard = GroupShard(0, await offsets.open(), settings)
    await shard.load()
    join = asyncio.create_task(_join(shard, "g", rebalance_ms=LONG))
    await _until(lambda: "g" in shard.groups and bool(shard.groups["g"].members))
    group = shard.groups["g"]
    assert group.state is GroupState.PREPARING_REBALANCE
    monkeypatch.setattr(shard, "_now", MillisecondClock(group.initial_delay_deadline))
    joined = await asyncio.wait_for(join, 5)  # not the rebalance timeout's minute
    assert joined.error == ErrorCode.none and joined.generation == 1
    assert group.state is GroupState.COMPLETING_REBALANCE
    shard.close()


async def test_a_consumer_group_member_whose_session_runs_out_leaves_for_good(
    offsets: Offsets,
) -> None:
    settings = GroupSettings(consumer=ConsumerGroupSettings(session_timeout_ms=400))
    topics = {"orders": TopicInfo(str(uuid.uuid4()), 3)}
    shard = GroupShard(0, await offsets.open(), settings)
    await shard.load()
    joined = await shard.consumer_heartbeat(
        Heartbeat(
            group_id="g",
            member_id="a",
            member_epoch=0,
            rebalance_timeout_ms=LONG,
            subscribed_topic_names=("orders",),
            owned={},
        ),
        topics,
    )
    assert joined.error == ErrorCode.none
    group = shard.consumer_group("g")
    assert group is not None
    deadline = group.members["a"].session_deadline
    gone = await _until(lambda: not group.members)
    assert gone >= deadline
    await asyncio.gather(*shard._background)  # the departure is stored
    shard.close()
    reloaded = await offsets.reload(settings)
    again = reloaded.consumer_group("g")
    assert again is not None and not again.members
    reloaded.close()


async def test_a_closed_shard_leaves_nothing_in_the_timer(offsets: Offsets) -> None:
    shard = GroupShard(0, await offsets.open(), SETTINGS)
    await shard.load()
    await asyncio.gather(*(_stable(shard, f"g{i}") for i in range(5)))
    assert len(shard._deadlines) == 5
    shard.close()
    assert len(shard._deadlines) == 0


def _member(member_id: str, deadline: float, *, joining: bool = False) -> Member:
    member = Member(member_id, None, "c", "/h", 1000, 1000, "consumer", [("range", b"")])
    member.heartbeat_deadline = deadline
    if joining:
        member.join_future = asyncio.get_running_loop().create_future()
    return member


async def test_a_group_s_next_deadline_is_its_earliest_timeout() -> None:
    group = Group("g", state=GroupState.STABLE)
    assert group.next_deadline(0.0) is None
    group.members = {"a": _member("a", 50.0), "b": _member("b", 40.0)}
    group.pending_members = {"p": 45.0}
    assert group.next_deadline(0.0) == 40.0
    # preparing a rebalance: members waiting in their join have no session running; the
    # rebalance's deadline counts, the initial delay only while it is ahead
    group.state = GroupState.PREPARING_REBALANCE
    group.members = {"a": _member("a", 50.0), "b": _member("b", 40.0, joining=True)}
    group.rebalance_deadline, group.initial_delay_deadline = 60.0, 30.0
    assert group.next_deadline(0.0) == 30.0
    assert group.next_deadline(31.0) == 45.0
    group.pending_members = {}
    assert group.next_deadline(31.0) == 50.0
    group.members["a"].join_future = asyncio.get_running_loop().create_future()
    assert group.next_deadline(31.0) == 60.0


def test_a_consumer_group_s_next_deadline_is_a_session_or_a_revocation() -> None:
    group = ConsumerGroup("g")
    assert ConsumerGroups.next_deadline(group) is None
    group.members = {"a": ConsumerMember("a"), "b": ConsumerMember("b")}
    group.members["a"].session_deadline, group.members["b"].session_deadline = 50.0, 40.0
    assert ConsumerGroups.next_deadline(group) == 40.0
    group.members["a"].revocation_deadline = 35.0
    assert ConsumerGroups.next_deadline(group) == 35.0
