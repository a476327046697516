"""A started controller on a local-directory metadata log, for tests that drive one directly
(with FakeBroker as its brokers), and the fast settings such tests share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, ObjectStoreMetadataLog

# heartbeats every 50 ms, leases of 0.3 s, a dead broker after 2 s, one offsets partition
FAST = ControllerSettings(
    heartbeat_interval_s=0.05,
    lease_s=0.3,
    session_timeout_s=2.0,
    clock_margin_s=0.05,
    offsets_topic_partitions=1,
    tick_s=0.01,
)


@contextlib.asynccontextmanager
async def running_controller(
    tmp_path: Path, settings: ControllerSettings
) -> AsyncIterator[Controller]:
    """A controller whose metadata log is under `tmp_path`/objects, started, stopped on exit."""
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), settings)
    await c.start()
    try:
        yield c
    finally:
        await c.stop()
