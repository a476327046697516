"""The local-directory store: conditional writes are atomic across processes, and a put of
many parts is written whole."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path

import pytest
from tidalmq_broker.storage.objectstore import LocalDirObjectStore, PreconditionFailed


def _create(root: str, me: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        store = LocalDirObjectStore(root)
        barrier.wait()
        try:
            await store.put("race/key", b"writer-%d" % me, if_none_match=True)
            results.put(me)
        except PreconditionFailed:
            results.put(-1)
        await store.close()

    asyncio.run(run())


def _replace(root: str, etag: str, me: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        store = LocalDirObjectStore(root)
        barrier.wait()
        try:
            await store.put("race/cp", b"owner-%d" % me, if_match=etag)
            results.put(me)
        except PreconditionFailed:
            results.put(-1)
        await store.close()

    asyncio.run(run())


def _race(target, args_for, n: int = 6) -> list[int]:  # type: ignore[no-untyped-def]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    return out


def test_exactly_one_process_creates(tmp_path: Path) -> None:
    root = str(tmp_path)
    out = _race(_create, lambda i: (root, i))
    winners = [r for r in out if r >= 0]
    assert len(winners) == 1
    assert (tmp_path / "race/key").read_bytes() == b"writer-%d" % winners[0]


def test_exactly_one_process_replaces(tmp_path: Path) -> None:
    root = str(tmp_path)
    etag = asyncio.run(LocalDirObjectStore(root).put("race/cp", b"initial", if_none_match=True))
    out = _race(_replace, lambda i: (root, etag, i))
    winners = [r for r in out if r >= 0]
    assert len(winners) == 1
    assert (tmp_path / "race/cp").read_bytes() == b"owner-%d" % winners[0]


async def test_temporary_files_never_show_in_listings(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path)
    await store.put("x/y", b"1")
    assert [o.key for o in await store.list("")] == ["x/y"]
    await store.delete(["x/y"])
    assert not (tmp_path / "x").exists()  # empty directories go with their last object
    await store.close()


async def test_a_put_of_parts_survives_partial_writes_and_iov_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """writev may take fewer bytes than asked (and at most IOV_MAX buffers): the store goes on
    where it stopped, mid-part or at a part boundary, until every byte is written once."""
    calls: list[int] = []
    real_writev = os.writev

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        assert 0 < len(buffers) <= 1024 and all(len(b) for b in buffers)
        calls.append(len(buffers))
        budget = 7 + len(calls) % 13  # a few bytes at a time, ending anywhere
        out = []
        for b in buffers:
            out.append(b[:budget])
            budget -= len(out[-1])
            if not budget:
                break
        return real_writev(fd, out)

    store = LocalDirObjectStore(tmp_path)
    parts = [b"%04d;" % i for i in range(1500)]
    parts[3] = b""
    parts[700] = bytes(range(256)) * 3
    monkeypatch.setattr(os, "writev", short_writev)
    etag = await store.put("p/parts", parts, if_none_match=True)
    monkeypatch.setattr(os, "writev", real_writev)
    assert (tmp_path / "p/parts").read_bytes() == b"".join(parts)
    assert (await store.head("p/parts")).etag == etag
    assert len(calls) > 500  # about 8 KB, 7 to 19 bytes a call
    assert not any((tmp_path / ".tidalmq-tmp").iterdir())  # no temporary file left behind

    # all of it in one go: a single writev of the first 1024 parts, then the rest
    calls.clear()

    def counting_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", counting_writev)
    await store.put("p/whole", parts)
    assert calls == [1024, 1499 - 1024]
    assert (tmp_path / "p/whole").read_bytes() == b"".join(parts)
    await store.close()


@pytest.mark.parametrize("writeback", ["sync_file_range", "fdatasync"])
async def test_a_large_put_is_written_back_piece_by_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writeback: str
) -> None:
    """A put of write_behind_min_bytes or more is written in pieces of write_behind_bytes whose
    writeback is waited for as the file grows (sync_file_range: each piece's started, the one
    before it waited for; without it an fdatasync per piece), so at most two pieces of it are
    ever dirty and other fsyncs of the filesystem never wait behind a whole segment; a smaller
    put is written in one go, then made durable once."""
    from tidalmq_broker.storage.objectstore import localdir

    events: list[tuple[str, int, int]] = []
    real_writev, real_fdatasync = os.writev, os.fdatasync
    real_sfr = localdir._libc_sync_file_range

    def writev(fd: int, buffers: list[memoryview]) -> int:
        assert all(len(b) for b in buffers)
        n = real_writev(fd, buffers[:3])  # short writes too: at most 3 buffers at a time
        events.append(("write", n, 0))
        return n

    def fdatasync(fd: int) -> None:
        events.append(("fdatasync", 0, 0))
        real_fdatasync(fd)

    def sync_file_range(fd: int, start: int, size: int, flags: int) -> int:
        events.append(("wait" if flags & 4 else "start", start, size))
        return real_sfr(fd, start, size, flags) if real_sfr is not None else 0

    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(
        localdir,
        "_libc_sync_file_range",
        sync_file_range if writeback == "sync_file_range" else None,
    )
    store = LocalDirObjectStore(tmp_path, write_behind_bytes=1000, write_behind_min_bytes=5000)
    parts = [bytes([i % 251]) * (37 + i * 11) for i in range(45)]  # 12,375 bytes, odd sizes
    await store.put("seg/big", parts, if_none_match=True)
    assert (tmp_path / "seg/big").read_bytes() == b"".join(parts)
    written = settled = most = 0  # bytes written, bytes whose writeback was waited for
    for kind, n, size in events:
        if kind == "write":
            written += n
        elif kind == "fdatasync":
            settled = written
        elif kind == "wait":
            settled = n + size  # the piece [start, start + size) and all before it
        most = max(most, written - settled)
    assert most <= 2000  # never more than two pieces' bytes dirty or in flight
    kinds = [kind for kind, _, _ in events]
    if writeback == "sync_file_range":  # 12 whole pieces started, each but the first's
        # predecessor waited for
        assert (kinds.count("start"), kinds.count("wait"), kinds.count("fdatasync")) == (12, 11, 0)
        assert [(s, z) for k, s, z in events if k == "start"] == [
            (i * 1000, 1000) for i in range(12)
        ]
    else:
        assert kinds.count("fdatasync") == 12

    events.clear()
    small = [b"x" * 1000] * 4
    await store.put("wal/small", small, if_none_match=True)
    assert (tmp_path / "wal/small").read_bytes() == b"".join(small)
    assert [k for k, _, _ in events if k != "write"] == []
    await store.close()


async def test_reads_of_missing_keys_leave_no_reference_cycles(tmp_path: Path) -> None:
    """A new broker opening partitions never written reads a checkpoint that is not there,
    once per partition. Raised in the store's thread, each miss left a reference cycle (the
    exception's traceback held the thread's frames, which held the read, whose future held
    the exception): ~20 objects a miss, and the young collections that freed them held the
    GIL for 100-300 ms while the scenario's brokers heartbeated. Now a miss leaves none, and
    still raises ObjectNotFound (get, get_with_etag, head)."""
    from tidalmq_broker.storage.objectstore import ObjectNotFound

    store = LocalDirObjectStore(str(tmp_path))
    await store.put("present/key", b"x")
    (tmp_path / "a-directory").mkdir()
    import gc

    gc.collect()
    gc.disable()
    try:
        misses = 0
        for i in range(200):
            for read in (store.get, store.get_with_etag, store.head):
                for key in (f"missing/{i}", "a-directory"):
                    with pytest.raises(ObjectNotFound):
                        await read(key)
                    misses += 1
        assert await store.get("present/key") == b"x"
        unreachable = gc.collect()
    finally:
        gc.enable()
        await store.close()
    assert unreachable < misses // 10, f"{unreachable} objects in cycles after {misses} misses"
