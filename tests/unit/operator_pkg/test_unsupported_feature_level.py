"""An operator replica whose build does not support the cluster's finalized feature level
(a newer build finalized it: this replica is a standby of an older build, or a rollback) does
not take the controller role (docs/transactions-v2.md, "Which levels the controllers
support"): it claims no epoch in the ClusterState, says why in one log line without a
traceback, in the ClusterState's Ready condition and in an Event, and looks again until the
replica is stopped."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, ObjectStoreMetadataLog
from tidalmq_core.metadata import TRANSACTION_VERSION
from tidalmq_core.records import feature_record
from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import OperatorSettings


class ClusterStateKube:
    """The ClusterState of a cluster, its status and the Events posted, in memory."""

    def __init__(self, cluster_id: str) -> None:
        self.state: dict[str, Any] = {
            "metadata": {"name": "tidalmq", "resourceVersion": "1", "annotations": {}},
            "spec": {"clusterId": cluster_id},
        }
        self.replaced = 0
        self.events: list[tuple[str, str, bool]] = []

    async def get(self, plural: str, name: str) -> dict[str, Any]:
        return self.state

    async def replace(self, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.replaced += 1  # a claim of the controller epoch
        self.state = body
        return body

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.state = {**self.state, "status": status}
        return self.state

    async def event(
        self,
        involved: dict[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        at: float | None = None,
    ) -> None:
        self.events.append((reason, message, warning))


class StopAfterFirstEvent:
    """Kopf's `stopped` flag: set once the replica has said why it does not start."""

    def __init__(self, kube: ClusterStateKube) -> None:
        self.kube = kube

    def __bool__(self) -> bool:
        return bool(self.kube.events)


async def test_an_operator_of_an_older_build_does_not_take_the_role(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = tmp_path / "objects"
    newer = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(objects)), ControllerSettings())
    await newer.start()  # a newer build finalized a level this one does not support
    await newer.commit([feature_record(TRANSACTION_VERSION, 3)])
    cluster_id = newer.metadata.cluster_id
    await newer.stop()
    kube = ClusterStateKube(cluster_id)
    runtime = OperatorRuntime(OperatorSettings(storage_url=f"file://{objects}"), kube)  # type: ignore[arg-type]
    caplog.set_level(logging.ERROR, logger="tidalmq_operator.runtime")
    await asyncio.wait_for(runtime.run_controller(StopAfterFirstEvent(kube)), 30)
    assert kube.replaced == 0, "no controller epoch claimed: a leader elsewhere keeps its role"
    assert runtime.controller is None and not runtime.active.is_set()
    why = (
        f"the cluster's finalized version 3 of feature {TRANSACTION_VERSION} is not supported "
        "by this controller (it supports 0-2): it does not take the controller role; run a "
        "build that supports it, or lower the level first (kafka-features downgrade) with one"
    )
    (ready,) = kube.state["status"]["conditions"]
    assert (ready["type"], ready["status"], ready["reason"], ready["message"]) == (
        "Ready",
        "False",
        "UnsupportedFeatureLevel",
        why,
    )
    assert kube.events == [("UnsupportedFeatureLevel", why, True)]
    (line,) = [r for r in caplog.records if r.name == "tidalmq_operator.runtime"]
    assert line.exc_info is None and line.getMessage() == (
        f"UnsupportedFeatureLevel: {why}; the controller does not start (looking again in 30s)"
    )
