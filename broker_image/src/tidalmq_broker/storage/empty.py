"""The one empty list that the storage state of every partition not yet written to shares.

A topic creation opens thousands of partitions at once, most of which stay empty for a while;
each list they kept of their own was an object the cyclic garbage collector tracks (and a young
collection every 50,000 of them; docs/control-plane.md). The offset index, the aborted
transactions and the tail cache of a partition start with this list and make their own when
they first add to it. It refuses every change, so a place that forgot to make its own list
fails at once instead of writing into every partition's state.
"""

from __future__ import annotations

from typing import Any, NoReturn


class _ReadOnlyEmptyList(list[Any]):
    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("the shared empty list is read-only: make a list of your own first")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


EMPTY_LIST: list[Any] = _ReadOnlyEmptyList()
