"""Benchmark: static topics - how long a logic queue is unavailable while it is
remapped under load, and how fast a consumer reads across remap boundaries.

    .venv/bin/python bench/static_topic.py                       # local-directory object store
    .venv/bin/python bench/static_topic.py --storage s3 --rounds 4 --mib 32

1. Remap time per logic queue (3 brokers, an 8-queue static topic). A keyed producer loads every
   queue (`--rate` records/s, 1 KiB) while a trickle producer writes one record every 5 ms to
   each queue (acks=all, idempotent). Each logic queue is remapped on its own, `--rounds` times,
   alternating the strict and the available order. Two figures per remap: the controller's
   (request -> the new physical queue is served by its broker) and the client's (the longest a
   trickle record produced to that queue during the remap waited for its acknowledgement).

2. Fetch throughput across remap boundaries. Two logic queues get `--mib` MiB each: queue 0 in
   one physical queue, queue 1 remapped `--boundaries` times while it is written (its data in
   boundaries + 1 physical queues, all but the last read from object storage). A fresh consumer
   reads each from offset 0; the ratio is queue 1's throughput over queue 0's (target >= 80%).
   Brokers run with a small tail cache (`--cache-mib`) so both reads are cold, as for a
   consumer catching up; `--cache-mib 256` measures the hot case instead.

Prints the figures and writes bench/RESULTS-static.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP

from tests.support.local_cluster import LocalClusterProcess

QUEUES = 8
RECORD = 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def call(cluster: LocalClusterProcess, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        cluster.controller_url + path,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {cluster.control_token}",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=300, context=cluster.control_context) as resp:
        doc = json.loads(resp.read())
    if "fault" in doc:
        raise RuntimeError(doc["fault"]["message"])
    return doc["result"]


class Load:
    """Keyed background load plus a per-queue trickle whose acknowledgement waits we keep."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        self.topic = topic
        self.rate = rate
        conf = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "retry.backoff.ms": 10,
            "retry.backoff.max.ms": 50,
            "topic.metadata.refresh.fast.interval.ms": 10,
            "message.timeout.ms": 120000,
        }
        self.bulk = Producer({**conf, "linger.ms": 5})
        self.trickle = Producer({**conf, "linger.ms": 0})
        self.waits: list[tuple[int, float, float]] = []  # (queue, produced, acked)
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._bulk, daemon=True),
            threading.Thread(target=self._trickle, daemon=True),
        ]

    def _bulk(self) -> None:
        payload = os.urandom(RECORD)
        interval = 1.0 / self.rate if self.rate else 0
        n = 0
        next_at = time.monotonic()
        while self.rate and not self._stop.is_set():
            try:
                self.bulk.produce(self.topic, key=b"key-%d" % (n % 1000), value=payload)
                n += 1
            except BufferError:
                self.bulk.poll(0.01)
                continue
            self.bulk.poll(0)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        self.bulk.flush(120)

    def _trickle(self) -> None:
        while not self._stop.is_set():
            for q in range(QUEUES):
                produced = time.time()

                def done(err: Any, msg: Any, q: int = q, produced: float = produced) -> None:
                    if err is not None:
                        self.errors += 1
                        return
                    with self._lock:
                        self.waits.append((q, produced, time.time()))

                self.trickle.produce(self.topic, value=b"t", partition=q, on_delivery=done)
            self.trickle.poll(0.005)
        self.trickle.flush(120)

    def worst_wait(self, queue: int, start: float, end: float) -> float | None:
        with self._lock:
            w = [a - p for q, p, a in self.waits if q == queue and start <= p <= end]
        return max(w) if w else None

    def quiet_waits(self) -> list[float]:
        with self._lock:
            return [a - p for _, p, a in self.waits]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(150)


