"""Benchmark: how long a partition is unavailable while it moves, by partition size, and how
fast a 300-partition cluster rebalances onto a new broker.

    .venv/bin/python bench/partition_moves.py                 # 1 MiB, 100 MiB, 1 GiB; 20 moves each
    .venv/bin/python bench/partition_moves.py --sizes 1,100 --moves 30 --storage s3

For each size, one partition is filled to that size, then moved back and forth between two
brokers while a producer keeps writing to it (acks=all, one record every 2 ms). The figure per
move is the client-visible unavailability: the longest a record produced during the move waited
for its acknowledgement (a record sent just after the source stopped appending waits until the
new broker acknowledges it, so this is the time from the move's start to the first acknowledged
produce on the new broker, measured conservatively on the client's clock). The producer's normal
latency is printed beside it. Prints p50/p99/max per size and writes bench/RESULTS-moves.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess

RECORD = 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def fill(bootstrap: str, topic: str, size_bytes: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 10,
                  "batch.size": 1 << 20, "compression.type": "none"})  # fmt: skip
    payload = os.urandom(RECORD)
    started = time.monotonic()
    n = size_bytes // RECORD
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=payload, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(600) == 0
    return time.monotonic() - started


class TrickleProducer:
    """One record every `interval` seconds; remembers (produced, acknowledged) times."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.002) -> None:
        self.records: list[tuple[float, float]] = []
        self.errors = 0
        self._p = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
            "enable.idempotence": True, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
            "topic.metadata.refresh.fast.interval.ms": 10, "message.timeout.ms": 60000,
        })  # fmt: skip
        self._topic = topic
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            produced = time.time()

            def on_delivery(err: Any, msg: Any, produced: float = produced) -> None:
                if err is not None:
                    self.errors += 1
                    return
                with self._lock:
                    self.records.append((produced, time.time()))

            self._p.produce(self._topic, value=b"x" * 100, partition=0, on_delivery=on_delivery)
            self._p.poll(self._interval)
        self._p.flush(60)

    def start(self) -> TrickleProducer:
        self._thread.start()
        return self

    def worst_wait(self, start: float, end: float) -> float | None:
        """Longest produce→ack wait of the records produced in [start, end]."""
        with self._lock:
            waits = [
                acked - produced for produced, acked in self.records if start <= produced <= end
            ]
        return max(waits) if waits else None

    def typical_waits(self) -> list[float]:
        with self._lock:
            return [acked - produced for produced, acked in self.records]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def measure_moves(
    cluster: LocalClusterProcess, topic: str, moves: int
) -> tuple[list[float], list[float]]:
    trickle = TrickleProducer(cluster.bootstrap, topic).start()
    time.sleep(1.0)
    results: list[float] = []
    quiet: list[float] = []
    try:
        for _ in range(moves):
            source = cluster.leaders(topic)[0]
            target = 1 if source == 0 else 0
            started = time.time()
            cluster.reassign({(topic, 0): target})
            deadline = time.monotonic() + 30
            opened = None
            while time.monotonic() < deadline and opened is None:
                for m in reversed(cluster.moves()["recent"]):
                    if m["topic"] == topic and m["started"] >= started - 1 and m["opened"]:
                        opened = m["opened"]
                        break
                else:
                    time.sleep(0.01)
            if opened is None:
                raise TimeoutError("move did not complete")
            time.sleep(1.0)  # let every record produced during the move be acknowledged
            worst = trickle.worst_wait(started, opened)
            if worst is None:
                raise RuntimeError("no record was produced during the move")
            results.append(worst)
            quiet_start = time.time()
            time.sleep(0.5)
            q = trickle.worst_wait(quiet_start, time.time() - 0.2)
            if q is not None:
                quiet.append(q)
    finally:
        trickle.stop()
    if trickle.errors:
        raise RuntimeError(f"{trickle.errors} records failed")
    return results, quiet


