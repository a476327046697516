"""Where the metadata log lives: batches of records and snapshots, as objects.

One object per committed batch, `<prefix>log/<version>` (20 digits), created only if absent
(If-None-Match): two controllers can never both append the same version, and the one that
loses learns that it was deposed. A snapshot of the image after batch V is `<prefix>snapshots/<V>`
(JSON lines, see tidalmq_core.snapshots); the batches it covers are deleted once a newer
snapshot exists (two are kept). Loading reads the newest snapshot and the batches after it.

A store that holds only the document of the earlier design (`<prefix>metadata.json`, the whole
image replaced on every change) is read as a snapshot at that document's version: an upgrade
continues from it, and the first snapshot written replaces it.

The in-memory log (`MemoryMetadataLog`) has the same semantics, for tests of the controller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.records import Record

log = logging.getLogger(__name__)

_dumps = json.JSONEncoder(separators=(",", ":")).encode
READ_CONCURRENCY = 16
KEEP_SNAPSHOTS = 2


class LogConflict(Exception):
    """Another controller appended this version first: this one was deposed."""


class MetadataLost(Exception):
    """The log is missing what its pointer says was committed (a wiped or replaced store)."""


@dataclass(slots=True)
class Batch:
    version: int
    epoch: int
    records: list[Record]
    data: bytes = b""  # the encoded batch (stored and pushed as it is)

    def __post_init__(self) -> None:
        if not self.data:
            self.data = encode_batch(self.version, self.epoch, self.records)


def encode_batch(version: int, epoch: int, records: list[Record]) -> bytes:
    return _dumps(
        {"v": version, "epoch": epoch, "ts": int(time.time() * 1000), "r": records}
    ).encode()


def decode_batch(data: bytes) -> Batch:
    doc = json.loads(data)
    return Batch(int(doc["v"]), int(doc["epoch"]), doc["r"], bytes(data))


@dataclass(slots=True)
class LoadedLog:
    """What a controller starts from: the newest snapshot (raw, and its version; none for a
    new cluster) and the batches after it, in order."""

    snapshot: bytes | None = None
    snapshot_version: int = 0
    batches: list[Batch] = field(default_factory=list)
    stored_snapshot: bool = False  # the snapshot is a snapshot object (not the old document)
    cluster_id: str | None = None  # for an empty log: the id the new cluster must have

    @property
    def head(self) -> int:
        """The version of the last committed batch (0: nothing committed)."""
        return self.batches[-1].version if self.batches else self.snapshot_version

    @property
    def empty(self) -> bool:
        return self.snapshot is None and not self.batches

    def image(self) -> ClusterMetadata | None:
        """The image after every loaded batch (None for an empty log)."""
        if self.empty:
            return None
        if self.snapshot is not None:
            meta = snapshots.decode(self.snapshot)
        else:  # batches from the first: a new cluster's first snapshot was never written
            meta = ClusterMetadata(cluster_id=self.cluster_id or "")
        from tidalmq_core.records import apply_batch

        for batch in self.batches:
            apply_batch(meta, batch.records, batch.version)
        return meta


class MetadataLog(Protocol):
    """The durable home of the metadata log (object store; on Kubernetes behind a pointer)."""

    async def load(self) -> LoadedLog: ...

    async def claim(self, epoch: int) -> None:
        """Before the first append of a new controller epoch (Kubernetes: the fence). Raises
        LogConflict if another controller claimed a newer epoch."""
        ...

    async def append(self, batch: Batch) -> None:
        """Store the batch at its version if that version is free. LogConflict: someone else
        appended it; any other exception: try again (the batch is not known to be stored)."""
        ...

    async def confirm(self, epoch: int, next_version: int) -> bool:
        """True while nobody else appended (or claimed) since our last append: `next_version`
        is still free. False: deposed. Raises when the store cannot tell right now."""
        ...

    async def write_snapshot(self, version: int, data: bytes) -> None: ...

    async def trim(self) -> None:
        """Delete what the newest snapshots make unnecessary."""
        ...


def _require_contiguous(loaded: LoadedLog) -> None:
    expected = loaded.snapshot_version + 1
    for batch in loaded.batches:
        if batch.version != expected:
            raise MetadataLost(
                f"metadata log: batch {expected} is missing (found {batch.version} next)"
            )
        expected += 1


def _key(prefix: str, kind: str, version: int) -> str:
    return f"{prefix}{kind}/{version:020d}"


def _version_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


class ObjectStoreMetadataLog:
    """The log as objects under `prefix` of an object store (local directory or S3)."""

    def __init__(self, store: ObjectStore, prefix: str = "cluster/") -> None:
        self.store = store
        self.prefix = prefix
        self._legacy_key = f"{prefix}metadata.json"

    async def load(self) -> LoadedLog:
        snaps = await self.store.list(f"{self.prefix}snapshots/")
        loaded = LoadedLog()
        if snaps:
            newest = max(snaps, key=lambda o: o.key)
            loaded.snapshot = await self.store.get(newest.key)
            loaded.snapshot_version = _version_of(newest.key)
            loaded.stored_snapshot = True
        else:
            legacy = await self._legacy()
            if legacy is not None:
                loaded.snapshot = snapshots.encode_bytes(legacy)
                loaded.snapshot_version = legacy.version
        after = _key(self.prefix, "log", loaded.snapshot_version)
        keys = [o.key for o in await self.store.list(f"{self.prefix}log/", start_after=after)]
        loaded.batches = await self._read(keys)
        _require_contiguous(loaded)
        return loaded

    async def _legacy(self) -> ClusterMetadata | None:
        try:
            data = await self.store.get(self._legacy_key)
        except ObjectNotFound:
            return None
        meta = ClusterMetadata.from_json(json.loads(data))
        log.info(
            "metadata: reading the single document of an earlier version (version %d)", meta.version
        )
        return meta

    async def _read(self, keys: list[str]) -> list[Batch]:
        sem = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(key: str) -> Batch:
            async with sem:
                return decode_batch(await self.store.get(key))

        return list(await asyncio.gather(*(one(k) for k in keys)))

    async def claim(self, epoch: int) -> None:
        return None  # the epoch record appended next is the claim

    async def append(self, batch: Batch) -> None:
        key = _key(self.prefix, "log", batch.version)
        try:
            await self.store.put(key, batch.data, if_none_match=True)
        except PreconditionFailed:
            # our own earlier attempt whose answer was lost, or another controller's batch
            try:
                existing = await self.store.get(key)
            except ObjectNotFound:
                raise LogConflict(f"batch {batch.version} vanished while appending") from None
            if existing != batch.data:
                raise LogConflict(
                    f"batch {batch.version} was appended by another controller"
                ) from None

    async def confirm(self, epoch: int, next_version: int) -> bool:
        try:
            await self.store.head(_key(self.prefix, "log", next_version))
        except ObjectNotFound:
            return True
        return False

    async def write_snapshot(self, version: int, data: bytes) -> None:
        key = _key(self.prefix, "snapshots", version)
        try:
            await self.store.put(key, data, if_none_match=True)
        except PreconditionFailed:
            pass  # written already (a retry); a snapshot at a version has one content

    async def trim(self) -> None:
        snaps = sorted(o.key for o in await self.store.list(f"{self.prefix}snapshots/"))
        if not snaps:
            return
        doomed = [self._legacy_key]  # superseded by the first snapshot (deleting none is fine)
        if len(snaps) >= KEEP_SNAPSHOTS:
            oldest_kept = _version_of(snaps[-KEEP_SNAPSHOTS])
            doomed += snaps[:-KEEP_SNAPSHOTS]
            for o in await self.store.list(f"{self.prefix}log/"):
                if _version_of(o.key) > oldest_kept:
                    break
                doomed.append(o.key)
        await self.store.delete(doomed)


class MemoryMetadataLog:
    """The log in memory, with the object store's semantics (tests). `fail_appends` makes the
    next appends raise OSError (a store outage)."""

    def __init__(self) -> None:
        self.batches: dict[int, Batch] = {}
        self.snapshots: dict[int, bytes] = {}
        self.fail_appends = 0
        self.appends = 0
        self.bytes_appended = 0

    async def load(self) -> LoadedLog:
        loaded = LoadedLog()
        if self.snapshots:
            loaded.snapshot_version = max(self.snapshots)
            loaded.snapshot = self.snapshots[loaded.snapshot_version]
            loaded.stored_snapshot = True
        loaded.batches = [
            self.batches[v] for v in sorted(self.batches) if v > loaded.snapshot_version
        ]
        _require_contiguous(loaded)
        return loaded

    async def claim(self, epoch: int) -> None:
        return None

    async def append(self, batch: Batch) -> None:
        if self.fail_appends:
            self.fail_appends -= 1
            raise OSError("metadata store unavailable (injected)")
        existing = self.batches.get(batch.version)
        if existing is not None:
            if existing.data != batch.data:
                raise LogConflict(f"batch {batch.version} was appended by another controller")
            return
        self.batches[batch.version] = batch
        self.appends += 1
        self.bytes_appended += len(batch.data)

    async def confirm(self, epoch: int, next_version: int) -> bool:
        return next_version not in self.batches

    async def write_snapshot(self, version: int, data: bytes) -> None:
        self.snapshots.setdefault(version, data)

    async def trim(self) -> None:
        if len(self.snapshots) < KEEP_SNAPSHOTS:
            return
        kept = sorted(self.snapshots)[-KEEP_SNAPSHOTS:]
        for v in list(self.snapshots):
            if v < kept[0]:
                del self.snapshots[v]
        for v in list(self.batches):
            if v <= kept[0]:
                del self.batches[v]


def records_bytes(batches: Iterable[Batch]) -> int:
    return sum(len(b.data) for b in batches)
