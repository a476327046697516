"""`tidalmq operator uninstall`: what the Helm chart's pre-delete hook runs, so that `helm
uninstall` never leaves the namespace stuck in Terminating.

Every Topic, StaticTopic, PartitionReassignment, User and ClusterState carries the operator's finalizer
(tidalmq.io/finalizer), which only a running operator removes. Helm deletes the operator along
with the rest of the release, after which deleting the namespace would wait forever on those
finalizers. The hook therefore

1. stops the operator: scales its Deployment to 0 and waits until none of its pods is left (so
   no operator re-adds a finalizer or acts on a resource half-way), then
2. removes the operator's finalizer (and only that one) from every TidalMQ resource of the
   namespace. The resources themselves stay, and so does the data: nothing is deleted from the
   object store (a Topic's finalizer would have deleted its data), and the ClusterState keeps the
   cluster's metadata until the namespace goes.

The decisions (which finalizers to drop, the JSON patch that drops them only if nobody changed
them meanwhile) are plain functions; `run` does the API calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)

FINALIZER = f"{GROUP}/finalizer"
# The resources the operator puts its finalizer on: the data holders first, the ClusterState
# (the controller's metadata) last.
PLURALS = ("topics", "statictopics", "partitionreassignments", "users", "clusterstates")


def finalizer_patch(obj: dict[str, Any], finalizer: str = FINALIZER) -> list[dict[str, Any]] | None:
    """The JSON patch that removes `finalizer` from the object, or None when it has none. The
    patch first tests that the finalizers are still the ones read, so a concurrent change makes
    it fail (HTTP 422) instead of dropping someone else's finalizer."""
    current = list(obj.get("metadata", {}).get("finalizers") or [])
    if finalizer not in current:
        return None
    kept = [f for f in current if f != finalizer]
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "replace", "path": "/metadata/finalizers", "value": kept},
    ]


def selector_string(match_labels: dict[str, str]) -> str:
    """A Deployment's matchLabels as a label selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


@dataclass
class Outcome:
    """What the hook did: for the log and the exit status."""

    operator_stopped: bool = False
    operator_missing: bool = False
    released: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


class Cluster:
    """The API calls of the hook (the official synchronous client)."""

    def __init__(self, namespace: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.apps = client.AppsV1Api()
        self.core = client.CoreV1Api()
        self.custom = client.CustomObjectsApi()

    def deployment_selector(self, name: str) -> str | None:
        """The Deployment's pod selector, None when there is no such Deployment."""
        from kubernetes.client.exceptions import ApiException

        try:
            deployment = self.apps.read_namespaced_deployment(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return selector_string(deployment.spec.selector.match_labels or {})

    def scale_to_zero(self, name: str) -> None:
        self.apps.patch_namespaced_deployment_scale(name, self.namespace, {"spec": {"replicas": 0}})

    def pod_names(self, selector: str) -> list[str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return [p.metadata.name for p in pods.items if p.metadata is not None and p.metadata.name]

    def resources(self, plural: str) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        try:
            # custom objects come back as the API's JSON (typed `object` by the client)
            result = cast(
                "dict[str, Any]",
                self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural),
            )
        except ApiException as exc:
            if exc.status == 404:  # the CRD is not installed: nothing of that kind
                return []
            raise
        return list(result.get("items", []))

    def patch(self, plural: str, name: str, patch: list[dict[str, Any]]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            patch,
            _content_type="application/json-patch+json",
        )

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return cast(
                "dict[str, Any]",
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def stop_operator(
    cluster: Cluster,
    deployment: str,
    timeout_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, bool]:
    """Scale the operator's Deployment to 0 and wait until its pods are gone. Returns (stopped,
    missing): missing when there is no such Deployment (nothing to stop)."""
    selector = cluster.deployment_selector(deployment)
    if selector is None:
        log.warning("no Deployment %s in %s: no operator to stop", deployment, cluster.namespace)
        return True, True
    cluster.scale_to_zero(deployment)
    log.info("scaled %s to 0; waiting for its pods (%s) to go", deployment, selector)
    deadline = clock() + timeout_s
    while True:
        pods = cluster.pod_names(selector)
        if not pods:
            log.info("the operator is stopped")
            return True, False
        if clock() >= deadline:
            log.warning("operator pods still present after %.0f s: %s", timeout_s, pods)
            return False, False
        sleep(1.0)


def release_finalizers(cluster: Cluster, *, attempts: int = 5) -> tuple[list[str], list[str]]:
    """Remove the operator's finalizer from every TidalMQ resource of the namespace. Returns
    (released, failed) as PLURAL/NAME."""
    from kubernetes.client.exceptions import ApiException

    released: list[str] = []
    failed: list[str] = []
    for plural in PLURALS:
        for obj in cluster.resources(plural):
            name = obj["metadata"]["name"]
            for _ in range(attempts):
                patch = finalizer_patch(obj)
                if patch is None:
                    break
                try:
                    cluster.patch(plural, name, patch)
                    released.append(f"{plural}/{name}")
                    break
                except ApiException as exc:
                    if exc.status == 404:  # gone meanwhile
                        break
                    if exc.status not in (409, 422):  # 422: the test op failed (it changed)
                        raise
                latest = cluster.get(plural, name)
                if latest is None:
                    break
                obj = latest
            else:
                failed.append(f"{plural}/{name}")
    return released, failed


def run(namespace: str, operator_deployment: str, timeout_s: float) -> Outcome:
    from tidalmq_operator.kube import load_config

    load_config()
    cluster = Cluster(namespace)
    outcome = Outcome()
    outcome.operator_stopped, outcome.operator_missing = stop_operator(
        cluster, operator_deployment, timeout_s
    )
    # Even when an operator pod lingers (a node gone): the namespace must be able to go.
    outcome.released, outcome.failed = release_finalizers(cluster)
    for name in outcome.released:
        log.info("removed %s from %s", FINALIZER, name)
    for name in outcome.failed:
        log.error("could not remove %s from %s", FINALIZER, name)
    return outcome
