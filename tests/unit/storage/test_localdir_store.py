"""Conditional writes of the local-directory store are atomic across processes."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

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
