"""An object store in a local directory, safe to share between processes.

Every write goes to a temporary file (written with os.writev from the parts of the content, in
the store's thread) that is fsynced and then renamed (or hard-linked, for create-only writes) into
place, and the directory is fsynced, so a returned put is durable.
Conditional writes hold an fcntl lock (striped by key) across check and rename, which makes them
atomic between threads and between broker processes sharing the directory. The etag names the
file version: inode, modification time and size of the file that was renamed into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tidalmq_broker.storage.objectstore.base import (
    Content,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    PreconditionFailed,
    content_parts,
    validate_key,
)

_LOCK_STRIPES = 64
_TMP_DIR = ".tidalmq-tmp"
_LOCK_DIR = ".tidalmq-locks"


try:
    _IOV_MAX = max(1, min(os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 1024  # Linux's limit on the buffers of one writev


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _write_all(fd: int, parts: list[memoryview]) -> None:
    """Write the non-empty byte views one after the other: writev of at most IOV_MAX buffers
    at a time, continuing after a partial write where it stopped."""
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


class LocalDirObjectStore(ObjectStore):
    kind = "localdir"

    def __init__(self, root: str | os.PathLike[str], *, max_threads: int = 8) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / _TMP_DIR).mkdir(exist_ok=True)
        (self.root / _LOCK_DIR).mkdir(exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="localdir")

    def __repr__(self) -> str:
        return f"LocalDirObjectStore({str(self.root)!r})"

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except (ObjectNotFound, PreconditionFailed, ValueError):
            raise
        except OSError as exc:
            raise ObjectStoreUnavailable(f"local object store {self.root}: {exc}") from exc

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
        return await self._run(self._put_sync, key, data, if_none_match, if_match)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = zlib.crc32(key.encode()) % _LOCK_STRIPES
        fd = os.open(self.root / _LOCK_DIR / f"{stripe:02d}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _put_sync(
        self,
        key: str,
        data: Content,
        if_none_match: bool,
        if_match: str | None,
    ) -> str:
        parts = content_parts(data)
        path = self.root / key
        tmp = self.root / _TMP_DIR / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, parts)
            os.fsync(fd)
            etag = _etag(os.fstat(fd))
        finally:
            os.close(fd)
        try:
            for _attempt in range(5):
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with self._locked(key):
                        if if_none_match:
                            try:
                                os.link(tmp, path)
                            except FileExistsError:
                                raise PreconditionFailed(f"{key} already exists") from None
                        else:
                            if if_match is not None:
                                try:
                                    current = _etag(os.stat(path))
                                except FileNotFoundError:
                                    raise PreconditionFailed(f"{key} does not exist") from None
                                if current != if_match:
                                    raise PreconditionFailed(f"{key} changed (etag {current})")
                            os.rename(tmp, path)
                    break
                except FileNotFoundError:
                    continue  # a concurrent delete removed the parent directory; recreate it
            else:
                raise OSError(errno.ENOENT, f"cannot create parent directory of {key}")
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            return etag
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    async def delete(self, keys: list[str]) -> None:
        for key in keys:
            validate_key(key)
        if keys:
            await self._run(self._delete_sync, keys)

    def _delete_sync(self, keys: list[str]) -> None:
        parents = set()
        for key in keys:
            path = self.root / key
            with self._locked(key), contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            parents.add(path.parent)
        for parent in parents:  # drop empty directories up to the root (best effort)
            current = parent
            while current != self.root:
                try:
                    current.rmdir()
                except OSError:
                    break
                current = current.parent

    # ---------------------------------------------------------------- reads
    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        validate_key(key)
        return await self._run(self._get_sync, key, start, end)

    def _get_sync(self, key: str, start: int | None, end: int | None) -> bytes:
        try:
            with open(self.root / key, "rb", buffering=0) as f:
                if start:
                    f.seek(start)
                if end is None:
                    return f.read()
                return f.read(max(0, end - (start or 0)))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        validate_key(key)
        return await self._run(self._get_with_etag_sync, key)

    def _get_with_etag_sync(self, key: str) -> tuple[bytes, str]:
        try:
            with open(self.root / key, "rb", buffering=0) as f:
                etag = _etag(os.fstat(f.fileno()))
                return f.read(), etag
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    async def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        return await self._run(self._head_sync, key)

    def _head_sync(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self.root / key)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None
        if not os.path.isfile(self.root / key):
            raise ObjectNotFound(key)
        return ObjectInfo(key, st.st_size, _etag(st), st.st_mtime)

    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        return await self._run(self._list_sync, prefix, start_after)

    def _list_sync(self, prefix: str, start_after: str | None) -> list[ObjectInfo]:
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
        self._pool.shutdown(wait=False)
