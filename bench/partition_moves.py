"""Benchmark: how long a partition is unavailable while it moves, by partition size, and how
fast a 300-partition cluster rebalances onto a new broker.

    .venv/bin/python bench/partition_moves.py                 # 1 MiB, 100 MiB, 1 GiB; 20 moves each
    .venv/bin/python bench/partition_moves.py --sizes 1,100 --moves 30 --storage s3

For each size, one partition is filled to that size, then moved back and forth between two
brokers while an idempotent producer keeps writing to it (acks=all, one record every 2 ms). The
figure per move is the issue's: the time from the reassignment request to the first record the
new broker acknowledged (the first acknowledgement once the controller recorded the target
open), plus the longest produce->ack wait of a record sent during the move (the client-visible
unavailability) and the producer's baseline between moves. Then a fresh 3-broker cluster with a 300-partition topic, under a
producer writing to every partition, gets a 4th broker: the time until the moved share serves.
Prints the figures and the targets, and writes bench/RESULTS-moves.md.
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
from dataclasses import dataclass
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
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 10,
            "batch.size": 1 << 20,
            "compression.type": "none",
        }
    )
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
    p.close()
    return time.monotonic() - started


class TrickleProducer:
    """One record every `interval` seconds to the given partitions in turn; remembers
    (produced, acknowledged, partition) per acknowledged record."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int = 1, interval: float = 0.002
    ) -> None:
        self.records: list[tuple[float, float, int]] = []
        self.errors = 0
        self._p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "enable.idempotence": True,
                "retry.backoff.ms": 10,
                "retry.backoff.max.ms": 50,
                "topic.metadata.refresh.fast.interval.ms": 10,
                "message.timeout.ms": 60000,
            }
        )
        self._topic = topic
        self._partitions = partitions
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            produced = time.time()
            partition = i % self._partitions
            i += 1

            def on_delivery(err: Any, msg: Any, produced: float = produced) -> None:
                if err is not None:
                    self.errors += 1
                    return
                with self._lock:
                    self.records.append((produced, time.time(), msg.partition()))

            self._p.produce(
                self._topic, value=b"x" * 100, partition=partition, on_delivery=on_delivery
            )
            self._p.poll(self._interval)
        self._p.flush(60)
        self._p.close()

    def start(self) -> TrickleProducer:
        self._thread.start()
        return self

    def worst_wait(self, start: float, end: float, partition: int = 0) -> float | None:
        """Longest produce->ack wait of the records produced in [start, end]."""
        with self._lock:
            waits = [
                acked - produced
                for produced, acked, p in self.records
                if start <= produced <= end and p == partition
            ]
        return max(waits) if waits else None

    def first_ack_by_new_broker(self, opened: float, partition: int = 0) -> float | None:
        """The first acknowledgement by the new broker: the first one at or after the moment
        the controller recorded the target open, less 20 ms (the target may acknowledge a
        moment before its report arrives). The source acknowledged everything it took before it
        reported the partition closed, which precedes the election and the open by far more
        than 20 ms (a metadata commit and a checkpoint read), so no earlier acknowledgement is
        the new broker's and none after this point is the source's."""
        with self._lock:
            acks = [a for _, a, p in self.records if a >= opened - 0.02 and p == partition]
        return min(acks) if acks else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@dataclass
class MoveFigures:
    to_first_ack: list[float]  # move requested -> first acknowledgement by the new broker
    worst_wait: list[float]  # longest produce->ack wait of a record produced during the move
    quiet: list[float]  # longest produce->ack wait between moves
    recorded: list[float]  # move requested -> the controller recorded it (controller clock)
    opened: list[float]  # the controller recorded the move -> the target opened (controller clock)


def measure_moves(cluster: LocalClusterProcess, topic: str, moves: int) -> MoveFigures:
    trickle = TrickleProducer(cluster.bootstrap, topic).start()
    time.sleep(1.0)
    figures = MoveFigures([], [], [], [], [])
    try:
        for n in range(moves):
            source = cluster.leaders(topic)[0]
            target = 1 if source == 0 else 0
            started = time.time()
            cluster.reassign({(topic, 0): target})
            deadline = time.monotonic() + 30
            opened = recorded = None
            while time.monotonic() < deadline and opened is None:
                for m in reversed(cluster.moves()["recent"]):
                    if m["topic"] == topic and m["started"] >= started - 1 and m["opened"]:
                        opened, recorded = m["opened"], m["started"]
                        break
                else:
                    time.sleep(0.01)
            if opened is None:
                raise TimeoutError("move did not complete")
            time.sleep(1.0)  # let every record produced during the move be acknowledged
            if cluster.leaders(topic)[0] != target:
                raise RuntimeError(f"move {n}: the partition is not on broker {target}")
            first = trickle.first_ack_by_new_broker(opened)
            worst = trickle.worst_wait(started, opened)
            if first is None or worst is None:
                raise RuntimeError("no record was produced during the move")
            figures.to_first_ack.append(first - started)
            figures.worst_wait.append(worst)
            figures.recorded.append(recorded - started)
            figures.opened.append(opened - recorded)
            quiet_start = time.time()
            time.sleep(0.5)
            q = trickle.worst_wait(quiet_start, time.time() - 0.2)
            if q is not None:
                figures.quiet.append(q)
    finally:
        trickle.stop()
    if trickle.errors:
        raise RuntimeError(f"{trickle.errors} records failed")
    return figures


