"""One TidalMQ broker: the Kafka listener, the storage engine, the partitions it leads, the group
coordinator, and its link to the controller (in this process, or remote)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from tidalmq_controller import (
    Batch,
    ControllerClient,
    Heartbeat,
    HeartbeatReply,
    HttpControllerClient,
    parse_bootstrap,
    report_doc,
)
from tidalmq_core import snapshots, updates
from tidalmq_core.control_auth import TokenError
from tidalmq_core.control_tls import ControlTlsError, may_call_broker
from tidalmq_core.metadata import (
    OFFSETS_TOPIC,
    SUPPORTED_FEATURES,
    TXN_STATE_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    Endpoint,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta, RecordError, apply_batch
from tidalmq_core.scram import ScramCredential
from tidalmq_core.static_mapping import is_physical_topic
from tidalmq_core.tls_reload import FollowingContext

from tidalmq_broker import consumer_lag
from tidalmq_broker.apis.registry import ApiTable
from tidalmq_broker.consumer_lag import ConsumerLag
from tidalmq_broker.groups.consumer_groups import ConsumerGroupSettings
from tidalmq_broker.groups.coordinator import GroupCoordinator, GroupSettings
from tidalmq_broker.handover import Handovers
from tidalmq_broker.heartbeat_news import PendingLooks
from tidalmq_broker.lifecycle import StopSteps
from tidalmq_broker.liveness import LivenessThread
from tidalmq_broker.metrics import BrokerMetrics
from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.protocol.codec import preload_schemas
from tidalmq_broker.protocol.metadata_response import TopicEncodings
from tidalmq_broker.security import SecurityConfigError
from tidalmq_broker.security.endpoints import (
    advertised_endpoints,
    broker_listeners,
    build_authorizer,
    build_endpoints,
    describe,
    describe_authorization,
)
from tidalmq_broker.server.http import HealthServer, HttpServer
from tidalmq_broker.server.listener import KafkaListener
from tidalmq_broker.server.listener_config import ListenerLimits
from tidalmq_broker.settings import BrokerSettings
from tidalmq_broker.static_topics.service import StaticTopicService
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.topic_data import delete_topic_data
from tidalmq_broker.transactions.coordinator import TransactionCoordinator, TxnSettings
from tidalmq_broker.transactions.marker_writes import MarkerListener
from tidalmq_broker.transactions.markers import (
    MarkerChannel,
    markers_doc,
    markers_from,
    write_all_here,
)
from tidalmq_broker.transactions.verification import TxnVerifier, answer_control_call

if TYPE_CHECKING:
    from tidalmq_controller import Controller

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _BeatNews:
    """What a heartbeat reported, acknowledged when its answer comes."""

    pending: dict[TopicPartition, int | None]  # open changes sent
    floors: dict[TopicPartition, tuple[str, int]]  # acknowledged ends sent
    looked: set[TopicPartition]  # the partitions looked at (their floors are sent or unchanged)
    gone: set[TopicPartition]  # of those, the ones not open here at the wished epoch then
    everything: bool  # every partition was looked at
    generation: int  # of _floors_sent when prepared (a reset in between voids the answer)


class _LocalChannel:
    """The controller's channel to a broker in the same process."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        return self._broker.apply_update(
            updates.MetadataUpdate(base, snapshot, [(b.version, b.records) for b in batches])
        )


