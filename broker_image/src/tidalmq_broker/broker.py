"""One TidalMQ broker: the Kafka listener, the storage engine, the partitions it leads, the group
coordinator, and its link to the controller (in this process, or remote)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from tidalmq_core.metadata import OFFSETS_TOPIC, BrokerInfo, ClusterMetadata

import tidalmq_broker.apis  # noqa: F401  (registers every API handler)
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.registry import REGISTRY, supported_versions
from tidalmq_broker.controller.controller import Controller
from tidalmq_broker.controller.store import ObjectStoreMetadataStore
from tidalmq_broker.groups.coordinator import GroupCoordinator, GroupSettings
from tidalmq_broker.metrics import BrokerMetrics
from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.server.http import HealthServer
from tidalmq_broker.server.listener import KafkaListener, ListenerLimits
from tidalmq_broker.settings import BrokerSettings
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.objectstore.factory import open_object_store

log = logging.getLogger(__name__)


class _LocalChannel:
    """The controller's channel to a broker in the same process."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def push_metadata(self, snapshot: ClusterMetadata) -> None:
        self._broker.apply_metadata(snapshot)


class Broker:
    def __init__(
        self,
        settings: BrokerSettings,
        *,
        store: ObjectStore | None = None,
        controller: Any = None,
    ) -> None:
        self.settings = settings
        self.broker_id = settings.broker_id
        self.incarnation = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
        self._store = store
        self.controller: Any = controller
        self.metadata = ClusterMetadata(cluster_id="", version=-1)
        self.metrics = BrokerMetrics(self.broker_id, {k: s.name for k, s in REGISTRY.items()})
        self.groups = GroupCoordinator(
            GroupSettings(
                min_session_timeout_ms=settings.group_min_session_timeout_ms,
                initial_rebalance_delay_ms=settings.group_initial_rebalance_delay_ms,
            ),
            self._offsets_partitions,
        )
        self.listener = KafkaListener(
            self._dispatch,
            supported_versions,
            lambda: api_versions_body(_unsupported_version()),
            limits=ListenerLimits(max_request_bytes=settings.max_request_bytes),
            observer=self.metrics,
        )
        self.http = HealthServer(self._readiness)
        self.engine: ObjectStreamEngine | None = None
        self.partitions: PartitionManager = None  # type: ignore[assignment]
        self._registered = False
        self._stopping = False
        self._gauges: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        s = self.settings
        if self._store is None:
            self._store = open_object_store(s.storage_url)
        self.engine = ObjectStreamEngine(
            self._store,
            self.broker_id,
            StorageConfig(
                flush_interval_ms=s.flush_interval_ms,
                flush_bytes=s.flush_bytes,
                cache_bytes=s.cache_bytes,
                checkpoint_interval_s=s.checkpoint_interval_s,
            ),
        )
        await self.engine.start()
        self.partitions = PartitionManager(self.engine, self.broker_id)
        self.partitions.add_hook(self.groups.on_partition)
        await self.listener.start(s.host, s.port)
        if s.port == 0:
            s.port = self.listener.port
        await self.http.start(s.http_host, s.http_port)
        if self.controller is None:
            self.controller = Controller(
                ObjectStoreMetadataStore(self._store),
                offsets_topic_partitions=s.offsets_topic_partitions,
            )
            await self.controller.start()
        host, port = s.advertised
        info = BrokerInfo(
            broker_id=self.broker_id,
            host=host,
            port=port,
            rack=s.rack or None,
            control_url=f"http://{s.http_host}:{self.http.port}",
            incarnation=self.incarnation,
        )
        snapshot = await self.controller.register_broker(info, _LocalChannel(self))
        self.apply_metadata(snapshot)
        self._registered = True
        self._gauges = asyncio.create_task(self._update_gauges())
        log.info(
            "broker %d serving Kafka on %s:%d (advertised %s:%d), http on %s:%d",
            self.broker_id, s.host, s.port, host, port, s.http_host, self.http.port,
        )  # fmt: skip

    async def stop(self) -> None:
        """SIGTERM: stop taking requests, let in-flight ones finish, flush and close every
        partition cleanly (clean-shutdown flag), then close connections."""
        if self._stopping:
            return
        self._stopping = True
        started = time.perf_counter()
        await self.listener.drain(self.settings.shutdown_timeout_s)
        if self._gauges is not None:
            self._gauges.cancel()
        if self.partitions is not None:
            await self.partitions.stop()
        await self.groups.close()
        if self.engine is not None:
            await self.engine.stop()
        await self.listener.close()
        await self.http.stop()
        log.info("broker %d stopped in %.2fs", self.broker_id, time.perf_counter() - started)

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            ok, reason = self._readiness()
            if ok:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker {self.broker_id} not ready: {reason}")
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ metadata
    def apply_metadata(self, snapshot: ClusterMetadata) -> None:
        if snapshot.version <= self.metadata.version:
            return
        self.metadata = snapshot
        if self.partitions is not None:
            self.partitions.apply(snapshot)

    def controller_id_for_clients(self) -> int:
        """Every broker forwards admin requests to the controller, so clients may use any."""
        return self.broker_id

    def _offsets_partitions(self) -> int:
        topic = self.metadata.topics.get(OFFSETS_TOPIC)
        return len(topic.partitions) if topic else 0

    # ------------------------------------------------------------------ internals
    def _dispatch(self, api_key: int) -> Any:
        spec = REGISTRY.get(api_key)
        if spec is None:
            return None
        handler = spec.handler

        async def call(request: Any, conn: Any) -> Any:
            return await handler(self, request, conn)

        return call

    def _readiness(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "shutting down"
        if not self._registered:
            return False, "not registered with the controller"
        if not self.partitions.is_settled():
            return False, "opening partitions"
        offsets = [tp.partition for tp in self.partitions.leading() if tp.topic == OFFSETS_TOPIC]
        loaded = {s.partition for s in self.groups.shards()}
        if not set(offsets) <= loaded:
            return False, "loading consumer groups"
        return True, "serving"

    async def _update_gauges(self) -> None:
        while True:
            self.metrics.partitions_led(len(self.partitions.leading()))
            self.metrics.connections(self.listener.connection_count)
            await asyncio.sleep(5)


def _unsupported_version() -> Any:
    from kio.schema.errors import ErrorCode

    return ErrorCode.unsupported_version