def rebalance_onto_new_broker(cluster: LocalClusterProcess, partitions: int) -> dict[str, Any]:
    """A fresh 3-broker cluster with one `partitions`-partition topic (plus the offsets topic)
    and a producer writing to every partition in turn throughout; a 4th broker is added."""
    topic = f"wide-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(120)
    cluster.wait_settled(120)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(partitions * 20):
        p.produce(topic, value=b"v" * 200, partition=i % partitions)
    p.flush(120)
    p.close()
    total = sum(len(t["partitions"]) for t in cluster.metadata()["topics"].values())
    trickle = TrickleProducer(cluster.bootstrap, topic, partitions, interval=0.001).start()
    time.sleep(2.0)
    try:
        requested = time.time()
        new = cluster.add_broker()
        registered = time.time()
        cluster.wait_settled(120)
        time.sleep(1.0)
    finally:
        trickle.stop()
    moved = [
        m
        for m in cluster.moves()["recent"]
        if m["started"] >= requested - 0.5 and m["target"] == new
    ]
    if not moved or any(not m["opened"] for m in moved):
        raise RuntimeError(f"rebalance incomplete: {moved}")
    first_start = min(m["started"] for m in moved)
    last_open = max(m["opened"] for m in moved)
    unavail = [m["unavailable_s"] for m in moved if m["unavailable_s"] is not None]
    return {
        "partitions": partitions,
        "total": total,
        "moved": len(moved),
        "new_broker": new,
        "spawn_to_registered_s": registered - requested,
        "first_move_to_all_serving_s": last_open - first_start,
        "registered_to_all_serving_s": last_open - registered,
        "move_p50_s": statistics.median(unavail),
        "move_p99_s": percentile(unavail, 99),
        "producer_errors": trickle.errors,
        "records": len(trickle.records),
    }


def start_cluster(workdir: Path, name: str, storage: str) -> tuple[LocalClusterProcess, Any]:
    storage_url, env, s3 = "", {}, None
    if storage == "s3":
        from tests.support.s3_server import start_s3_server

        s3 = start_s3_server()
        storage_url, env = s3.url(prefix=name), s3.env()
    cluster = LocalClusterProcess(
        workdir / name,
        brokers=3,
        storage_url=storage_url,
        env={**env, "TIDALMQ_LOG_LEVEL": "WARNING"},
    )
    cluster.start()
    return cluster, s3


