"""The broker's Prometheus metrics (names follow Prometheus conventions: snake_case, _total,
_seconds, _bytes). Storage metrics live in storage/metrics.py."""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Summary
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidalmq_broker.server.budget import MemoryBudget
from tidalmq_broker.server.listener import KafkaListener
from tidalmq_broker.server.listener_config import RequestObserver

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("tidalmq_requests_total", "Kafka requests handled", ["broker", "api"])
REQUEST_ERRORS = Counter(
    "tidalmq_request_failures_total", "Kafka requests whose handler failed", ["broker", "api"]
)
REQUEST_SECONDS = Histogram(
    "tidalmq_request_seconds", "Kafka request latency", ["broker", "api"], buckets=_LATENCY_BUCKETS
)
REQUEST_BYTES = Counter("tidalmq_request_bytes_total", "Request bytes received", ["broker", "api"])
# A sum and a count (a summary without quantiles), not a histogram: the figure wanted is the
# mean per request (rate of _sum over rate of _count), observing it costs two additions, and
# buckets fine enough for microseconds would add a dozen series per API (server/cpu.py).
REQUEST_CPU_SECONDS = Summary(
    "tidalmq_request_cpu_seconds",
    "Event-loop thread CPU time per request, per API: decoding, handler and encoding (not "
    "waiting, not the WAL flush)",
    ["broker", "api"],
)
# Per partition and broker: a partition's series live on the broker that leads it, from the
# open to the close (so a leadership change starts a new series instead of mixing two brokers).


# Their values are plain numbers each BrokerMetrics keeps per partition, read at scrape time by
# the two collectors below: the same series as prometheus_client Counters and a Gauge with
# labels (names, help, types, labels, _total and _created samples), without a labelled child
# per partition. Making those four children (each a lock, a value object and the label checks)
# was a third of a broker's CPU for opening a creation's brand-new partitions.
_LABELS = ("broker", "topic", "partition")
# by broker label: a broker started again in the same process (tests) replaces the earlier one's
# series, as the labelled children it shared with it did, instead of writing them twice
_SOURCES: weakref.WeakValueDictionary[str, BrokerMetrics] = weakref.WeakValueDictionary()


class PartitionTraffic:
    """tidalmq_partition_bytes_in_total, _records_in_total and _bytes_out_total: bytes and
    records appended, bytes fetched, per partition led here (the planner's input)."""

    FAMILIES = (
        ("tidalmq_partition_bytes_in", "Record batch bytes appended"),
        ("tidalmq_partition_records_in", "Records appended"),
        ("tidalmq_partition_bytes_out", "Record batch bytes fetched"),
    )

    def describe(self) -> Iterator[Metric]:
        return iter([CounterMetricFamily(n, doc, labels=_LABELS) for n, doc in self.FAMILIES])

    def collect(self) -> Iterator[Metric]:
        families = [CounterMetricFamily(n, doc, labels=_LABELS) for n, doc in self.FAMILIES]
        created = prometheus_metrics._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES, as Counter
        for source in list(_SOURCES.values()):
            broker = source._broker
            for (topic, partition), row in list(source._partitions.items()):
                labels = (broker, topic, str(partition))
                at = row[3] if created else None
                for i, family in enumerate(families):
                    family.add_metric(labels, row[i], created=at)
        return iter(families)


class PartitionLeaderEpochs:
    """tidalmq_partition_leader_epoch: the epoch of each partition open here."""

    NAME = "tidalmq_partition_leader_epoch"
    HELP = "Leader epoch of each partition this broker has open (present only while it leads it)"

    def describe(self) -> Iterator[Metric]:
        return iter([GaugeMetricFamily(self.NAME, self.HELP, labels=_LABELS)])

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=_LABELS)
        for source in list(_SOURCES.values()):
            broker = source._broker
            for (topic, partition), epoch in list(source._epochs.items()):
                family.add_metric((broker, topic, str(partition)), epoch)
        return iter([family])


