"""The controller's metadata store on Kubernetes: one ClusterState resource.

The Kubernetes API (etcd) is the metadata quorum: every commit replaces the resource naming the
resourceVersion it read, so a deposed controller (another operator replica that lost its role)
fails with a conflict instead of overwriting newer metadata.
"""

from __future__ import annotations

import logging
from typing import Any

from tidalmq_broker.controller.store import StaleMetadata
from tidalmq_core.metadata import ClusterMetadata

from tidalmq_operator.kube import Conflict, Kube, NotFound
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

PLURAL = "clusterstates"


class ClusterStateStore:
    """Compare-and-swap on the document itself: the version token is the (controller epoch,
    metadata version) of the document last written. A save re-reads the resource, refuses if the
    document is not the one we wrote last (someone else committed), and replaces it naming the
    resourceVersion just read, so the check and the write are atomic. Kopf's own bookkeeping
    (annotations) also bumps resourceVersion; such conflicts are retried, document changes not.
    """

    def __init__(self, kube: Kube, name: str) -> None:
        self._kube = kube
        self._name = name

    @staticmethod
    def _token(spec: dict[str, Any]) -> str | None:
        document = spec.get("document")
        if not document:
            return None
        return f"{document.get('controller_epoch', 0)}:{document.get('version', 0)}"

    async def load(self) -> tuple[ClusterMetadata | None, str | None]:
        try:
            obj = await self._kube.get(PLURAL, self._name)
        except NotFound:
            return None, None
        spec = obj.get("spec") or {}
        if not spec.get("document"):
            # created by the operator at startup with only its (immutable) cluster id
            return ClusterMetadata(cluster_id=spec["clusterId"]), None
        return ClusterMetadata.from_json(spec["document"]), self._token(spec)

    async def save(self, metadata: ClusterMetadata, token: str | None) -> str:
        for _ in range(10):
            try:
                obj = await self._kube.get(PLURAL, self._name)
            except NotFound:
                obj = None
            spec = (obj or {}).get("spec") or {}
            if self._token(spec) != token:
                raise StaleMetadata(
                    f"ClusterState {self._name} holds {self._token(spec)}, expected {token}"
                )
            body: dict[str, Any] = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ClusterState",
                "metadata": {"name": self._name},
                "spec": {"clusterId": spec.get("clusterId") or metadata.cluster_id,
                         "document": metadata.to_json()},
            }  # fmt: skip
            try:
                if obj is None:
                    await self._kube.create(PLURAL, body)
                else:
                    body["metadata"] = {**obj["metadata"], "name": self._name}
                    await self._kube.replace(PLURAL, self._name, body)
            except Conflict:
                continue  # the resource changed under us: look again
            break
        else:
            raise StaleMetadata(f"ClusterState {self._name} keeps changing; giving up this commit")
        try:
            await self._kube.patch_status(PLURAL, self._name, {
                "version": metadata.version,
                "controllerEpoch": metadata.controller_epoch,
                "brokers": len(metadata.live_brokers()),
                "topics": len(metadata.topics),
            })  # fmt: skip
        except Exception as exc:  # the printer columns are cosmetic
            log.debug("ClusterState status not updated: %s", exc)
        return self._token({"document": metadata.to_json()}) or ""
