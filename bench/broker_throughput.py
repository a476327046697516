"""Benchmark of one real broker process driven by confluent-kafka (librdkafka) clients.

    .venv/bin/python bench/broker_throughput.py                      # local store, then MinIO
    .venv/bin/python bench/broker_throughput.py --backend localdir --duration 20 --partitions 8

Per backend (a fresh broker process each time):

1. **max produce**: `--producers` client processes send 1 KiB records (random, so nothing
   compresses) with acks=all as fast as the broker takes them, for `--duration` seconds after a
   warm-up; throughput counts acknowledged records only.
2. **latency**: the same clients paced at half the measured maximum (or `--latency-mb-s`); every
   record's latency is librdkafka's own (`Message.latency()`: delivery report minus produce()
   call), so it includes the linger time and the broker's durable flush.
3. **consume from cache**: consumers read the newest ~60% of the tail cache's capacity (the
   broker's hit/miss counters show that it came from memory).
4. **consume cold**: the broker is restarted (clean SIGTERM: the cache starts empty) and the same
   range is read again, now by ranged GETs with read-ahead.

With `--tls`, instead: produce throughput (phase 1 only) over each listener security, PLAINTEXT,
SSL and SASL_SSL (SCRAM-SHA-512), of one TidalMQ broker (local store) and of one Apache Kafka
broker (KRaft, bench/kafka/) in the same run, each listener in turn with the same clients and
settings; both brokers get the same certificate, SCRAM user and listener settings
(bench/listener_security.py). Written between their own markers of `bench/RESULTS-broker.md`:

    .venv/bin/python bench/broker_throughput.py --tls --rounds 2         # 15 s per row
    .venv/bin/python bench/broker_throughput.py --tls --duration 2 --warmup 1 --partitions 2 \
        --producers 1 --no-write                                         # smoke: seconds

The broker's resident memory (VmRSS from /proc, sampled every 100 ms) and CPU time are recorded per
phase, as are the clients' CPU time and the load average (the machine is shared: read every figure
with it). The table is printed and written between the markers of `bench/RESULTS-broker.md`
(`--results`), leaving the rest of that page as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))

from bench import procstat  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402

TOPIC = "bench"
_BEGIN = "<!-- broker_throughput:begin -->"
_END = "<!-- broker_throughput:end -->"
_TLS_BEGIN = "<!-- broker_throughput_tls:begin -->"
_TLS_END = "<!-- broker_throughput_tls:end -->"
_RECORD_OVERHEAD = 10  # bytes a 1 KiB record takes in a v2 batch beyond its value (varints)


# ---------------------------------------------------------------------------- broker sampling
class ProcSampler:
    """Samples VmRSS of a process every `interval_s`; phases read peak RSS and CPU seconds."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_rss_mb = 0.0
        self.phase_peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss_mb(self) -> float:
        return procstat.rss_bytes(self.pid) / (1 << 20)

    def cpu_s(self) -> float:
        try:
            return procstat.cpu_s(self.pid)
        except OSError:
            return 0.0

    def begin_phase(self) -> None:
        self.phase_peak_mb = self.rss_mb()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self.rss_mb()
            self.peak_rss_mb = max(self.peak_rss_mb, rss)
            self.phase_peak_mb = max(self.phase_peak_mb, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def profiled(pid: int, out: Path | None, name: str) -> Iterator[None]:
    """Sample the broker with py-spy while the block runs: the thread holding the GIL (the
    Python work; the store's threads mostly wait in system calls), as collapsed stacks for
    flame graphs (e.g. `flamegraph.pl file.txt > file.svg`)."""
    if out is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    out.mkdir(parents=True, exist_ok=True)
    target = out / (re.sub(r"[^\w.-]+", "_", name) + ".txt")
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--gil",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(target),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def broker_counters(broker: BrokerProcess) -> dict[str, float]:
    """The storage counters the report uses, summed over label sets."""
    wanted = {
        "tidalmq_storage_cache_hit_bytes_total": "cache_hit",
        "tidalmq_storage_cache_miss_bytes_total": "cache_miss",
        "tidalmq_storage_wal_flushes_total": "wal_flushes",
        "tidalmq_storage_wal_flush_bytes_sum": "wal_bytes",
        "tidalmq_storage_wal_flush_seconds_sum": "wal_seconds",
    }
    produce = {
        "tidalmq_request_seconds_sum": "produce_seconds",
        "tidalmq_request_seconds_count": "produce_requests",
        "tidalmq_request_bytes_total": "produce_bytes",
    }
    out = dict.fromkeys([*wanted.values(), *produce.values()], 0.0)
    with urllib.request.urlopen(broker.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        if m is None:
            continue
        if m.group(1) in wanted:
            out[wanted[m.group(1)]] += float(m.group(3))
        elif m.group(1) in produce and 'api="Produce"' in (m.group(2) or ""):
            out[produce[m.group(1)]] += float(m.group(3))
    return out


# ---------------------------------------------------------------------------- client processes
def _producer_config(args: dict[str, Any], bootstrap: str, only_errors: bool) -> dict[str, Any]:
    """The producers' settings; `args["client_security"]`: the listener's (security.protocol,
    TLS, SASL; bench/listener_security.py)."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": args["linger_ms"],
        "batch.size": args["batch_size"],
        "batch.num.messages": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.kbytes": 512 * 1024,
        "queue.buffering.max.messages": 2_000_000,
        "max.in.flight.requests.per.connection": 5 if args["idempotent"] else args["max_in_flight"],
        "enable.idempotence": args["idempotent"],
        "delivery.report.only.error": only_errors,
        "socket.send.buffer.bytes": 4 << 20,
        "statistics.interval.ms": 0,
        **args.get("client_security", {}),
    }


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def produce_worker(
    bootstrap: str, args: dict[str, Any], partitions: list[int], start: float, rate: float
) -> dict[str, Any]:
    """Produce to `partitions` from wall-clock `start` for warm-up + duration seconds.

    rate = 0: as fast as possible (success reports disabled; delivered = produced - queued -
    failed). rate > 0: records per second, paced, every delivery report's latency kept.
    """
    from confluent_kafka import KafkaException, Producer

    paced = rate > 0
    value = os.urandom(args["record_size"])
    failed = [0]
    latencies: list[float] = []
    measuring = [False]

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed[0] += 1
        elif measuring[0]:
            latencies.append(msg.latency())

    # the callback is set once in the configuration, not passed with every produce() call
    config = _producer_config(args, bootstrap, only_errors=not paced)
    producer = Producer({**config, "on_delivery": on_delivery})

    warm_end = start + args["warmup"]
    end = warm_end + args["duration"]
    while time.time() < start:
        time.sleep(0.005)
    produced = 0
    counted_at_begin = 0
    produce = producer.produce
    poll = producer.poll
    n_parts = len(partitions)
    i = 0
    began = time.monotonic()
    cpu_begin = 0.0
    in_window = False
    window_start_mono = 0.0
    batch = 1000
    while True:
        now = time.time()
        if not in_window and now >= warm_end:
            in_window = True
            measuring[0] = True
            counted_at_begin = produced - len(producer) - failed[0]
            window_start_mono = time.monotonic()
            cpu_begin = _cpu_s()
        if now >= end:
            break
        if paced:
            due = int((time.monotonic() - began) * rate) - produced
            if due <= 0:
                poll(0)
                time.sleep(0.0005)
                continue
            n = min(due, batch)
        else:
            n = batch
        for _ in range(n):
            try:
                produce(TOPIC, value, partition=partitions[i % n_parts])
            except BufferError:
                poll(0.002)
                break
            except KafkaException:
                failed[0] += 1
                break
            produced += 1
            i += 1
        poll(0)
    window_s = time.monotonic() - window_start_mono
    delivered_in_window = produced - len(producer) - failed[0] - counted_at_begin
    cpu_used = _cpu_s() - cpu_begin
    measuring[0] = False
    producer.flush(60)
    return {
        "delivered": delivered_in_window,
        "window_s": window_s,
        "failed": failed[0],
        "left": len(producer),
        "latencies": latencies,
        "cpu_s": cpu_used,
    }


def consume_worker(
    bootstrap: str, args: dict[str, Any], ranges: list[tuple[int, int, int]]
) -> dict[str, Any]:
    """Read (partition, start, end) ranges; returns records, value bytes, seconds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{os.getpid()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": args["fetch_partition_bytes"],
            "queued.max.messages.kbytes": 256 * 1024,
            "fetch.wait.max.ms": 100,
            "socket.receive.buffer.bytes": 4 << 20,
        }
    )
    remaining = {p: end for p, _start, end in ranges if end > _start}
    started = time.monotonic()
    cpu_begin = _cpu_s()
    consumer.assign([TopicPartition(TOPIC, p, start) for p, start, _end in ranges])
    records = 0
    nbytes = 0
    errors = 0
    deadline = started + args["consume_timeout"]
    while remaining and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=10000, timeout=0.5):
            if msg.error():
                errors += 1
                continue
            p = msg.partition()
            end = remaining.get(p)
            if end is None:
                continue
            records += 1
            nbytes += len(msg.value())
            if msg.offset() >= end - 1:
                del remaining[p]
    elapsed = time.monotonic() - started
    cpu_used = _cpu_s() - cpu_begin
    consumer.close()
    return {
        "records": records,
        "bytes": nbytes,
        "seconds": elapsed,
        "errors": errors,
        "incomplete": len(remaining),
        "cpu_s": cpu_used,
    }


