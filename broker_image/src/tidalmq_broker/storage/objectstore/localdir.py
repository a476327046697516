"""An object store in a local directory, safe to share between processes.

A put writes a temporary file in the store's temporary directory (os.writev of the content's
parts) and renames it into place, or hard-links it for create-only writes. Every put holds an
fcntl lock, striped by key (and a thread lock per stripe), across its check and rename, which
makes conditional writes atomic between threads and between broker processes sharing the
directory. The etag names the file version: inode, modification time and size of the file that
was renamed into place.

Group commit: the operations issued on an event loop are gathered into batches, and a batch is
one executor job (one thread handoff each way, not one per operation). A write batch
  1. writes the temporary file of every put (no fsync each),
  2. syncs the filesystem once (syncfs(2)): all their data is durable,
  3. renames or links each into place under its lock, the conditions checked one by one (a put
     that loses fails alone with PreconditionFailed, the others go on),
  4. syncs the filesystem again: the names are durable,
and only then does any put of the batch return. So a visible object is always complete (its data
was durable before its name appeared), and a put that returned is durable. A failed sync fails
every put it covered (ObjectStoreUnavailable); a failed sync in step 2 renames nothing.
A batch of fewer than `syncfs_min_batch` puts (a lone put: two fsyncs cost less than two
syncfs, measured in bench/RESULTS-storage.md; two puts need three or four fsyncs, more than two
syncfs), or any batch where syncfs cannot report write errors (not Linux, or a kernel before
5.8), fsyncs each temporary file in step 2 and each directory it changed in step 4 instead, in
the same order.
At most `max_write_batches` write batches per event loop (and lane) are in flight; puts that
meanwhile wait for the next one (under load that is what makes the batches), which takes them in
order, at most `max_batch_ops` puts and `max_batch_bytes` bytes (a bigger put goes alone).
Puts of `large_put_bytes` or more (WAL objects, segments) have batches of their own, with their
own allowance in flight: they never wait behind thousands of small writes. Gets, heads and
deletes go in read batches of their own, dispatched at once: they never wait for a sync.

syncfs writes back every dirty page of the filesystem, not only the store's: on a filesystem
shared with a heavy writer, a batch waits for that writer's data too.

Write-behind: a put of `write_behind_min_bytes` or more (8 MiB: compaction's segments, not the
WAL objects of the produce path, which flush_bytes keeps near 4 MiB) writes its temporary file
in pieces of `write_behind_bytes` (1 MiB): the writeback of each starts as it is written
(sync_file_range, no journal commit; an fdatasync where there is none) and is waited for before
the next piece's, as RocksDB's bytes_per_sync does. Written whole and then fsynced, a 64 MiB
segment left up to 64 MiB of dirty pages that every other fsync and syncfs of the filesystem
(the WAL's, a move's clean checkpoint, the controller's metadata log) waited behind:
checkpoints of 30-50 ms instead of 7-20 while a broker compacted the gigabyte it had just
taken (docs/architecture/partition-move.md, "A move right after a large write").

The parent directories known to exist are remembered instead of created before every put; a
delete may remove an empty one (here or in another process), so a put whose rename finds no
parent creates it again and retries.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import ctypes
import errno
import fcntl
import itertools
import os
import re
import stat
import sys
import threading
import uuid
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tidalmq_broker.storage.objectstore.base import (
    Content,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    PreconditionFailed,
    content_parts,
    content_size,
    validate_key,
)

_LOCK_STRIPES = 64  # the lock files other processes use too: keep the stripes and their names
_T = TypeVar("_T")
_TMP_DIR = ".tidalmq-tmp"
_LOCK_DIR = ".tidalmq-locks"
_MAX_KNOWN_DIRS = 1 << 16
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_MAX_READ = 1 << 30  # bytes per read call (Linux stops a read at 2 GiB - 4 KiB anyway)


try:
    _IOV_MAX = max(1, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024  # Linux's limit on the buffers of one writev


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs where it reports write errors: Linux 5.8 and later (before 5.8 it returned
    0 even when writeback had failed, which would make a failed write look durable)."""
    if not sys.platform.startswith("linux"):
        return None
    version = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if version is None or (int(version[1]), int(version[2])) < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


# Looked up at every batch (tests replace it to inject failures); None: fsync file by file.
_libc_syncfs: Callable[[int], int] | None = _load_syncfs()

