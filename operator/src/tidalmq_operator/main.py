"""`tidalmq operator run`: Kopf with peering, the controller's daemon, health and metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from typing import Any

import kopf
from tidalmq_controller import StandbyRegistration
from tidalmq_controller.hosting import (
    HealthServer,
    install_gc_policy,
    setup_logging,
    tune_runtime,
)
from tidalmq_core.control_auth import TokenError
from tidalmq_core.control_tls import ControlTlsError
from tidalmq_core.metadata import new_cluster_id

from tidalmq_operator import handlers  # noqa: F401  (registers the handlers)
from tidalmq_operator.kube import Conflict, Kube, load_config
from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import GROUP, VERSION, OperatorSettings

log = logging.getLogger(__name__)


async def _ensure_objects(kube: Kube, settings: OperatorSettings) -> None:
    """The ClusterState the controller daemon runs on, and the peering object."""
    try:
        await kube.create(
            "clusterstates",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ClusterState",
                "metadata": {"name": settings.cluster_state_name},
                "spec": {"clusterId": new_cluster_id()},
            },
        )
    except Conflict:
        pass
    try:
        await asyncio.to_thread(
            kube.custom.create_namespaced_custom_object,
            "kopf.dev",
            "v1",
            kube.namespace,
            "kopfpeerings",
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": settings.peering_name},
            },
        )
    except Exception as exc:  # exists already (409) or created by the chart
        log.debug("peering object: %s", exc)


async def run_operator(settings: OperatorSettings) -> None:
    load_config()
    kube = Kube(settings.namespace)
    runtime = OperatorRuntime(settings, kube)
    await _ensure_objects(kube, settings)

    def readiness() -> tuple[bool, str]:
        if runtime.active.is_set():
            return True, "active controller"
        return False, "standby (another replica holds the controller role)"

    http = HealthServer(readiness)
    await http.start(settings.http_host, settings.http_port)
    standby = standby_registration(settings, runtime.active)

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.name = runtime.settings.peering_name
        settings.peering.mandatory = True
        settings.peering.priority = int.from_bytes(os.urandom(2), "big")
        settings.peering.lifetime = runtime.settings.peering_lifetime_s
        settings.posting.level = logging.INFO
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.watching.server_timeout = 60
        settings.networking.request_timeout = 30

    try:
        await kopf.operator(
            namespaces=[settings.namespace],
            memo=kopf.Memo(runtime=runtime),
            identity=kopf.Identity(socket.gethostname()) if hasattr(kopf, "Identity") else None,
        )
    finally:
        if standby is not None:
            standby.cancel()
        await http.stop()


def standby_registration(
    settings: OperatorSettings, active: asyncio.Event
) -> asyncio.Task[None] | None:
    """While this replica does not hold the controller role, it registers its controller id
    and supported feature levels with the one that does (through the controller Service), so
    no level is finalized that it could not serve if it took over (KIP-919)."""
    if not settings.controller_url:
        return None
    registration = StandbyRegistration(
        settings.controller_url,
        controller_id=settings.controller_id,
        token=settings.control_auth().token,
        tls=settings.control_tls(),
        interval_s=settings.standby_registration_interval_s,
    )
    return asyncio.create_task(
        registration.run(active.is_set), name="standby controller registration"
    )


def main(settings: OperatorSettings | None = None) -> int:
    settings = settings or OperatorSettings.from_env()
    try:  # the controller serves only with a control token: say so now, not when it starts
        settings.control_auth()
        settings.control_tls()  # control-plane mTLS: its files are read now
    except (TokenError, ControlTlsError) as exc:
        print(f"tidalmq operator: cannot start: {exc}", file=sys.stderr)
        return 2
    setup_logging(
        os.environ.get("TIDALMQ_LOG_LEVEL", "INFO"), os.environ.get("TIDALMQ_LOG_FORMAT", "text")
    )
    logging.getLogger("kopf.objects").setLevel(logging.INFO)
    tune_runtime()  # the operator hosts the controller: its liveness thread answers heartbeats
    install_gc_policy()  # freeze the metadata after big changes (tidalmq_controller/gc_policy.py)
    asyncio.run(run_operator(settings))
    return 0
