"""WAL flushes and their CPU per produce request at a given request rate, in one process.

Drives the WAL writer (storage/wal_writer.py) on a local-directory object store the way a Java
producer's produce requests do: every request is one append of `--append-bytes` per partition
(`--partitions`), requests arrive at `--rate` a second, and at most `--in-flight` requests are
waiting for their flush at once (the producer's max.in.flight.requests.per.connection, 5). It
prints the flushes per request (what the writer's flush window decides; the machine's load
barely moves it), the process's CPU per request (every thread, user + system: the flushes'
files and fsyncs included), and the appends' latency (enqueue to durable).

Rounds of the checkouts given alternate, each in a fresh process, so that a loaded machine
weighs on all of them alike; each round's figures and the median per checkout are printed with
the load average.

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python bench/wal_flush_rate.py --source /tmp/before --source . --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


async def _round(
    requests: int,
    rate: float,
    partitions: int,
    size: int,
    in_flight: int,
    flush_interval_ms: float,
) -> dict[str, float]:
    from tidalmq_broker.storage.api import StorageConfig
    from tidalmq_broker.storage.objectstore import LocalDirObjectStore
    from tidalmq_broker.storage.wal_writer import Flush, PendingAppend, WalWriter
    from tidalmq_core.model import TopicPartition

    class Source:
        def __init__(self, n: int) -> None:
            self.tp = TopicPartition("t", n)
            self.topic_id = "id"
            self.leader_epoch = 0

    def complete(flush: Flush[Source]) -> None:
        for a in flush.appends:
            if a.future is not None and not a.future.done():
                a.future.set_result(None)

    with tempfile.TemporaryDirectory(prefix="wal-flush-rate-") as tmp:
        store = LocalDirObjectStore(tmp)
        config = StorageConfig(flush_interval_ms=flush_interval_ms)
        writer: WalWriter[Source] = WalWriter(store, "1", "inc", config, complete)
        loop = asyncio.get_running_loop()
        sources = [Source(n) for n in range(partitions)]
        offsets = [0] * partitions
        latencies: list[float] = []
        slots = asyncio.Semaphore(in_flight)

        async def request() -> None:
            started = time.perf_counter()
            futures = []
            for n, p in enumerate(sources):
                fut: asyncio.Future[None] = loop.create_future()
                writer.enqueue(
                    PendingAppend(p, bytearray(size), offsets[n], offsets[n], 0, [], fut)
                )
                offsets[n] += 1
                futures.append(fut)
            await asyncio.gather(*futures)
            latencies.append(time.perf_counter() - started)
            slots.release()

        for _ in range(50):  # warm-up: the store's directories, the code
            await slots.acquire()
            await request()
        puts_before = writer.completed_seq
        cpu0, wall0 = os.times(), time.perf_counter()
        latencies.clear()
        tasks = []
        for i in range(requests):
            await slots.acquire()
            delay = wall0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(request()))
        await asyncio.gather(*tasks)
        cpu1, wall1 = os.times(), time.perf_counter()
        flushes = writer.completed_seq - puts_before
        await writer.wait_idle()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        latencies.sort()
        return {
            "flushes_per_request": flushes / requests,
            "cpu_us": cpu / requests * 1e6,
            "system_us": (cpu1.system - cpu0.system) / requests * 1e6,
            "rate": requests / (wall1 - wall0),
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, action="append", help="a checkout (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=3000, help="per round")
    ap.add_argument("--rate", type=float, default=600.0, help="requests a second")
    ap.add_argument("--partitions", type=int, default=4, help="appends per request")
    ap.add_argument("--append-bytes", type=int, default=15_500, help="one batch of 15 x 1 KiB")
    ap.add_argument("--in-flight", type=int, default=5, help="requests waiting at once")
    ap.add_argument(
        "--flush-interval-ms", type=float, default=5.0, help="W (the broker's default: 5)"
    )
    ap.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.round:
        figures = asyncio.run(
            _round(
                args.requests,
                args.rate,
                args.partitions,
                args.append_bytes,
                args.in_flight,
                args.flush_interval_ms,
            )
        )
        print(json.dumps(figures))
        return 0
    sources = args.source or [HERE]
    results: dict[Path, list[dict[str, float]]] = {s: [] for s in sources}
    for r in range(args.rounds):
        for source in sources:
            env = {**os.environ, "PYTHONPATH": str(source.resolve() / "broker_image" / "src")}
            cmd = [sys.executable, __file__, "--round", "--requests", str(args.requests)]
            cmd += ["--rate", str(args.rate), "--partitions", str(args.partitions)]
            cmd += ["--append-bytes", str(args.append_bytes), "--in-flight", str(args.in_flight)]
            cmd += ["--flush-interval-ms", str(args.flush_interval_ms)]
            load = os.getloadavg()[0]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            f = json.loads(out.stdout.strip().splitlines()[-1])
            results[source].append(f)
            print(
                f"round {r + 1} {source}: {f['flushes_per_request']:.3f} flushes/request, "
                f"{f['cpu_us']:.0f} us CPU/request ({f['system_us']:.0f} system), "
                f"{f['rate']:.0f} requests/s, p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms "
                f"(load {load:.2f})",
                flush=True,
            )
    for source, rounds in results.items():

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(f[key] for f in rounds)

        print(
            f"{source}: median {med('flushes_per_request'):.3f} flushes/request, "
            f"{med('cpu_us'):.0f} us CPU/request ({med('system_us'):.0f} system), "
            f"{med('rate'):.0f} requests/s, p50 {med('p50_ms'):.1f} ms, p99 {med('p99_ms'):.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
