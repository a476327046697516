"""Topics by id (tidalmq_core.metadata.TopicTable): the metadata image's index of topic names by
topic id is kept by every change to its topics, whichever way the image changes (records applied,
snapshots loaded, documents read, copies, a dict assigned), so a lookup by id is O(1) and never
stale: a deleted topic's id finds nothing, a topic re-created under its name is found by its new
id only. Checked against a recomputation from the topics after every step."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random
from collections.abc import Iterator
from typing import Any

import pytest
from tidalmq_controller._scoped import scoped_records
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo, TopicTable
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    apply_batch,
    apply_record,
    partitions_added_record,
    topic_configs_record,
    topic_record,
    topic_removed_record,
)


def topic(name: str, topic_id: str, partitions: int = 1) -> TopicInfo:
    return TopicInfo(name, topic_id, [PartitionState(0, 0, [0]) for _ in range(partitions)])


def apply(meta: ClusterMetadata, *records: Record) -> None:
    delta = MetadataDelta()
    for rec in records:
        apply_record(meta, rec, delta)


def check_index(meta: ClusterMetadata, ids_seen: set[str]) -> None:
    """The index is what a walk over the topics finds, and every id no topic holds finds
    nothing (ids are unique here, as the controller makes them)."""
    topics = meta.topics
    assert isinstance(topics, TopicTable)
    recomputed = {t.topic_id: name for name, t in topics.items()}
    assert topics.indexed_ids() == recomputed
    for topic_id, name in recomputed.items():
        assert meta.topic_by_id(topic_id) is topics[name]
        assert topics.name_of(topic_id) == name
    for topic_id in ids_seen - recomputed.keys():
        assert meta.topic_by_id(topic_id) is None, f"{topic_id} is gone but still found"
        assert topics.name_of(topic_id) is None


def test_create_delete_recreate_and_snapshot_loads_keep_the_index() -> None:
    seen = {"id-orders-1", "id-audit", "id-orders-2", "id-orders-3", "id-audit-2"}
    meta = ClusterMetadata("c")
    check_index(meta, seen)
    apply(meta, topic_record(topic("orders", "id-orders-1")))
    apply(meta, topic_record(topic("audit", "id-audit", 2)))
    check_index(meta, seen)
    assert meta.topic_by_id("id-orders-1") is meta.topics["orders"]

    apply(meta, topic_removed_record("orders"))
    check_index(meta, seen)
    assert meta.topic_by_id("id-orders-1") is None

    apply(meta, topic_record(topic("orders", "id-orders-2")))  # re-created: a new id
    check_index(meta, seen)
    assert meta.topic_by_id("id-orders-1") is None
    assert meta.topic_by_id("id-orders-2") is meta.topics["orders"]

    # a topic record naming an existing topic with another id replaces it (no delete between)
    apply(meta, topic_record(topic("orders", "id-orders-3")))
    check_index(meta, seen)
    assert meta.topic_by_id("id-orders-2") is None

    # records that change a topic in place keep its id
    apply(
        meta,
        topic_configs_record("audit", {"retention.ms": "5"}),
        partitions_added_record("audit", [0], at=2),
    )
    check_index(meta, seen)

    loaded = snapshots.decode(snapshots.encode_bytes(meta))  # a snapshot loaded
    check_index(loaded, seen)
    assert loaded.topic_by_id("id-orders-3") is loaded.topics["orders"]
    apply_batch(loaded, [topic_removed_record("audit")], loaded.version + 1)
    check_index(loaded, seen)
    apply_batch(loaded, [topic_record(topic("audit", "id-audit-2"))], loaded.version + 1)
    check_index(loaded, seen)
    assert loaded.topic_by_id("id-audit") is None
    check_index(meta, seen)  # the image it was loaded from is its own: unchanged
    assert meta.topic_by_id("id-audit") is meta.topics["audit"]

    rolled = snapshots.decode(snapshots.roll(snapshots.encode_bytes(loaded), []))
    check_index(rolled, seen)
    from_json = ClusterMetadata.from_json(loaded.to_json())
    check_index(from_json, seen)
    assert from_json.topic_by_id("id-audit-2") is from_json.topics["audit"]


def test_random_sequences_of_records_and_snapshot_loads_keep_the_index() -> None:
    rng = random.Random(7)
    names = [f"topic-{i}" for i in range(6)]
    meta = ClusterMetadata("c")
    seen: set[str] = set()
    serial = 0
    for _ in range(400):
        name = rng.choice(names)
        roll = rng.random()
        if roll < 0.45:
            serial += 1
            topic_id = f"id-{serial}"
            seen.add(topic_id)
            apply_batch(meta, [topic_record(topic(name, topic_id))], meta.version + 1)
        elif roll < 0.8:
            apply_batch(meta, [topic_removed_record(name)], meta.version + 1)
        elif roll < 0.9:
            meta = snapshots.decode(snapshots.encode_bytes(meta))
        else:
            meta = ClusterMetadata.from_json(meta.to_json())
        check_index(meta, seen)
    assert len(seen) > 100


def test_every_way_of_changing_the_topics_keeps_the_index() -> None:
    seen = {"a1", "a2", "b1", "c1", "d1", "e1"}
    meta = ClusterMetadata("c", topics={"a": topic("a", "a1")})  # a plain dict given
    check_index(meta, seen)
    meta.topics = {"b": topic("b", "b1")}  # type: ignore[assignment]  # a plain dict assigned
    check_index(meta, seen)
    meta.topics["a"] = topic("a", "a1")
    meta.topics["a"] = topic("a", "a2")
    check_index(meta, seen)
    del meta.topics["a"]
    check_index(meta, seen)
    assert meta.topics.pop("b").topic_id == "b1"
    assert meta.topics.pop("b", None) is None
    with pytest.raises(KeyError):
        meta.topics.pop("b")
    check_index(meta, seen)
    meta.topics.update({"c": topic("c", "c1")}, d=topic("d", "d1"))
    check_index(meta, seen)
    meta.topics |= {"e": topic("e", "e1")}
    meta.topics.setdefault("e", topic("e", "not-this"))
    check_index(meta, seen)
    name, _ = meta.topics.popitem()
    assert name == "e"
    check_index(meta, seen)

    for other in (
        copy.copy(meta),
        copy.deepcopy(meta),
        pickle.loads(pickle.dumps(meta)),
        dataclasses.replace(meta, version=9),
        meta.copy(),
    ):
        check_index(other, seen)
    deep = copy.deepcopy(meta)
    deep.topics["c"] = topic("c", "a2")
    check_index(deep, seen)
    check_index(meta, seen)  # the copy's change is its own
    assert meta.topic_by_id("c1") is meta.topics["c"]
    table = meta.topics.copy()
    assert isinstance(table, TopicTable)
    table.clear()
    check_index(meta, seen)

    meta.topics.clear()
    check_index(meta, seen)
    assert meta.topic_by_id("c1") is None


def test_the_check_finds_an_index_that_diverged() -> None:
    """What the index guards against, done the only ways it can be: around the table."""
    meta = ClusterMetadata("c", topics={"a": topic("a", "a1")})
    dict.__setitem__(meta.topics, "a", topic("a", "a2"))  # bypasses the index
    with pytest.raises(AssertionError):
        check_index(meta, {"a1", "a2"})
    # and a topic's id cannot change in place
    with pytest.raises(AttributeError):
        topic("b", "b1").topic_id = "b2"


def test_a_shared_id_finds_a_topic_holding_it_until_none_does() -> None:
    """Never made by the controller (ids are uuid4), but an image with one stays consistent."""
    meta = ClusterMetadata("c", topics={"a": topic("a", "x"), "b": topic("b", "x")})
    assert meta.topic_by_id("x") in (meta.topics["a"], meta.topics["b"])
    del meta.topics[meta.topics.name_of("x") or ""]
    remaining = next(iter(meta.topics))
    assert meta.topic_by_id("x") is meta.topics[remaining]
    meta.topics[remaining] = topic(remaining, "y")
    assert meta.topic_by_id("x") is None
    assert meta.topic_by_id("y") is meta.topics[remaining]


def test_the_controllers_scoped_view_finds_topics_by_id_as_it_changes_them() -> None:
    image = ClusterMetadata("c", topics={"a": topic("a", "a1"), "b": topic("b", "b1")})
    found: dict[str, Any] = {}

    def mutate(work: ClusterMetadata) -> None:
        found["untouched"] = work.topic_by_id("b1")
        del work.topics["a"]
        found["deleted"] = work.topic_by_id("a1")
        work.topics["a"] = topic("a", "a2")
        found["recreated"] = work.topic_by_id("a2")
        found["old"] = work.topic_by_id("a1")
        work.topics["b"] = topic("b", "b2")
        found["replaced"] = work.topic_by_id("b1")

    records = scoped_records(image, mutate)
    assert found["untouched"] is not None and found["untouched"].name == "b"
    assert found["untouched"] is not image.topics["b"], "a copy: the image is not changed"
    assert found["deleted"] is None and found["old"] is None and found["replaced"] is None
    assert found["recreated"].topic_id == "a2"
    assert image.topic_by_id("a1") is image.topics["a"]  # the image itself is unchanged
    apply(image, *records)
    check_index(image, {"a1", "a2", "b1", "b2"})


class _Id(str):
    """A topic id that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _Id.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class _WalkCountingTable(TopicTable):
    walks = 0

    def __iter__(self) -> Iterator[str]:
        _WalkCountingTable.walks += 1
        return super().__iter__()

    def items(self) -> Any:
        _WalkCountingTable.walks += 1
        return super().items()

    def values(self) -> Any:
        _WalkCountingTable.walks += 1
        return super().values()

    def keys(self) -> Any:
        _WalkCountingTable.walks += 1
        return super().keys()