def remap_times(cluster: LocalClusterProcess, rounds: int, rate: int) -> dict[str, Any]:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    call(cluster, "/v1/static-topics/create", {"name": name, "total_queues": QUEUES})
    load = Load(cluster.bootstrap, name, rate).start()
    time.sleep(3)
    brokers = sorted(b["broker"] for b in cluster.status()["brokers"])
    out: dict[str, dict[str, list[float]]] = {
        m: {"server": [], "client": [], "jump": []} for m in ("strict", "available")
    }
    try:
        for r in range(rounds):
            mode = "strict" if r % 2 == 0 else "available"
            queues = call(cluster, "/v1/static-topics/describe", {"name": name})["queues"]
            for q in queues:
                target = brokers[(brokers.index(q["broker"]) + 1) % len(brokers)]
                started = time.time()
                (rec,) = call(
                    cluster,
                    "/v1/static-topics/remap",
                    {
                        "name": name,
                        "moves": [{"queue": q["queue"], "broker": target, "mode": mode}],
                    },
                )
                if rec["opened_ms"] is None:
                    raise RuntimeError(f"queue {q['queue']} was not served in time: {rec}")
                time.sleep(1.0)  # every trickle record of the remap is acknowledged by now
                worst = load.worst_wait(q["queue"], started, started + rec["opened_ms"] / 1000)
                out[mode]["server"].append(rec["opened_ms"] / 1000)
                if worst is not None:
                    out[mode]["client"].append(worst)
                out[mode]["jump"].append(rec["jump"])
            print(f"round {r + 1}/{rounds} ({mode}): {QUEUES} queues remapped", flush=True)
    finally:
        load.stop()
    if load.errors:
        raise RuntimeError(f"{load.errors} records failed")
    quiet = load.quiet_waits()
    return {
        "name": name,
        "modes": out,
        "quiet_p50": statistics.median(quiet),
        "quiet_p99": percentile(quiet, 99),
    }


def fill(bootstrap: str, topic: str, queue: int, n: int) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 10,
            "batch.size": 1 << 20,
            "enable.idempotence": True,
        }
    )
    payload = os.urandom(RECORD)
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=payload, partition=queue)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(600) == 0


