"""Group commit in the local-directory store: concurrent puts share one thread job and two
syncs, each put still succeeds or fails on its own, and no name ever points to data that was
not durable first. Failures are injected by replacing syscalls (os.writev, libc's syncfs); the
files are real."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.storage.objectstore import (
    LocalDirObjectStore,
    ObjectNotFound,
    ObjectStoreUnavailable,
    PreconditionFailed,
    localdir,
)

needs_syncfs = pytest.mark.skipif(localdir._libc_syncfs is None, reason="no syncfs here")
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd")


def tmp_files(root: Path) -> list[Path]:
    return sorted((root / ".tidalmq-tmp").iterdir())


def spy_syncfs(monkeypatch: pytest.MonkeyPatch, events: list[Any]) -> None:
    real = localdir._libc_syncfs
    assert real is not None

    def syncfs(fd: int) -> int:
        events.append("syncfs")
        return real(fd)

    monkeypatch.setattr(localdir, "_libc_syncfs", syncfs)


def spy_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every write batch, in the order the jobs ran."""
    sizes: list[int] = []
    real = LocalDirObjectStore._write_batch

    def write_batch(self: LocalDirObjectStore, ops: list[Any]) -> list[object]:
        sizes.append(len(ops))
        return real(self, ops)

    monkeypatch.setattr(LocalDirObjectStore, "_write_batch", write_batch)
    return sizes


async def outcomes(*aws: Any) -> list[Any]:
    return list(await asyncio.gather(*aws, return_exceptions=True))


@needs_syncfs
async def test_concurrent_conditional_puts_fail_alone_in_one_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 puts issued together make one batch (one job, two syncs); the ones whose condition
    does not hold fail with PreconditionFailed, and only they."""
    store = LocalDirObjectStore(tmp_path)
    etags = {}
    for i in range(60):
        etags[i] = await store.put(f"cp/{i % 7}/{i}", b"v1-%d" % i)
    events: list[Any] = []
    spy_syncfs(monkeypatch, events)
    sizes = spy_batches(monkeypatch)

    wins: dict[str, bytes] = {}
    losses: dict[str, bytes] = {}
    puts = []
    for i in range(60):
        key = f"cp/{i % 7}/{i}"
        if i % 3 == 0:  # the current etag: wins
            wins[key] = b"v2-%d" % i
            puts.append(store.put(key, wins[key], if_match=etags[i]))
        elif i % 3 == 1:  # a stale etag: loses
            losses[key] = b"stale-%d" % i
            puts.append(store.put(key, losses[key], if_match="1-2-3"))
        else:  # exists already: a create loses
            losses[key] = b"create-%d" % i
            puts.append(store.put(key, losses[key], if_none_match=True))
    for i in range(60, 130):  # new keys: creates win, an if_match on nothing loses
        key = f"new/{i % 5}/{i}"
        if i % 2:
            wins[key] = b"new-%d" % i
            puts.append(store.put(key, wins[key], if_none_match=True))
        else:
            losses[key] = b"nothing-%d" % i
            puts.append(store.put(key, losses[key], if_match=etags[0]))
    # the same new key created twice in the batch: the first in order wins
    puts.append(store.put("dup/key", b"first", if_none_match=True))
    puts.append(store.put("dup/key", b"second", if_none_match=True))
    keys = [*wins, *losses]  # in the order of `puts` up to the duplicates
    order = [*(f"cp/{i % 7}/{i}" for i in range(60)), *(f"new/{i % 5}/{i}" for i in range(60, 130))]
    assert sorted(keys) == sorted(order)

    results = await outcomes(*puts)

    assert sizes == [len(puts)] and events == ["syncfs", "syncfs"]
    for key, result in zip(order, results[:-2], strict=True):
        if key in wins:
            assert isinstance(result, str), (key, result)
            data, etag = await store.get_with_etag(key)
            assert data == wins[key] and etag == result
        else:
            assert isinstance(result, PreconditionFailed), (key, result)
            if key.startswith("new/"):
                with pytest.raises(ObjectNotFound):
                    await store.get(key)
            else:
                assert await store.get(key) != losses[key]
    assert isinstance(results[-2], str) and isinstance(results[-1], PreconditionFailed)
    assert await store.get("dup/key") == b"first"
    assert tmp_files(tmp_path) == []
    await store.close()


async def test_a_failed_temporary_write_fails_only_its_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing one temporary file: that put fails (ObjectStoreUnavailable, the
    errno kept as the cause), leaves nothing behind, and the rest of the batch is stored."""
    store = LocalDirObjectStore(tmp_path)
    sizes = spy_batches(monkeypatch)
    real_writev = os.writev

    def writev(fd: int, buffers: list[memoryview]) -> int:
        if bytes(buffers[0][:4]) == b"FULL":
            real_writev(fd, [buffers[0][:2]])  # a partial temporary file, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    payloads = {f"w/{i}": (b"FULL-%d" if i == 4 else b"ok-%d") % i for i in range(10)}
    results = await outcomes(*(store.put(k, v, if_none_match=True) for k, v in payloads.items()))

    assert sizes == [10]
    failed = results[4]
    assert isinstance(failed, ObjectStoreUnavailable)
    assert isinstance(failed.__cause__, OSError) and failed.__cause__.errno == errno.ENOSPC
    with pytest.raises(ObjectNotFound):
        await store.get("w/4")
    for i, (key, value) in enumerate(payloads.items()):
        if i != 4:
            assert isinstance(results[i], str)
            assert await store.get(key) == value
    assert tmp_files(tmp_path) == []
    await store.close()


