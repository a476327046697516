"""Prometheus metrics of the storage engine (default registry, one set per process).

Every series carries the broker id, so several engines in one process (tests, the embedded
local cluster) stay apart.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SIZE_BUCKETS = (1024, 16 * 1024, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

OBJECT_REQUESTS = Counter(
    "tidalmq_storage_object_requests_total",
    "Object-store requests by operation and outcome (ok, not_found, precondition_failed, error)",
    ["broker", "op", "outcome"],
)
OBJECT_BYTES = Counter(
    "tidalmq_storage_object_bytes_total",
    "Bytes moved to (put) and from (get) the object store",
    ["broker", "op"],
)
OBJECT_LATENCY = Histogram(
    "tidalmq_storage_object_request_seconds",
    "Object-store request latency by operation",
    ["broker", "op"],
    buckets=_LATENCY_BUCKETS,
)
WAL_FLUSHES = Counter(
    "tidalmq_storage_wal_flushes_total", "WAL objects written, by outcome", ["broker", "outcome"]
)
WAL_FLUSH_BYTES = Histogram(
    "tidalmq_storage_wal_flush_bytes",
    "Size of WAL objects",
    ["broker"],
    buckets=_SIZE_BUCKETS,
)
WAL_FLUSH_SECONDS = Histogram(
    "tidalmq_storage_wal_flush_seconds",
    "Time from the flush decision until the WAL object is durable",
    ["broker"],
    buckets=_LATENCY_BUCKETS,
)
APPEND_BYTES = Counter(
    "tidalmq_storage_append_bytes_total", "Record batch bytes appended", ["broker"]
)
APPEND_FAILURES = Counter(
    "tidalmq_storage_append_failures_total",
    "Appends that failed, by reason",
    ["broker", "reason"],
)
DUPLICATE_BATCHES = Counter(
    "tidalmq_produce_duplicate_batches_total",
    "Idempotent producers' retries of batches already appended: answered with the original "
    "offsets, not written again",
    ["broker"],
)
CACHE_HIT_BYTES = Counter(
    "tidalmq_storage_cache_hit_bytes_total", "Bytes read from the tail cache", ["broker"]
)
CACHE_MISS_BYTES = Counter(
    "tidalmq_storage_cache_miss_bytes_total",
    "Bytes read from the object store because the cache did not hold them",
    ["broker"],
)
CACHE_BYTES = Gauge("tidalmq_storage_cache_bytes", "Bytes held by the tail cache", ["broker"])
CHECKPOINTS = Counter(
    "tidalmq_storage_checkpoints_total",
    "Partition checkpoints written, by outcome",
    ["broker", "outcome"],
)
COMPACTIONS = Counter(
    "tidalmq_storage_compactions_total", "Compaction runs by outcome", ["broker", "outcome"]
)
COMPACTED_BYTES = Counter(
    "tidalmq_storage_compacted_bytes_total", "Bytes copied into segments", ["broker"]
)
RETENTION_SEGMENTS = Counter(
    "tidalmq_storage_retention_deleted_segments_total",
    "Segments deleted by retention or DeleteRecords",
    ["broker"],
)
GARBAGE_DELETED = Counter(
    "tidalmq_storage_garbage_deleted_objects_total",
    "Unreferenced objects deleted, by kind (wal, segment) and path (refcount, sweep)",
    ["broker", "kind", "path"],
)
OPEN_PARTITIONS = Gauge(
    "tidalmq_storage_open_partitions", "Partitions open on this broker", ["broker"]
)
STORE_LOST = Gauge(
    "tidalmq_store_lost",
    "1 while the object store's identity marker is missing or names another cluster (nothing "
    "is served), else 0",
    ["broker"],
)
STORE_UNWRITABLE = Gauge(
    "tidalmq_storage_store_unwritable",
    "1 while the object store does not take this broker's writes (the last PUT failed or timed "
    "out; appends are refused with KAFKA_STORAGE_ERROR and /readyz answers 503), else 0",
    ["broker"],
)
RECOVERIES = Counter(
    "tidalmq_storage_partition_opens_total",
    "Partition opens by kind (new, clean, unclean)",
    ["broker", "kind"],
)


class BrokerMetrics:
    """The label children the hot paths use, resolved once per engine (labels() is slow)."""

    def __init__(self, broker: str) -> None:
        self.duplicate_batches = DUPLICATE_BATCHES.labels(broker)
        self.cache_hit_bytes = CACHE_HIT_BYTES.labels(broker)
        self.cache_miss_bytes = CACHE_MISS_BYTES.labels(broker)


# the log cleaner of compacted topics (docs/compaction.md section 8)
CLEANER_PASSES = Counter(
    "tidalmq_storage_cleaner_passes_total",
    "Log cleaner passes by outcome (ok, partial: the key map filled, raced, idle: nothing to "
    "rewrite, uncleanable, failed)",
    ["broker", "outcome"],
)
CLEANER_BYTES = Counter(
    "tidalmq_storage_cleaner_bytes_total",
    "Object-store bytes the log cleaner read (read) and wrote (written)",
    ["broker", "phase"],
)
CLEANER_RECORDS = Counter(
    "tidalmq_storage_cleaner_records_total",
    "Records the log cleaner read, by what it did with them (kept, superseded, "
    "tombstone_expired, aborted, keyless, marker_removed)",
    ["broker", "action"],
)
CLEANER_GROUPS_SKIPPED = Counter(
    "tidalmq_storage_cleaner_groups_skipped_total",
    "Segment groups the log cleaner left as they were (nothing in them changed: no PUT)",
    ["broker"],
)
CLEANER_PASS_SECONDS = Histogram(
    "tidalmq_storage_cleaner_pass_seconds",
    "Duration of log cleaner passes",
    ["broker"],
    buckets=(0.01, 0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0),
)
CLEANER_MAX_DIRTY_RATIO = Gauge(
    "tidalmq_storage_cleaner_max_dirty_ratio",
    "The highest cleanable dirty ratio among this broker's compacted partitions at the last "
    "round (Kafka's max-dirty-percent, as a fraction)",
    ["broker"],
)
CLEANER_CLEANABLE_PARTITIONS = Gauge(
    "tidalmq_storage_cleaner_cleanable_partitions",
    "Compacted partitions the last cleaner round chose",
    ["broker"],
)
CLEANER_UNCLEANABLE_PARTITIONS = Gauge(
    "tidalmq_storage_cleaner_uncleanable_partitions",
    "Partitions left uncleaned until reopened: a batch the cleaner cannot parse",
    ["broker"],
)
