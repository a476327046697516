"""The controller's metadata log on Kubernetes: objects in the object store, fenced and pointed
to by one small ClusterState resource.

The log itself (a batch of records per object, snapshots) lives in the object store like the
local cluster's (tidalmq_controller.ObjectStoreMetadataLog), under `cluster/` of the metadata
store. The ClusterState holds only what must survive and fence: the cluster id
(spec.clusterId), the controller epoch and a pointer (the last batch version known committed,
the newest snapshot), the last two as annotations (`tidalmq.io/controller-epoch`,
`tidalmq.io/metadata-log`): the API server keeps annotations whatever version of the CRD's
schema is installed, so an operator newer than the cluster's CRDs still fences. Its size does
not grow with the partition count (etcd refuses requests over 1.5 MiB and slows long before).

- Fence: a controller claims epoch E by replacing the ClusterState naming the resourceVersion
  it read, only if its epoch is below E (compare-and-swap): two operator replicas can never
  both claim. Every append is also a conditional create in the store.
- Role check: the ClusterState still holds our epoch and the log's next version is free.
- Lost or foreign store: the pointer says what must be there. A log that ends before it, or a
  store whose log names another cluster, is refused loudly (MetadataLost) instead of starting a
  new, empty cluster on it.
- Upgrade: a ClusterState that holds the whole document (`spec.document`, the earlier design)
  is read once as the first snapshot; the document is dropped once that snapshot is stored.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from tidalmq_controller import Batch, LoadedLog, LogConflict, MetadataLost, ObjectStoreMetadataLog
from tidalmq_core import snapshots
from tidalmq_core.metadata import ClusterMetadata

from tidalmq_operator.kube import Conflict, Kube, NotFound
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

PLURAL = "clusterstates"
EPOCH_ANNOTATION = "tidalmq.io/controller-epoch"
LOG_ANNOTATION = "tidalmq.io/metadata-log"
POINTER_INTERVAL_S = 5.0  # the pointer follows the log at most this often (and on snapshots)


class ClusterStateLog:
    """MetadataLog over an object-store log, fenced and pointed to by a ClusterState."""

    def __init__(self, kube: Kube, name: str, inner: ObjectStoreMetadataLog) -> None:
        self._kube = kube
        self._name = name
        self.inner = inner
        self._epoch = 0
        self._cluster_id = ""
        self._pointed_at = 0.0
        self._head = 0
        self._snapshot = 0
        self._legacy = False

    async def _read(self) -> dict[str, Any]:
        return await self._kube.get(PLURAL, self._name)

    async def load(self) -> LoadedLog:
        obj = await self._read()
        spec = obj.get("spec") or {}
        self._cluster_id = str(spec["clusterId"])
        pointer = _pointer(obj)
        loaded = await self.inner.load()
        if loaded.empty and spec.get("document"):
            # the earlier design kept the whole document here: it is the first snapshot
            meta = ClusterMetadata.from_json(spec["document"])
            loaded.snapshot = snapshots.encode_bytes(meta)
            loaded.snapshot_version = meta.version
            self._legacy = True
            log.info(
                "metadata: reading the ClusterState's document (version %d) as the first "
                "snapshot of the metadata log",
                meta.version,
            )
        head = int(pointer.get("head", 0))
        if loaded.head < head:
            raise MetadataLost(
                f"the metadata log in {self.inner.store!r} ends at version {loaded.head}, but "
                f"ClusterState {self._name} says version {head} was committed: the store was "
                "wiped or replaced. Point the cluster at its own store (its metadata is "
                f"under {self.inner.prefix})"
            )
        image_id = _cluster_id_of(loaded)
        if image_id is not None and image_id != self._cluster_id:
            raise MetadataLost(
                f"the metadata log in {self.inner.store!r} belongs to cluster {image_id}, not "
                f"{self._cluster_id} (ClusterState {self._name}): point the cluster at its own "
                "store"
            )
        self._head = loaded.head
        self._snapshot = loaded.snapshot_version
        loaded.cluster_id = self._cluster_id
        return loaded

    async def claim(self, epoch: int) -> None:
        for _ in range(20):
            obj = await self._read()
            current = _epoch(obj)
            if current >= epoch:
                raise LogConflict(
                    f"ClusterState {self._name} holds controller epoch {current} (claiming {epoch})"
                )
            try:
                await self._replace(obj, {EPOCH_ANNOTATION: str(epoch)})
            except Conflict:
                continue  # changed under us (kopf's annotations too): look again
            self._epoch = epoch
            return
        raise LogConflict(
            f"ClusterState {self._name} keeps changing; could not claim epoch {epoch}"
        )

    async def _replace(
        self, obj: dict[str, Any], annotations: dict[str, str], spec: dict[str, Any] | None = None
    ) -> None:
        """Replace the resource as read, with these annotations (and spec), naming the
        resourceVersion read: raises Conflict if it changed meanwhile."""
        meta = dict(obj["metadata"])
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterState",
            "metadata": meta,
            "spec": spec if spec is not None else (obj.get("spec") or {}),
        }
        await self._kube.replace(PLURAL, self._name, body)

    async def append(self, batch: Batch) -> None:
        await self.inner.append(batch)
        self._head = batch.version
        if time.monotonic() - self._pointed_at >= POINTER_INTERVAL_S:
            await self._point()

    async def confirm(self, epoch: int, next_version: int) -> bool:
        obj = await self._read()
        if _epoch(obj) != epoch:
            return False
        return await self.inner.confirm(epoch, next_version)

    async def write_snapshot(self, version: int, data: bytes) -> None:
        await self.inner.write_snapshot(version, data)
        self._snapshot = max(self._snapshot, version)
        await self._point(drop_document=self._legacy)
        self._legacy = False

    async def trim(self) -> None:
        await self.inner.trim()

    async def _point(self, *, drop_document: bool = False) -> None:
        """Record where the log stands (only while the ClusterState holds our epoch)."""
        self._pointed_at = time.monotonic()
        for _ in range(10):
            try:
                obj = await self._read()
            except NotFound:
                return
            if _epoch(obj) != self._epoch:
                raise LogConflict(f"ClusterState {self._name} was claimed by another controller")
            pointer = _pointer(obj)
            spec = dict(obj.get("spec") or {})
            if (
                int(pointer.get("head", 0)) >= self._head
                and int(pointer.get("snapshot", 0)) >= self._snapshot
                and not (drop_document and "document" in spec)
            ):
                return
            new = {
                "head": max(self._head, int(pointer.get("head", 0))),
                "snapshot": max(self._snapshot, int(pointer.get("snapshot", 0))),
                "prefix": self.inner.prefix,
            }
            if drop_document:
                spec.pop("document", None)
            try:
                await self._replace(obj, {LOG_ANNOTATION: json.dumps(new, sort_keys=True)}, spec)
                return
            except Conflict:
                continue

    async def condition(self, kind: str, status: bool, reason: str, message: str) -> None:
        """Set one condition of the ClusterState (lastTransitionTime moves only on a change)."""
        try:
            obj = await self._read()
            old = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            flag = "True" if status else "False"
            previous = old.get(kind)
            since = (previous or {}).get("lastTransitionTime")
            if previous is None or previous.get("status") != flag or since is None:
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            old[kind] = {
                "type": kind,
                "status": flag,
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": since,
            }
            await self._kube.patch_status(PLURAL, self._name, {"conditions": list(old.values())})
        except Exception as exc:  # cosmetic: the log and the Event say it too
            log.debug("ClusterState condition not updated: %s", exc)

    async def status(self, meta: ClusterMetadata) -> None:
        """The printer columns (cosmetic: failures are ignored)."""
        try:
            await self._kube.patch_status(
                PLURAL,
                self._name,
                {
                    "version": meta.version,
                    "controllerEpoch": meta.controller_epoch,
                    "brokers": len(meta.live_brokers()),
                    "topics": len(meta.topics),
                },
            )
        except Exception as exc:
            log.debug("ClusterState status not updated: %s", exc)


def _epoch(obj: dict[str, Any]) -> int:
    return int(((obj.get("metadata") or {}).get("annotations") or {}).get(EPOCH_ANNOTATION, 0))


def _pointer(obj: dict[str, Any]) -> dict[str, Any]:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(LOG_ANNOTATION)
    try:
        return dict(json.loads(raw)) if raw else {}
    except (ValueError, TypeError):
        return {}


def _cluster_id_of(loaded: LoadedLog) -> str | None:
    """The cluster id the loaded log names (its snapshot's, or its first batch's)."""
    if loaded.snapshot is not None:
        return str(json.loads(loaded.snapshot.split(b"\n", 1)[0])["cluster_id"])
    for batch in loaded.batches:
        for rec in batch.records:
            if rec.get("t") == "cluster":
                return str(rec["id"])
    return None