@needs_syncfs
@pytest.mark.parametrize("failing_sync", [1, 2])
async def test_a_failed_syncfs_fails_every_put_of_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_sync: int
) -> None:
    """syncfs returning -1 with EIO fails every put of the batch with ObjectStoreUnavailable.
    When the data sync fails, no name is created; when the names' sync fails, the objects may
    be visible (complete: their data was synced) but no put claims it is durable. The next
    batch is not affected."""
    store = LocalDirObjectStore(tmp_path)
    real = localdir._libc_syncfs
    assert real is not None
    calls = [0]

    def syncfs(fd: int) -> int:
        calls[0] += 1
        if calls[0] == failing_sync:
            ctypes.set_errno(errno.EIO)
            return -1
        return real(fd)

    monkeypatch.setattr(localdir, "_libc_syncfs", syncfs)
    payloads = {f"s/{i % 3}/{i}": b"data-%d" % i for i in range(12)}
    results = await outcomes(*(store.put(k, v) for k, v in payloads.items()))

    assert all(isinstance(r, ObjectStoreUnavailable) for r in results), results
    assert all(isinstance(r.__cause__, OSError) and r.__cause__.errno == errno.EIO for r in results)
    visible = {o.key for o in await store.list("s/")}
    if failing_sync == 1:
        assert calls[0] == 1 and visible == set()
    else:
        assert calls[0] == 2 and visible == set(payloads)
        for key, value in payloads.items():
            assert await store.get(key) == value
    assert tmp_files(tmp_path) == []

    again = await outcomes(*(store.put(f"t/{i}", b"x") for i in range(5)))
    assert all(isinstance(r, str) for r in again)
    await store.close()