_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux): starts (and waits for) the writeback of a file's range
    without a journal commit, where fdatasync would commit one."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


# Looked up at every write-behind (tests replace it); None: an fdatasync per piece.
_libc_sync_file_range: Callable[[int, int, int, int], int] | None = _load_sync_file_range()


def _write_back(fd: int, start: int, size: int) -> None:
    """Start the writeback of the piece [start, start + size) and wait for that of the piece
    of the same size before it, so at most two pieces of the file are ever dirty or in flight.
    (Durability is still the caller's fsync or syncfs at the end; a writeback error shows there
    too.)"""
    sfr = _libc_sync_file_range
    if sfr is None:
        os.fdatasync(fd)
        return
    _libc_ok(sfr(fd, start, size, _SFR_WRITE), "sync_file_range")
    if start:
        wait = _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER
        _libc_ok(sfr(fd, start - size, size, wait), "sync_file_range")


def _libc_ok(rc: int, call: str) -> None:
    """A libc call's -1 as the OSError of its errno (EIO if it left none)."""
    if rc != 0:
        err = ctypes.get_errno() or errno.EIO
        raise OSError(err, f"{call}: {os.strerror(err)}")


def _syncfs(fn: Callable[[int], int], fd: int) -> None:
    _libc_ok(fn(fd), "syncfs")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, _READ_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _write_all(fd: int, parts: list[memoryview], write_behind: int = 0) -> None:
    """Write the non-empty byte views one after the other. `write_behind` > 0: in pieces of
    that many bytes, the writeback of each started as it is written and waited for before the
    one after next (`_write_back`); the caller makes the whole file durable after (fsync or
    syncfs)."""
    if write_behind <= 0:
        _writev_all(fd, parts)
        return
    piece: list[memoryview] = []
    room = write_behind
    offset = 0  # where the piece being gathered starts in the file
    for part in parts:
        while part:
            take = part[:room]
            piece.append(take)
            part = part[len(take) :]
            room -= len(take)
            if room == 0:
                _writev_all(fd, piece)
                _write_back(fd, offset, write_behind)
                offset += write_behind
                piece, room = [], write_behind
    if piece:
        _writev_all(fd, piece)


def _writev_all(fd: int, parts: list[memoryview]) -> None:
    """writev of at most IOV_MAX buffers at a time, continuing after a partial write where it
    stopped."""
    i = 0
    while i < len(parts):
        written = os.writev(fd, parts[i : i + _IOV_MAX])
        if written <= 0:
            raise OSError(errno.EIO, f"writev wrote {written} bytes")
        while written:
            size = len(parts[i])
            if written < size:
                parts[i] = parts[i][written:]  # partial: the rest of this part goes next
                break
            written -= size
            i += 1


