"""Fetch v13+ names topics by id: the broker finds each id's topic in its metadata image through an
index built once per image, and never answers from a stale one (a topic deleted and re-created
under the same name has a new id; an image without the topic knows no id)."""

from __future__ import annotations

import uuid

from tidalmq_broker.apis.fetch import _TopicNames
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo

ORDERS = uuid.UUID("6f1c7d3e-0b8a-4f0e-9a51-3c2d1e0f4a5b")
AUDIT = uuid.UUID("0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6a")


def image(**topics: uuid.UUID) -> ClusterMetadata:
    return ClusterMetadata(
        "cluster",
        topics={
            name: TopicInfo(name, str(topic_id), [PartitionState(1, 0, [1])])
            for name, topic_id in topics.items()
        },
    )


def test_an_id_names_its_topic_and_an_unknown_id_none() -> None:
    names = _TopicNames()
    meta = image(orders=ORDERS, audit=AUDIT)
    assert names.name(meta, ORDERS) == "orders"
    assert names.name(meta, AUDIT) == "audit"
    assert names.name(meta, uuid.uuid4()) is None
    assert names.name(meta, None) is None  # a null id (all zeros on the wire)


def test_a_new_image_is_never_answered_from_the_old_index() -> None:
    names = _TopicNames()
    assert names.name(image(orders=ORDERS), ORDERS) == "orders"
    recreated = uuid.UUID("11111111-2222-4333-8444-555555555555")
    after = image(orders=recreated)  # orders deleted and created again: a new id
    assert names.name(after, ORDERS) is None
    assert names.name(after, recreated) == "orders"
    assert names.name(image(), recreated) is None  # and then deleted
    assert names.name(image(audit=AUDIT), AUDIT) == "audit"