@needs_syncfs
async def test_names_appear_only_after_their_data_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order inside a batch: every temporary file written, syncfs, every rename/link,
    syncfs, then the puts return. At the first sync no key is visible and every temporary file
    is complete; at the second every key is."""
    store = LocalDirObjectStore(tmp_path)
    payloads = {f"o/{i % 4}/{i}": os.urandom(100 + i) for i in range(16)}
    events: list[Any] = []
    real = localdir._libc_syncfs
    assert real is not None

    def syncfs(fd: int) -> int:
        visible = [k for k in payloads if (tmp_path / k).exists()]
        temps = sorted(p.read_bytes() for p in tmp_files(tmp_path))
        events.append(("syncfs", len(visible), temps == sorted(payloads.values())))
        return real(fd)

    def spy(name: str, fn: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def call(src: str, dst: str) -> None:
            events.append((name, os.path.relpath(dst, tmp_path)))
            fn(src, dst)

        return call

    monkeypatch.setattr(localdir, "_libc_syncfs", syncfs)
    monkeypatch.setattr(os, "rename", spy("rename", os.rename))
    monkeypatch.setattr(os, "link", spy("link", os.link))

    async def put(i: int, key: str, value: bytes) -> None:
        await store.put(key, value, if_none_match=bool(i % 2))
        events.append(("returned", key))

    await asyncio.gather(*(put(i, k, v) for i, (k, v) in enumerate(payloads.items())))

    n = len(payloads)
    assert events[0] == ("syncfs", 0, True)
    assert [e[0] for e in events[1 : n + 1]] == ["link" if i % 2 else "rename" for i in range(n)]
    assert [e[1] for e in events[1 : n + 1]] == list(payloads)
    assert events[n + 1][:2] == ("syncfs", n)
    assert sorted(e[1] for e in events[n + 2 :]) == sorted(payloads)
    for key, value in payloads.items():
        assert await store.get(key) == value
    await store.close()


def _crash_child(root: str, stop_at: str, ready: Any) -> None:
    """Put 8 objects in one batch and stop for good at `stop_at`, waiting to be killed:
    "writing" in the middle of a temporary file, "data-synced" after the data's syncfs (before
    any rename), "renamed" after the renames (before the names' syncfs)."""
    real_syncfs = localdir._libc_syncfs
    assert real_syncfs is not None
    real_writev = os.writev
    syncs = [0]

    def stop() -> None:
        ready.set()
        time.sleep(3600)

    def syncfs(fd: int) -> int:
        rc = real_syncfs(fd)
        syncs[0] += 1
        if (stop_at, syncs[0]) in (("data-synced", 1), ("renamed", 2)):
            stop()
        return rc

    def writev(fd: int, buffers: list[memoryview]) -> int:
        if stop_at == "writing" and len(buffers) > 1:
            real_writev(fd, buffers[:1])  # the first part of a two-part object, then nothing
            stop()
        return real_writev(fd, buffers)

    localdir._libc_syncfs = syncfs
    os.writev = writev  # type: ignore[assignment]

    async def run() -> None:
        store = LocalDirObjectStore(root)
        await asyncio.gather(
            *(store.put(f"k/{i}", [b"%d-" % i, b"x" * 5000], if_none_match=True) for i in range(8))
        )

    asyncio.run(run())


@needs_syncfs
@pytest.mark.parametrize("stop_at", ["writing", "data-synced", "renamed"])
async def test_a_writer_killed_between_phases_leaves_no_partial_object(
    tmp_path: Path, stop_at: str
) -> None:
    """A child process is killed (SIGKILL) in the middle of a batch. Before the renames no key
    is visible, whatever the temporary files hold; after them, every visible object is whole.
    (A killed process is not a power cut: this checks what becomes visible when, the syncs
    themselves are checked by the order test above.)"""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_crash_child, args=(str(tmp_path), stop_at, ready))
    child.start()
    try:
        assert ready.wait(60), "the child never reached the point to be killed at"
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(30)
    assert child.exitcode == -signal.SIGKILL

    store = LocalDirObjectStore(tmp_path)
    listed = await store.list("")
    temps = [p.read_bytes() for p in tmp_files(tmp_path)]
    whole = {b"%d-" % i + b"x" * 5000 for i in range(8)}
    if stop_at == "writing":
        assert listed == []
        assert temps == [b"0-"]  # a partial object exists, under no key
    elif stop_at == "data-synced":
        assert listed == []
        assert set(temps) == whole
    else:
        assert [o.key for o in listed] == [f"k/{i}" for i in range(8)]
        for info in listed:
            assert await store.get(info.key) in whole and info.size == 5002
    # whoever comes next can still create the keys that were never made visible
    if stop_at != "renamed":
        assert isinstance(await store.put("k/0", b"again", if_none_match=True), str)
    await store.close()


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@needs_proc
async def test_without_syncfs_every_file_and_directory_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (no syncfs: not Linux, or a kernel that does not report its errors): each
    temporary file is fsynced before any rename, then each directory that got an entry (the
    parents, and the directories above new ones) before the puts return."""
    monkeypatch.setattr(localdir, "_libc_syncfs", None)
    store = LocalDirObjectStore(tmp_path)
    synced: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = fd_path(fd)
        synced.append(("dir" if os.path.isdir(path) else "file", path))
        real_fsync(fd)

    renamed: list[int] = []
    real_rename = os.rename

    def rename(src: str, dst: str) -> None:
        renamed.append(len(synced))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    keys = [f"a/b/{i}" for i in range(4)] + [f"c/{i}" for i in range(4)]
    results = await outcomes(*(store.put(k, b"v") for k in keys))

    assert all(isinstance(r, str) for r in results)
    files = [p for kind, p in synced if kind == "file"]
    assert len(files) == 8 and all(".tidalmq-tmp" in p for p in files)
    assert min(renamed) >= 8  # every file synced before the first rename
    root = fd_path(store._fd(localdir._LOCK_STRIPES)).removesuffix("/.tidalmq-tmp")
    dirs = {p for kind, p in synced if kind == "dir"}
    assert dirs == {f"{root}/a/b", f"{root}/a", f"{root}/c", root}
    for key in keys:
        assert await store.get(key) == b"v"
    await store.close()


@needs_syncfs
async def test_a_lone_put_fsyncs_and_batches_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone put fsyncs its file and directory (cheaper than two syncfs), two puts sync the
    filesystem; batches take the waiting puts in order, at most max_batch_ops of them and
    max_batch_bytes (a bigger put alone), max_write_batches of them in flight."""
    events: list[Any] = []
    spy_syncfs(monkeypatch, events)
    sizes = spy_batches(monkeypatch)
    store = LocalDirObjectStore(
        tmp_path, max_batch_ops=4, max_batch_bytes=1000, max_write_batches=1
    )
    await store.put("lone", b"1")
    assert events == [] and sizes == [1]
    await asyncio.gather(store.put("two/1", b"1"), store.put("two/2", b"2"))
    assert events == ["syncfs"] * 2 and sizes == [1, 2]

    sizes.clear()
    events.clear()
    small = [store.put(f"n/{i}", b"x" * 10) for i in range(9)]
    await asyncio.gather(*small)
    assert sizes == [4, 4, 1] and events == ["syncfs"] * 4

    sizes.clear()
    await asyncio.gather(
        store.put("b/1", b"x" * 400),
        store.put("b/2", b"x" * 400),
        store.put("b/3", b"x" * 400),
        store.put("b/big", [b"x" * 3000, b"y" * 3000]),
        store.put("b/4", b"x" * 400),
    )
    assert sizes == [2, 1, 1, 1]
    assert await store.get("b/big") == b"x" * 3000 + b"y" * 3000
    await store.close()