def read_all(bootstrap: str, topic: str, queue: int, expected: int) -> tuple[float, int]:
    """Seconds to read `expected` records of one logic queue from offset 0, and bytes read."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
        }
    )
    c.assign([KafkaTP(topic, queue, 0)])
    got = 0
    size = 0
    last = -1
    started = None
    deadline = time.monotonic() + 600
    while got < expected and time.monotonic() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error():
                raise RuntimeError(m.error())
            if started is None:
                started = time.perf_counter()
            assert m.offset() > last, "logic offsets increase"
            last = m.offset()
            got += 1
            size += len(m.value())
    elapsed = time.perf_counter() - (started or time.perf_counter())
    c.close()
    if got < expected:
        raise RuntimeError(f"read {got} of {expected} records of queue {queue}")
    return elapsed, size


def fetch_throughput(
    cluster: LocalClusterProcess, mib: int, boundaries: int, repeats: int
) -> dict[str, Any]:
    name = f"fetch-{uuid.uuid4().hex[:6]}"
    call(cluster, "/v1/static-topics/create", {"name": name, "total_queues": 2})
    n = mib * 1024 * 1024 // RECORD
    fill(cluster.bootstrap, name, 0, n)
    brokers = sorted(b["broker"] for b in cluster.status()["brokers"])
    part = n // (boundaries + 1)
    for k in range(boundaries + 1):
        fill(cluster.bootstrap, name, 1, part if k < boundaries else n - part * boundaries)
        if k < boundaries:
            leader = call(cluster, "/v1/static-topics/describe", {"name": name})["queues"][1]
            target = brokers[(brokers.index(leader["broker"]) + 1) % len(brokers)]
            call(
                cluster,
                "/v1/static-topics/remap",
                {
                    "name": name,
                    "moves": [{"queue": 1, "broker": target, "mode": "strict"}],
                },
            )
    items = len(call(cluster, "/v1/static-topics/describe", {"name": name})["mapping"]["1"])
    time.sleep(5)  # the sealed physical queues' compaction runs in the background
    single, across = [], []
    for _ in range(repeats):
        s, size0 = read_all(cluster.bootstrap, name, 0, n)
        a, size1 = read_all(cluster.bootstrap, name, 1, n)
        single.append(size0 / s)
        across.append(size1 / a)
        print(
            f"  one physical queue {size0 / s / 2**20:.1f} MiB/s, across {items} items "
            f"{size1 / a / 2**20:.1f} MiB/s",
            flush=True,
        )
    s_med, a_med = statistics.median(single), statistics.median(across)
    return {"mib": mib, "items": items, "single": s_med, "across": a_med, "ratio": a_med / s_med}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--storage", choices=["local", "s3"], default="local")
    ap.add_argument("--rounds", type=int, default=6, help="remap rounds (alternating orders)")
    ap.add_argument("--rate", type=int, default=2000, help="background records/s")
    ap.add_argument("--mib", type=int, default=64, help="MiB per logic queue for the fetch test")
    ap.add_argument("--boundaries", type=int, default=4, help="remaps inside the fetched queue")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-mib", type=int, default=4, help="brokers' tail cache")
    ap.add_argument("--out", default=str(Path(__file__).parent / "RESULTS-static.md"))
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tidalmq-static-"))
    storage_url, env, s3 = "", {}, None
    if args.storage == "s3":
        from tests.support.s3_server import start_s3_server

        s3 = start_s3_server()
        storage_url, env = s3.url(prefix="static"), s3.env()
    cluster = LocalClusterProcess(
        workdir / "cluster",
        brokers=3,
        storage_url=storage_url,
        env={
            **env,
            "TIDALMQ_LOG_LEVEL": "WARNING",
            "TIDALMQ_CACHE_BYTES": str(args.cache_mib << 20),
        },
    )
    cluster.start()
    load_before = os.getloadavg()
    try:
        remaps = remap_times(cluster, args.rounds, args.rate)
        for mode, figs in remaps["modes"].items():
            s, c = figs["server"], figs["client"]
            print(
                f"{mode:>9}: {len(s)} remaps; served after p50 {statistics.median(s) * 1000:.0f} ms, "
                f"p99 {percentile(s, 99) * 1000:.0f} ms; client waits p50 "
                f"{statistics.median(c) * 1000:.0f} ms, p99 {percentile(c, 99) * 1000:.0f} ms; "
                f"largest jump {max(figs['jump'])}",
                flush=True,
            )
        fetch = fetch_throughput(cluster, args.mib, args.boundaries, args.repeats)
        print(
            f"fetch: one physical queue {fetch['single'] / 2**20:.1f} MiB/s, across "
            f"{fetch['items']} physical queues {fetch['across'] / 2**20:.1f} MiB/s "
            f"= {fetch['ratio'] * 100:.0f}%",
            flush=True,
        )
    finally:
        cluster.stop()
        if s3 is not None:
            s3.stop()
    load = os.getloadavg()
    command = (
        f".venv/bin/python bench/static_topic.py --storage {args.storage} --rounds {args.rounds} "
        f"--rate {args.rate} --mib {args.mib} --boundaries {args.boundaries} "
        f"--repeats {args.repeats} --cache-mib {args.cache_mib}"
    )
    rows = []
    for mode, figs in remaps["modes"].items():
        s, c = figs["server"], figs["client"]
        rows.append(
            f"| {mode} | {len(s)} | {statistics.median(s) * 1000:.0f} ms | "
            f"{percentile(s, 99) * 1000:.0f} ms | {statistics.median(c) * 1000:.0f} ms | "
            f"{percentile(c, 99) * 1000:.0f} ms | {max(figs['jump'])} |"
        )
    lines = [
        "# Static topic benchmark",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores; load average {load_before[0]:.1f} at the start, {load[0]:.1f}/"
        f"{load[1]:.1f}/{load[2]:.1f} at the end (the machine is shared); storage: {args.storage}.",
        "",
        f"Command: `{command}`",
        "",
        "## Remap time per logic queue under load",
        "",
        f"3 brokers, an {QUEUES}-queue static topic, {args.rate} records/s of keyed 1 KiB records "
        "plus one record every 5 ms to each queue; each queue remapped on its own to the next "
        "broker. *Served after*: the remap request until the new physical queue is served "
        "(controller's clock). *Client waits*: the longest produce-to-acknowledgement wait of a "
        f"record sent to that queue during the remap (normal wait p50 {remaps['quiet_p50'] * 1000:.0f} ms, "
        f"p99 {remaps['quiet_p99'] * 1000:.0f} ms over the whole run).",
        "",
        "| order | remaps | served after p50 | p99 | client waits p50 | p99 | largest logic-offset jump |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "## Fetch throughput across remap boundaries",
        "",
        f"{args.mib} MiB of 1 KiB records per logic queue, brokers' tail cache {args.cache_mib} MiB; "
        f"queue 0 in one physical queue, queue 1 in {fetch['items']} (remapped {args.boundaries} "
        f"times while written; the older ones are read from object storage). A fresh consumer "
        f"reads each from offset 0; median of {args.repeats}.",
        "",
        "| within one physical queue | across remap boundaries | ratio (target >= 80%) |",
        "|---:|---:|---:|",
        f"| {fetch['single'] / 2**20:.1f} MiB/s | {fetch['across'] / 2**20:.1f} MiB/s | "
        f"{fetch['ratio'] * 100:.0f}% |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
