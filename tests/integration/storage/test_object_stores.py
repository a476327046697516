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


async def test_put_of_a_sequence_of_buffers(backend: Callable[[], ObjectStore]) -> None:
    """A put of several buffers stores them concatenated: any mix of bytes, bytearray and
    memoryview, empty parts, more parts than one writev takes (IOV_MAX = 1024), and
    conditional puts, with the same answers as a put of the joined bytes."""
    store = backend()
    try:
        frame = bytearray(b"<frame header>" + bytes(range(256)) * 4)
        parts: list[bytes | bytearray | memoryview] = [
            b"head",
            b"",
            memoryview(frame)[14:],
            bytearray(b"tail"),
            memoryview(b""),
        ]
        expected = b"".join(parts)
        etag = await store.put("seq/mixed", parts, if_none_match=True)
        assert await store.get("seq/mixed") == expected
        assert await store.get("seq/mixed", 2, 10) == expected[2:10]
        info = await store.head("seq/mixed")
        assert info.size == len(expected) and info.etag == etag
        assert frame.startswith(b"<frame header>")  # the caller's buffers are untouched

        many: list[bytes | memoryview] = [b"%05d|" % i for i in range(2500)]
        many[1024] = b""
        many[2048] = memoryview(bytearray(100_000))  # a bigger one across a writev boundary
        await store.put("seq/many", many)
        data = await store.get("seq/many")
        assert data == b"".join(many) and (await store.head("seq/many")).size == len(data)

        assert await store.put("seq/empty", [b"", b""]) and await store.get("seq/empty") == b""
        await store.put("seq/none", [])
        assert (await store.head("seq/none")).size == 0

        with pytest.raises(PreconditionFailed):
            await store.put("seq/mixed", [b"x", b"y"], if_none_match=True)
        second = await store.put("seq/mixed", (b"v", memoryview(b"2")), if_match=etag)
        assert await store.get("seq/mixed") == b"v2"
        with pytest.raises(PreconditionFailed):
            await store.put("seq/mixed", [b"v", b"3"], if_match=etag)  # stale etag
        with pytest.raises(PreconditionFailed):
            await store.put("seq/gone", [b"x"], if_match=second)
        data, etag3 = await store.get_with_etag("seq/mixed")
        assert data == b"v2" and etag3 == second
    finally:
        await store.close()