@needs_syncfs
async def test_a_large_put_does_not_wait_for_the_batches_of_small_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a batch of small puts is stuck in its sync (with no room for another batch of
    them), a large put issued after them still goes: it has a lane of its own."""
    real = localdir._libc_syncfs
    assert real is not None
    stuck, release = threading.Event(), threading.Event()

    def syncfs(fd: int) -> int:
        if not stuck.is_set():  # the first batch of small puts, before its renames
            stuck.set()
            release.wait(60)
        return real(fd)

    monkeypatch.setattr(localdir, "_libc_syncfs", syncfs)
    store = LocalDirObjectStore(tmp_path, max_write_batches=1, large_put_bytes=10_000)
    small = [asyncio.ensure_future(store.put(f"s/{i}", b"x" * 100)) for i in range(300)]
    await asyncio.sleep(0)
    assert await asyncio.to_thread(stuck.wait, 60)
    try:
        big = [b"w" * 6000, b"a" * 6000]
        etag = await asyncio.wait_for(store.put("wal/1", big, if_none_match=True), 20)
        assert (await store.head("wal/1")).etag == etag
        assert not any(p.done() for p in small)
    finally:
        release.set()
    assert all(isinstance(r, str) for r in await outcomes(*small))
    await store.close()


async def test_known_directories_survive_deletes_here_and_elsewhere(tmp_path: Path) -> None:
    """Parents are created once and remembered; a delete removes empty parents, in this store
    or in another one (another process) that the first does not hear about: the next put there
    creates them again."""
    store, other = LocalDirObjectStore(tmp_path), LocalDirObjectStore(tmp_path)
    await store.put("p/q/r/one", b"1")
    await store.delete(["p/q/r/one"])
    assert not (tmp_path / "p").exists()
    await store.put("p/q/r/two", b"2")  # this store knew the delete

    await other.delete(["p/q/r/two"])  # this one did not: it still thinks p/q/r exists
    assert not (tmp_path / "p").exists()
    results = await outcomes(*(store.put(f"p/q/r/{i}", b"%d" % i) for i in range(5)))
    assert all(isinstance(r, str) for r in results)
    assert [o.key for o in await other.list("p/")] == [f"p/q/r/{i}" for i in range(5)]
    await store.close()
    await other.close()


async def test_reads_are_batched_and_answer_each_on_its_own(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path)
    etag = await store.put("r/obj", b"0123456789")
    (tmp_path / "r" / "dir").mkdir()
    results = await outcomes(
        store.get("r/obj"),
        store.get("r/obj", 2, 5),
        store.get("r/obj", 7),
        store.get("r/obj", 20),
        store.get("r/obj", 8, 100),
        store.get("r/missing"),
        store.get("r/dir"),
        store.get("r/obj/below"),
        store.get_with_etag("r/obj"),
        store.head("r/obj"),
        store.head("r/dir"),
        store.delete(["r/gone", "r/missing"]),
    )
    assert results[:5] == [b"0123456789", b"234", b"789", b"", b"89"]
    assert all(isinstance(r, ObjectNotFound) for r in results[5:8])
    assert results[8] == (b"0123456789", etag)
    assert results[9].etag == etag and results[9].size == 10
    assert isinstance(results[10], ObjectNotFound) and results[11] is None
    await store.close()


async def test_a_put_cancelled_before_its_batch_starts_does_not_happen(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path)
    task = asyncio.ensure_future(store.put("c/x", b"1"))
    await asyncio.sleep(0)  # the put is queued, its batch not yet started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.put("c/y", b"2")
    with pytest.raises(ObjectNotFound):
        await store.get("c/x")
    await store.close()


def test_one_store_serves_several_event_loops(tmp_path: Path) -> None:
    """Batches are per event loop: a store used by one loop after another, or by two loops in
    two threads at once, answers each on its own loop."""
    store = LocalDirObjectStore(tmp_path)
    asyncio.run(store.put("l/1", b"1"))
    assert asyncio.run(store.get("l/1")) == b"1"

    async def many(n: int) -> list[str]:
        return list(await asyncio.gather(*(store.put(f"l/{n}/{i}", b"x") for i in range(50))))

    results: list[list[str]] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(asyncio.run(many(n)))) for n in (2, 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [len(r) for r in results] == [50, 50]
    assert len(asyncio.run(store.list("l/"))) == 101


async def test_close_waits_for_queued_puts(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path, max_write_batches=1, max_batch_ops=2)
    puts = [asyncio.ensure_future(store.put(f"z/{i}", b"z")) for i in range(7)]
    await asyncio.sleep(0)
    await store.close()
    results = await outcomes(*puts)
    assert all(isinstance(r, str) for r in results)
    with pytest.raises(RuntimeError):
        await store.put("z/after", b"z")
