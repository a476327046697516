"""The object-store contract, against every backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tidalmq_broker.storage.objectstore import ObjectNotFound, ObjectStore, PreconditionFailed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60, func_only=True)]


async def test_put_get_ranges_head_list_delete(backend: Callable[[], ObjectStore]) -> None:
    store = backend()
    try:
        etag = await store.put("a/b/one", b"0123456789")
        assert await store.get("a/b/one") == b"0123456789"
        assert await store.get("a/b/one", 2, 5) == b"234"
        assert await store.get("a/b/one", 7) == b"789"
        data, etag2 = await store.get_with_etag("a/b/one")
        assert data == b"0123456789" and etag2 == etag
        info = await store.head("a/b/one")
        assert info.size == 10 and info.etag == etag
        await store.put("a/b/two", memoryview(b"2"))
        await store.put("a/c", bytearray(b"3"))
        assert [o.key for o in await store.list("a/")] == ["a/b/one", "a/b/two", "a/c"]
        assert [o.key for o in await store.list("a/b/")] == ["a/b/one", "a/b/two"]
        assert [o.key for o in await store.list("a/", start_after="a/b/one")] == ["a/b/two", "a/c"]
        await store.delete(["a/b/one", "a/missing"])
        with pytest.raises(ObjectNotFound):
            await store.get("a/b/one")
        with pytest.raises(ObjectNotFound):
            await store.head("a/b/one")
        assert [o.key for o in await store.list("a/")] == ["a/b/two", "a/c"]
    finally:
        await store.close()


async def test_conditional_writes(backend: Callable[[], ObjectStore]) -> None:
    store = backend()
    try:
        first = await store.put("cp", b"v1", if_none_match=True)
        with pytest.raises(PreconditionFailed):
            await store.put("cp", b"v2", if_none_match=True)
        second = await store.put("cp", b"v2", if_match=first)
        assert second != first
        with pytest.raises(PreconditionFailed):
            await store.put("cp", b"v3", if_match=first)  # stale etag: someone else won
        with pytest.raises(PreconditionFailed):
            await store.put("nothing-here", b"x", if_match=second)
        assert await store.get("cp") == b"v2"
    finally:
        await store.close()
