"""PUTs and GETs to an S3 store: direct (s3_http.py) against botocore's client, on MinIO.

Two measurements, each alternating the two paths so that both see the same machine:

- `--store`: one process, `S3ObjectStore.put` / `get` in a loop (PUTs of a 2 KB header and a
  body, then range GETs), latency p50 / p99 and the process's CPU per request;
- `--producer`: one TidalMQ broker on MinIO (`s3://...&direct=false` for botocore's client)
  under Kafka's Java producer flat out (`kafka-producer-perf-test`, 1 KiB records, acks=all,
  6 partitions; `--rate` for a fixed rate instead), its MiB/s and latency, and the broker's WAL
  flushes and PUTs: the share under 10 ms, 25 ms and 100 ms.

    .venv/bin/python bench/s3_requests.py --store --body-kb 100 --requests 300 --pairs 2
    .venv/bin/python bench/s3_requests.py --producer --records 300000 --pairs 3
    .venv/bin/python bench/s3_requests.py --producer --rate 2000 --records 60000 --pairs 2

The machine's load is printed with every row: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.side_by_side_systems import create_topic, loadavg, percentile, single_broker
from tests.support.s3_server import S3Server, start_s3_server

PATHS = ("client", "direct")


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


async def _store_round(server: S3Server, direct: bool, body: list[bytes], n: int) -> str:
    store = server.make_store()
    if not direct:
        store._http = None
    try:
        lat: list[float] = []
        cpu = time.process_time()
        for i in range(n):
            t = time.perf_counter()
            await store.put(f"put/{i}", body, if_none_match=True)
            lat.append(time.perf_counter() - t)
        put_cpu = (time.process_time() - cpu) / n * 1000
        get_lat: list[float] = []
        cpu = time.process_time()
        for i in range(n):
            t = time.perf_counter()
            await store.get(f"put/{i}", 1000, len(body[0]) + len(body[1]) // 2)
            get_lat.append(time.perf_counter() - t)
        get_cpu = (time.process_time() - cpu) / n * 1000
        return (
            f"PUT p50 {_ms(lat, 50):5.2f} p99 {_ms(lat, 99):6.2f} ms, CPU {put_cpu:.2f} ms | "
            f"GET p50 {_ms(get_lat, 50):5.2f} p99 {_ms(get_lat, 99):6.2f} ms, "
            f"CPU {get_cpu:.2f} ms"
        )
    finally:
        await store.close()


def store_rounds(args: argparse.Namespace) -> None:
    server = start_s3_server("minio")
    body = [os.urandom(2000), os.urandom(args.body_kb * 1000)]
    try:
        for _ in range(args.pairs):
            for path in PATHS:
                load = loadavg()
                row = asyncio.run(_store_round(server, path == "direct", body, args.requests))
                print(f"{path:7s} {row}   load {load}", flush=True)
    finally:
        server.stop()


def _shares_under(before: str, after: str, series: str, label: str = "") -> str:
    """The share of a histogram's observations between two scrapes under 10, 25 and 100 ms."""

    def buckets(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(series) and label in line and 'le="' in line:
                le = line.split('le="', 1)[1].split('"', 1)[0]
                out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    b0, b1 = buckets(before), buckets(after)
    total = b1.get("+Inf", 0.0) - b0.get("+Inf", 0.0)
    if not total:
        return "n/a"
    shares = [(b1.get(le, 0.0) - b0.get(le, 0.0)) / total for le in ("0.01", "0.025", "0.1")]
    return f"{int(total)}: " + " / ".join(f"{share:.1%}" for share in shares)


def producer_rounds(args: argparse.Namespace) -> None:
    import tests.support.s3_server as s3_server
    from bench.kafka.harness import producer_perf_test

    plain_url = s3_server.S3Server.url
    for _ in range(args.pairs):
        for path in PATHS:
            options = "" if path == "direct" else "&direct=false"

            def url(self: Any, prefix: str = "", options: str = options) -> str:
                return plain_url(self, prefix) + options

            s3_server.S3Server.url = url  # type: ignore[method-assign]
            work = Path(args.workdir) / uuid.uuid4().hex[:8]
            with single_broker("tidalmq", work, "minio") as system:
                create_topic(system.bootstrap, "warm", 6)
                producer_perf_test(system.bootstrap, "warm", num_records=20_000)
                topic = f"flat-{uuid.uuid4().hex[:6]}"
                create_topic(system.bootstrap, topic, 6)
                load = loadavg()
                broker: Any = system.broker  # type: ignore[attr-defined]
                before = broker.metrics()
                result, _ = producer_perf_test(
                    system.bootstrap, topic, num_records=args.records, throughput=args.rate
                )
                after = broker.metrics()
            flushes = _shares_under(before, after, "tidalmq_storage_wal_flush_seconds_bucket")
            puts = _shares_under(
                before, after, "tidalmq_storage_object_request_seconds_bucket", 'op="put"'
            )
            print(
                f"{path:7s} {result.mb_per_sec:6.2f} MiB/s, latency p50 {result.p50_ms:.0f} "
                f"p99 {result.p99_ms:.0f} ms; under 10 / 25 / 100 ms: WAL flushes {flushes}, "
                f"PUTs {puts}   load {load} -> {loadavg()}",
                flush=True,
            )
    s3_server.S3Server.url = plain_url  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", action="store_true", help="the store's requests in one process")
    ap.add_argument("--producer", action="store_true", help="a broker under the Java producer")
    ap.add_argument("--body-kb", type=int, default=100)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--rate", type=int, default=-1, help="records/s (-1: flat out)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/tidalmq-s3-requests")
    args = ap.parse_args()
    if not (args.store or args.producer):
        ap.error("say --store, --producer or both")
    if args.store:
        store_rounds(args)
    if args.producer:
        producer_rounds(args)


if __name__ == "__main__":
    main()
