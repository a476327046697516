"""The consumer group protocol's coordinator side (KIP-848), driven heartbeat by heartbeat: member
epochs, the target assignment, reconciliation (a partition is revoked from its owner before
anyone else gets it), leaving, session and rebalance timeouts, static membership, and the stored
document of a group."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.consumer_groups import MetadataTopics
from tidalmq_broker.groups.assignors import Assignment
from tidalmq_broker.groups.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    MemberState,
)
from tidalmq_broker.groups.consumer_groups import (
    ConsumerGroups,
    ConsumerGroupSettings,
    Heartbeat,
    HeartbeatResult,
    TopicInfo,
    group_document,
    group_from_document,
)
from tidalmq_core.metadata import PartitionState, TopicTable
from tidalmq_core.metadata import TopicInfo as MetadataTopic

T1 = str(uuid.uuid4())
TOPICS = {"orders": TopicInfo(T1, 4)}
SETTINGS = ConsumerGroupSettings(session_timeout_ms=45_000, heartbeat_interval_ms=500)


class Coordinator:
    """ConsumerGroups with a store that keeps every document written, and a clock."""

    def __init__(self, settings: ConsumerGroupSettings = SETTINGS) -> None:
        self.stored: list[dict[str, Any]] = []
        self.groups = ConsumerGroups(settings, self._store)
        self.now = 1000.0
        self.topics = dict(TOPICS)

    async def _store(self, group: ConsumerGroup) -> None:
        self.stored.append(copy.deepcopy(group_document(group)))

    async def beat(self, member_id: str, epoch: int, **kw: Any) -> HeartbeatResult:
        if epoch == 0:
            kw.setdefault("rebalance_timeout_ms", 30_000)
            kw.setdefault("subscribed_topic_names", ("orders",))
            kw.setdefault("owned", {})
        result = await self.groups.heartbeat(
            Heartbeat(group_id="g", member_id=member_id, member_epoch=epoch, **kw),
            self.topics,
            self.now,
        )
        self.check_no_partition_has_two_owners()
        return result

    def check_no_partition_has_two_owners(self) -> None:
        group = self.groups.groups.get("g")
        seen: set[tuple[str, int]] = set()
        for member in group.members.values() if group else ():
            owns = member.owns()
            assert not owns & seen, f"{owns & seen} owned twice"
            seen |= owns


def _parts(assignment: Assignment | None) -> set[int]:
    return set(assignment.get(T1, frozenset())) if assignment is not None else set()


async def test_one_member_gets_every_partition() -> None:
    c = Coordinator()
    r = await c.beat("a", 0)
    assert r.error == ErrorCode.none and r.member_id == "a"
    assert r.member_epoch == 1 and _parts(r.assignment) == {0, 1, 2, 3}
    assert r.heartbeat_interval_ms == 500
    assert c.groups.groups["g"].state() is ConsumerGroupState.STABLE
    assert c.stored[-1]["members"][0]["assigned"] == {T1: [0, 1, 2, 3]}
    # a heartbeat that changes nothing writes nothing and carries no assignment
    writes = len(c.stored)
    r = await c.beat("a", 1)
    assert r.member_epoch == 1 and r.assignment is None and len(c.stored) == writes


async def test_a_partition_moves_only_after_its_owner_revoked_it() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    rb = await c.beat("b", 0)
    # b is in at epoch 2 but gets nothing a still owns
    assert rb.member_epoch == 2 and _parts(rb.assignment) == set()
    group = c.groups.groups["g"]
    assert group.epoch == 2 and group.assignment_epoch == 2
    assert group.state() is ConsumerGroupState.RECONCILING
    assert group.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    # a is told to give up two partitions, keeping its epoch until it confirms
    ra = await c.beat("a", 1)
    kept = _parts(ra.assignment)
    assert ra.member_epoch == 1 and len(kept) == 2
    assert group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    # b still waits: the revoked partitions are a's until a says it let them go
    rb = await c.beat("b", 2)
    assert _parts(group.members["b"].assigned) == set()
    # a heartbeat still owning them changes nothing
    ra = await c.beat("a", 1, owned={T1: frozenset({0, 1, 2, 3})})
    assert ra.member_epoch == 1 and group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    # a confirms: it moves to epoch 2
    ra = await c.beat("a", 1, owned={T1: frozenset(kept)})
    assert ra.member_epoch == 2 and _parts(ra.assignment) == kept
    assert group.members["a"].state is MemberState.STABLE
    # and b's next heartbeat gets the rest
    rb = await c.beat("b", 2)
    assert _parts(rb.assignment) == {0, 1, 2, 3} - kept
    assert group.state() is ConsumerGroupState.STABLE


async def test_a_member_that_leaves_frees_its_partitions_at_once() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    await c.beat("b", 0)
    ra = await c.beat("a", 1)
    await c.beat("a", 1, owned={T1: frozenset(_parts(ra.assignment))})
    await c.beat("b", 2)
    left = await c.beat("a", -1)
    assert left.error == ErrorCode.none and left.member_epoch == -1
    rb = await c.beat("b", 2)
    assert rb.member_epoch == 3 and _parts(rb.assignment) == {0, 1, 2, 3}
    assert [m["id"] for m in c.stored[-1]["members"]] == ["b"]


async def test_epochs_and_members_are_checked() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    assert (await c.beat("a", 7)).error == ErrorCode.fenced_member_epoch
    assert (await c.beat("zz", 1)).error == ErrorCode.unknown_member_id
    assert (await c.beat("zz", -1)).error == ErrorCode.unknown_member_id
    bad = await c.beat("x", 0, rebalance_timeout_ms=-1)
    assert bad.error == ErrorCode.invalid_request
    bad = await c.beat("x", 0, owned={T1: frozenset({1})})
    assert bad.error == ErrorCode.invalid_request
    bad = await c.beat("x", 0, server_assignor="sticky")
    assert bad.error == ErrorCode.unsupported_assignor and "uniform" in (bad.message or "")
    bad = await c.beat("x", 0, subscribed_topic_regex="ord.*")
    assert bad.error == ErrorCode.invalid_regular_expression
    # the previous epoch is accepted when the member owns only what it was given (lost reply)
    await c.beat("b", 0)
    ra = await c.beat("a", 1)
    ra = await c.beat("a", 1, owned={T1: frozenset(_parts(ra.assignment))})
    assert ra.member_epoch == 2
    again = await c.beat("a", 1, owned={T1: frozenset(_parts(ra.assignment))})
    assert again.error == ErrorCode.none and again.member_epoch == 2


async def test_offsets_are_committed_by_members_at_their_epoch() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    assert c.groups.validate_offsets("g", "a", 1) == ErrorCode.none
    assert c.groups.validate_offsets("g", "a", 0) == ErrorCode.stale_member_epoch
    assert c.groups.validate_offsets("g", "b", 1) == ErrorCode.unknown_member_id
    assert c.groups.validate_offsets("g", "", -1) == ErrorCode.unknown_member_id
    await c.beat("a", -1)
    assert c.groups.validate_offsets("g", "", -1) == ErrorCode.none  # empty: admin commits


async def test_a_commit_at_an_older_epoch_is_taken_for_partitions_held_since() -> None:
    """KIP-1251: the member's heartbeat moved it on while its commit was on its way."""
    c = Coordinator()
    await c.beat("a", 0)
    await c.beat("b", 0)
    ra = await c.beat("a", 1)
    kept = _parts(ra.assignment)
    await c.beat("a", 1, owned={T1: frozenset(kept)})  # a now at epoch 2, holding `kept`
    await c.beat("b", 2)
    held = {(T1, p) for p in kept}
    assert c.groups.validate_offsets("g", "a", 1, held) == ErrorCode.none
    assert c.groups.validate_offsets("g", "a", 1, None) == ErrorCode.stale_member_epoch
    # b got its partitions at epoch 2: a commit of them at epoch 1 is not its own
    b_parts = {(T1, p) for p in _parts(c.groups.groups["g"].members["b"].assigned)}
    assert c.groups.validate_offsets("g", "b", 2, b_parts) == ErrorCode.none
    await c.beat("a", -1)
    rb = await c.beat("b", 2)
    assert rb.member_epoch == 3
    assert c.groups.validate_offsets("g", "b", 2, b_parts) == ErrorCode.none
    new = {(T1, p) for p in kept}
    assert c.groups.validate_offsets("g", "b", 2, new) == ErrorCode.stale_member_epoch
    assert c.groups.validate_offsets("g", "b", 4, b_parts) == ErrorCode.stale_member_epoch


