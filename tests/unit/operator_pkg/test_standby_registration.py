"""An operator replica that does not hold the controller role registers its controller id and
supported feature levels with the one that does, through the controller Service
(TIDALMQ_CONTROLLER_URL, set by the chart), and stops asking while it leads
(docs/transactions-v2.md, "Which levels the controllers support")."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path

from tidalmq_controller import ControllerServer, ControllerSettings
from tidalmq_core.control_auth import ControlAuth
from tidalmq_core.metadata import SUPPORTED_FEATURES
from tidalmq_operator.main import standby_registration
from tidalmq_operator.settings import OperatorSettings

from tests.support.controllers import running_controller

TOKEN = "unit-test-cluster-token-" + "d" * 30


def test_the_settings_come_from_the_chart_environment() -> None:
    s = OperatorSettings.from_env({"TIDALMQ_CONTROLLER_URL": "https://tq-operator.ns.svc:9690"})
    assert s.controller_url == "https://tq-operator.ns.svc:9690"
    assert s.standby_registration_interval_s == 30.0
    assert OperatorSettings.from_env({}).controller_url == ""


async def test_a_standby_replica_registers_with_the_active_controller(tmp_path: Path) -> None:
    settings = ControllerSettings(
        auto_rebalance=False, offsets_topic_partitions=1, controller_id="operator-blue"
    )
    async with running_controller(tmp_path, settings) as active:
        server = ControllerServer(active, ControlAuth([TOKEN]))
        await server.start("127.0.0.1", 0)
        try:
            replica = dataclasses.replace(
                OperatorSettings(),
                controller_url=f"http://127.0.0.1:{server.port}",
                controller_id="operator-green",
                control_token=TOKEN,
            )
            assert (
                standby_registration(
                    dataclasses.replace(replica, controller_url=""), asyncio.Event()
                )
                is None
            )
            task = standby_registration(replica, asyncio.Event())
            assert task is not None
            try:
                deadline = asyncio.get_running_loop().time() + 20
                while "operator-green" not in active.metadata.controllers:
                    assert asyncio.get_running_loop().time() < deadline, "never registered"
                    await asyncio.sleep(0.05)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert active.metadata.controllers["operator-green"] == dict(SUPPORTED_FEATURES)
            # a replica that leads asks nothing
            await active.forget_controller("operator-green")
            leading = asyncio.Event()
            leading.set()
            task = standby_registration(
                dataclasses.replace(replica, standby_registration_interval_s=0.1), leading
            )
            assert task is not None
            await asyncio.sleep(0.5)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert "operator-green" not in active.metadata.controllers
        finally:
            await server.stop()