REGISTRY.register(PartitionTraffic())
# Per topic and broker (bounded by topics, not partitions): what dashboards and alerts use; the
# per-partition series above are the planner's input (docs/metrics.md, "Cardinality").
TOPIC_BYTES_IN = Counter(
    "tidalmq_topic_bytes_in_total", "Record batch bytes appended, per topic", ["broker", "topic"]
)
TOPIC_RECORDS_IN = Counter(
    "tidalmq_topic_records_in_total", "Records appended, per topic", ["broker", "topic"]
)
TOPIC_BYTES_OUT = Counter(
    "tidalmq_topic_bytes_out_total", "Record batch bytes fetched, per topic", ["broker", "topic"]
)
TOPIC_RECORDS_OUT = Counter(
    "tidalmq_topic_records_out_total",
    "Records fetched (counted from the batch headers), per topic",
    ["broker", "topic"],
)
REQUEST_QUEUE_SECONDS = Histogram(
    "tidalmq_request_queue_seconds",
    "Time from a request taken off its connection to its handler starting (the event loop's "
    "backlog), per API",
    ["broker", "api"],
    buckets=_LATENCY_BUCKETS,
)
REGISTRY.register(PartitionLeaderEpochs())
TXN_PARTITION_CHECKS = Counter(
    "tidalmq_transaction_partition_checks_total",
    "Questions partition leaders and group coordinators asked the transaction coordinator about "
    "a transactional write (KIP-890): kind=verify (is the partition in the transaction: "
    "transaction version 1) or add (add it: Produce v12 / TxnOffsetCommit v5 at "
    "transaction.version 2)",
    ["broker", "kind"],
)
LEADER_HINTS = Counter(
    "tidalmq_leader_hints_total",
    "Partitions answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH with their current leader "
    "named (KIP-951: Produce v10+, Fetch v16+), so the client re-routes without a Metadata "
    "request, by API",
    ["broker", "api"],
)
HANDOVER_HOLDS = Counter(
    "tidalmq_produce_handover_holds_total",
    "Partitions of produce requests held through a handover (leaderless in this broker's "
    "image, or opening here) instead of answered with an error, by how the hold ended: served "
    "here, redirected (NOT_LEADER_OR_FOLLOWER naming the new leader), timed_out (answered with "
    "the error it was held on), failed (another error)",
    ["broker", "outcome"],
)
HANDOVER_HOLD_SECONDS = Histogram(
    "tidalmq_produce_handover_hold_seconds",
    "How long a partition of a produce request was held through a handover",
    ["broker"],
    buckets=_LATENCY_BUCKETS,
)
PRODUCE_ERRORS = Counter(
    "tidalmq_produce_errors_total", "Produce partition errors", ["topic", "error"]
)
PARTITION_MISSING_OFFSETS = Gauge(
    "tidalmq_partition_missing_offsets",
    "Acknowledged offsets the object store no longer holds, per lost partition (present only "
    "while the partition is lost)",
    ["broker", "topic", "partition"],
)
PARTITIONS_LOST = Gauge(
    "tidalmq_partitions_lost", "Partitions this broker leads whose data is lost", ["broker"]
)
PARTITIONS_LED = Gauge("tidalmq_partitions_led", "Partitions this broker leads", ["broker"])
CONNECTIONS = Gauge("tidalmq_connections", "Open client connections", ["broker"])
CONNECTIONS_MUTED = Gauge(
    "tidalmq_connections_muted",
    "Connections whose requests are not read now because their clients have not read their "
    "responses (max_response_bytes_per_connection)",
    ["broker"],
)
CONNECTIONS_WAITING_FOR_MEMORY = Gauge(
    "tidalmq_connections_waiting_for_memory",
    "Connections that stopped reading until the request budget (queued.max.request.bytes) has room",
    ["broker"],
)
CONNECTIONS_REFUSED = Counter(
    "tidalmq_connections_refused_total",
    "Connections closed as soon as accepted, by cap (max_connections, max_connections_per_ip)",
    ["broker", "reason"],
)
CONNECTIONS_CLOSED = Counter(
    "tidalmq_connections_closed_total",
    "Connections the broker closed because of a bound (idle: connections.max.idle.ms)",
    ["broker", "reason"],
)
BUFFERED_BYTES = Gauge(
    "tidalmq_buffered_bytes",
    "Bytes the connections hold now, against the broker-wide budgets: request (frames being "
    "read, requests not yet answered) and response (being built or not yet read by clients)",
    ["broker", "kind"],
)
BUFFER_BUDGET_BYTES = Gauge(
    "tidalmq_buffer_budget_bytes",
    "The broker-wide budgets: queued.max.request.bytes and queued.max.response.bytes (0: none)",
    ["broker", "kind"],
)
PARTITION_OPEN_SECONDS = Histogram(
    "tidalmq_partition_open_seconds",
    "Time to open a partition (read checkpoint, fence, recover)",
    ["broker"],
    buckets=_LATENCY_BUCKETS,
)


