"""Log compaction, Apache Kafka and TidalMQ in the same run: a compacted topic of N keys
written M times each, then how long each system's cleaner takes to compact it and the log's
bytes before and after (DescribeLogDirs, as `kafka-log-dirs` reads it), and the bytes on disk
(Kafka's data directory, all topics; TidalMQ's local object store, garbage not yet swept
included). A consumer from the start then checks that every key is there with its latest
value. The machine's load average is printed with every figure.

    .venv/bin/python bench/compaction.py --keys 10000 --updates 10
    .venv/bin/python bench/compaction.py --keys 5000 --updates 6   # smoke

Both systems get the same topic configs (1 MiB segments, min.cleanable.dirty.ratio 0.01) and
a cleaner that looks every second (Kafka: log.cleaner.backoff.ms; TidalMQ:
TIDALMQ_CLEANER_BACKOFF_MS, and WAL ranges become segments after 1 s idle instead of 60 s).
Neither compacts its active part, but they bound it differently: Kafka's active segment is
rolled only by a new record, so its updates stay; TidalMQ's last segment leaves the active part
once older than segment.ms (2 s here) with no new record, and is compacted too.

The log's size is read after each round of updates. After the first round every key is there
once and nothing can be cleaned yet, so that size is the **one-copy size**: what a fully compacted
log holds, give or take the active part, which neither system compacts. The writes add `--updates`
times that; Kafka's cleaner already works while they go on, so its size at the end of the writes
is smaller than what was written ("peak" is the largest size read between rounds).

"Compacted" is when the log is down to one copy per key (at most the one-copy size plus one
segment, Kafka's active segment, plus 2% for batch layout) and its size then stayed the same for
`--settle` seconds, polled every 0.5 s; the time reported is from the end of the writes to the
last change of size ("total s" adds the writes, for a cleaner that works while they go on). A
size that merely stops changing for a while is not enough: a cleaner works in passes, and a pass
reads (maps) the whole dirty range before it rewrites anything, so at 100,000 keys x 10 the log
stays unchanged for longer than any fixed settle time while the next pass maps
(docs/compaction.md, benchmark). The run fails if the log is not compacted within `--timeout`,
printing the sizes it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tidalmq_broker.admin_client import AdminClient as WireAdmin

from bench.kafka.harness import KafkaCluster
from tests.support.broker_process import BrokerProcess

KAFKA, TIDALMQ = "Apache Kafka", "TidalMQ"
SEGMENT_BYTES = 1 << 20  # Kafka 4's least segment.bytes
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(SEGMENT_BYTES),
    "segment.ms": "2000",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
KAFKA_BROKER_CONFIG = {"log.cleaner.backoff.ms": "1000"}
TIDALMQ_ENV = {
    "TIDALMQ_LOG_LEVEL": "WARNING",
    "TIDALMQ_CLEANER_BACKOFF_MS": "1000",
    "TIDALMQ_COMPACTION_INTERVAL_S": "1",
    "TIDALMQ_COMPACTION_IDLE_S": "1",
}
POLL_S = 0.5


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def du(path: Path) -> int:
    """Bytes allocated on disk under `path` (Kafka preallocates its index files sparse)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


@contextmanager
def kafka_system(workdir: Path) -> Iterator[tuple[str, Callable[[], int]]]:
    cluster = KafkaCluster(brokers=1, dir=workdir / "kafka", broker_config=KAFKA_BROKER_CONFIG)
    cluster.start()
    try:
        (node,) = cluster.broker_nodes
        yield cluster.bootstrap, lambda: du(node.data_dir)
    finally:
        cluster.stop()


@contextmanager
def tidalmq_system(workdir: Path) -> Iterator[tuple[str, Callable[[], int]]]:
    objects = workdir / "objects"
    broker = BrokerProcess(f"file://{objects}", workdir / "logs", env=TIDALMQ_ENV)
    broker.start(timeout_s=120)
    try:
        yield broker.bootstrap, lambda: du(objects)
    finally:
        broker.stop(timeout_s=60)


def log_size(admin: WireAdmin, topic: str) -> int:
    """The partition's size as the broker reports it (DescribeLogDirs v4, as kafka-log-dirs
    asks; the one broker answers for its own log directories)."""
    response = admin.call(35, 4, {"topics": [{"topic": topic, "partitions": [0]}]})
    return sum(
        p.partition_size
        for r in response.results
        for t in r.topics
        if t.name == topic
        for p in t.partitions
    )


def compacted_size(one_copy: int) -> int:
    """The most a log of one record per key can hold, `one_copy` being its size with each key
    written once: plus the active segment that neither system compacts (Kafka's holds up to
    segment.bytes of updates) and 2% for batches laid out differently."""
    return one_copy + SEGMENT_BYTES + one_copy // 50


def produce(
    bootstrap: str,
    topic: str,
    keys: int,
    updates: int,
    value_bytes: int,
    size: Callable[[], int],
) -> tuple[float, list[int]]:
    """Write `updates` rounds of one record per key; the seconds taken and the log's size
    after each round (read while the next is not yet written)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    failed: list[str] = []

    def done(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    pad = b"x" * max(0, value_bytes - 12)
    sizes: list[int] = []
    started = time.monotonic()
    for round_ in range(updates):
        for k in range(keys):
            producer.produce(
                topic, key=b"key-%08d" % k, value=b"v%06d-" % round_ + pad, on_delivery=done
            )
            producer.poll(0)
        producer.flush(60)
        sizes.append(size())
    if producer.flush(60) != 0 or failed:
        raise RuntimeError(f"produce failed: {failed[:3]}")
    return time.monotonic() - started, sizes


def read_latest(bootstrap: str, topic: str, end: int) -> tuple[int, dict[bytes, bytes]]:
    """Records read from the start up to `end`, and the last value seen per key."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    count, latest = 0, {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            count += 1
            latest[msg.key()] = msg.value()
            if msg.offset() + 1 >= end:
                break
    finally:
        consumer.close()
    return count, latest


