"""Test-only Kopf handler for the end-to-end tests: reconciles `Echo` custom resources
(group e2e.tidalmq.io) into ConfigMaps and reports what it did in the resource's status.

Run in a pod of the TidalMQ image (which ships kopf):
    kopf run --standalone --namespace NS /handlers/echo_handler.py
"""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes

GROUP, VERSION, PLURAL = "e2e.tidalmq.io", "v1", "echoes"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    kubernetes.config.load_incluster_config()
    settings.posting.level = 20  # INFO events, visible with kubectl get events


def upsert_configmap(namespace: str, name: str, message: str, owner: dict[str, Any]) -> str:
    api = kubernetes.client.CoreV1Api()
    body: dict[str, Any] = {
        "metadata": {"name": f"{name}-echo", "labels": {"e2e.tidalmq.io/echo": name}},
        "data": {"message": message},
    }
    kopf.adopt(body, owner=owner)
    try:
        api.create_namespaced_config_map(namespace, body)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
        api.patch_namespaced_config_map(f"{name}-echo", namespace, body)
    return f"{name}-echo"


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.message")
def reconcile(
    spec: kopf.Spec,
    name: str,
    namespace: str,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    message = spec.get("message")
    if not isinstance(message, str) or not message:
        raise kopf.PermanentError("spec.message must be a non-empty string")
    configmap = upsert_configmap(namespace, name, message, dict(body))
    patch.status["phase"] = "Reconciled"
    patch.status["echoed"] = message
    patch.status["configMap"] = configmap
    logger.info(f"echoed {message!r} into ConfigMap {configmap}")