# ---------------------------------------------------------------------------- phases
@dataclasses.dataclass
class Phase:
    name: str
    mb_s: float = 0.0
    records_s: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    broker_cpu: float = 0.0  # cores the broker used on average
    client_cpu: float = 0.0  # cores the clients used on average
    peak_rss_mb: float = 0.0
    load: str = ""
    note: str = ""


@dataclasses.dataclass
class BackendResult:
    backend: str
    phases: list[Phase] = dataclasses.field(default_factory=list)
    peak_rss_mb: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)


def _split(items: list[int], n: int) -> list[list[int]]:
    return [items[i::n] for i in range(n) if items[i::n]]


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))] * 1000


def _create_topic(bootstrap: str, partitions: int, **client: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **client})
    futures = admin.create_topics(
        [NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)], operation_timeout=30
    )
    for fut in futures.values():
        fut.result(60)
    # wait until every partition has a leader (the broker opened it)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(TOPIC, timeout=10)
        topic = md.topics.get(TOPIC)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {TOPIC} did not get leaders for {partitions} partitions")


def _watermarks(bootstrap: str, partitions: int) -> list[tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def _run_producers(
    pool: Any,
    bootstrap: str,
    args: argparse.Namespace,
    rate_records_s: float,
    client_security: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    shared = {**vars(args), "client_security": client_security or {}}
    groups = _split(list(range(args.partitions)), args.producers)
    start = time.time() + 1.5  # let every worker import and connect first
    per_worker = rate_records_s / len(groups)
    jobs = [
        pool.apply_async(produce_worker, (bootstrap, shared, group, start, per_worker))
        for group in groups
    ]
    return [job.get(timeout=args.warmup + args.duration + 300) for job in jobs]


def _run_consumers(
    pool: Any, bootstrap: str, args: argparse.Namespace, ranges: list[tuple[int, int, int]]
) -> list[dict[str, Any]]:
    groups = [
        ranges[i :: args.consumers] for i in range(args.consumers) if ranges[i :: args.consumers]
    ]
    jobs = [pool.apply_async(consume_worker, (bootstrap, vars(args), g)) for g in groups]
    return [job.get(timeout=args.consume_timeout + 120) for job in jobs]


def _produce_phase(
    name: str,
    pool: Any,
    sampler: ProcSampler,
    bootstrap: str,
    args: argparse.Namespace,
    rate: float,
    client_security: dict[str, Any] | None = None,
) -> tuple[Phase, list[dict[str, Any]], float]:
    """One produce phase: the phase's figures, the workers' outputs and its wall time."""
    sampler.begin_phase()
    cpu0, t0, load0 = sampler.cpu_s(), time.monotonic(), procstat.load_triple()
    outs = _run_producers(pool, bootstrap, args, rate, client_security)
    # the workers' windows are the measured part; broker CPU over the whole call includes
    # warm-up and drain, so scale by wall time
    wall = time.monotonic() - t0
    window = max(o["window_s"] for o in outs)
    delivered = sum(o["delivered"] for o in outs)
    phase = Phase(name)
    phase.records_s = delivered / window
    phase.mb_s = phase.records_s * args.record_size / 1e6
    phase.broker_cpu = (sampler.cpu_s() - cpu0) / wall
    phase.client_cpu = sum(o["cpu_s"] for o in outs) / window
    phase.peak_rss_mb = sampler.phase_peak_mb
    phase.load = f"{load0} -> {procstat.load_triple()}"
    return phase, outs, wall


def run_backend(
    backend: str,
    storage_url: str,
    env: dict[str, str],
    args: argparse.Namespace,
    workdir: Path,
    store_pid: int | None = None,
) -> BackendResult:
    """All phases against one fresh broker; `store_pid`: the S3 server, whose CPU is noted."""
    store = ProcSampler(store_pid, interval_s=1.0) if store_pid else None
    result = BackendResult(backend)
    broker_args = [
        "--flush-interval-ms",
        str(args.flush_interval_ms),
        "--flush-bytes",
        str(args.flush_bytes),
        "--cache-bytes",
        str(args.cache_mb << 20),
        *args.broker_arg,
    ]
    broker = BrokerProcess(
        storage_url, workdir / "logs", env={**env, "TIDALMQ_LOG_LEVEL": "WARNING"}, args=broker_args
    )
    broker.start()
    assert broker.proc is not None
    sampler = ProcSampler(broker.proc.pid)
    ctx = mp.get_context("spawn")
    n_workers = max(args.producers, args.consumers)
    try:
        with ctx.Pool(n_workers) as pool:
            _create_topic(broker.bootstrap, args.partitions)
            record_bytes = args.record_size

            def measure_produce(name: str, rate: float) -> tuple[Phase, list[dict[str, Any]]]:
                store0 = store.cpu_s() if store else 0.0
                counters0 = broker_counters(broker)
                assert broker.proc is not None
                with profiled(broker.proc.pid, args.profile, f"{backend}-{name}"):
                    phase, outs, wall = _produce_phase(
                        name, pool, sampler, broker.bootstrap, args, rate
                    )
                counters1 = broker_counters(broker)
                failed = sum(o["failed"] for o in outs)
                flushes = counters1["wal_flushes"] - counters0["wal_flushes"]
                wal_mb = (counters1["wal_bytes"] - counters0["wal_bytes"]) / 1e6
                requests = counters1["produce_requests"] - counters0["produce_requests"]
                req_s = counters1["produce_seconds"] - counters0["produce_seconds"]
                wal_s = counters1["wal_seconds"] - counters0["wal_seconds"]
                req_kb = (counters1["produce_bytes"] - counters0["produce_bytes"]) / 1e3
                phase.note = (
                    f"{flushes / wall:.0f} WAL PUTs/s of {wal_mb / max(flushes, 1):.2f} MB, "
                    f"{1000 * wal_s / max(flushes, 1):.1f} ms avg; {requests / wall:.0f} "
                    f"Produce requests/s of {req_kb / max(requests, 1):.0f} KB, "
                    f"{1000 * req_s / max(requests, 1):.1f} ms avg"
                    + (f"; {failed} records FAILED" if failed else "")
                    + (
                        f"; S3 server used {(store.cpu_s() - store0) / wall:.2f} cores"
                        if store
                        else ""
                    )
                )
                return phase, outs

            # 1. maximum produce throughput
            max_phase, _ = measure_produce("produce max", 0)
            result.phases.append(max_phase)
            print(f"[{backend}] {max_phase}", flush=True)

            # 2. latency at half of that load (or the load asked for)
            target_mb_s = args.latency_mb_s or max_phase.mb_s / 2
            rate = target_mb_s * 1e6 / record_bytes
            lat_phase, outs = measure_produce(f"produce @{target_mb_s:.0f} MB/s", rate)
            lats = sorted(x for o in outs for x in o["latencies"])
            if lats:
                lat_phase.p50_ms = _pct(lats, 0.50)
                lat_phase.p95_ms = _pct(lats, 0.95)
                lat_phase.p99_ms = _pct(lats, 0.99)
                lat_phase.max_ms = lats[-1] * 1000
            result.phases.append(lat_phase)
            print(f"[{backend}] {lat_phase}", flush=True)

            # 3. consume the newest ~60% of the cache's capacity (all of it is in the cache)
            marks = _watermarks(broker.bootstrap, args.partitions)
            per_part = int(
                args.cache_mb
                * (1 << 20)
                * args.consume_fraction
                / args.partitions
                / (record_bytes + _RECORD_OVERHEAD)
            )
            ranges = [(p, max(low, high - per_part), high) for p, (low, high) in enumerate(marks)]

            def measure_consume(name: str) -> Phase:
                sampler.begin_phase()
                cpu0, t0, load0 = sampler.cpu_s(), time.monotonic(), procstat.load_triple()
                store0 = store.cpu_s() if store else 0.0
                c0 = broker_counters(broker)
                assert broker.proc is not None
                with profiled(broker.proc.pid, args.profile, f"{backend}-{name}"):
                    outs = _run_consumers(pool, broker.bootstrap, args, ranges)
                wall = time.monotonic() - t0
                c1 = broker_counters(broker)
                seconds = max(o["seconds"] for o in outs)
                phase = Phase(name)
                phase.records_s = sum(o["records"] for o in outs) / seconds
                phase.mb_s = sum(o["bytes"] for o in outs) / seconds / 1e6
                phase.broker_cpu = (sampler.cpu_s() - cpu0) / wall
                phase.client_cpu = sum(o["cpu_s"] for o in outs) / seconds
                phase.peak_rss_mb = sampler.phase_peak_mb
                phase.load = f"{load0} -> {procstat.load_triple()}"
                hit = c1["cache_hit"] - c0["cache_hit"]
                miss = c1["cache_miss"] - c0["cache_miss"]
                total_mb = sum(o["bytes"] for o in outs) / 1e6
                phase.note = (
                    f"{total_mb:.0f} MB; broker read {hit / 1e6:.0f} MB from cache, "
                    f"{miss / 1e6:.0f} MB from the object store (reads and compaction)"
                )
                if store:
                    phase.note += f"; S3 server used {(store.cpu_s() - store0) / wall:.2f} cores"
                incomplete = sum(o["incomplete"] for o in outs)
                errors = sum(o["errors"] for o in outs)
                if incomplete or errors:
                    phase.note += f"; {incomplete} partitions INCOMPLETE, {errors} errors"
                return phase

            result.phases.append(measure_consume("consume cache"))
            print(f"[{backend}] {result.phases[-1]}", flush=True)

            # 4. restart (clean): the cache starts empty, the same range is read cold
            broker.stop()
            broker.start()
            sampler.stop()
            result.peak_rss_mb = max(result.peak_rss_mb, sampler.peak_rss_mb)
            assert broker.proc is not None
            sampler = ProcSampler(broker.proc.pid)
            result.phases.append(measure_consume("consume cold"))
            print(f"[{backend}] {result.phases[-1]}", flush=True)
    finally:
        sampler.stop()
        if store is not None:
            store.stop()
        result.peak_rss_mb = max(result.peak_rss_mb, sampler.peak_rss_mb)
        code = broker.stop()
        if code not in (0, None):
            result.notes.append(f"broker exited with {code}")
            print(broker.tail_log(), file=sys.stderr)
    return result


# ---------------------------------------------------------------------------- listener security
@dataclasses.dataclass
class SecurityRow:
    system: str
    listener: str
    phase: Phase
    round: int = 1


def _wait_served(bootstrap: str, client: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Until a client with these settings gets the topic's metadata (handshake, SASL exchange
    and all): a SCRAM user added to Kafka takes a moment to reach its listeners."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = AdminClient({"bootstrap.servers": bootstrap, **client}).list_topics(
                TOPIC, timeout=5
            )
            if md.topics.get(TOPIC) is not None and md.topics[TOPIC].error is None:
                return
            problem = f"metadata {md.topics}"
        except Exception as exc:  # librdkafka's KafkaException: retried until the deadline
            problem = repr(exc)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{bootstrap} with {client.get('security.protocol')}: {problem}")
        time.sleep(0.5)


def _broker_settled(sampler: ProcSampler, idle_cores: float = 0.1, max_s: float = 60.0) -> float:
    """Waits until the broker uses less than `idle_cores` over a second (what the previous row
    left it to do, flushing, compacting, collecting, is done: otherwise it would be charged to
    the next row), at most `max_s`; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < max_s:
        cpu0 = sampler.cpu_s()
        time.sleep(1.0)
        if sampler.cpu_s() - cpu0 < idle_cores:
            break
    return time.monotonic() - started


def _security_rows(
    system: str,
    bootstraps: dict[str, str],
    pid: int,
    pool: Any,
    args: argparse.Namespace,
    pki: Any,
) -> list[SecurityRow]:
    """Maximum produce throughput over each listener of one running broker, in turn."""
    from bench import listener_security

    rows = []
    sampler = ProcSampler(pid)
    try:
        for round_, (listener, bootstrap) in (
            (r, item) for r in range(1, args.rounds + 1) for item in bootstraps.items()
        ):
            client = listener_security.client_config(listener, pki)
            _wait_served(bootstrap, client)
            quiet_after = _broker_settled(sampler)
            phase, outs, _ = _produce_phase(
                "produce max", pool, sampler, bootstrap, args, 0, client
            )
            failed = sum(o["failed"] for o in outs)
            phase.note = f"broker idle after {quiet_after:.0f} s" + (
                f"; {failed} records FAILED" if failed else ""
            )
            rows.append(SecurityRow(system, listener, phase, round_))
            print(f"[{system} {listener} round {round_}] {phase}", flush=True)
    finally:
        sampler.stop()
    return rows


def run_security(args: argparse.Namespace, workdir: Path) -> tuple[list[SecurityRow], str]:
    """Produce throughput over PLAINTEXT, SSL and SASL_SSL of TidalMQ (local store) and of
    Apache Kafka, one broker each, one after the other; returns the rows and Kafka's version."""
    from bench import listener_security
    from bench.kafka.harness import KafkaCluster
    from tests.support.broker_process import free_port

    pki = listener_security.make_pki(workdir / "pki")
    rows: list[SecurityRow] = []
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.producers) as pool:
        broker = BrokerProcess(f"file://{workdir / 'objects'}", workdir / "logs")
        ports = {
            name: broker.port if name == "PLAINTEXT" else free_port()
            for name in listener_security.LISTENERS
        }
        security_args, security_env = listener_security.tidalmq_args(ports, pki)
        broker.args = [
            "--flush-interval-ms",
            str(args.flush_interval_ms),
            "--flush-bytes",
            str(args.flush_bytes),
            "--cache-bytes",
            str(args.cache_mb << 20),
            *security_args,
            *args.broker_arg,
        ]
        broker.env = {**security_env, "TIDALMQ_LOG_LEVEL": "WARNING"}
        broker.start()
        try:
            assert broker.proc is not None
            _create_topic(broker.bootstrap, args.partitions)
            bootstraps = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
            rows += _security_rows(
                "TidalMQ (local store)", bootstraps, broker.proc.pid, pool, args, pki
            )
        finally:
            code = broker.stop()
            if code not in (0, None):
                print(broker.tail_log(), file=sys.stderr)
            # gigabytes per row: gone before Kafka's part writes as much (the disk filled here)
            shutil.rmtree(workdir / "objects", ignore_errors=True)
        kafka = KafkaCluster(
            brokers=1,
            dir=workdir / "kafka",
            listeners=listener_security.kafka_listeners(),
            broker_config=listener_security.kafka_config(pki),
        )
        with kafka:
            listener_security.kafka_add_user(kafka.bootstrap)
            _create_topic(kafka.bootstrap, args.partitions)
            bootstraps = {
                name: kafka.listener_bootstrap(name) for name in listener_security.LISTENERS
            }
            pid = kafka.broker_nodes[0].pid
            assert pid is not None
            rows += _security_rows(
                f"Apache Kafka {kafka.version}", bootstraps, pid, pool, args, pki
            )
            version = kafka.version
    return rows, version


