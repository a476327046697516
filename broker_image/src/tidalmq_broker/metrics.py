"""The broker's Prometheus metrics (names follow Prometheus conventions: snake_case, _total,
_seconds, _bytes). Storage metrics live in storage/metrics.py."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from tidalmq_broker.server.listener import RequestObserver

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("tidalmq_requests_total", "Kafka requests handled", ["broker", "api"])
REQUEST_ERRORS = Counter(
    "tidalmq_request_failures_total", "Kafka requests whose handler failed", ["broker", "api"]
)
REQUEST_SECONDS = Histogram(
    "tidalmq_request_seconds", "Kafka request latency", ["broker", "api"], buckets=_LATENCY_BUCKETS
)
REQUEST_BYTES = Counter("tidalmq_request_bytes_total", "Request bytes received", ["broker", "api"])
BYTES_IN = Counter(
    "tidalmq_partition_bytes_in_total", "Record batch bytes appended", ["topic", "partition"]
)
RECORDS_IN = Counter(
    "tidalmq_partition_records_in_total", "Records appended", ["topic", "partition"]
)
BYTES_OUT = Counter(
    "tidalmq_partition_bytes_out_total", "Record batch bytes fetched", ["topic", "partition"]
)
PRODUCE_ERRORS = Counter(
    "tidalmq_produce_errors_total", "Produce partition errors", ["topic", "error"]
)
PARTITIONS_LED = Gauge("tidalmq_partitions_led", "Partitions this broker leads", ["broker"])
CONNECTIONS = Gauge("tidalmq_connections", "Open client connections", ["broker"])
PARTITION_OPEN_SECONDS = Histogram(
    "tidalmq_partition_open_seconds",
    "Time to open a partition (read checkpoint, fence, recover)",
    ["broker"],
    buckets=_LATENCY_BUCKETS,
)


class BrokerMetrics(RequestObserver):
    """Resolves each label set once (labels() takes a lock and hashes the values, several times
    per request otherwise)."""

    def __init__(self, broker_id: int, api_names: dict[int, str]) -> None:
        self._broker = str(broker_id)
        self._api_names = api_names
        self._per_api: dict[int, tuple[Any, Any, Any, Any]] = {}
        self._in: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._out: dict[tuple[str, int], Any] = {}

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

    def produced(self, topic: str, partition: int, size: int, records: int) -> None:
        children = self._in.get((topic, partition))
        if children is None:
            p = str(partition)
            children = (BYTES_IN.labels(topic, p), RECORDS_IN.labels(topic, p))
            self._in[(topic, partition)] = children
        children[0].inc(size)
        children[1].inc(records)

    def fetched(self, topic: str, partition: int, size: int) -> None:
        child = self._out.get((topic, partition))
        if child is None:
            child = self._out[(topic, partition)] = BYTES_OUT.labels(topic, str(partition))
        child.inc(size)

    def produce_errors(self, topic: str, error: str) -> None:
        PRODUCE_ERRORS.labels(topic, error).inc()

    def partitions_led(self, count: int) -> None:
        PARTITIONS_LED.labels(self._broker).set(count)

    def connections(self, count: int) -> None:
        CONNECTIONS.labels(self._broker).set(count)

    def partition_opened(self, seconds: float) -> None:
        PARTITION_OPEN_SECONDS.labels(self._broker).observe(seconds)
