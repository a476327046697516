"""The controller's metadata store on Kubernetes: one ClusterState resource.

The Kubernetes API (etcd) is the metadata quorum: every commit replaces the resource naming the
resourceVersion it read, so a deposed controller (another operator replica that lost its role)
fails with a conflict instead of overwriting newer metadata.
"""

from __future__ import annotations

import logging

from tidalmq_broker.controller.store import StaleMetadata
from tidalmq_core.metadata import ClusterMetadata

from tidalmq_operator.kube import Conflict, Kube, NotFound
from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

PLURAL = "clusterstates"


class ClusterStateStore:
    def __init__(self, kube: Kube, name: str) -> None:
        self._kube = kube
        self._name = name

    async def load(self) -> tuple[ClusterMetadata | None, str | None]:
        try:
            obj = await self._kube.get(PLURAL, self._name)
        except NotFound:
            return None, None
        document = (obj.get("spec") or {}).get("document")
        token = obj["metadata"]["resourceVersion"]
        if not document:
            return None, token  # created empty by the operator at startup
        return ClusterMetadata.from_json(document), token

    async def save(self, metadata: ClusterMetadata, token: str | None) -> str:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterState",
            "metadata": {"name": self._name},
            "spec": {"clusterId": metadata.cluster_id, "document": metadata.to_json()},
        }
        try:
            if token is None:
                obj = await self._kube.create(PLURAL, body)
            else:
                body["metadata"]["resourceVersion"] = token
                obj = await self._kube.replace(PLURAL, self._name, body)
        except Conflict as exc:
            raise StaleMetadata(
                f"ClusterState {self._name} changed (resourceVersion {token})"
            ) from exc
        new_token = obj["metadata"]["resourceVersion"]
        try:
            # the status patch bumps the resourceVersion too: the next commit names that one
            patched = await self._kube.patch_status(PLURAL, self._name, {
                "version": metadata.version,
                "controllerEpoch": metadata.controller_epoch,
                "brokers": len(metadata.live_brokers()),
                "topics": len(metadata.topics),
            })  # fmt: skip
            new_token = patched["metadata"]["resourceVersion"]
        except Exception as exc:  # the printer columns are cosmetic
            log.debug("ClusterState status not updated: %s", exc)
        return new_token
