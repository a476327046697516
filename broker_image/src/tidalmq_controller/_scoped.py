"""Changes written as a function of the image, turned into records (for the static topics,
whose remap steps are written that way).

`scoped_records(image, mutate)` runs `mutate` on a view of the image whose topics and static
topics are copied when first touched, then compares each touched one with the image and returns
the records that make the difference. It costs O(what `mutate` touches), not O(cluster): a
remap touches one static topic, its Kafka view and its physical queues.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from tidalmq_core.metadata import ClusterMetadata, TopicInfo, TopicTable
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import (
    Record,
    partition_diff,
    partitions_added_record,
    static_topic_record,
    topic_configs_record,
    topic_record,
    topic_removed_record,
)
from tidalmq_core.static_mapping import StaticTopicState

V = TypeVar("V")

_MISSING = object()


class CopyOnAccess(dict[str, V], Generic[V]):
    """A dict over `source` whose values are copied (with `copier`) the first time they are
    read; assignments and deletions stay here. `touched()` says what may have changed."""

    def __init__(self, source: dict[str, V], copier: Callable[[V], V]) -> None:
        super().__init__()
        self._source = source
        self._copier = copier
        self.removed: set[str] = set()

    def _load(self, key: str) -> None:
        if not dict.__contains__(self, key) and key not in self.removed and key in self._source:
            super().__setitem__(key, self._copier(self._source[key]))

    def __getitem__(self, key: str) -> V:
        self._load(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self._load(key)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        return isinstance(key, str) and key in self._source and key not in self.removed

    # writes go through super() (a subclass's dict may keep an index: _ScopedTopics)
    def __setitem__(self, key: str, value: V) -> None:
        self.removed.discard(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        super().pop(key, None)
        self.removed.add(key)

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        if key in self:
            value = self[key]
            del self[key]
            return value
        if default is _MISSING:
            raise KeyError(key)
        return default

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def _keys(self) -> list[str]:
        own = [k for k in dict.keys(self)]
        return own + [
            k for k in self._source if k not in self.removed and not dict.__contains__(self, k)
        ]

    def keys(self) -> Any:
        return self._keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def items(self) -> Any:
        return [(k, self[k]) for k in self._keys()]

    def values(self) -> Any:
        return [self[k] for k in self._keys()]

    def touched(self) -> list[str]:
        return list(dict.keys(self))


class _ScopedTopics(CopyOnAccess[TopicInfo], TopicTable):
    """The scoped view's topics: copied on access like any CopyOnAccess, and found by id as in
    a TopicTable (the ones held here through its index, the others through the image's)."""

    _source: TopicTable  # the image's topics, found by id through their own index

    def __init__(self, source: TopicTable) -> None:
        super().__init__(source, _copy_topic)

    def by_id(self, topic_id: str) -> TopicInfo | None:
        own = TopicTable.by_id(self, topic_id)
        if own is not None:
            return own
        name = self._source.name_of(topic_id)
        if name is None or name in self.removed or dict.__contains__(self, name):
            return None  # gone from the view, or replaced here by a topic with another id
        return self[name]

    def name_of(self, topic_id: str) -> str | None:
        topic = self.by_id(topic_id)
        return None if topic is None else topic.name


def _copy_topic(topic: TopicInfo) -> TopicInfo:
    return copy.deepcopy(topic)


def _copy_static(state: StaticTopicState) -> StaticTopicState:
    return StaticTopicState.from_json(state.to_json())


def scoped_records(
    image: ClusterMetadata, mutate: Callable[[ClusterMetadata], object]
) -> list[Record]:
    """The records of what `mutate` changes (it must touch only topics and static topics)."""
    work = copy.copy(image)
    topics = _ScopedTopics(image.topics)
    statics: CopyOnAccess[StaticTopicState] = CopyOnAccess(image.static_topics, _copy_static)
    work.topics = topics
    work.static_topics = statics
    mutate(work)
    records: list[Record] = []
    for name in statics.removed:
        if name in image.static_topics:
            records.append(static_topic_record(name, None))
    for name in statics.touched():
        new = dict.__getitem__(statics, name)
        old = image.static_topics.get(name)
        if old is None or old.to_json() != new.to_json():
            records.append(static_topic_record(name, new))
    for name in topics.removed:
        if name in image.topics:
            records.append(topic_removed_record(name))
    for name in topics.touched():
        records.extend(topic_changes(image.topics.get(name), dict.__getitem__(topics, name)))
    return records


def topic_changes(old: TopicInfo | None, new: TopicInfo) -> list[Record]:
    """Records turning topic `old` into `new`: per partition when only partitions changed (and
    some were added), else the whole topic."""
    if (
        old is None
        or old.topic_id != new.topic_id
        or old.internal != new.internal
        or old.kind != new.kind
        or len(new.partitions) < len(old.partitions)
    ):
        return [topic_record(new)]
    records: list[Record] = []
    if old.configs != new.configs:
        records.append(topic_configs_record(new.name, new.configs))
    for i, (a, b) in enumerate(zip(old.partitions, new.partitions, strict=False)):
        rec = partition_diff(TopicPartition(new.name, i), a, b)
        if rec is not None:
            records.append(rec)
    added = new.partitions[len(old.partitions) :]
    if added:
        records.append(
            partitions_added_record(
                new.name,
                [p.replicas[0] if p.replicas else -1 for p in added],
                at=len(old.partitions),
            )
        )
        for j, p in enumerate(added, len(old.partitions)):
            plain_leader = p.replicas[0] if p.replicas else -1
            rec = partition_diff(
                TopicPartition(new.name, j),
                type(p)(plain_leader, 0, list(p.replicas)),
                p,
            )
            if rec is not None:
                records.append(rec)
    return records
