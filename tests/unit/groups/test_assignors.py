"""The server-side assignors of consumer groups (KIP-848): every subscribed partition to exactly
one subscriber, balanced (uniform) or in ranges (range), and sticky where that keeps balance."""

from __future__ import annotations

import pytest
from tidalmq_broker.groups.assignors import (
    Assignment,
    MemberSpec,
    RangeAssignor,
    UniformAssignor,
    assignors_named,
)


def _pairs(result: dict[str, Assignment]) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = {}
    for member, assignment in result.items():
        for topic, partitions in assignment.items():
            for p in partitions:
                owners.setdefault((topic, p), []).append(member)
    return owners


def _counts(result: dict[str, Assignment]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


def test_uniform_gives_every_partition_once_and_balances() -> None:
    topics = {"t1": 7, "t2": 3}
    members = {m: MemberSpec(frozenset(topics)) for m in ("a", "b", "c")}
    result = UniformAssignor().assign(members, topics)
    owners = _pairs(result)
    assert sorted(owners) == sorted((t, p) for t, n in topics.items() for p in range(n))
    assert all(len(o) == 1 for o in owners.values())
    assert sorted(_counts(result).values()) == [3, 3, 4]


def test_uniform_is_sticky_when_a_member_joins() -> None:
    topics = {"t": 6}
    first = UniformAssignor().assign({"a": MemberSpec(frozenset(topics))}, topics)
    assert first == {"a": {"t": frozenset(range(6))}}
    members = {
        "a": MemberSpec(frozenset(topics), current=first["a"]),
        "b": MemberSpec(frozenset(topics)),
    }
    second = UniformAssignor().assign(members, topics)
    assert _counts(second) == {"a": 3, "b": 3}
    assert second["a"]["t"] <= first["a"]["t"]  # a keeps half of what it had, loses the rest
    # a third member takes from both, and each keeps what it can
    members = {
        "a": MemberSpec(frozenset(topics), current=second["a"]),
        "b": MemberSpec(frozenset(topics), current=second["b"]),
        "c": MemberSpec(frozenset(topics)),
    }
    third = UniformAssignor().assign(members, topics)
    assert _counts(third) == {"a": 2, "b": 2, "c": 2}
    assert third["a"]["t"] <= second["a"]["t"] and third["b"]["t"] <= second["b"]["t"]


def test_uniform_respects_heterogeneous_subscriptions() -> None:
    topics = {"t1": 4, "t2": 2}
    members = {
        "a": MemberSpec(frozenset({"t1"})),
        "b": MemberSpec(frozenset({"t1", "t2"})),
        "c": MemberSpec(frozenset({"t2"})),
    }
    result = UniformAssignor().assign(members, topics)
    owners = _pairs(result)
    assert all(len(o) == 1 for o in owners.values()) and len(owners) == 6
    assert set(result["a"]) <= {"t1"} and set(result["c"]) <= {"t2"}
    assert max(_counts(result).values()) - min(_counts(result).values()) <= 1


def test_uniform_leaves_unsubscribed_topics_out() -> None:
    result = UniformAssignor().assign({"a": MemberSpec(frozenset({"t1"}))}, {"t1": 1, "t2": 5})
    assert result == {"a": {"t1": frozenset({0})}}


def test_range_gives_contiguous_ranges_the_first_members_one_more() -> None:
    topics = {"t1": 5, "t2": 2}
    members = {m: MemberSpec(frozenset(topics)) for m in ("b", "a")}
    result = RangeAssignor().assign(members, topics)
    assert result == {
        "a": {"t1": frozenset({0, 1, 2}), "t2": frozenset({0})},
        "b": {"t1": frozenset({3, 4}), "t2": frozenset({1})},
    }


def test_range_orders_static_members_by_instance_id() -> None:
    members = {
        "m1": MemberSpec(frozenset({"t"}), instance_id="z"),
        "m2": MemberSpec(frozenset({"t"}), instance_id="y"),
    }
    assert RangeAssignor().assign(members, {"t": 2}) == {
        "m2": {"t": frozenset({0})},
        "m1": {"t": frozenset({1})},
    }


def test_configured_assignors() -> None:
    assert [a.name for a in assignors_named("range, uniform")] == ["range", "uniform"]
    with pytest.raises(ValueError, match="sticky"):
        assignors_named("uniform,sticky")
    with pytest.raises(ValueError):
        assignors_named(" , ")