async def test_session_timeout_removes_a_member() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    await c.beat("b", 0)
    c.now += 30
    await c.beat("b", 2)
    c.now += 20  # a silent for 50 s, b for 20 s
    changed = c.groups.expire(c.now)
    assert [g.group_id for g in changed] == ["g"]
    assert list(c.groups.groups["g"].members) == ["b"]
    rb = await c.beat("b", 2)
    assert _parts(rb.assignment) == {0, 1, 2, 3} and rb.member_epoch == 3


async def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_removed() -> None:
    c = Coordinator()
    await c.beat("a", 0, rebalance_timeout_ms=10_000)
    await c.beat("b", 0)
    await c.beat("a", 1)  # told to revoke
    c.now += 5
    await c.beat("a", 1)
    assert not c.groups.expire(c.now)
    c.now += 6
    await c.beat("b", 2)
    assert c.groups.expire(c.now) and list(c.groups.groups["g"].members) == ["b"]


async def test_a_static_member_comes_back_to_its_partitions() -> None:
    c = Coordinator()
    r1 = await c.beat("a1", 0, instance_id="host-1")
    await c.beat("a1", 1, owned={T1: frozenset(_parts(r1.assignment))})
    epoch = c.groups.groups["g"].epoch
    # another process with the same instance id while it is active is refused
    clash = await c.beat("a2", 0, instance_id="host-1")
    assert clash.error == ErrorCode.unreleased_instance_id
    # it leaves for a restart: the partitions stay its own
    r = await c.beat("a1", -2, instance_id="host-1")
    assert r.member_epoch == -2
    assert _parts(c.groups.groups["g"].members["a1"].assigned) == {0, 1, 2, 3}
    r2 = await c.beat("a2", 0, instance_id="host-1")
    assert r2.error == ErrorCode.none and r2.member_epoch == 1
    assert _parts(r2.assignment) == {0, 1, 2, 3}
    assert list(c.groups.groups["g"].members) == ["a2"] and c.groups.groups["g"].epoch == epoch