def stop_cluster(cluster: LocalClusterProcess, s3: Any) -> None:
    cluster.stop()
    if s3 is not None:
        s3.stop()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


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
    load_before = os.getloadavg()
    began = time.time()
    rows = []
    cluster, s3 = start_cluster(workdir, "moves", args.storage)
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
            f = measure_moves(cluster, topic, args.moves)
            row = {
                "size": f"{size_mib} MiB",
                "moves": len(f.to_first_ack),
                "p50": statistics.median(f.to_first_ack),
                "p99": percentile(f.to_first_ack, 99),
                "max": max(f.to_first_ack),
                "wait_p50": statistics.median(f.worst_wait),
                "wait_p99": percentile(f.worst_wait, 99),
                "quiet": max(f.quiet) if f.quiet else float("nan"),
                "rec_p50": statistics.median(f.recorded),
                "rec_p99": percentile(f.recorded, 99),
                "open_p50": statistics.median(f.opened),
                "open_p99": percentile(f.opened, 99),
            }
            rows.append(row)
            print(
                f"{row['size']:>9}: {row['moves']} moves; move start -> first ack on the new broker "
                f"p50 {ms(row['p50'])}, p99 {ms(row['p99'])}, max {ms(row['max'])}; longest record wait "
                f"p50 {ms(row['wait_p50'])}, p99 {ms(row['wait_p99'])} (between moves at most "
                f"{ms(row['quiet'])}); request -> recorded p50 {ms(row['rec_p50'])}, p99 "
                f"{ms(row['rec_p99'])}; recorded -> opened p50 {ms(row['open_p50'])}, p99 "
                f"{ms(row['open_p99'])}",
                flush=True,
            )
    finally:
        stop_cluster(cluster, s3)
    cluster, s3 = start_cluster(workdir, "rebalance", args.storage)
    try:
        reb = rebalance_onto_new_broker(cluster, args.rebalance_partitions)
    finally:
        stop_cluster(cluster, s3)
    print(
        f"rebalance: {reb['moved']} of {reb['total']} partitions moved onto broker "
        f"{reb['new_broker']}; all serving {reb['registered_to_all_serving_s']:.2f} s after it "
        f"registered ({reb['first_move_to_all_serving_s']:.2f} s from the first move's start); "
        f"per-move p50 {ms(reb['move_p50_s'])}, p99 {ms(reb['move_p99_s'])}; producer errors "
        f"{reb['producer_errors']}",
        flush=True,
    )
    load_after = os.getloadavg()
    worst_p99 = max(r["p99"] for r in rows)
    worst_wait_p99 = max(r["wait_p99"] for r in rows)
    growth = rows[-1]["p50"] / rows[0]["p50"] if rows[0]["p50"] > 0 else float("nan")
    commit = os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip() or "?"
    lines = [
        "# Partition move benchmark (`bench/partition_moves.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))} at {commit}, "
        f"{time.time() - began:.0f} s; machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after; storage: {args.storage}.",
        "",
        "```sh",
        f".venv/bin/python bench/partition_moves.py --sizes {args.sizes} --moves {args.moves} "
        f"--storage {args.storage} --rebalance-partitions {args.rebalance_partitions}",
        "```",
        "",
        "## One partition moved back and forth while a producer writes to it",
        "",
        "`tidalmq local up` with 3 brokers; the partition is filled to its size first, then moved "
        "between brokers 0 and 1 while an idempotent confluent-kafka producer (acks=all, "
        "linger.ms=0) sends a record to it every 2 ms. *Move start -> first ack* is the issue's "
        "figure: from the reassignment request (client clock) to the first acknowledgement by the "
        "new broker (the first acknowledgement once the target opened). *Longest record "
        "wait* is the longest produce->ack time of a record sent during the move; *between moves* "
        "the longest wait outside moves, the producer's baseline. With 20 moves, p99 is the "
        "largest of 20. The last columns split the move on the controller's clock: from the "
        "request to the controller recording the target (a move's first step: a metadata commit), and "
        "from there to the target serving (close, election, open).",
        "",
        "| partition size | moves | move start -> first ack p50 | p99 | max | longest record wait p50 | p99 | between moves | request -> recorded p50 / p99 | recorded -> opened p50 / p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['size']} | {r['moves']} | {ms(r['p50'])} | {ms(r['p99'])} | {ms(r['max'])} | "
            f"{ms(r['wait_p50'])} | {ms(r['wait_p99'])} | {ms(r['quiet'])} | "
            f"{ms(r['rec_p50'])} / {ms(r['rec_p99'])} | {ms(r['open_p50'])} / {ms(r['open_p99'])} |"
            for r in rows
        ],
        "",
        "## A 4th broker joins a 3-broker cluster",
        "",
        f"A fresh cluster holding one {reb['partitions']}-partition topic ({reb['total']} "
        "partitions with the offsets topic's), each partition with 20 records; a producer writes "
        "to every partition in turn (one record per ms) throughout; `tidalmq local add-broker`. "
        "The controller moves a fair share onto the new broker by itself.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| partitions moved onto the new broker | {reb['moved']} of {reb['total']} |",
        f"| broker process spawned -> registered | {reb['spawn_to_registered_s']:.2f} s |",
        f"| registered -> all its partitions serving | {reb['registered_to_all_serving_s']:.2f} s |",
        f"| first move started -> last move opened | {reb['first_move_to_all_serving_s']:.2f} s |",
        f"| unavailability per moved partition p50 / p99 (controller clock) | {ms(reb['move_p50_s'])} / {ms(reb['move_p99_s'])} |",
        f"| producer: records acknowledged / failed | {reb['records']} / {reb['producer_errors']} |",
        "",
        "## Against the targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| move start -> first ack on the new broker, p99 <= 0.5 s at every size | worst p99 {ms(worst_p99)} | {verdict(worst_p99 <= 0.5)} |",
        f"| client-visible unavailability (longest record wait), p99 <= 0.5 s at every size | worst p99 {ms(worst_wait_p99)} | {verdict(worst_wait_p99 <= 0.5)} |",
        f"| no growth with partition size | p50 at {rows[-1]['size']} / p50 at {rows[0]['size']} = {growth:.2f} | {verdict(growth <= 1.5)} |",
        f"| {reb['partitions']}-partition cluster rebalanced onto a 4th broker within 5 s | {reb['registered_to_all_serving_s']:.2f} s after it registered | {verdict(reb['registered_to_all_serving_s'] <= 5.0)} |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines[-6:]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
