"""Changes written as functions of the image (tidalmq_controller/_scoped.py): `scoped_records` runs
them on a view that copies only what they touch, and the records it returns, applied to the
image, give what the function would have made of a full copy."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import pytest
from tidalmq_controller import _scoped as scoped
from tidalmq_controller._scoped import CopyOnAccess, scoped_records, topic_changes
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, DataLoss, PartitionState, TopicInfo
from tidalmq_core.records import MetadataDelta, Record, apply_record
from tidalmq_core.static_mapping import StaticTopicState, initial_mapping


def plain(brokers: list[int]) -> list[PartitionState]:
    return [PartitionState(b, 0, [b]) for b in brokers]


def image() -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="c", version=9)
    meta.topics = {
        "a": TopicInfo("a", "id-a", plain([0, 1, 2]), configs={"retention.ms": "5"}),
        "b": TopicInfo("b", "id-b", plain([1, 2])),
    }
    for name, brokers in (("s", [0, 1]), ("r", [2, 2, 0])):
        meta.static_topics[name] = initial_mapping(
            name, len(brokers), brokers, brokers=None, now_ms=1
        )
        meta.topics[name] = TopicInfo(name, f"id-{name}", plain(brokers), kind="static")
        meta.topics[f"__sq.{name}"] = TopicInfo(
            f"__sq.{name}", f"id-sq-{name}", plain(brokers), internal=True, kind="physical"
        )
    return meta


def applied(meta: ClusterMetadata, records: list[Record]) -> ClusterMetadata:
    out = meta.copy()
    delta = MetadataDelta()
    for rec in records:
        apply_record(out, rec, delta)
    return out


def names(records: list[Record]) -> set[str]:
    return {str(r.get("name", r.get("n"))) for r in records}


def test_a_remap_of_one_static_topic_writes_records_for_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meta = image()
    before = meta.to_json()
    copied: list[str] = []
    copy_topic, copy_static = scoped._copy_topic, scoped._copy_static

    def counting_topic(topic: TopicInfo) -> TopicInfo:
        copied.append(topic.name)
        return copy_topic(topic)

    def counting_static(state: StaticTopicState) -> StaticTopicState:
        copied.append(f"static {state.name}")
        return copy_static(state)

    monkeypatch.setattr(scoped, "_copy_topic", counting_topic)
    monkeypatch.setattr(scoped, "_copy_static", counting_static)

    def remap(m: ClusterMetadata) -> None:
        """Queue 0 of `s` moves to broker 1: its physical queue is sealed, a new one opens."""
        state = m.static_topics["s"]
        state.jump += 1
        state.retired.append(7)
        physical = m.topics["__sq.s"]
        physical.partitions[0].leader = NO_LEADER
        physical.partitions.append(PartitionState(1, 0, [1]))
        m.topics["s"].partitions[0] = PartitionState(1, 1, [1])
        assert "a" in m.topics and len(m.topics) == 6  # looking is not touching

    records = scoped_records(meta, remap)
    assert names(records) == {"s", "__sq.s"}
    assert sorted(copied) == ["__sq.s", "s", "static s"], "only what it touched was copied"
    assert meta.to_json() == before, "the image itself is not changed"
    expected = copy.deepcopy(meta)
    remap(expected)
    assert applied(meta, records) == expected
    kinds = sorted(r["t"] for r in records)
    assert kinds == ["grow", "p", "p", "static"], "per partition, not whole topics"


def test_nothing_changed_writes_nothing() -> None:
    meta = image()

    def look(m: ClusterMetadata) -> None:
        for name, topic in m.topics.items():  # copies everything
            assert topic.name == name
        for state in m.static_topics.values():
            assert state.total_queues > 0

    assert scoped_records(meta, look) == []


def test_a_function_that_fails_changes_nothing() -> None:
    meta = image()
    before = meta.to_json()

    def fail(m: ClusterMetadata) -> None:
        m.topics["a"].partitions[0].leader = 2
        del m.topics["b"]
        raise ValueError("no")

    with pytest.raises(ValueError):
        scoped_records(meta, fail)
    assert meta.to_json() == before


def test_removal_and_replacement() -> None:
    meta = image()

    def change(m: ClusterMetadata) -> None:
        del m.static_topics["r"]
        m.topics.pop("r")
        del m.topics["__sq.r"]
        m.topics["b"] = TopicInfo("b", "id-b2", plain([0]))  # another topic of that name
        m.topics["new"] = TopicInfo("new", "id-n", plain([2, 0]))
        m.topics["gone-again"] = TopicInfo("gone-again", "id-g", [])
        del m.topics["gone-again"]  # created and removed: nothing to write

    records = scoped_records(meta, change)
    assert {(r["t"], r.get("name")) for r in records} == {
        ("static", "r"),
        ("tgone", "r"),
        ("tgone", "__sq.r"),
        ("topic", "b"),
        ("topic", "new"),
    }
    expected = copy.deepcopy(meta)
    change(expected)
    assert applied(meta, records) == expected


def test_added_partitions_are_a_grow_and_what_differs_from_new() -> None:
    old = TopicInfo("a", "id-a", plain([0, 1]))
    new = copy.deepcopy(old)
    new.partitions += [PartitionState(2, 0, [2]), PartitionState(NO_LEADER, 3, [0], created=True)]
    records = topic_changes(old, new)
    assert records[0] == {"t": "grow", "name": "a", "at": 2, "r": [2, 0]}
    assert records[1:] == [{"t": "p", "n": "a", "p": 3, "l": NO_LEADER, "e": 3, "c": True}]
    fewer = copy.deepcopy(old)
    fewer.partitions.pop()
    assert [r["t"] for r in topic_changes(old, fewer)] == ["topic"], "shrunk: written whole"
    assert [r["t"] for r in topic_changes(None, old)] == ["topic"]


def test_copy_on_access() -> None:
    source = {"x": [1], "y": [2], "z": [3]}
    view: CopyOnAccess[list[int]] = CopyOnAccess(source, list)
    view["x"].append(9)
    assert source["x"] == [1] and view["x"] == [1, 9]
    assert view.touched() == ["x"]
    del view["y"]
    assert "y" not in view and view.get("y") is None and view.pop("y", None) is None
    with pytest.raises(KeyError):
        view.pop("y")
    with pytest.raises(KeyError):
        del view["y"]
    assert sorted(view) == ["x", "z"] and len(view) == 2 and source.keys() == {"x", "y", "z"}
    view["y"] = [5]
    assert view.removed == set() and view["y"] == [5]
    assert view.setdefault("w", [0]) == [0] and view.setdefault("z", [7]) == [3]
    assert dict(view.items()) == {"x": [1, 9], "y": [5], "z": [3], "w": [0]}
    assert source == {"x": [1], "y": [2], "z": [3]}


# ------------------------------------------------------------------ property-style
ACTIONS = [
    *["field"] * 3,
    "configs",
    "grow",
    "remove",
    "create",
    "replace",
    "shrink",
    "kind",
    "static",
    "unstatic",
    "recreate",
]
FIELDS = [
    "leader",
    "leader_epoch",
    "replicas",
    "moving",
    "created",
    "end_offset_floor",
    "lost",
    "accepted_from",
]


def random_change(seed: int) -> Callable[[ClusterMetadata], None]:
    """A deterministic random change of topics and static topics (the same on any view)."""

    def change(m: ClusterMetadata) -> None:
        rng = random.Random(seed)
        for _ in range(rng.randint(1, 6)):
            names = sorted(m.topics)
            name = rng.choice(names)
            action = rng.choice(ACTIONS)
            topic = m.topics[name]
            if action == "field" and topic.partitions:
                part = rng.choice(topic.partitions)
                attr = rng.choice(FIELDS)
                b = rng.randrange(3)
                if attr == "leader":
                    part.leader = rng.choice([NO_LEADER, b])
                elif attr == "leader_epoch":
                    part.leader_epoch += 1
                elif attr == "replicas":
                    part.replicas = [b]
                elif attr == "moving":
                    part.original_replicas, part.target_replicas = list(part.replicas), [b]
                    part.move_started_ms = rng.randrange(1000)
                elif attr == "created":
                    part.created = not part.created
                elif attr == "end_offset_floor":
                    part.end_offset_floor += rng.randrange(100)
                elif attr == "lost":
                    part.lost = rng.choice([None, DataLoss(5, 2, 1, b, "gone")])
                else:
                    part.accepted_from = rng.choice([None, 7])
            elif action == "configs":
                topic.configs = {"cleanup.policy": rng.choice(["delete", "compact"])}
            elif action == "grow":
                b = rng.randrange(3)
                new = PartitionState(b, 0, [b])
                if rng.random() < 0.5:
                    new.leader, new.leader_epoch, new.created = NO_LEADER, 2, True
                topic.partitions.append(new)
            elif action == "remove":
                del m.topics[name]
            elif action == "create":
                key = f"n{rng.randrange(3)}"
                m.topics[key] = TopicInfo(key, f"id-{rng.randrange(9)}", plain([rng.randrange(3)]))
            elif action == "replace":
                m.topics[name] = TopicInfo(name, f"id-{rng.randrange(9)}", plain([1, 2]))
            elif action == "shrink" and topic.partitions:
                topic.partitions.pop()
            elif action == "kind":
                topic.kind = rng.choice(["normal", "static", "physical"])
                topic.internal = topic.kind == "physical"
            elif action == "static":
                key = rng.choice(["s", "r", "q"])
                state = m.static_topics.get(key)
                if state is None:
                    m.static_topics[key] = initial_mapping(key, 1, [0], brokers=None, now_ms=2)
                else:
                    state.jump += 1
                    state.retired.append(rng.randrange(9))
            elif action == "unstatic":
                m.static_topics.pop(rng.choice(["s", "r", "q"]), None)
            elif action == "recreate":
                old = m.topics.pop(name)
                m.topics[name] = copy.deepcopy(old)
                m.topics[name].partitions[:1] = plain([rng.randrange(3)])

    return change


@pytest.mark.parametrize("seed", range(150))
def test_records_applied_give_what_the_change_makes_of_a_copy(seed: int) -> None:
    meta = image()
    before = meta.to_json()
    change = random_change(seed)
    records = scoped_records(meta, change)
    assert meta.to_json() == before
    expected = copy.deepcopy(meta)
    change(expected)
    assert applied(meta, records) == expected
