"""Stopping the controller while its loop is being woken (heartbeats, reports) must stop it:
on Python 3.11, asyncio.wait_for() returns the inner result instead of raising when the
cancellation and the wake-up land together, which left stop() waiting forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, ObjectStoreMetadataLog

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.001)


async def test_stop_while_the_loop_is_woken_all_the_time(tmp_path: Path) -> None:
    store = ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects"))
    for _ in range(20):
        controller = Controller(store, SETTINGS)
        await controller.start()

        async def wake(c: Controller = controller) -> None:
            while True:
                c._wake.set()  # what every heartbeat and report does
                await asyncio.sleep(0)

        waker = asyncio.create_task(wake())
        await asyncio.sleep(0.005)
        stopping = asyncio.create_task(controller.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)
        waker.cancel()
        if not done:  # the loop ignored its cancellation: stop it for good, then fail
            while not stopping.done():
                controller._loop_task.cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
        assert done, "Controller.stop() did not return: the loop swallowed its cancellation"
