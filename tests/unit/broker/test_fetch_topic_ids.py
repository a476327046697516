"""Fetch v13+ names topics by id: the broker finds each id's topic through its metadata image's
index of topics by id, which every change to the image keeps, so it never answers from a stale
one (a topic deleted and re-created under the same name has a new id; an image without the topic
knows no id), whether the image is replaced or changed in place by records."""

from __future__ import annotations

import uuid

from tidalmq_broker.apis.fetch import _topic_name
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.records import apply_batch, topic_record, topic_removed_record

ORDERS = uuid.UUID("6f1c7d3e-0b8a-4f0e-9a51-3c2d1e0f4a5b")
AUDIT = uuid.UUID("0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6a")
RECREATED = uuid.UUID("11111111-2222-4333-8444-555555555555")


def topic(name: str, topic_id: uuid.UUID) -> TopicInfo:
    return TopicInfo(name, str(topic_id), [PartitionState(1, 0, [1])])


def image(**topics: uuid.UUID) -> ClusterMetadata:
    return ClusterMetadata(
        "cluster", topics={name: topic(name, topic_id) for name, topic_id in topics.items()}
    )


def test_an_id_names_its_topic_and_an_unknown_id_none() -> None:
    meta = image(orders=ORDERS, audit=AUDIT)
    assert _topic_name(meta, ORDERS) == "orders"
    assert _topic_name(meta, AUDIT) == "audit"
    assert _topic_name(meta, uuid.uuid4()) is None
    assert _topic_name(meta, None) is None  # a null id (all zeros on the wire)


def test_a_new_image_answers_from_its_own_topics() -> None:
    assert _topic_name(image(orders=ORDERS), ORDERS) == "orders"
    after = image(orders=RECREATED)  # orders deleted and created again: a new id
    assert _topic_name(after, ORDERS) is None
    assert _topic_name(after, RECREATED) == "orders"
    assert _topic_name(image(), RECREATED) is None  # and then deleted
    assert _topic_name(image(audit=AUDIT), AUDIT) == "audit"


def test_an_image_changed_in_place_by_records_is_never_answered_stale() -> None:
    """The broker applies each committed batch to its image in place: the same object."""
    meta = image(orders=ORDERS, audit=AUDIT)
    assert _topic_name(meta, ORDERS) == "orders"
    apply_batch(meta, [topic_removed_record("orders")], 1)
    assert _topic_name(meta, ORDERS) is None
    apply_batch(meta, [topic_record(topic("orders", RECREATED))], 2)
    assert _topic_name(meta, ORDERS) is None
    assert _topic_name(meta, RECREATED) == "orders"
    assert _topic_name(meta, AUDIT) == "audit"