def measure(
    system: str, bootstrap: str, disk: Callable[[], int], args: argparse.Namespace
) -> dict[str, Any]:
    topic = f"compaction-{int(time.time())}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=TOPIC_CONFIGS)])[topic].result(30)
    kadmin = WireAdmin(bootstrap)
    try:
        log(f"{system}: writing {args.keys} keys x {args.updates} updates (load {load()})")
        produce_s, round_sizes = produce(
            bootstrap,
            topic,
            args.keys,
            args.updates,
            args.value_bytes,
            lambda: log_size(kadmin, topic),
        )
        written_at = time.monotonic()
        records = args.keys * args.updates
        before, disk_before = log_size(kadmin, topic), disk()
        one_copy = round_sizes[0]
        compacted = compacted_size(one_copy)
        log(
            f"{system}: wrote {records} records in {produce_s:.1f} s; log {before:,} bytes "
            f"(one copy per key {one_copy:,}, so about {one_copy * args.updates:,} written; "
            f"peak {max(round_sizes):,}); compacted at <= {compacted:,}"
        )
        log(f"{system}: log bytes after each round: {', '.join(f'{n:,}' for n in round_sizes)}")
        size, changed_at = before, written_at
        seen = [(0.0, before)]
        deadline = written_at + args.timeout
        while True:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{system}: not compacted to <= {compacted:,} bytes within {args.timeout} s;"
                    f" sizes seen (s after the writes, bytes): {seen}"
                )
            time.sleep(POLL_S)
            now_size = log_size(kadmin, topic)
            if now_size != size:
                size, changed_at = now_size, time.monotonic()
                seen.append((round(changed_at - written_at, 1), size))
            elif size <= compacted and time.monotonic() - changed_at >= args.settle:
                break
        compact_s = changed_at - written_at
        end = records
        count, latest = read_latest(bootstrap, topic, end)
        want = {b"key-%08d" % k for k in range(args.keys)}
        last = b"v%06d-" % (args.updates - 1)
        if set(latest) != want or any(not v.startswith(last) for v in latest.values()):
            raise RuntimeError(f"{system}: a key is missing or not at its latest value")
        result = {
            "system": system,
            "keys": args.keys,
            "updates": args.updates,
            "records_written": records,
            "produce_s": round(produce_s, 2),
            "compact_s": round(compact_s, 2),
            "writes_to_compacted_s": round(produce_s + compact_s, 2),
            "log_bytes_one_copy": one_copy,
            "log_bytes_written": one_copy * args.updates,
            "log_bytes_peak": max(round_sizes),
            "log_bytes_by_round": round_sizes,
            "log_bytes_before": before,
            "log_bytes_after": size,
            "disk_bytes_before": disk_before,
            "disk_bytes_after": disk(),
            "records_read_after": count,
            "size_changes": seen,
            "load_after": load(),
        }
        log(
            f"{system}: compacted in {compact_s:.1f} s: log {before:,} -> {size:,} bytes "
            f"({size / before:.1%}), {count} records read from the start (load {load()})"
        )
        return result
    finally:
        kadmin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--systems", default="kafka,tidalmq")
    parser.add_argument("--settle", type=float, default=5.0, help="s of unchanged size")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    one_copy = args.keys * (args.value_bytes + 20)  # about: 118 bytes a record at 100
    if args.updates * one_copy - compacted_size(one_copy) < SEGMENT_BYTES:
        # a log that small is "compacted" before any cleaning (Kafka's active segment alone
        # could hold it all)
        parser.error(
            f"write at least one segment ({SEGMENT_BYTES:,} bytes) more than a compacted log "
            "holds: more keys or updates"
        )

    systems = {"kafka": (KAFKA, kafka_system), "tidalmq": (TIDALMQ, tidalmq_system)}
    load_before = load()
    log(f"load before {load_before} on {os.cpu_count()} cores")
    results = []
    for key in args.systems.split(","):
        name, start = systems[key]
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-compaction-{key}-"))
        try:
            with start(workdir) as (bootstrap, disk):
                results.append(measure(name, bootstrap, disk, args))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\n{'system':<14}{'records':>10}{'one copy':>12}{'written':>14}{'peak':>14}"
        f"{'end writes':>14}{'compact s':>11}{'total s':>9}{'log after':>12}{'disk before':>14}"
        f"{'disk after':>12}{'read after':>12}  load after"
    )
    for r in results:
        print(
            f"{r['system']:<14}{r['records_written']:>10}{r['log_bytes_one_copy']:>12,}"
            f"{r['log_bytes_written']:>14,}{r['log_bytes_peak']:>14,}"
            f"{r['log_bytes_before']:>14,}{r['compact_s']:>11}{r['writes_to_compacted_s']:>9}"
            f"{r['log_bytes_after']:>12,}"
            f"{r['disk_bytes_before']:>14,}{r['disk_bytes_after']:>12,}"
            f"{r['records_read_after']:>12}  {r['load_after']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"load_before": load_before, "results": results}, indent=2))


if __name__ == "__main__":
    main()