def render_security(
    rows: list[SecurityRow], args: argparse.Namespace, started: str, kafka_version: str
) -> str:
    lines = [
        f"Run {started} on {platform.node()} ({os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Apache Kafka {kafka_version}), load average (1/5/15 min) "
        "at the start of each row -> at its end in the last column.",
        "",
        f"Produce throughput as fast as the broker takes it, {args.record_size} B random records, "
        f"acks=all, {args.partitions} partitions, producer processes: {args.producers} "
        f"(confluent-kafka), linger.ms={args.linger_ms}, batch.size={args.batch_size}, "
        f"idempotence {'on' if args.idempotent else 'off'}; {args.warmup:.0f} s warm-up + "
        f"{args.duration:.0f} s per row. One broker of each, its listeners measured one after "
        "the other (again each round), each once the broker is idle after the previous one: "
        "PLAINTEXT; SSL (TLS, the broker's ECDSA P-256 certificate, no client "
        "certificate); SASL_SSL (SCRAM-SHA-512 over the same TLS); the same certificate, user "
        "and client settings for both (bench/listener_security.py). TidalMQ: local store, "
        f"flush {args.flush_interval_ms} ms / {args.flush_bytes >> 20} MiB, every append durable "
        "in its WAL object before the ack; Kafka: KRaft, one node, the page cache (no fsync "
        "before the ack, its default).",
        "",
        "| system | round | listener | MB/s | records/s | of PLAINTEXT (same round) | broker CPU "
        "(cores) | client CPU (cores) | broker peak RSS MB | notes | load |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    plain = {(r.system, r.round): r.phase.mb_s for r in rows if r.listener == "PLAINTEXT"}
    for r in rows:
        p = r.phase
        base = plain.get((r.system, r.round))
        share = f"{100 * p.mb_s / base:.0f}%" if base else ""
        lines.append(
            f"| {r.system} | {r.round} | {r.listener} | {p.mb_s:.1f} | {p.records_s:,.0f} | {share} | "
            f"{p.broker_cpu:.2f} | {p.client_cpu:.2f} | {p.peak_rss_mb:.0f} | {p.note} | "
            f"{p.load} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- report
def render(results: list[BackendResult], args: argparse.Namespace, started: str) -> str:
    lines = [
        f"Run {started} on {platform.node()} ({os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}), load average (1/5/15 min) at the start of each "
        "phase -> at its end in the last column.",
        "",
        f"Settings: {args.record_size} B records, acks=all, {args.partitions} partitions, "
        f"{args.producers} producer / {args.consumers} consumer processes, linger.ms="
        f"{args.linger_ms}, batch.size={args.batch_size}, max.in.flight={args.max_in_flight}, "
        f"idempotence {'on' if args.idempotent else 'off'}; {args.warmup:.0f} s warm-up + "
        f"{args.duration:.0f} s per produce phase; broker flush {args.flush_interval_ms} ms / "
        f"{args.flush_bytes >> 20} MiB, cache {args.cache_mb} MiB"
        + (f", extra broker flags {' '.join(args.broker_arg)}" if args.broker_arg else "")
        + ".",
        "",
        "| backend | phase | MB/s | records/s | p50 ms | p95 ms | p99 ms | max ms | broker CPU "
        "(cores) | client CPU (cores) | broker peak RSS MB | notes | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v:.1f}"

    for r in results:
        for p in r.phases:
            lines.append(
                f"| {r.backend} | {p.name} | {p.mb_s:.1f} | {p.records_s:,.0f} | {ms(p.p50_ms)} | "
                f"{ms(p.p95_ms)} | {ms(p.p99_ms)} | {ms(p.max_ms)} | {p.broker_cpu:.2f} | "
                f"{p.client_cpu:.2f} | {p.peak_rss_mb:.0f} | {p.note} | {p.load} |"
            )
    lines.append("")
    for r in results:
        lines.append(f"Broker peak RSS over the whole {r.backend} run: {r.peak_rss_mb:.0f} MB.")
        lines.extend(f"{r.backend}: {n}" for n in r.notes)
    return "\n".join(lines)


def write_results(
    path: Path,
    section: str,
    markers: tuple[str, str] = (_BEGIN, _END),
    heading: str = "Latest run",
) -> None:
    begin, end = markers
    block = f"{begin}\n{section}\n{end}"
    if path.exists():
        text = path.read_text()
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            path.write_text(head + block + tail)
            return
        path.write_text(text.rstrip() + f"\n\n## {heading}\n\n" + block + "\n")
        return
    path.write_text(
        "# Broker benchmark (`bench/broker_throughput.py`)\n\n## Latest run\n\n" + block + "\n"
    )


@contextlib.contextmanager
def backends(
    args: argparse.Namespace, workdir: Path
) -> Iterator[list[tuple[str, str, dict[str, str]]]]:
    out: list[tuple[str, str, dict[str, str]]] = []
    server = None
    if args.backend in ("localdir", "both"):
        out.append(("local store", f"file://{workdir / 'objects'}", {}, None))
    try:
        if args.backend in ("s3", "both"):
            from tests.support.s3_server import start_s3_server

            server = start_s3_server(args.s3)
            pid = server.process.pid if server.process is not None else None
            out.append(
                (
                    f"S3 ({server.kind})",
                    server.url(prefix=server.unique_prefix("bench")),
                    server.env(),
                    pid,
                )
            )
        yield out
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["localdir", "s3", "both"], default="both")
    parser.add_argument("--s3", choices=["minio", "moto"], default=None, help="S3 server kind")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per produce phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--consumers", type=int, default=2, help="consumer processes")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--batch-size", type=int, default=1 << 20, help="librdkafka batch.size")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=1_000_000,
        help="librdkafka's default (5 with --idempotent)",
    )
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument(
        "--latency-mb-s", type=float, default=0.0, help="load of the latency phase (0: half max)"
    )
    parser.add_argument("--flush-interval-ms", type=float, default=5.0)
    parser.add_argument("--flush-bytes", type=int, default=4 << 20)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--consume-fraction", type=float, default=0.6)
    parser.add_argument("--fetch-partition-bytes", type=int, default=4 << 20)
    parser.add_argument("--consume-timeout", type=float, default=180.0)
    parser.add_argument(
        "--broker-arg", action="append", default=[], help="extra broker flag (repeatable)"
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy the broker per phase into this folder"
    )
    parser.add_argument("--results", type=Path, default=_REPO / "bench" / "RESULTS-broker.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="produce throughput over PLAINTEXT, SSL and SASL_SSL, TidalMQ and Apache Kafka",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="--tls: measure each system's listeners this often"
    )
    args = parser.parse_args()

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    workdir = Path(tempfile.mkdtemp(prefix="tidalmq-broker-bench-"))
    if args.tls:
        try:
            rows, kafka_version = run_security(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        section = render_security(rows, args, started, kafka_version)
        print()
        print(section)
        if not args.no_write:
            write_results(
                args.results,
                section,
                (_TLS_BEGIN, _TLS_END),
                "Produce throughput with TLS and SASL, next to plaintext",
            )
            print(f"\nwritten to {args.results}")
        return
    results: list[BackendResult] = []
    try:
        with backends(args, workdir) as chosen:
            for name, url, env, store_pid in chosen:
                print(f"== {name}: {url}", flush=True)
                results.append(
                    run_backend(name, url, env, args, workdir / name.split()[0], store_pid)
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = render(results, args, started)
    print()
    print(section)
    if not args.no_write:
        write_results(args.results, section)
        print(f"\nwritten to {args.results}")


if __name__ == "__main__":
    main()