def rebalance_onto_new_broker(cluster: LocalClusterProcess, partitions: int) -> dict[str, float]:
    topic = f"wide-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(120)
    cluster.wait_settled(120)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(partitions * 20):
        p.produce(topic, value=b"v" * 200, partition=i % partitions)
    p.flush(120)
    started = time.time()
    new = cluster.add_broker()
    registered = time.time()
    cluster.wait_settled(120)
    done = time.time()
    moved = [
        m for m in cluster.moves()["recent"] if m["started"] >= started - 0.5 and m["target"] == new
    ]
    last_open = max((m["opened"] or 0) for m in moved) if moved else done
    unavail = [m["unavailable_s"] for m in moved if m["unavailable_s"] is not None]
    return {
        "partitions": partitions, "moved": len(moved),
        "register_s": registered - started, "all_serving_s": last_open - registered,
        "move_p50_s": statistics.median(unavail) if unavail else float("nan"),
        "move_p99_s": percentile(unavail, 99),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1,100,1024", help="partition sizes in MiB")
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--storage", choices=["local", "s3"], default="local")
    ap.add_argument("--rebalance-partitions", type=int, default=300)
    ap.add_argument("--out", default=str(Path(__file__).parent / "RESULTS-moves.md"))
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tidalmq-moves-"))
    storage_url, env, s3 = "", {}, None
    if args.storage == "s3":
        from tests.support.s3_server import start_s3_server

        s3 = start_s3_server()
        storage_url, env = s3.url(prefix="moves"), s3.env()
    cluster = LocalClusterProcess(workdir / "cluster", brokers=3, storage_url=storage_url,
                                  env={**env, "TIDALMQ_LOG_LEVEL": "WARNING"})  # fmt: skip
    cluster.start()
    rows = []
    try:
        for size_mib in [int(s) for s in args.sizes.split(",")]:
            topic = f"moves-{size_mib}m-{uuid.uuid4().hex[:4]}"
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
            cluster.wait_settled(60)
            if cluster.leaders(topic)[0] not in (0, 1):
                cluster.reassign({(topic, 0): 0})
                cluster.wait_settled(60)
            fill_s = fill(cluster.bootstrap, topic, size_mib * 1024 * 1024)
            print(f"{size_mib} MiB filled in {fill_s:.1f}s", flush=True)
            times, quiet = measure_moves(cluster, topic, args.moves)
            row = {
                "size": f"{size_mib} MiB", "moves": len(times),
                "p50": statistics.median(times), "p99": percentile(times, 99), "max": max(times),
                "quiet": max(quiet) if quiet else float("nan"),
            }  # fmt: skip
            rows.append(row)
            print(f"{row['size']:>9}: moves {row['moves']}, unavailable p50 {row['p50'] * 1000:.0f} ms, "
                  f"p99 {row['p99'] * 1000:.0f} ms, max {row['max'] * 1000:.0f} ms "
                  f"(worst wait between moves {row['quiet'] * 1000:.0f} ms)", flush=True)  # fmt: skip
        reb = rebalance_onto_new_broker(cluster, args.rebalance_partitions)
        print(f"rebalance: {reb['moved']} of {reb['partitions']} partitions onto a new broker; "
              f"all serving {reb['all_serving_s']:.2f}s after it registered "
              f"(per-move p50 {reb['move_p50_s'] * 1000:.0f} ms, p99 {reb['move_p99_s'] * 1000:.0f} ms)",
              flush=True)  # fmt: skip
    finally:
        cluster.stop()
        if s3 is not None:
            s3.stop()
    load = os.getloadavg()
    lines = [
        "# Partition move benchmark",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores; load average {load[0]:.1f}/{load[1]:.1f}; storage: {args.storage}.",
        "",
        f"Command: `.venv/bin/python bench/partition_moves.py --sizes {args.sizes} --moves {args.moves} --storage {args.storage}`",
        "",
        "Client-visible unavailability per move (request → first ack from the new broker), "
        "3 brokers, a producer writing every 2 ms:",
        "",
        "| partition size | moves | p50 | p99 | max | worst wait between moves |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {r['size']} | {r['moves']} | {r['p50'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms | {r['max'] * 1000:.0f} ms | {r['quiet'] * 1000:.0f} ms |" for r in rows],
        "",
        f"Rebalance onto a 4th broker: {reb['partitions']} partitions, {reb['moved']} moved; all serving "
        f"{reb['all_serving_s']:.2f} s after the broker registered (per-move p50 "
        f"{reb['move_p50_s'] * 1000:.0f} ms, p99 {reb['move_p99_s'] * 1000:.0f} ms).",
        "",
    ]  # fmt: skip
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
