"""Benchmark of the storage engine alone (no Kafka protocol): produce, cache reads, cold reads.

    .venv/bin/python bench/storage_engine.py                       # local store and S3 server
    .venv/bin/python bench/storage_engine.py --backend localdir --mb 1024 --partitions 32

Appends real v2 batches of 1 KiB records (built once with protocol.records.build_batch and reused:
the broker treats batches as opaque bytes) to N partitions with acks=all semantics (each append
returns once its WAL object is durable), then reads everything back from the tail cache, then
compacts, opens the partitions on a second engine with no cache and reads them cold.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidalmq_broker.protocol.records import build_batch
from tidalmq_broker.storage.api import PartitionConfig, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_core.model import TopicPartition

from tests.support.storage_helpers import CountingStore


@dataclasses.dataclass
class Figures:
    backend: str
    produce_mb_s: float = 0.0
    puts_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cache_read_mb_s: float = 0.0
    cold_read_mb_s: float = 0.0
    cold_gets: int = 0
    max_rss_mb: float = 0.0


async def run(backend: str, make_store, args: argparse.Namespace) -> Figures:  # type: ignore[no-untyped-def]
    figures = Figures(backend)
    record = os.urandom(args.record_size)
    batch = build_batch(
        [(None, record)] * args.records_per_batch, timestamp_ms=int(time.time() * 1000)
    )
    total_bytes = args.mb * 1024 * 1024
    n_batches = max(1, total_bytes // len(batch))
    config = StorageConfig(
        flush_interval_ms=args.flush_interval_ms,
        flush_bytes=args.flush_bytes,
        max_inflight_flushes=args.max_inflight,
        cache_bytes=total_bytes + (64 << 20),
        checkpoint_interval_s=5,
        compaction_interval_s=3600,
        retention_check_interval_s=3600,
        garbage_sweep_interval_s=3600,
    )
    store = CountingStore(make_store())
    engine = ObjectStreamEngine(store, 1, config)
    await engine.start()
    tps = [TopicPartition("bench", i) for i in range(args.partitions)]
    logs = [await engine.open_partition(tp, "bench-topic", 1, PartitionConfig()) for tp in tps]
    latencies: list[float] = []
    per_worker = n_batches // (args.partitions * args.inflight_per_partition) or 1

    async def producer(log) -> None:  # type: ignore[no-untyped-def]
        for _ in range(per_worker):
            started = time.perf_counter()
            await log.append(batch)
            latencies.append(time.perf_counter() - started)

    puts_before = store.wal_puts()
    started = time.perf_counter()
    await asyncio.gather(
        *(producer(log) for log in logs for _ in range(args.inflight_per_partition))
    )
    elapsed = time.perf_counter() - started
    written = len(latencies) * len(batch)
    figures.produce_mb_s = written / elapsed / 1e6
    figures.puts_per_s = (store.wal_puts() - puts_before) / elapsed
    latencies.sort()
    figures.p50_ms = statistics.median(latencies) * 1000
    figures.p99_ms = latencies[int(len(latencies) * 0.99) - 1] * 1000

    async def read_all(log, fetch_bytes: int) -> int:  # type: ignore[no-untyped-def]
        offset, n = 0, 0
        while offset < log.high_watermark:
            result = await log.read(offset, fetch_bytes)
            n += len(result.records)
            # the last batch of the result tells where to go on (per batch, not per record)
            from tidalmq_broker.protocol.records import iter_headers

            last = None
            for h in iter_headers(result.records):
                last = h
            assert last is not None
            offset = last.last_offset + 1
        return n

    started = time.perf_counter()
    read = sum(await asyncio.gather(*(read_all(log, args.fetch_bytes) for log in logs)))
    figures.cache_read_mb_s = read / (time.perf_counter() - started) / 1e6

    for log in logs:
        await engine.compact_partition(log, force=True)
    await engine.stop()

    cold_store = CountingStore(make_store())
    cold = ObjectStreamEngine(cold_store, 2, dataclasses.replace(config, cache_bytes=0))
    await cold.start()
    cold_logs = [await cold.open_partition(tp, "bench-topic", 2, PartitionConfig()) for tp in tps]
    cold_store.reset()
    started = time.perf_counter()
    read = sum(await asyncio.gather(*(read_all(log, args.fetch_bytes) for log in cold_logs)))
    figures.cold_read_mb_s = read / (time.perf_counter() - started) / 1e6
    figures.cold_gets = cold_store.ops["get"]
    await cold.stop()
    await store.close()
    await cold_store.close()
    figures.max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["localdir", "s3", "both"], default="both")
    parser.add_argument("--mb", type=int, default=512, help="megabytes to produce per backend")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--records-per-batch", type=int, default=16)
    parser.add_argument("--inflight-per-partition", type=int, default=4)
    parser.add_argument("--flush-interval-ms", type=float, default=10)
    parser.add_argument("--flush-bytes", type=int, default=4 << 20)
    parser.add_argument("--max-inflight", type=int, default=4)
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20)
    parser.add_argument(
        "--s3",
        choices=["minio", "moto"],
        default=None,
        help="S3 server (default: as the tests choose)",
    )
    args = parser.parse_args()

    results: list[Figures] = []
    if args.backend in ("localdir", "both"):
        root = tempfile.mkdtemp(prefix="tidalmq-bench-")
        try:
            results.append(asyncio.run(run("localdir", lambda: LocalDirObjectStore(root), args)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if args.backend in ("s3", "both"):
        from tests.support.s3_server import start_s3_server

        server = start_s3_server(args.s3)
        try:
            prefix = server.unique_prefix("bench")
            results.append(
                asyncio.run(run(f"s3 ({server.kind})", lambda: server.make_store(prefix), args))
            )
        finally:
            server.stop()

    print(
        f"\n{args.mb} MB per backend, {args.partitions} partitions, batches of {args.records_per_batch} x "
        f"{args.record_size} B records, {args.inflight_per_partition} appends in flight per partition, "
        f"flush {args.flush_interval_ms} ms / {args.flush_bytes >> 20} MiB, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    header = f"{'backend':<14}{'produce MB/s':>14}{'PUTs/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'cache rd MB/s':>15}{'cold rd MB/s':>14}{'cold GETs':>11}{'max RSS MB':>12}"
    print(header)
    for f in results:
        print(
            f"{f.backend:<14}{f.produce_mb_s:>14.1f}{f.puts_per_s:>9.1f}{f.p50_ms:>9.2f}{f.p99_ms:>9.2f}"
            f"{f.cache_read_mb_s:>15.1f}{f.cold_read_mb_s:>14.1f}{f.cold_gets:>11}{f.max_rss_mb:>12.0f}"
        )


if __name__ == "__main__":
    main()
