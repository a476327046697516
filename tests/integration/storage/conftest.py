"""Every storage scenario runs against every backend: a local directory and a real S3 server."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore, ObjectStore

from tests.support.s3_server import S3_FIXTURES
from tests.support.storage_helpers import FaultyStore

S3_FIXTURES.add("backend")  # `backend` asks for the S3 server when its parameter is "s3"

TEST_CONFIG = StorageConfig(
    flush_interval_ms=5,
    flush_bytes=1 << 20,
    checkpoint_interval_s=3600,
    compaction_interval_s=3600,
    retention_check_interval_s=3600,
    garbage_sweep_interval_s=3600,
    garbage_grace_s=0,
    compaction_idle_s=3600,
)


@pytest.fixture(params=["localdir", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], ObjectStore]:
    """A factory of stores that all see the same objects (one per simulated broker)."""
    if request.param == "localdir":
        return lambda: LocalDirObjectStore(tmp_path / "objects")
    server = request.getfixturevalue("s3_server")
    prefix = server.unique_prefix(request.node.name[:40].replace("[", "-").replace("]", ""))
    return lambda: server.make_store(prefix)


class Cluster:
    """Engines of several simulated brokers over one object store."""

    def __init__(self, backend: Callable[[], ObjectStore]) -> None:
        self.backend = backend
        self.engines: list[ObjectStreamEngine] = []
        self.stores: list[FaultyStore] = []
        self.fenced: list[object] = []

    async def engine(self, broker_id: int, **overrides: object) -> ObjectStreamEngine:
        store = FaultyStore(self.backend())
        config = dataclasses.replace(TEST_CONFIG, **overrides)  # type: ignore[arg-type]

        async def on_fenced(tp: object) -> None:
            self.fenced.append((broker_id, tp))

        engine = ObjectStreamEngine(store, broker_id, config, on_fenced=on_fenced, owns_store=True)
        await engine.start()
        self.engines.append(engine)
        self.stores.append(store)
        return engine

    def inspector(self) -> ObjectStore:
        return self.backend()

    async def close(self) -> None:
        for engine in self.engines:
            await engine.stop()
            await engine.raw_store.close()  # also for engines abandoned by a test


@pytest.fixture
async def cluster(backend: Callable[[], ObjectStore]) -> AsyncIterator[Cluster]:
    c = Cluster(backend)
    try:
        yield c
    finally:
        await c.close()