async def test_new_partitions_bump_the_group_epoch() -> None:
    c = Coordinator()
    await c.beat("a", 0)
    c.topics["orders"] = TopicInfo(T1, 6)
    r = await c.beat("a", 1)
    assert r.member_epoch == 2 and _parts(r.assignment) == set(range(6))


async def test_range_assignor_when_the_member_asks() -> None:
    c = Coordinator()
    await c.beat("a", 0, server_assignor="range")
    await c.beat("b", 0, server_assignor="range")
    group = c.groups.groups["g"]
    assert group.assignor == "range"
    assert group.target == {"a": {T1: frozenset({0, 1})}, "b": {T1: frozenset({2, 3})}}


async def test_the_stored_document_rebuilds_the_group() -> None:
    c = Coordinator()
    await c.beat("a", 0, instance_id="i", rack_id="r1")
    await c.beat("b", 0)
    await c.beat("a", 1)  # a is revoking
    doc = c.stored[-1]
    group = group_from_document("g", doc)
    assert group_document(group) == doc
    assert group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    # a new coordinator loads it and carries on
    other = ConsumerGroups(SETTINGS, c._store)
    other.load("g", doc, now=0.0)
    assert other.groups["g"].members["a"].revocation_deadline == 30.0


class UnwalkableTopics(TopicTable):
    """A cluster's topic table that fails the test if anything walks it, and notes the names
    looked up."""

    def __init__(self, topics: dict[str, MetadataTopic]) -> None:
        super().__init__(topics)
        self.looked_up: list[str] = []

    def get(self, name: str, default: Any = None) -> Any:
        self.looked_up.append(name)
        return super().get(name, default)

    def walked(self, *args: Any) -> Any:
        raise AssertionError("a heartbeat walked every topic of the cluster")

    __iter__ = keys = values = items = __len__ = walked


def _topic(name: str, partitions: int) -> MetadataTopic:
    return MetadataTopic(name, str(uuid.uuid4()), [PartitionState(0, 0, [0])] * partitions)


async def test_a_heartbeat_looks_up_only_the_subscribed_topics() -> None:
    """At thousands of topics a heartbeat must cost O(what its group subscribes to), and still
    see a subscribed topic created, or given partitions, after the member subscribed."""
    table = UnwalkableTopics({f"clicks-{i}": _topic(f"clicks-{i}", 4) for i in range(5_000)})
    dict.__setitem__(table, "orders", _topic("orders", 4))
    orders = str(uuid.UUID(dict.__getitem__(table, "orders").topic_id))
    groups = ConsumerGroups(SETTINGS, lambda group: asyncio.sleep(0))
    topics = MetadataTopics(table)

    def beat(member: str, epoch: int, **kw: Any) -> Any:
        if epoch == 0:
            kw.update(rebalance_timeout_ms=30_000, owned={})
        return groups.heartbeat(Heartbeat("g", member, epoch, **kw), topics, 1000.0)

    joined = await beat("a", 0, subscribed_topic_names=("orders", "payments"))
    assert joined.assignment == {orders: frozenset(range(4))}
    assert set(table.looked_up) == {"orders", "payments"}
    table.looked_up.clear()
    await beat("a", 1)
    assert set(table.looked_up) == {"orders", "payments"}

    table["payments"] = _topic("payments", 2)  # created after the member subscribed
    payments = str(uuid.UUID(table["payments"].topic_id))
    r = await beat("a", 1)
    assert r.member_epoch == 2 and r.assignment == {
        orders: frozenset(range(4)),
        payments: frozenset({0, 1}),
    }
    grown = dataclasses.replace(table["payments"], partitions=[PartitionState(0, 0, [0])] * 3)
    table["payments"] = grown  # given a partition more
    r = await beat("a", 2)
    assert r.member_epoch == 3 and r.assignment == {
        orders: frozenset(range(4)),
        payments: frozenset({0, 1, 2}),
    }


def test_settings_reject_unknown_assignors() -> None:
    with pytest.raises(ValueError):
        ConsumerGroupSettings(assignors="cooperative-sticky")