class Broker:
    def __init__(
        self,
        settings: BrokerSettings,
        *,
        apis: ApiTable[Broker],
        store: ObjectStore | None = None,
        controller: ControllerClient | None = None,
    ) -> None:
        self.settings = settings
        self.broker_id = settings.broker_id
        self._apis = apis  # the Kafka APIs served (tidalmq_broker.apis.KAFKA_APIS)
        self.incarnation = _new_incarnation()
        self._store = store
        # None until start() makes the client (the controller's URL or the embedded one)
        self.controller: ControllerClient = controller  # type: ignore[assignment]
        self.own_controller: Controller | None = None
        self._lease_expiry = 0.0
        self._liveness: LivenessThread[_BeatNews] | None = None
        self._reregistering = False
        self._catching_up = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.metadata = ClusterMetadata(cluster_id="", version=-1)
        self.metadata_encodings = TopicEncodings()  # Metadata responses' pieces, kept encoded
        self.metrics = BrokerMetrics(
            self.broker_id,
            {k: s.name for k, s in apis.specs.items()},
            per_partition_traffic=settings.partition_traffic_metrics,
        )
        self.groups = GroupCoordinator(
            GroupSettings(
                min_session_timeout_ms=settings.group_min_session_timeout_ms,
                initial_rebalance_delay_ms=settings.group_initial_rebalance_delay_ms,
                consumer=ConsumerGroupSettings(
                    session_timeout_ms=settings.group_consumer_session_timeout_ms,
                    heartbeat_interval_ms=settings.group_consumer_heartbeat_interval_ms,
                    assignors=settings.group_consumer_assignors,
                ),
            ),
            self._offsets_partitions,
        )
        # consumer lag of the groups coordinated here, computed at each scrape (consumer_lag.py)
        self.consumer_lag = ConsumerLag(
            self._committed_offsets,
            self._partition_ends,
            per_partition=settings.consumer_lag_partition_metrics,
            max_partition_series=settings.consumer_lag_partition_series_max,
        )
        self.transactions = TransactionCoordinator(
            TxnSettings(
                max_timeout_ms=settings.transaction_max_timeout_ms,
                timeout_check_interval_s=(
                    settings.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
                ),
                id_expiration_ms=settings.transactional_id_expiration_ms,
                id_expiration_check_interval_s=(
                    settings.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
                ),
            ),
            self._txn_state_partitions,
            MarkerChannel(self),
            lambda: self.controller.allocate_producer_id(),
            lambda: self.controller.ensure_transaction_state_topic(),
        )
        # KIP-890: transactional batches new to a partition are checked with the coordinator
        # (part 1, unless verification is off) or added by it (part 2, transaction version 2,
        # whatever the verification setting: the implicit add is how the partition joins)
        self.txn_partitions = TxnVerifier(self)
        self.txn_verifier: TxnVerifier | None = (
            self.txn_partitions if settings.transaction_partition_verification_enable else None
        )
        # told of every transaction marker written here (transactions/marker_writes.py)
        self.txn_marker_listeners: list[MarkerListener] = [self.groups.on_txn_marker]
        # every listener, TLS and SASL setting is checked here, before anything starts
        # each TLS listener's context, by listener name: renewed certificates, no restart
        self.tls_contexts: dict[str, FollowingContext] = {}
        self._listeners, self._endpoints = build_endpoints(
            settings, self._scram_credential, self.tls_contexts
        )
        try:  # the users an embedded controller creates at start if absent
            self._scram_bootstrap = parse_bootstrap(
                settings.scram_bootstrap, settings.scram_bootstrap_file
            )
        except ValueError as exc:
            raise SecurityConfigError(str(exc)) from exc
        try:  # the control plane's token (docs/security.md): required with a remote controller
            self._control = settings.control_credentials()
        except TokenError as exc:
            raise SecurityConfigError(str(exc)) from exc
        try:  # control-plane mTLS (tidalmq_core.control_tls): its files are read now
            self._control_tls = settings.control_tls()
        except ControlTlsError as exc:
            raise SecurityConfigError(str(exc)) from exc
        if self._control is None and settings.controller_url:
            raise SecurityConfigError(
                "--controller-url needs the control-plane token: --control-token-file or "
                "TIDALMQ_CONTROL_TOKEN_FILE (or TIDALMQ_CONTROL_TOKEN)"
            )
        # who may do what (security/authorizer.py): the ACLs of the metadata, loaded as they
        # change
        self.authorizer = build_authorizer(
            settings, self._listeners, sorted({u.user for u in self._scram_bootstrap})
        )
        self.advertised: list[Endpoint] = []  # what clients are told, once bound
        self.listener = KafkaListener(
            self._dispatch,
            apis.supported_versions,
            apis.api_versions_error_body,
            limits=listener_limits(settings),
            observer=self.metrics,
        )
        self.metrics.watch_listener(self.listener)
        # the control endpoints (metadata pushes, drain) need the token; without one (a
        # standalone broker given none) they refuse every call
        authenticate = self._control.authenticate if self._control is not None else None
        # with mTLS, the port serving the control endpoints speaks HTTPS and lets in only the
        # controller's (an administrator's) certificate and this broker's own
        tls = self._control_tls
        own = self.broker_id
        check_role = functools.partial(may_call_broker, broker_id=own) if tls else None
        self.http = HealthServer(
            self._readiness,
            authenticate,
            before_scrape=lambda: self.metrics.publish_led(None),
            tls=tls if settings.control_port < 0 else None,
            check_role=check_role,
        )
        self.control = (
            self.http
            if settings.control_port < 0
            else HttpServer(authenticate, tls=tls, check_role=check_role)
        )
        self.engine: ObjectStreamEngine | None = None
        self.partitions: PartitionManager = None  # type: ignore[assignment]  # set by start()
        # produce appends held through partitions' handovers (moves, openings): handover.py
        self.handovers = Handovers(self.broker_id)
        self.static_topics: StaticTopicService | None = None  # set by start()
        self._registered = False
        self._stopping = False
        # the steps of stop(), timed (a slow one is logged; a forced exit names the one running)
        self.stop_steps = StopSteps(f"broker {self.broker_id}")
        self._gauges: asyncio.Task[None] | None = None
        # high watermarks the controller has acknowledged (heartbeats send what changed since)
        self._floors_sent: dict[TopicPartition, tuple[str, int]] = {}
        # partitions the next heartbeats look at (O(changed) per heartbeat, at most
        # NEWS_PER_HEARTBEAT each: heartbeat_news.py), or all of them (after a reset or a
        # snapshot)
        self._beat_dirty = PendingLooks()
        self._beat_everything = True
        self._floors_generation = 0
        # the controller does not know what we have open (a new controller): send it all
        self._resync = True
        # reports of partitions closed, opened, lost: sent many per request, in order
        self._reports: list[dict[str, Any]] = []
        self._reports_wake = asyncio.Event()
        self._reporter: asyncio.Task[None] | None = None
        # set each time the metadata image changes (wait_metadata)
        self._metadata_changed = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        s = self.settings
        if self._store is None:
            self._store = open_object_store(s.storage_url)
        self.engine = ObjectStreamEngine(
            self._store,
            self.broker_id,
            s.storage_config(),
            lease_check=self._lease_valid,
            on_fenced=self._partition_fenced,
        )
        await self.engine.start()
        self.partitions = PartitionManager(self.engine, self.broker_id)
        self.partitions.add_serving_listener(self.handovers.changed)
        consumer_lag.watch(self.consumer_lag)  # exported from now until stop()
        static = StaticTopicService(
            self.broker_id, lambda: self.metadata, self.partitions, self.engine.store
        )
        self.partitions.logic_queues = static  # Produce/Fetch/ListOffsets on logic queues
        self.static_topics = static  # and the ends of logic queues for consumer lag
        self.groups.offset_keys = static  # committed offsets with Double-Read-Check
        self.partitions.add_hook(self.groups.on_partition)
        self.partitions.add_hook(self.transactions.on_partition)
        self.partitions.add_report(self._report_partition)
        self.engine.on_store_state = self._store_state_changed
        await self.listener.start_endpoints(self._endpoints)
        if self.tls_contexts:
            self.metrics.watch_tls(self.tls_contexts)
            if s.ssl_reload_interval_ms > 0:
                self._spawn(self._reload_certificates(), "TLS certificate reloads")
        ports = self.listener.ports
        if s.port == 0 and not s.listeners:
            s.port = self.listener.port
        self.advertised = advertised_endpoints(self._listeners, ports)
        self.control.app.router.add_post("/v1/metadata", self._receive_metadata)
        self.control.app.router.add_post("/v1/metadata/updates", self._receive_update)
        self.control.app.router.add_post("/v1/drain", self._http_drain)
        self.control.app.router.add_post("/v1/transactions/markers", self._http_txn_markers)
        self.control.app.router.add_post("/v1/transactions/verify", self._http_txn_verify)
        await self.http.start(s.http_host, s.http_port)
        if self.control is not self.http:
            await self.control.start(s.http_host, s.control_port)
        if self.controller is None:
            if s.controller_url:
                assert self._control is not None  # checked in __init__
                self.controller = HttpControllerClient(
                    s.controller_url, token=self._control.token, tls=self._control_tls
                )
            else:
                # loaded here only: a broker of a cluster never loads the controller itself
                from tidalmq_controller import (
                    Controller,
                    ControllerSettings,
                    LocalControllerClient,
                    ObjectStoreMetadataLog,
                )

                self.own_controller = Controller(
                    ObjectStoreMetadataLog(self._store),
                    ControllerSettings(
                        offsets_topic_partitions=s.offsets_topic_partitions,
                        transaction_state_partitions=s.transaction_state_partitions,
                        transaction_version=(
                            s.transaction_version if s.transaction_version >= 0 else None
                        ),
                        auto_rebalance=False,
                        embedded=True,
                        controller_id=f"broker-{s.broker_id}",
                    ),
                    topic_data_deleter=functools.partial(delete_topic_data, self._store),
                    object_store=self._store,
                )
                await self.own_controller.start()
                self.controller = LocalControllerClient(self.own_controller)
        if self.own_controller is not None and self._scram_bootstrap:
            created = await self.own_controller.bootstrap_scram_credentials(self._scram_bootstrap)
            if created:
                log.info("SCRAM credentials bootstrapped: %s", ", ".join(created))
        elif self._scram_bootstrap:
            log.warning(
                "--scram-bootstrap is applied by the controller, and this broker uses "
                "the one at %s: give it there",
                s.controller_url,
            )
        self._reporter = asyncio.create_task(self._report_loop(), name="partition reports")
        await self._register_until_done()
        self._liveness = LivenessThread(
            asyncio.get_running_loop(),
            interval_s=s.heartbeat_interval_s,
            prepare=self._prepare_beat,
            bare=self._bare_beat,
            send=lambda beat: self.controller.beat_blocking(beat),
            on_lease=self._lease_from,
            on_reply=self._beat_answered,
        )
        self._liveness.enabled = True
        self._liveness.start()
        self._gauges = asyncio.create_task(self._update_gauges())
        self._spawn(self._publish_partition_metrics(), "partition metrics")
        # the schemas of every served version, off the event loop (a request would import
        # them on it, the first of each version)
        self._spawn(asyncio.to_thread(preload_schemas, self._apis.supported_versions()), "schemas")
        bound = [f"{name}:{port}" for name, port in ports.items()]
        log.log(
            logging.INFO if self.authorizer.enabled else logging.WARNING,
            "broker %d serving Kafka on %s (advertised %s), http on %s:%d; %s",
            self.broker_id,
            ",".join(bound),
            describe(self.advertised),
            s.http_host,
            self.http.port,
            describe_authorization(s, self.authorizer),
        )

    def _scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The SASL listeners' credential lookup: this broker's metadata image."""
        return self.metadata.scram_credentials.get(user, {}).get(mechanism)

    async def stop(self, deadline: float | None = None) -> None:
        """SIGTERM: stop taking requests, let in-flight ones finish, flush and close every
        partition cleanly (clean-shutdown flag), then close connections.

        `deadline` (time.monotonic()) is when the process will be gone whatever happens (the
        stop deadline): the drain and the wait for in-flight requests each get at most half of
        what is left then, so closing the partitions keeps time of its own."""
        if self._stopping:
            return
        started = time.perf_counter()
        steps = self.stop_steps
        if self.own_controller is None and self._registered and self.settings.drain_on_stop:
            # scale-in / SIGTERM: hand every partition to the other brokers first (each closes
            # cleanly here and opens there), so clients see a move, not a failure
            try:
                with steps.step("drain through the controller"):
                    drained = await self.controller.drain_broker(
                        self.broker_id,
                        timeout_s=self._stop_budget(deadline),
                        incarnation=self.incarnation,
                    )
                log.info("broker %d drained: %s", self.broker_id, drained)
            except Exception as exc:
                log.warning("drain through the controller failed (%s); closing locally", exc)
        self._stopping = True
        self.handovers.release_all()  # answered now, not after their wait
        with steps.step("waiting for in-flight requests"):
            await self.listener.drain(self._stop_budget(deadline))
        if self._liveness is not None:
            with steps.step("stopping the heartbeats"):
                # not joined: the thread may be inside a heartbeat (2 s timeout per socket
                # operation) or waiting for this loop to prepare one; joining here held the loop
                # (and every close below) up to 3 s. It is a daemon thread that sends nothing
                # once told to stop, and a heartbeat already on its way only renews a lease.
                self._liveness.stop(timeout_s=0)
        if self._gauges is not None:
            self._gauges.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.partitions is not None:
            with steps.step("stopping the partition workers"):
                await self.partitions.stop()
        with steps.step("sending the last partition reports"):
            await self._flush_reports(min(5.0, self._stop_budget(deadline)))
        if self._reporter is not None:
            self._reporter.cancel()
        consumer_lag.unwatch(self.consumer_lag)
        with steps.step("closing the group and transaction coordinators"):
            await self.groups.close()
            await self.transactions.close()
        if self.engine is not None:
            # closing every partition (flush, clean checkpoint) is the stop's own work and takes
            # what it takes: the stop deadline bounds it (a partition not closed then is
            # recovered from the WAL by its next owner, losing nothing acknowledged)
            with steps.step("closing the partitions (storage engine)"):
                await self.engine.stop()
        with steps.step("closing client connections"):
            await self.listener.close()
        if self.own_controller is None and self._registered and self.settings.drain_on_stop:
            with steps.step("leaving the cluster"), contextlib.suppress(Exception):
                await self.controller.remove_broker(self.broker_id, incarnation=self.incarnation)
        if self.own_controller is not None:
            with steps.step("stopping the embedded controller"):
                await self.own_controller.stop()
        if isinstance(self.controller, HttpControllerClient):
            with steps.step("closing the controller client"):
                await self.controller.close()
        with steps.step("stopping the HTTP servers"):
            if self.control is not self.http:
                await self.control.stop()
            await self.http.stop()
        log.info("broker %d stopped in %.2fs", self.broker_id, time.perf_counter() - started)

    def _stop_budget(self, deadline: float | None) -> float:
        timeout = self.settings.shutdown_timeout_s
        if deadline is None:
            return timeout
        return max(0.0, min(timeout, (deadline - time.monotonic()) / 2))

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
        """Adopt a whole image unless it is older than ours (tools and tests; the controller
        sends updates, see apply_update)."""
        if snapshot.version <= self.metadata.version and self.metadata.cluster_id:
            return
        self.metadata = snapshot
        self.authorizer.load(snapshot.acls)
        if self.engine is not None:
            self.engine.expect_identity(snapshot.cluster_id, snapshot.store_marker)
        if self.partitions is not None and not self._stopping:
            self.partitions.apply(snapshot)
            self.handovers.everything_changed()
        self._metadata_changed.set()

    async def wait_metadata(self, version: int, timeout_s: float) -> bool:
        """Wait until this broker's image holds `version` (True) or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while self.metadata.version < version:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._metadata_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._metadata_changed.wait(), left)
        return True

    def apply_update(self, update: updates.MetadataUpdate) -> int:
        """Apply the batches after our version (a snapshot first when given); an update that
        does not follow our version is refused. Returns the version we hold afterwards."""
        try:
            return self._apply_update(update)
        finally:
            self._metadata_changed.set()

    def _apply_update(self, update: updates.MetadataUpdate) -> int:
        if update.snapshot is not None:
            image = snapshots.decode(update.snapshot)
            if image.version > self.metadata.version or not self.metadata.cluster_id:
                self.apply_metadata(image)
        elif update.base != self.metadata.version:
            return self.metadata.version
        delta = MetadataDelta()
        for version, records in update.batches:
            if version <= self.metadata.version:
                continue
            if version != self.metadata.version + 1:
                break  # a gap: the controller sends from our version next time
            try:
                apply_batch(self.metadata, records, version, delta)
            except (RecordError, KeyError, TypeError, ValueError) as exc:
                log.error(
                    "metadata batch %d could not be applied (%s); asking for a snapshot",
                    version,
                    exc,
                )
                self.metadata = ClusterMetadata(cluster_id="", version=-1)
                self.authorizer.load(self.metadata.acls)
                return -1
        if delta.acls:  # before anything else: no request is decided on the old bindings
            self.authorizer.load(self.metadata.acls)
        if delta:
            self.metadata_encodings.changed(delta)
            if delta.other and self.engine is not None:
                self.engine.expect_identity(self.metadata.cluster_id, self.metadata.store_marker)
            if self.partitions is not None and not self._stopping:
                self.partitions.apply_delta(self.metadata, delta)
                self.handovers.metadata_changed(delta)
        return self.metadata.version

    async def drain(self, timeout_s: float) -> bool:
        """Hand every partition to the other brokers (preStop, scale-in); True when done."""
        if self.own_controller is not None:
            return False  # a standalone broker has nowhere to move its partitions
        return await self.controller.drain_broker(
            self.broker_id, timeout_s=timeout_s, incarnation=self.incarnation
        )

    async def _http_drain(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        timeout_s = float(body.get("timeout_s", self.settings.shutdown_timeout_s))
        try:
            drained = await self.drain(timeout_s)
        except Exception as exc:
            return web.json_response({"drained": False, "error": str(exc)}, status=503)
        return web.json_response(
            {"drained": drained, "leading": len(self.partitions.open_partitions())}
        )

    async def _http_txn_markers(self, request: web.Request) -> web.Response:
        """Transaction markers from a coordinator on another broker, relayed by the controller
        (docs/transactions.md): written here as WriteTxnMarkers writes them."""
        try:
            markers = markers_from(await request.json())
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        results = await write_all_here(self, markers)
        doc = markers_doc(markers)
        for entry in doc["markers"]:
            entry["error_code"] = results[TopicPartition(entry["topic"], entry["partition"])]
        return web.json_response({"results": doc["markers"]})

    async def _http_txn_verify(self, request: web.Request) -> web.Response:
        """A partition leader's verify-only question (KIP-890) for the transactions this broker
        coordinates, relayed by the controller: answered per partition."""
        try:
            doc = await request.json()
            return web.json_response(await answer_control_call(self.transactions, doc))
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)

    async def _receive_metadata(self, request: web.Request) -> web.Response:
        self.apply_metadata(ClusterMetadata.from_json(await request.json()))
        return web.json_response({"applied": self.metadata.version})

    async def _receive_update(self, request: web.Request) -> web.Response:
        try:
            update = updates.decode(await request.read())
        except updates.UpdateError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"applied": self.apply_update(update)})

    async def _catch_up(self) -> None:
        """Fetch and apply what we miss of the metadata."""
        self.apply_update(await self.controller.fetch_update(self.metadata.version))

    # ------------------------------------------------------------------ controller link
    def _lease_valid(self) -> bool:
        return self.own_controller is not None or time.monotonic() < self._lease_expiry

    async def _register(self) -> None:
        s = self.settings
        host, port, listeners = broker_listeners(self.advertised)
        info = BrokerInfo(
            broker_id=self.broker_id,
            host=host,
            port=port,
            rack=s.rack or None,
            control_url=s.control_url(self.control.port),
            incarnation=self.incarnation,
            listeners=listeners,
            supported_features=dict(SUPPORTED_FEATURES),
        )
        version = await self.controller.register_broker(info, _LocalChannel(self))
        if self.metadata.version < version:
            await self._catch_up()
        self._registered = True
        self._resync = True
        reregistering, self._reregistering = self._reregistering, False
        try:
            await self._heartbeat_once()  # the first lease
        finally:
            self._reregistering = reregistering

    async def _register_until_done(self) -> None:
        """Join the cluster, retrying while the controller is unreachable (it may be starting,
        or moving to another operator replica); the broker is not ready meanwhile."""
        delay = 0.2
        while True:
            try:
                await self._register()
                return
            except Exception as exc:
                log.warning(
                    "registration with the controller failed (%s); retrying in %.1fs", exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # The lease is renewed from the liveness thread (liveness.py), which asks the event loop
    # for each heartbeat's news and goes without it when the loop is too busy to answer.
    async def _prepare_beat(self) -> tuple[Heartbeat, _BeatNews] | None:
        """A heartbeat with what opened and closed since the last answered one (everything
        when the controller asked for it) and the acknowledged ends to keep as floors. Changes
        nothing: the answer acknowledges (`_beat_answered`)."""
        if not self._registered or self._reregistering:
            return None
        changed = self.partitions.take_changed()
        if changed is None:
            self._beat_everything = True
        else:
            self._beat_dirty.add(changed)
        full = self._resync
        everything = full or self._beat_everything
        open_now: dict[TopicPartition, int] = {}
        if everything:
            open_now = self.partitions.open_partitions()
            current = self.partitions.open_high_watermarks()
            looked = set(current) | set(self._floors_sent) | self._beat_dirty.all()
            hwm = self.partitions.high_watermarks(is_physical_topic, looked | set(open_now))
        else:
            looked = self._beat_dirty.next()
            current = self.partitions.open_high_watermarks(looked)
            hwm = self.partitions.high_watermarks(is_physical_topic, looked)
        # a floor at offset 0 says nothing (the controller keeps only floors above its own):
        # a brand-new partition's is not sent until it has an acknowledged record
        floors = {tp: v for tp, v in current.items() if self._floors_sent.get(tp, (v[0], 0)) != v}
        changes: dict[TopicPartition, int | None]
        if full:
            changes = dict(open_now)
            pending = self.partitions.open_changes()
        else:
            changes = pending = self.partitions.open_changes(limit=self._beat_dirty.per_heartbeat)
        beat = Heartbeat(
            self.broker_id,
            self.incarnation,
            self.metadata.version,
            changes,
            full=full,
            hwm=hwm,
            floors=floors,
        )
        news = _BeatNews(
            pending, floors, looked, looked - set(current), everything, self._floors_generation
        )
        return beat, news

    def _reset_floors_sent(self) -> None:
        """Forget what the controller acknowledged: the next heartbeat looks at everything."""
        self._floors_sent = {}
        self._floors_generation += 1
        self._beat_everything = True

    def _bare_beat(self) -> Heartbeat:
        """A heartbeat without news (liveness thread, when the event loop is late)."""
        return Heartbeat(self.broker_id, self.incarnation, self.metadata.version, {}, full=False)

    def _lease_from(self, beat: Heartbeat, sent: float, reply: HeartbeatReply) -> None:
        """The lease a heartbeat's answer grants, from when it was sent (any thread): it always
        expires before the controller's view of it (granted when the heartbeat arrived)."""
        if beat.incarnation != self.incarnation:
            return  # an answer to our previous incarnation
        if reply.fenced:
            self._lease_expiry = 0.0  # stop acknowledging at once
        else:
            self._lease_expiry = max(self._lease_expiry, sent + reply.lease_s)

    def _beat_answered(
        self, beat: Heartbeat, news: _BeatNews | None, sent: float, reply: HeartbeatReply
    ) -> None:
        """The rest of a heartbeat's answer, on the event loop."""
        if beat.incarnation != self.incarnation or self._stopping:
            return
        if reply.fenced:
            if not self._reregistering:
                self._spawn(self._on_fenced(reply.reason), "re-register")
            return
        if news is not None:
            self.partitions.ack_open_changes(news.pending)
            self._resync = reply.resync
            if news.generation == self._floors_generation:
                for tp in news.gone:
                    self._floors_sent.pop(tp, None)
                self._floors_sent.update(news.floors)
                self._beat_dirty.done(news.looked)
                if news.everything:
                    self._beat_everything = False
        elif reply.resync:
            self._resync = True
        if reply.metadata_version > self.metadata.version and not self._catching_up:
            self._spawn(self._catch_up_once(), "metadata catch-up")

    async def _catch_up_once(self) -> None:
        self._catching_up = True
        try:
            await self._catch_up()
        except Exception as exc:
            log.warning("metadata catch-up failed: %s", exc)
        finally:
            self._catching_up = False

    async def _reload_certificates(self) -> None:
        """Renewed keystore/truststore files are served to new connections without a restart
        (security/tls.py, listener_context)."""
        interval = self.settings.ssl_reload_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.reload_certificates()

    def reload_certificates(self, listeners: Collection[str] | None = None) -> dict[str, str]:
        """Look at the TLS files of these listeners (None: every TLS listener) now, and reload
        those that changed: every `ssl.reload.interval.ms`, and at once on an AlterConfigs of
        their paths (apis/configs.py). Returns why, by listener, the files cannot be loaded now
        (the listener keeps serving its previous certificate); empty when they can."""
        problems = {}
        for name, context in self.tls_contexts.items():
            if listeners is not None and name not in listeners:
                continue
            failures = context.failures
            # a few file stats; the rare reload parses a PEM file or two (milliseconds)
            if context.check():
                self.metrics.tls_reload(name, ok=True)
            elif context.failures != failures:
                self.metrics.tls_reload(name, ok=False)
            if context.last_error:
                problems[name] = context.last_error
        return problems

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _heartbeat_once(self) -> None:
        """One heartbeat from the event loop (the first lease, at registration)."""
        prepared = await self._prepare_beat()
        if prepared is None:
            return
        beat, news = prepared
        sent = time.monotonic()
        # on a thread, as the liveness thread sends them: a registering broker's loop is busy
        # applying the metadata and opening its partitions, and must not delay the answer
        reply = await asyncio.to_thread(self.controller.beat_blocking, beat)
        self._lease_from(beat, sent, reply)
        if reply.fenced:
            await self._on_fenced(reply.reason)
            return
        self._beat_answered(beat, news, sent, reply)

    async def _on_fenced(self, reason: str) -> None:
        """The controller no longer vouches for us: stop acknowledging at once, give up every
        partition, and join again as a new incarnation."""
        log.warning(
            "broker %d fenced by the controller (%s); re-registering", self.broker_id, reason
        )
        self._reregistering = True
        try:
            self._lease_expiry = 0.0
            self._reset_floors_sent()
            self.partitions.release_all()
            await self.partitions.wait_settled(30)
            self.incarnation = _new_incarnation()
            await self._register_until_done()
            # only now: until registered, the metadata gives it its partitions at the epochs
            # the fenced incarnation held them at (PartitionManager.release_all)
            if not self._stopping:
                self.partitions.rejoin(self.metadata)
        finally:
            self._reregistering = False

    async def _partition_fenced(self, tp: TopicPartition) -> None:
        if self.partitions is not None:
            await self.partitions.fenced(tp)

    async def _report_partition(
        self,
        kind: str,
        tp: TopicPartition,
        epoch: int,
        *,
        topic_id: str | None = None,
        high_watermark: int | None = None,
        loss: DataLoss | None = None,
        stored: bool = True,
    ) -> None:
        if kind == "lost":
            assert loss is not None
            self.metrics.partition_lost(tp.topic, tp.partition, loss.missing_offsets)
            self.metrics.partitions_lost(len(self.partitions.lost_partitions()))
        elif kind == "forgotten":
            self.metrics.partition_not_lost(tp.topic, tp.partition)
            self.metrics.partitions_lost(len(self.partitions.lost_partitions()))
            return
        elif kind == "closed":
            self.metrics.partition_released(tp.topic, tp.partition)
        else:
            if self.metrics.partition_not_lost(tp.topic, tp.partition):
                self.metrics.partitions_lost(len(self.partitions.lost_partitions()))
            self.metrics.partition_led(tp.topic, tp.partition, epoch)
        self._reports.append(
            report_doc(
                kind,
                tp,
                epoch,
                topic_id=topic_id,
                high_watermark=high_watermark,
                loss=loss,
                stored=stored,
            )
        )
        self._reports_wake.set()

    async def _report_loop(self) -> None:
        """Send the queued reports, everything queued so far in one request, in order; a
        failed request is sent again (reports are idempotent)."""
        delay = 0.05
        while True:
            await self._reports_wake.wait()
            self._reports_wake.clear()
            while self._reports:
                batch = self._reports[:5000]
                try:
                    await self.controller.report(self.broker_id, batch)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.debug("partition reports not delivered (%s); retrying", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                delay = 0.05
                del self._reports[: len(batch)]

    async def _flush_reports(self, timeout_s: float) -> None:
        """At stop: give the last reports (the closes) a moment to reach the controller."""
        deadline = time.monotonic() + timeout_s
        while self._reports and time.monotonic() < deadline and self._reporter is not None:
            if self._reporter.done():
                return
            self._reports_wake.set()
            await asyncio.sleep(0.02)

    def _store_state_changed(self, problem: str | None) -> None:
        """The engine lost (or found again) the object store: every partition is looked at
        again (they re-open through the usual checks once the store is back)."""
        if problem is not None:
            self._reset_floors_sent()
        if self.partitions is not None and not self._stopping:
            self.partitions.wake_all()

    def controller_id_for_clients(self) -> int:
        """Every broker forwards admin requests to the controller, so clients may use any."""
        return self.broker_id

    def _offsets_partitions(self) -> int:
        topic = self.metadata.topics.get(OFFSETS_TOPIC)
        return len(topic.partitions) if topic else 0

    def _txn_state_partitions(self) -> int:
        topic = self.metadata.topics.get(TXN_STATE_TOPIC)
        return len(topic.partitions) if topic else 0

    # ------------------------------------------------------------------ internals
    def _dispatch(self, api_key: int) -> Any:
        spec = self._apis.specs.get(api_key)
        if spec is None:
            return None
        handler = spec.handler

        async def call(request: Any, conn: Any) -> Any:
            return await handler(self, request, conn)

        return call

    def _readiness(self) -> tuple[bool, str]:
        """Ready: this broker can serve what it is given. Not ready while it stops, before it
        registered with the controller, once its lease from the controller has expired (it may
        acknowledge nothing), while the object store is lost or does not take its writes.

        Partitions still opening and consumer groups still loading do not make a broker
        unready: clients are told LEADER_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS for
        those (retriable, as Kafka answers during a load) while everything else is served.
        Readiness used to wait until every partition was open and every group shard loaded,
        so one partition whose open kept failing (or waited for newer metadata) held a
        serving broker out of its Service, and a wave of moves took a broker out too."""
        if self._stopping:
            return False, "shutting down"
        if not self._registered:
            return False, "not registered with the controller"
        if not self._lease_valid():
            expired = time.monotonic() - self._lease_expiry
            return False, f"lease from the controller expired {expired:.1f}s ago"
        engine = self.engine
        if engine is not None and engine.store_problem is not None:
            return False, f"object store lost: {engine.store_problem}"
        if engine is not None and engine.write_problem is not None:
            return False, engine.write_problem
        busy = []
        if not self.partitions.is_settled():
            busy.append("opening partitions")
        lost = self.partitions.lost_partitions()
        offsets = {  # O(offsets partitions), not O(partitions led here): probes come often
            i
            for i in range(self._offsets_partitions())
            if self.partitions.leads(tp := TopicPartition(OFFSETS_TOPIC, i)) and tp not in lost
        }
        loaded = {s.partition for s in self.groups.shards()}
        if not offsets <= loaded:
            busy.append("loading consumer groups")
        return True, "serving" + (f" ({', '.join(busy)})" if busy else "")

    def _committed_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """The committed offsets of every group coordinated here, by the partitions clients
        know (static topics' logic queues)."""
        return {
            group: {tp: c.offset for tp, c in shard.fetch_offsets(group, None).items()}
            for shard in self.groups.shards()
            for group in shard.offsets
        }

    def _partition_ends(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The ends of `wanted`: the high watermark of those led here, else the acknowledged
        end the metadata holds (consumer_lag.py); static topics' logic queues translated from
        their leader physical queue's end (StaticTopicService.lag_ends)."""
        local = (
            self.partitions.high_watermarks(
                lambda _topic: True, [TopicPartition(t, p) for t, p in wanted]
            )
            if self.partitions is not None
            else {}
        )
        topics = self.metadata.topics
        out: dict[tuple[str, int], int] = {}
        logic_queues: list[tuple[str, int]] = []
        for topic, partition in wanted:
            hwm = local.get(TopicPartition(topic, partition))
            if hwm is not None:
                out[(topic, partition)] = hwm
                continue
            info = topics.get(topic)
            if info is None:
                continue
            if info.kind == "static":
                logic_queues.append((topic, partition))
            elif info.kind == "normal" and partition < len(info.partitions):
                out[(topic, partition)] = info.partitions[partition].end_offset_floor
        if logic_queues and self.static_topics is not None:
            out.update(self.static_topics.lag_ends(logic_queues))
        return out

    async def _publish_partition_metrics(self) -> None:
        """Partitions' series, a chunk every quarter second (BrokerMetrics.publish_led), so
        a burst of opens is not followed by a burst of label work; not while partitions are
        being opened or closed (a chunk of 500 costs about 30 ms of the event loop, which a
        creation or a rebalance waits for), unless that has gone on for 5 s; a scrape
        publishes the rest first (HealthServer's before_scrape)."""
        deferred_since: float | None = None
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            if self.partitions is not None and self.partitions.working():
                deferred_since = deferred_since or now
                if now - deferred_since < 5.0:
                    continue
            deferred_since = None
            self.metrics.publish_led()

    async def _update_gauges(self) -> None:
        while True:
            self.metrics.partitions_led(self.partitions.leading_count())
            self.metrics.partitions_lost(len(self.partitions.lost_partitions()))
            await asyncio.sleep(5)


def listener_limits(settings: BrokerSettings) -> ListenerLimits:
    """The Kafka listener's bounds from the broker's settings."""
    try:
        overrides = settings.connection_overrides()
    except ValueError as exc:
        raise SystemExit(f"broker {settings.broker_id}: cannot start: {exc}") from None
    return ListenerLimits(
        max_request_bytes=settings.max_request_bytes,
        max_inflight_per_connection=settings.max_inflight_requests_per_connection,
        max_inflight_bytes_per_connection=settings.max_inflight_request_bytes_per_connection,
        max_response_bytes_per_connection=settings.max_response_bytes_per_connection,
        queued_max_request_bytes=settings.queued_max_request_bytes,
        queued_max_response_bytes=settings.queued_max_response_bytes,
        max_connections=settings.max_connections,
        max_connections_per_ip=settings.max_connections_per_ip,
        max_connections_per_ip_overrides=overrides,
        idle_timeout_s=settings.connections_max_idle_ms / 1000,
        failed_authentication_delay_s=settings.connection_failed_authentication_delay_ms / 1000,
    )


def _new_incarnation() -> str:
    return f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