class BrokerMetrics(RequestObserver):
    """Resolves each label set once (labels() takes a lock and hashes the values, several times
    per request otherwise)."""

    def __init__(
        self, broker_id: int, api_names: dict[int, str], *, per_partition_traffic: bool = True
    ) -> None:
        self._broker = str(broker_id)
        self._api_names = api_names
        # False: no per-partition traffic series (partition_traffic_metrics); per topic only
        self._per_partition = per_partition_traffic
        self._per_api: dict[int, tuple[Any, Any, Any, Any]] = {}
        self._queued: dict[int, Any] = {}
        self._cpu: dict[int, Any] = {}
        # per topic: its label children, and the partitions led here (series go with the last)
        self._topics: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._topic_partitions: dict[str, set[int]] = {}
        # per partition: bytes in, records in, bytes out, when its series began (PartitionTraffic)
        self._partitions: dict[tuple[str, int], list[float]] = {}
        # partitions opened here whose series are not published yet (see publish_led)
        self._led_pending: dict[tuple[str, int], int] = {}
        self._lost: set[tuple[str, int]] = set()  # partitions with a missing-offsets series
        # per partition open here: its leader epoch once published (PartitionLeaderEpochs)
        self._epochs: dict[tuple[str, int], int] = {}
        _SOURCES[self._broker] = self

    def observe(self, api_key: int, seconds: float, request_bytes: int, error: bool) -> None:
        children = self._per_api.get(api_key)
        if children is None:
            name = self._api_names.get(api_key, str(api_key))
            children = (
                REQUESTS.labels(self._broker, name),
                REQUEST_SECONDS.labels(self._broker, name),
                REQUEST_BYTES.labels(self._broker, name),
                REQUEST_ERRORS.labels(self._broker, name),
            )
            self._per_api[api_key] = children
        requests, latency, size, errors = children
        requests.inc()
        latency.observe(seconds)
        size.inc(request_bytes)
        if error:
            errors.inc()

    def cpu(self, api_key: int, seconds: float) -> None:
        child = self._cpu.get(api_key)
        if child is None:
            name = self._api_names.get(api_key, str(api_key))
            child = self._cpu[api_key] = REQUEST_CPU_SECONDS.labels(self._broker, name)
        child.observe(seconds)

    def leader_hints(self, api: str, partitions: int) -> None:
        """`partitions` misdirected partitions of one `api` ("produce", "fetch") response were
        answered with their current leader (KIP-951, apis/leader_hints.py)."""
        if partitions:
            LEADER_HINTS.labels(self._broker, api).inc(partitions)

    def queued(self, api_key: int, seconds: float) -> None:
        child = self._queued.get(api_key)
        if child is None:
            name = self._api_names.get(api_key, str(api_key))
            child = self._queued[api_key] = REQUEST_QUEUE_SECONDS.labels(self._broker, name)
        child.observe(seconds)

    def _topic(self, topic: str) -> tuple[Any, Any, Any, Any]:
        children = self._topics.get(topic)
        if children is None:
            labels = (self._broker, topic)
            children = (
                TOPIC_BYTES_IN.labels(*labels),
                TOPIC_RECORDS_IN.labels(*labels),
                TOPIC_BYTES_OUT.labels(*labels),
                TOPIC_RECORDS_OUT.labels(*labels),
            )
            self._topics[topic] = children
        return children

    def _partition(self, topic: str, partition: int) -> list[float]:
        row = self._partitions.get((topic, partition))
        if row is None:
            row = self._partitions[(topic, partition)] = [0.0, 0.0, 0.0, time.time()]
        return row

    def produced(self, topic: str, partition: int, size: int, records: int) -> None:
        self.produced_partition(topic, partition, size, records)
        self.produced_topic(topic, size, records)

    def produced_partition(self, topic: str, partition: int, size: int, records: int) -> None:
        if self._per_partition:
            row = self._partition(topic, partition)
            row[0] += size
            row[1] += records

    def produced_topic(self, topic: str, size: int, records: int) -> None:
        """A produce request's appends to `topic`, all partitions together (one increment
        per request and topic, not per partition: the produce path's cost per request)."""
        per_topic = self._topic(topic)
        per_topic[0].inc(size)
        per_topic[1].inc(records)

    def fetched(self, topic: str, partition: int, size: int, records: int) -> None:
        if self._per_partition:
            self._partition(topic, partition)[2] += size
        per_topic = self._topic(topic)
        per_topic[2].inc(size)
        per_topic[3].inc(records)

    def partition_led(self, topic: str, partition: int, epoch: int) -> None:
        """The partition opened here: its series appear (at zero traffic too), soon: a
        rebalance opens thousands of partitions at once, so they are published in chunks off
        the path that reports the open (publish_led; its topic's series may need label sets
        resolved, a partition's own series are plain numbers, see PartitionTraffic)."""
        self._led_pending[(topic, partition)] = epoch
        self._topic_partitions.setdefault(topic, set()).add(partition)

    def publish_led(self, limit: int | None = 500) -> int:
        """Publish the series of up to `limit` (None: all) partitions opened since; how many
        are left."""
        count = len(self._led_pending)
        for _ in range(count if limit is None else min(limit, count)):
            (topic, partition), epoch = self._led_pending.popitem()
            if self._per_partition:
                self._partition(topic, partition)
            self._topic(topic)
            self._epochs[(topic, partition)] = epoch
        return len(self._led_pending)

    def partition_released(self, topic: str, partition: int) -> None:
        """The partition closed here: its series go (Prometheus marks them stale)."""
        self._led_pending.pop((topic, partition), None)
        self._partitions.pop((topic, partition), None)
        self._epochs.pop((topic, partition), None)
        led = self._topic_partitions.get(topic)
        if led is not None:
            led.discard(partition)
            if not led:  # the last partition of the topic led here: its series go too
                del self._topic_partitions[topic]
                self._topics.pop(topic, None)
                for metric in (
                    TOPIC_BYTES_IN,
                    TOPIC_RECORDS_IN,
                    TOPIC_BYTES_OUT,
                    TOPIC_RECORDS_OUT,
                ):
                    with contextlib.suppress(KeyError):
                        metric.remove(self._broker, topic)

    def partition_lost(self, topic: str, partition: int, missing: int) -> None:
        self._lost.add((topic, partition))
        PARTITION_MISSING_OFFSETS.labels(self._broker, topic, str(partition)).set(missing)

    def partition_not_lost(self, topic: str, partition: int) -> bool:
        """Every open reports it: only a partition reported lost has a series to remove (a
        remove that raises KeyError cost a rebalance's opens a quarter of their time). True
        when it was."""
        if (topic, partition) not in self._lost:
            return False
        self._lost.discard((topic, partition))
        with contextlib.suppress(KeyError):
            PARTITION_MISSING_OFFSETS.remove(self._broker, topic, str(partition))
        return True

    def partitions_lost(self, count: int) -> None:
        PARTITIONS_LOST.labels(self._broker).set(count)

    def produce_errors(self, topic: str, error: str) -> None:
        PRODUCE_ERRORS.labels(topic, error).inc()

    def partitions_led(self, count: int) -> None:
        PARTITIONS_LED.labels(self._broker).set(count)

    def connections(self, count: int) -> None:
        CONNECTIONS.labels(self._broker).set(count)

    def watch_listener(self, listener: KafkaListener) -> None:
        """The listener's gauges, read at each scrape."""
        b = self._broker
        CONNECTIONS.labels(b).set_function(lambda: listener.connection_count)
        CONNECTIONS_MUTED.labels(b).set_function(lambda: listener.muted)
        requests, responses = listener.request_budget, listener.response_budget
        CONNECTIONS_WAITING_FOR_MEMORY.labels(b).set_function(
            lambda: requests.waiting if requests is not None else 0
        )
        for kind, budget in (("request", requests), ("response", responses)):
            BUFFER_BUDGET_BYTES.labels(b, kind).set(budget.limit if budget is not None else 0)
            BUFFERED_BYTES.labels(b, kind).set_function(_used_of(budget))
        for reason in ("max_connections", "max_connections_per_ip"):
            CONNECTIONS_REFUSED.labels(b, reason)  # present at 0
        CONNECTIONS_CLOSED.labels(b, "idle")

    def connection_refused(self, reason: str) -> None:
        CONNECTIONS_REFUSED.labels(self._broker, reason).inc()

    def connection_closed(self, reason: str) -> None:
        CONNECTIONS_CLOSED.labels(self._broker, reason).inc()

    def partition_opened(self, seconds: float) -> None:
        PARTITION_OPEN_SECONDS.labels(self._broker).observe(seconds)

    def watch_tls(self, listeners: Mapping[str, TlsListenerState]) -> None:
        """The expiry of each TLS listener's certificate (by listener name), read at each
        scrape."""
        for name, state in listeners.items():
            TLS_CERTIFICATE_EXPIRY.labels(self._broker, name).set_function(_expiry_of(state))
            for result in ("ok", "failed"):
                TLS_CERTIFICATE_RELOADS.labels(self._broker, name, result)  # present at 0

    def tls_reload(self, listener: str, ok: bool) -> None:
        TLS_CERTIFICATE_RELOADS.labels(self._broker, listener, "ok" if ok else "failed").inc()


TLS_CERTIFICATE_EXPIRY = Gauge(
    "tidalmq_tls_certificate_expiry_timestamp_seconds",
    "When the certificate a TLS listener serves expires (Unix time; renewed files are reloaded "
    "every ssl.reload.interval.ms)",
    ["broker", "listener"],
)
TLS_CERTIFICATE_RELOADS = Counter(
    "tidalmq_tls_certificate_reloads_total",
    "TLS listener certificate reloads after their files changed (result: ok, or failed: the "
    "files could not be loaded and the old certificate is still served)",
    ["broker", "listener", "result"],
)


class TlsListenerState(Protocol):
    @property
    def not_after(self) -> float | None: ...


def _expiry_of(state: TlsListenerState) -> Callable[[], float]:
    """A gauge's reader of a TLS listener's certificate expiry (NaN when unknown)."""
    return lambda: state.not_after if state.not_after is not None else math.nan


def _used_of(budget: MemoryBudget | None) -> Callable[[], float]:
    """A gauge's reader of the bytes `budget` holds (0 without a budget)."""
    if budget is None:
        return lambda: 0
    return lambda: budget.used
