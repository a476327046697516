"""The cluster metadata model: names every other package agrees on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Self, TypeVar


class TopicPartition(NamedTuple):
    """A topic's partition. A named tuple, not a dataclass: every map of partitions (the
    controller's image and indexes, a broker's wishes and open partitions) hashes and compares
    these per partition, and a tuple does that in C, twice as fast as a frozen dataclass's
    generated methods (a 6,000-partition creation hashes each one dozens of times)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


K = TypeVar("K")
V = TypeVar("V")
_MISSING: Any = object()


class IndexedDict(dict[K, V]):
    """A dict that keeps an index derived from its entries: every mutating dict method goes
    through `_index` (an entry added), `_unindex` (an entry removed), `_replaced` (a key given a
    new value: both, unless a subclass knows better) and `_clear_index`, so the index cannot
    diverge from the entries. Copies, `copy.copy`, `copy.deepcopy` and pickle rebuild it from
    the entries. Lookups are the dict's own, at the dict's speed; only writes pay the index."""

    def __init__(self, entries: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        super().__init__(entries)
        for key, value in dict.items(self):
            self._index(key, value)

    def _index(self, key: K, value: V) -> None:
        raise NotImplementedError

    def _unindex(self, key: K, value: V) -> None:
        raise NotImplementedError

    def _replaced(self, key: K, old: V, new: V) -> None:
        self._unindex(key, old)
        self._index(key, new)

    def _clear_index(self) -> None:
        raise NotImplementedError

    def __setitem__(self, key: K, value: V) -> None:
        if dict.__contains__(self, key):
            old = dict.__getitem__(self, key)
            dict.__setitem__(self, key, value)
            self._replaced(key, old, value)
        else:
            dict.__setitem__(self, key, value)
            self._index(key, value)

    def __delitem__(self, key: K) -> None:
        value = dict.pop(self, key)
        self._unindex(key, value)

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        if dict.__contains__(self, key):
            value = dict.pop(self, key)
            self._unindex(key, value)
            return value
        if default is _MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[K, V]:
        key, value = dict.popitem(self)
        self._unindex(key, value)
        return key, value

    def setdefault(self, key: K, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    # dict's own |= would bypass the index. Its stub ties __ior__ to __or__'s overloads (a
    # plain dict, left as it is), which no override returning the subclass satisfies.
    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        dict.clear(self)
        self._clear_index()

    def copy(self) -> Self:
        return type(self)(self)

    def __reduce__(self) -> tuple[Any, ...]:  # copy.copy, copy.deepcopy and pickle rebuild it
        return (type(self), (dict(self),))


class PartitionMap(IndexedDict[TopicPartition, V]):
    """A dict keyed by partition that also knows which topics it holds partitions of
    (`has_topic`, O(1)). A broker asks it whether any partition of a topic is wished or open
    here: when none is, a topic's creation or deletion concerns only the partitions it leads,
    not every partition of the topic. Lookups are the dict's own; only the writes count."""

    def __init__(
        self,
        entries: Mapping[TopicPartition, V] | Iterable[tuple[TopicPartition, V]] = (),
    ) -> None:
        self._per_topic: dict[str, int] = {}
        super().__init__(entries)

    def has_topic(self, name: str) -> bool:
        return name in self._per_topic

    def _index(self, tp: TopicPartition, value: V) -> None:
        self._per_topic[tp.topic] = self._per_topic.get(tp.topic, 0) + 1

    def _unindex(self, tp: TopicPartition, value: V) -> None:
        left = self._per_topic[tp.topic] - 1
        if left:
            self._per_topic[tp.topic] = left
        else:
            del self._per_topic[tp.topic]

    def _replaced(self, tp: TopicPartition, old: V, new: V) -> None:
        pass  # the same partition: its topic's count stays

    def _clear_index(self) -> None:
        self._per_topic.clear()
