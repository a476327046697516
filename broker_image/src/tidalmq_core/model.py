"""The cluster metadata model: names every other package agrees on."""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar


class TopicPartition(NamedTuple):
    """A topic's partition. A named tuple, not a dataclass: every map of partitions (the
    controller's image and indexes, a broker's wishes and open partitions) hashes and compares
    these per partition, and a tuple does that in C, twice as fast as a frozen dataclass's
    generated methods (a 6,000-partition creation hashes each one dozens of times)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


V = TypeVar("V")


class PartitionMap(dict[TopicPartition, V]):
    """A dict keyed by partition that also knows which topics it holds partitions of
    (`has_topic`, O(1)). A broker asks it whether any partition of a topic is wished or open
    here: when none is, a topic's creation or deletion concerns only the partitions it leads,
    not every partition of the topic. Lookups are the dict's own; only the writes count."""

    def __init__(self) -> None:
        super().__init__()
        self._per_topic: dict[str, int] = {}

    def has_topic(self, name: str) -> bool:
        return name in self._per_topic

    def _added(self, name: str) -> None:
        self._per_topic[name] = self._per_topic.get(name, 0) + 1

    def _removed(self, name: str) -> None:
        left = self._per_topic[name] - 1
        if left:
            self._per_topic[name] = left
        else:
            del self._per_topic[name]

    def __setitem__(self, tp: TopicPartition, value: V) -> None:
        if tp not in self:
            self._added(tp.topic)
        super().__setitem__(tp, value)

    def __delitem__(self, tp: TopicPartition) -> None:
        super().__delitem__(tp)
        self._removed(tp.topic)

    def pop(self, tp: TopicPartition, *default: Any) -> Any:
        if tp in self:
            self._removed(tp.topic)
        return super().pop(tp, *default)

    def popitem(self) -> tuple[TopicPartition, V]:
        tp, value = super().popitem()
        self._removed(tp.topic)
        return tp, value

    def setdefault(self, tp: TopicPartition, default: V) -> V:
        if tp not in self:
            self[tp] = default
        return self[tp]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for tp, value in dict(*args, **kwargs).items():
            self[tp] = value

    def __ior__(self, other: Any) -> PartitionMap[V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self._per_topic.clear()