def test_a_lookup_by_id_walks_no_topics() -> None:
    """O(1), counted rather than timed: a lookup (found or not, in an image of a thousand
    topics) neither walks the table nor compares more than the one id it finds."""
    from tidalmq_broker.apis.fetch import _topic_name

    meta = ClusterMetadata("c")
    meta.topics = _WalkCountingTable(
        (f"t{i}", topic(f"t{i}", _Id(f"00000000-0000-4000-8000-{i:012d}"))) for i in range(1000)
    )
    import uuid

    _WalkCountingTable.walks = 0
    _Id.compared = 0
    assert meta.topic_by_id("00000000-0000-4000-8000-000000000500") is meta.topics["t500"]
    assert meta.topic_by_id("not-an-id") is None
    assert _topic_name(meta, uuid.UUID("00000000-0000-4000-8000-000000000999")) == "t999"
    assert _topic_name(meta, uuid.uuid4()) is None
    apply(meta, topic_removed_record("t1"), topic_record(topic("t1", "new-id")))
    assert meta.topic_by_id("00000000-0000-4000-8000-000000000001") is None
    assert _WalkCountingTable.walks == 0
    assert _Id.compared <= 8, f"{_Id.compared} id comparisons for six lookups and two records"


def test_a_new_topic_info_has_every_field_as_the_dataclass_defaults_say() -> None:
    """TopicInfo's hand-written __init__ (past the topic-id guard) sets every field: a field
    added to the class but not to the __init__ is missing on every new topic, found here."""
    topic = TopicInfo("t", "id", [])
    for f in dataclasses.fields(TopicInfo):
        if f.name in ("name", "topic_id", "partitions"):
            continue
        expected = (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        )
        assert getattr(topic, f.name) == expected, f.name
    assert topic.produce_rules() is topic.produce_rules()  # derived once, kept
