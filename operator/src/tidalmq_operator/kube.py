"""The few Kubernetes API calls the operator makes outside Kopf's handler plumbing: the
ClusterState document and the operator's own Secrets (compare-and-swap on resourceVersion:
Conflict when it changed since it was read), status patches of our resources,
Events, and pod listings. The official client is synchronous, so each call runs in a thread."""

from __future__ import annotations

import asyncio
import builtins
import datetime
import logging
import os
import socket
import time
import uuid
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tidalmq_operator.settings import GROUP, VERSION

log = logging.getLogger(__name__)


REPORTING_COMPONENT = "tidalmq.io/operator"
_INSTANCE = (os.environ.get("TIDALMQ_POD_NAME") or socket.gethostname() or "tidalmq-operator")[:128]


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class NotFound(Exception):
    """HTTP 404"""


def load_config() -> None:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()


class Kube:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(exc.reason) from exc
            if exc.status == 404:
                raise NotFound(exc.reason) from exc
            raise

    # ------------------------------------------------------------------ our resources
    async def get(self, plural: str, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name
        )
        return doc

    async def list(self, plural: str) -> list[dict[str, Any]]:
        result = await self._call(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, plural
        )
        return list(result.get("items", []))

    async def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call(
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            body,
        )
        return doc

    async def replace(self, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call(
            self.custom.replace_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            body,
        )
        return doc

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        doc: dict[str, Any] = await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            {"status": status},
        )
        return doc

    async def remove_annotation(self, plural: str, name: str, key: str) -> None:
        """Remove one annotation of one of our resources (a merge patch: null deletes)."""
        await self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            plural,
            name,
            {"metadata": {"annotations": {key: None}}},
        )

    # ------------------------------------------------------------------ secrets (User resources)
    async def get_secret(self, name: str) -> dict[str, Any]:
        """A Secret of our namespace as a plain dict (`data` base64, as the API gives it)."""
        secret = await self._call(self.core.read_namespaced_secret, name, self.namespace)
        return dict(self.core.api_client.sanitize_for_serialization(secret))

    async def create_secret(self, body: dict[str, Any]) -> None:
        await self._call(self.core.create_namespaced_secret, self.namespace, body)

    async def patch_secret(self, name: str, body: dict[str, Any]) -> None:
        """A strategic merge patch; with `metadata.resourceVersion` in `body` the API server
        applies it only to that version, Conflict otherwise: a compare-and-swap that needs
        the `patch` verb only (the chart's Role grants no `update` on Secrets)."""
        await self._call(self.core.patch_namespaced_secret, name, self.namespace, body)

    async def delete_secret(self, name: str) -> None:
        await self._call(self.core.delete_namespaced_secret, name, self.namespace)

    # ------------------------------------------------------------------ core
    async def label_pod(self, name: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one label of a pod."""
        await self._call(
            self.core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"labels": {key: value}}},
        )

    async def pods(self, selector: str) -> builtins.list[Any]:  # Kube.list shadows list here
        result = await self._call(
            self.core.list_namespaced_pod, self.namespace, label_selector=selector
        )
        return list(result.items)

    async def event(
        self,
        involved: dict[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        at: float | None = None,
    ) -> None:
        """Record a Kubernetes Event on one of our resources (best effort); `at`: when what it
        reports happened (default now). Besides the second-resolution first/lastTimestamp, the
        Event carries eventTime to the microsecond (which core/v1 accepts with a reporting
        controller, instance and action), so the steps of a sub-second move keep their order
        and timings can be measured from Events."""
        meta = involved.get("metadata", {})
        moment = datetime.datetime.fromtimestamp(
            at if at is not None else time.time(), datetime.UTC
        )
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{meta.get('name', 'tidalmq')}.{uuid.uuid4().hex[:10]}",
                namespace=self.namespace,
            ),
            involved_object=client.V1ObjectReference(
                api_version=involved.get("apiVersion", f"{GROUP}/{VERSION}"),
                kind=involved.get("kind"),
                name=meta.get("name"),
                namespace=self.namespace,
                uid=meta.get("uid"),
            ),
            reason=reason,
            message=message[:1000],
            type="Warning" if warning else "Normal",
            first_timestamp=moment,
            last_timestamp=moment,
            # MicroTime wants exactly six fraction digits, which isoformat() drops at .000000;
            # the models type it datetime (kubernetes >= 37 parses this string back into one)
            event_time=moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),  # type: ignore[arg-type]
            action=reason,
            reporting_component=REPORTING_COMPONENT,
            reporting_instance=_INSTANCE,
            count=1,
            source=client.V1EventSource(component="tidalmq-operator"),
        )
        try:
            await self._call(self.core.create_namespaced_event, self.namespace, body)
        except Exception as exc:  # events are best effort
            log.debug("event %s on %s not recorded: %s", reason, meta.get("name"), exc)
