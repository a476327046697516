"""A started controller on a local-directory metadata log, for tests that drive one directly
(with FakeBroker as its brokers)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, ObjectStoreMetadataLog


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