def _read_at(fd: int, offset: int, size: int) -> bytes:
    """`size` bytes from `offset`, fewer at the end of the file."""
    if size <= 0:
        return b""
    data = os.pread(fd, min(size, _MAX_READ), offset)
    if len(data) == size or not data:
        return data
    chunks = [data]
    got = len(data)
    while got < size:
        chunk = os.pread(fd, min(size - got, _MAX_READ), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


class _Put:
    __slots__ = ("data", "future", "if_match", "if_none_match", "key", "path", "size")

    def __init__(
        self,
        key: str,
        path: str,
        data: Content,
        if_none_match: bool,
        if_match: str | None,
        future: asyncio.Future[Any],
    ) -> None:
        self.key = key
        self.path = path
        self.data = data
        self.if_none_match = if_none_match
        self.if_match = if_match
        self.future = future
        try:
            self.size = content_size(data)
        except TypeError:
            self.size = 0  # content_parts says what is wrong, in the job, for this put alone


_GET, _GET_WITH_ETAG, _HEAD, _DELETE = range(4)


class _Missing:
    """What a read of a key that does not exist hands back from the store's thread: the
    `ObjectNotFound` is made on the event loop (`_finish`). Raised in the thread, it carried a
    traceback of the thread's frames, which hold the batch's outcomes and the read, which holds
    its future, which holds the exception: a reference cycle per missing key (about 20 objects),
    thousands when a new broker opens partitions never written (no checkpoint yet) and a young
    collection of 100-300 ms that held the GIL from the broker's heartbeats."""

    __slots__ = ()


_MISSING = _Missing()


class _Read:
    """A get, head or delete (deletes go with the reads: they do not wait for a sync)."""

    __slots__ = ("end", "future", "key", "keys", "kind", "path", "start")

    def __init__(
        self,
        kind: int,
        key: str,
        path: str,
        future: asyncio.Future[Any],
        start: int | None = None,
        end: int | None = None,
        keys: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.key = key
        self.path = path
        self.start = start
        self.end = end
        self.keys = keys
        # None once its caller is done with it (`_read`), answered or cancelled
        self.future: asyncio.Future[Any] | None = future


class _Lane:
    """Puts waiting for a write batch, and the lane's batches in flight."""

    __slots__ = ("in_flight", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[_Put] = deque()
        self.in_flight = 0


class _Queue:
    """The operations of one event loop waiting for a batch, and its batches in flight; touched
    only on that loop. Small and large puts have lanes of their own: a large put never waits
    for the batches of small ones (thousands of checkpoints during a rebalance)."""

    __slots__ = ("large", "reads", "scheduled", "small")

    def __init__(self) -> None:
        self.small = _Lane()
        self.large = _Lane()
        self.reads: list[_Read] = []
        self.scheduled = False

    def idle(self) -> bool:
        small, large = self.small, self.large
        return not (
            self.reads
            or self.scheduled
            or small.waiting
            or small.in_flight
            or large.waiting
            or large.in_flight
        )


def _close_fds(fds: list[int]) -> None:
    for i, fd in enumerate(fds):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
            fds[i] = -1


class LocalDirObjectStore(ObjectStore):
    kind = "localdir"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_threads: int = 8,
        max_write_batches: int = 2,
        max_batch_ops: int = 256,
        max_batch_bytes: int = 4 << 20,
        large_put_bytes: int = 256 << 10,
        syncfs_min_batch: int = 2,
        write_behind_bytes: int = 1 << 20,
        write_behind_min_bytes: int = 8 << 20,
    ) -> None:
        if min(max_threads, max_write_batches, max_batch_ops, max_batch_bytes) < 1:
            raise ValueError("local object store limits must be at least 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / _TMP_DIR).mkdir(exist_ok=True)
        (self.root / _LOCK_DIR).mkdir(exist_ok=True)
        self._root = str(self.root)
        self._prefix = os.path.join(self._root, "")
        self._tmp_dir = os.path.join(self._root, _TMP_DIR)
        self._lock_dir = os.path.join(self._root, _LOCK_DIR)
        self._max_write_batches = max_write_batches
        self._max_batch_ops = max_batch_ops
        self._max_batch_bytes = max_batch_bytes
        self._large_put_bytes = large_put_bytes
        self._syncfs_min_batch = syncfs_min_batch
        self._write_behind_bytes = write_behind_bytes
        self._write_behind_min_bytes = write_behind_min_bytes
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="localdir")
        self._queues: dict[asyncio.AbstractEventLoop, _Queue] = {}
        self._dirs: set[str] = {self._root}  # parent directories known to exist
        # descriptors [one per lock stripe..., the temporary directory's], closed with the store
        self._fds: list[int] = [-1] * (_LOCK_STRIPES + 1)
        weakref.finalize(self, _close_fds, self._fds)
        self._fds_lock = threading.Lock()
        self._pid = -1
        self._after_fork()

    def __repr__(self) -> str:
        return f"LocalDirObjectStore({str(self.root)!r})"

    def _after_fork(self) -> None:
        """Per-process state: a forked child must not share the parent's flocks (they belong to
        the open file, which fork shares), thread locks or temporary file names."""
        _close_fds(self._fds)
        self._pid = os.getpid()
        self._stripe_locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._tmp_names = itertools.count()
        self._tmp_prefix = f"{self._pid}-{uuid.uuid4().hex[:16]}-"

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            with self._fds_lock:
                if os.getpid() != self._pid:
                    self._after_fork()

    def _fd(self, i: int) -> int:
        fd = self._fds[i]
        if fd >= 0:
            return fd
        with self._fds_lock:
            if self._fds[i] < 0:
                if i == _LOCK_STRIPES:
                    self._fds[i] = os.open(self._tmp_dir, _READ_FLAGS)
                else:
                    path = os.path.join(self._lock_dir, f"{i:02d}")
                    self._fds[i] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            return self._fds[i]

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except (ObjectNotFound, PreconditionFailed, ValueError):
            raise
        except OSError as exc:
            raise ObjectStoreUnavailable(f"local object store {self.root}: {exc}") from exc

    # ---------------------------------------------------------------- batching (event loop)
    def _queue(self, loop: asyncio.AbstractEventLoop) -> _Queue:
        q = self._queues.get(loop)
        if q is None:
            q = self._queues[loop] = _Queue()
        return q

    def _schedule(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        # on the next turn of the loop: everything issued in this one goes in the same batch
        if not q.scheduled:
            q.scheduled = True
            loop.call_soon(self._dispatch, loop, q)

    def _dispatch(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        q.scheduled = False
        if q.reads:
            # done (or gone): its caller was cancelled
            reads = [op for op in q.reads if op.future is not None and not op.future.done()]
            q.reads = []
            batch: list[_Read] = []
            size = 0
            for op in reads:
                n = op.end - (op.start or 0) if op.end is not None else 0
                if batch and (
                    len(batch) >= self._max_batch_ops or size + n > self._max_batch_bytes
                ):
                    self._submit(loop, q, None, self._read_job, batch)
                    batch, size = [], 0
                batch.append(op)
                size += n
            if batch:
                self._submit(loop, q, None, self._read_job, batch)
        for lane in (q.large, q.small):
            while lane.waiting and lane.in_flight < self._max_write_batches:
                writes = self._take_writes(lane.waiting)
                if writes:
                    lane.in_flight += 1
                    self._submit(loop, q, lane, self._write_job, writes)
        self._forget_if_idle(loop, q)

    def _take_writes(self, waiting: deque[_Put]) -> list[_Put]:
        """The next batch: puts in order, up to max_batch_ops and max_batch_bytes (at least
        one put, however large)."""
        batch: list[_Put] = []
        size = 0
        while waiting and len(batch) < self._max_batch_ops:
            op = waiting[0]
            if op.future.done():  # the caller was cancelled before the put started
                waiting.popleft()
                continue
            if batch and size + op.size > self._max_batch_bytes:
                break
            waiting.popleft()
            batch.append(op)
            size += op.size
        return batch

    def _submit(
        self,
        loop: asyncio.AbstractEventLoop,
        q: _Queue,
        lane: _Lane | None,
        job: Callable[..., None],
        ops: Sequence[_Put | _Read],
    ) -> None:
        try:
            self._pool.submit(job, loop, q, lane, ops)
        except RuntimeError as exc:  # the store (or the interpreter) is shutting down
            if lane is not None:
                lane.in_flight -= 1
            for op in ops:
                if op.future is not None and not op.future.done():
                    op.future.set_exception(RuntimeError(*exc.args))

    def _finish(
        self,
        loop: asyncio.AbstractEventLoop,
        q: _Queue,
        lane: _Lane | None,
        ops: Sequence[_Put | _Read],
        outcomes: list[object],
    ) -> None:
        if lane is not None:
            lane.in_flight -= 1
        for op, outcome in zip(ops, outcomes, strict=True):
            future = op.future
            if future is None or future.done():
                continue  # the caller was cancelled
            if outcome is _MISSING:
                assert isinstance(op, _Read)
                future.set_exception(ObjectNotFound(op.key))
            elif isinstance(outcome, BaseException):
                future.set_exception(self._error(outcome))
            else:
                future.set_result(outcome)
        if lane is not None and lane.waiting:
            self._schedule(loop, q)
        else:
            self._forget_if_idle(loop, q)

    def _forget_if_idle(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        if q.idle() and self._queues.get(loop) is q:
            del self._queues[loop]

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, OSError):
            err = ObjectStoreUnavailable(f"local object store {self.root}: {exc}")
            err.__cause__ = exc
            return err
        return exc

    def _hand_back(
        self,
        loop: asyncio.AbstractEventLoop,
        q: _Queue,
        lane: _Lane | None,
        ops: Sequence[_Put | _Read],
        outcomes: list[object],
    ) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(self._finish, loop, q, lane, ops, outcomes)

    # ---------------------------------------------------------------- writes
    async def put(
        self,
        key: str,
        data: Content,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        validate_key(key)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        op = _Put(key, self._prefix + key, data, if_none_match, if_match, future)
        q = self._queue(loop)
        (q.large if op.size >= self._large_put_bytes else q.small).waiting.append(op)
        self._schedule(loop, q)
        return await future

    def _write_job(
        self, loop: asyncio.AbstractEventLoop, q: _Queue, lane: _Lane, ops: list[_Put]
    ) -> None:
        try:
            outcomes = self._write_batch(ops)
        except BaseException as exc:  # a bug: no caller may be left waiting
            outcomes = [exc] * len(ops)
        self._hand_back(loop, q, lane, ops, outcomes)

    def _write_batch(self, ops: list[_Put]) -> list[object]:
        """The batch's etags or exceptions, in order (see the module's docstring)."""
        self._check_fork()
        syncfs = _libc_syncfs if len(ops) >= self._syncfs_min_batch else None
        out: list[object] = [None] * len(ops)
        tmps: list[str | None] = [None] * len(ops)
        try:
            written = []
            for i, op in enumerate(ops):  # 1. the temporary files
                try:
                    parts = content_parts(op.data)
                    tmp = f"{self._tmp_dir}/{self._tmp_prefix}{next(self._tmp_names)}"
                    fd = os.open(tmp, _TMP_FLAGS, 0o644)
                    tmps[i] = tmp
                    try:
                        big = op.size >= self._write_behind_min_bytes
                        _write_all(fd, parts, self._write_behind_bytes if big else 0)
                        if syncfs is None:
                            os.fsync(fd)
                        out[i] = _etag(os.fstat(fd))
                    finally:
                        os.close(fd)
                    written.append(i)
                except Exception as exc:
                    out[i] = exc
            if written and syncfs is not None:  # 2. their data durable before any name
                try:
                    _syncfs(syncfs, self._fd(_LOCK_STRIPES))
                except OSError as exc:
                    for i in written:
                        out[i] = exc
                    written = []
            placed = []
            changed: set[str] = set()  # directories with a new entry
            for i in written:  # 3. the names
                op = ops[i]
                try:
                    # written: those whose temporary file was made (tmps[i] set)
                    self._place(op, tmps[i], changed)  # type: ignore[arg-type]
                    placed.append(i)
                    if not op.if_none_match:
                        tmps[i] = None  # renamed away
                except Exception as exc:
                    out[i] = exc
            if placed:  # 4. the names durable before any put returns
                try:
                    if syncfs is not None:
                        _syncfs(syncfs, self._fd(_LOCK_STRIPES))
                    else:
                        for directory in changed:
                            _fsync_dir(directory)
                except OSError as exc:
                    for i in placed:
                        out[i] = exc
                    self._dirs.difference_update(changed)  # sync their parents next time
        finally:
            for leftover in tmps:
                if leftover is not None:
                    with contextlib.suppress(OSError):  # best effort: the result stands
                        os.unlink(leftover)
        return out

    def _place(self, op: _Put, tmp: str, changed: set[str]) -> None:
        """Rename (or link) the temporary file to the key, its condition checked under the key's
        lock; creates the parent directories the first time."""
        parent = _parent(op.path)
        for _attempt in range(5):
            if parent not in self._dirs:
                self._make_dirs(parent, changed)
            try:
                self._locked_place(op, tmp)
            except FileNotFoundError:
                self._dirs.discard(parent)  # a concurrent delete removed it: create it again
                continue
            changed.add(parent)
            return
        raise OSError(errno.ENOENT, f"cannot create parent directory of {op.key}")

    def _locked_place(self, op: _Put, tmp: str) -> None:
        stripe = zlib.crc32(op.key.encode()) % _LOCK_STRIPES
        lock_fd = self._fd(stripe)
        with self._stripe_locks[stripe]:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                if op.if_none_match:
                    try:
                        os.link(tmp, op.path)
                    except FileExistsError:
                        raise PreconditionFailed(f"{op.key} already exists") from None
                    return
                if op.if_match is not None:
                    try:
                        current = _etag(os.stat(op.path))
                    except FileNotFoundError:
                        raise PreconditionFailed(f"{op.key} does not exist") from None
                    if current != op.if_match:
                        raise PreconditionFailed(f"{op.key} changed (etag {current})")
                os.rename(tmp, op.path)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _make_dirs(self, directory: str, changed: set[str]) -> None:
        """mkdir -p. The parents of the directories are noted for the fsync fallback, even of
        one that existed: its creator (another process) may have died before syncing it."""
        if not directory or directory == "/":
            return
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        except FileNotFoundError:
            self._make_dirs(_parent(directory), changed)
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise
        changed.add(_parent(directory))
        if len(self._dirs) >= _MAX_KNOWN_DIRS:
            self._dirs.clear()
            self._dirs.add(self._root)
        self._dirs.add(directory)

    async def delete(self, keys: list[str]) -> None:
        for key in keys:
            validate_key(key)
        if keys:
            await self._read(_Read(_DELETE, "", "", self._future(), keys=list(keys)))

    def _delete_sync(self, keys: Sequence[str]) -> None:
        parents = set()
        for key in keys:
            path = self._prefix + key
            stripe = zlib.crc32(key.encode()) % _LOCK_STRIPES
            lock_fd = self._fd(stripe)
            with self._stripe_locks[stripe]:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
            parents.add(_parent(path))
        for parent in parents:  # drop empty directories up to the root (best effort)
            current = parent
            while current != self._root and current.startswith(self._prefix):
                try:
                    os.rmdir(current)
                except OSError:
                    break
                self._dirs.discard(current)
                current = _parent(current)

    # ---------------------------------------------------------------- reads
    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _read(self, op: _Read) -> Any:
        loop = asyncio.get_running_loop()
        q = self._queue(loop)
        q.reads.append(op)
        self._schedule(loop, q)
        assert op.future is not None  # not in a local: see below
        try:
            return await op.future
        finally:
            # a raised exception's traceback holds this frame, and so `op`: were `op` still to
            # hold the future, which holds the exception, that would be a reference cycle
            op.future = None

    def _read_job(
        self, loop: asyncio.AbstractEventLoop, q: _Queue, lane: None, ops: list[_Read]
    ) -> None:
        outcomes: list[object] = []
        try:
            self._check_fork()
            for op in ops:
                try:
                    outcomes.append(self._read_one(op))
                except Exception as exc:
                    outcomes.append(exc)
        except BaseException as exc:  # a bug: no caller may be left waiting
            outcomes = [exc] * len(ops)
        self._hand_back(loop, q, None, ops, outcomes)

    def _read_one(self, op: _Read) -> object:
        if op.kind == _HEAD:
            try:
                st = os.stat(op.path)
            except (FileNotFoundError, NotADirectoryError):
                return _MISSING
            if not stat.S_ISREG(st.st_mode):
                return _MISSING
            return ObjectInfo(op.key, st.st_size, _etag(st), st.st_mtime)
        if op.kind == _DELETE:
            self._delete_sync(op.keys)
            return None
        try:
            fd = os.open(op.path, _READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return _MISSING
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return _MISSING
            if op.kind == _GET_WITH_ETAG:
                return _read_at(fd, 0, st.st_size), _etag(st)
            start = op.start or 0
            end = st.st_size if op.end is None else op.end
            return _read_at(fd, start, end - start)
        finally:
            os.close(fd)

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        validate_key(key)
        data: bytes = await self._read(
            _Read(_GET, key, self._prefix + key, self._future(), start, end)
        )
        return data

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        validate_key(key)
        out: tuple[bytes, str] = await self._read(
            _Read(_GET_WITH_ETAG, key, self._prefix + key, self._future())
        )
        return out

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        info: ObjectInfo = await self._read(_Read(_HEAD, key, self._prefix + key, self._future()))
        return info

    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        return await self._run(self._list_sync, prefix, start_after)

    def _list_sync(self, prefix: str, start_after: str | None) -> builtins.list[ObjectInfo]:
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / base_rel if base_rel else self.root
        out: list[ObjectInfo] = []
        if not base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if not d.startswith(".tidalmq")]
                rel_dir = ""
            for name in filenames:
                key = f"{rel_dir}/{name}" if rel_dir else name
                if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                out.append(ObjectInfo(key, st.st_size, _etag(st), st.st_mtime))
        out.sort(key=lambda info: info.key)
        return out

    async def close(self) -> None:
        """Waits for the operations this loop has queued but not started (they would otherwise
        fail: the threads are gone), then lets the threads go once their jobs are done."""
        q = self._queues.get(asyncio.get_running_loop())
        if q is not None:
            queued: tuple[_Put | _Read, ...] = (*q.small.waiting, *q.large.waiting, *q.reads)
            waiting = [op.future for op in queued if op.future is not None]
            if waiting:
                await asyncio.wait(waiting)
        self._pool.shutdown(wait=False)
