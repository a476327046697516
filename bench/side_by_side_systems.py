"""Apache Kafka and TidalMQ behind one small interface, plus the clients and probes that
``bench/side_by_side.py`` measures both with.

Everything that touches a system goes through its Kafka bootstrap address (the same CLI tools,
the same confluent-kafka clients, the same metadata polling), except starting, restarting and
growing a cluster, which each system does its own way.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import (
    KafkaCluster,
    assemble,
    java_executable,
    reassignment_plan,
    run_tool,
    tool_command,
)
from tests.support.broker_process import BrokerProcess
from tests.support.local_cluster import LocalClusterProcess

KAFKA = "Apache Kafka"
TIDALMQ = "TidalMQ"
MIB = 1 << 20
REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


# --------------------------------------------------------------------------------------------
# Page cache: what is resident, and evicting our own data files from it


def _files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out.extend(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes(path: Path) -> int:
    try:
        size = path.stat().st_size
        if size == 0:
            return 0
        with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            try:
                if _libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                    return 0
                return min(size, sum(1 for b in vec if b & 1) * _PAGE)
            finally:
                del addr  # release the exported buffer before the mmap closes
    except (OSError, ValueError, BufferError):
        return 0


def resident_bytes(paths: Iterable[Path]) -> tuple[int, int]:
    """(bytes of these files in the page cache, total bytes of these files)."""
    files = _files(paths)
    total = sum(f.stat().st_size for f in files if f.exists())
    return sum(_resident_bytes(f) for f in files), total


def evict_from_page_cache(paths: Iterable[Path]) -> None:
    """Write back and drop these files' pages from the page cache (POSIX_FADV_DONTNEED).

    Only our own benchmark files: the rest of the machine's cache is left alone."""
    for f in _files(paths):
        with contextlib.suppress(OSError):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --------------------------------------------------------------------------------------------
# The systems


class System:
    """A running cluster of either kind, reached through ``bootstrap``."""

    name: str
    bootstrap: str

    def broker_ids(self) -> list[int]:
        raise NotImplementedError

    def data_paths(self) -> list[Path]:
        """Where the partition data lives on this machine (page-cache eviction targets)."""
        raise NotImplementedError

    def restart(self, *, evict: bool) -> dict[str, Any]:
        """Stop the (single) broker cleanly, optionally evict its data from the page cache,
        start it again; returns what was resident before and after."""
        raise NotImplementedError

    def add_broker(self) -> int:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> System:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KafkaSystem(System):
    name = KAFKA

    def __init__(self, workdir: Path, brokers: int) -> None:
        self.cluster = KafkaCluster(brokers=brokers, dir=workdir)
        self.cluster.start()
        self.bootstrap = self.cluster.bootstrap

    def broker_ids(self) -> list[int]:
        return self.cluster.broker_ids

    def data_paths(self) -> list[Path]:
        return [n.data_dir for n in self.cluster.broker_nodes]

    def restart(self, *, evict: bool) -> dict[str, Any]:
        (node_id,) = self.cluster.broker_ids
        self.cluster.stop_node(node_id)
        before = resident_bytes(self.data_paths())
        if evict:
            evict_from_page_cache(self.data_paths())
        after = resident_bytes(self.data_paths())
        self.cluster.start_node(node_id)
        return _residency(before, after, evict)

    def add_broker(self) -> int:
        node = self.cluster.add_broker()
        self.bootstrap = self.cluster.bootstrap
        return node.node_id

    def stop(self) -> None:
        self.cluster.stop()
        shutil.rmtree(self.cluster.dir, ignore_errors=True)


class ObjectStorage:
    """Where TidalMQ keeps its data: a local directory (file://) or MinIO (s3://)."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self._s3: Any = None
        self.env: dict[str, str] = {}
        if kind == "local":
            self.root = workdir / "objects"
            self.root.mkdir(parents=True, exist_ok=True)
            self.url = f"file://{self.root}"
        elif kind == "minio":
            from tests.support.s3_server import start_s3_server

            self._s3 = start_s3_server("minio")
            assert self._s3.workdir is not None
            self.root = self._s3.workdir / "data"
            self.url = self._s3.url(prefix=f"sbs-{uuid.uuid4().hex[:8]}")
            self.env = self._s3.env()
        else:
            raise ValueError(f"unknown storage {kind!r} (local or minio)")

    def stop(self) -> None:
        if self._s3 is not None:
            self._s3.stop()


TIDAL_ENV = {"TIDALMQ_LOG_LEVEL": "WARNING"}


class TidalSingle(System):
    """One TidalMQ broker process with its embedded controller (restartable in place)."""

    name = TIDALMQ

    def __init__(self, workdir: Path, storage: ObjectStorage) -> None:
        self.storage = storage
        self.broker = BrokerProcess(storage.url, workdir / "logs", env={**TIDAL_ENV, **storage.env})
        self.broker.start(timeout_s=120)
        self.bootstrap = self.broker.bootstrap

    def broker_ids(self) -> list[int]:
        return [self.broker.broker_id]

    def data_paths(self) -> list[Path]:
        return [self.storage.root]

    def restart(self, *, evict: bool) -> dict[str, Any]:
        self.broker.stop(timeout_s=60)
        before = resident_bytes(self.data_paths())
        if evict:
            evict_from_page_cache(self.data_paths())
        after = resident_bytes(self.data_paths())
        self.broker.start(timeout_s=120)
        return _residency(before, after, evict)

    def stop(self) -> None:
        try:
            if self.broker.alive():
                self.broker.stop(timeout_s=60)
        finally:
            self.broker.kill()


class TidalCluster(System):
    """``tidalmq local up``: a controller and N broker processes sharing one object store."""

    name = TIDALMQ

    def __init__(self, workdir: Path, storage: ObjectStorage, brokers: int) -> None:
        self.storage = storage
        self.cluster = LocalClusterProcess(
            workdir / "cluster",
            brokers=brokers,
            storage_url=storage.url,
            env={**TIDAL_ENV, **storage.env},
        )
        self.cluster.start(timeout_s=180)
        self.bootstrap = self.cluster.bootstrap

    def broker_ids(self) -> list[int]:
        return sorted(
            b["broker"] for b in self.cluster.status()["brokers"] if b["state"] == "alive"
        )

    def data_paths(self) -> list[Path]:
        return [self.storage.root]

    def add_broker(self) -> int:
        broker = self.cluster.add_broker()
        self.bootstrap = self.cluster.status()["bootstrap"]
        return broker

    def stop(self) -> None:
        self.cluster.stop()


def _residency(before: tuple[int, int], after: tuple[int, int], evicted: bool) -> dict[str, Any]:
    return {
        "evicted": evicted,
        "data_mib": round(before[1] / MIB, 1),
        "resident_before_mib": round(before[0] / MIB, 1),
        "resident_after_evict_mib": round(after[0] / MIB, 1),
    }


# --------------------------------------------------------------------------------------------
# Admin and metadata through the Kafka protocol (the same calls for both systems)


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    assignment: Sequence[Sequence[int]] | None = None,
    timeout: float = 120.0,
) -> None:
    if assignment is None:
        client = admin(bootstrap)  # keep the handle alive until the result is in
        client.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout)
    else:
        # kafka-topics --replica-assignment (confluent-kafka 2.16 refuses an explicit assignment)
        spec = ",".join(":".join(map(str, replicas)) for replicas in assignment)
        run_tool(
            "kafka-topics",
            "--create",
            "--topic",
            topic,
            "--replica-assignment",
            spec,
            bootstrap=bootstrap,
            check=True,
        )
    wait_for(
        lambda: (
            all(s[0] >= 0 for s in partition_states(bootstrap, topic).values())
            and len(partition_states(bootstrap, topic)) == partitions
        ),
        timeout,
        f"topic {topic} leaders",
    )


def delete_topic(bootstrap: str, topic: str) -> None:
    with contextlib.suppress(Exception):
        client = admin(bootstrap)
        client.delete_topics([topic])[topic].result(60)


def partition_states(
    bootstrap: str, topic: str, client: AdminClient | None = None
) -> dict[int, tuple[int, tuple[int, ...]]]:
    """partition -> (leader, replicas) as the cluster's metadata tells a client."""
    md = (client or admin(bootstrap)).list_topics(topic, timeout=10)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return {}
    return {p: (m.leader, tuple(m.replicas)) for p, m in t.partitions.items()}


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class MetadataWatch:
    """Polls a topic's metadata every ``interval`` s in a thread, keeping every change with the
    client-side time it was first seen. After hurry(s), for s seconds, the polls follow each
    other back to back (one request in flight, ~1 ms apart), so a change then is timed to a
    millisecond or two rather than to ``interval``; otherwise every ``interval`` (a move of
    seconds is not loaded with hundreds of Metadata requests a second, nor the machine's
    cores with the polling)."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.02) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.interval = interval
        self._fast_until = 0.0
        self._hurried = threading.Event()  # wakes the poller out of its interval's wait
        self.history: list[tuple[float, dict[int, tuple[int, tuple[int, ...]]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._client = admin(bootstrap)

    def hurry(self, seconds: float) -> None:
        self._fast_until = time.monotonic() + seconds
        self._hurried.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                state = partition_states(self.bootstrap, self.topic, self._client)
                if state and (not self.history or self.history[-1][1] != state):
                    self.history.append((time.time(), state))
            if time.monotonic() >= self._fast_until:
                self._hurried.wait(self.interval)
                self._hurried.clear()

    def start(self) -> MetadataWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._hurried.set()
        self._thread.join(10)

    def latest(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        return self.history[-1][1] if self.history else {}

    def first_time(
        self, pred: Callable[[dict[int, tuple[int, tuple[int, ...]]]], bool]
    ) -> float | None:
        """When the state first satisfied ``pred`` and kept satisfying it up to now."""
        found: float | None = None
        for t, state in self.history:
            if pred(state):
                if found is None:
                    found = t
            else:
                found = None
        return found


# --------------------------------------------------------------------------------------------
# kafka-reassign-partitions, timed from outside the JVM


@dataclass
class ToolRun:
    tool: str
    returncode: int
    launched: float
    exited: float
    submitted: float | None  # when the tool printed "Successfully started partition reassignment"
    output: str = field(repr=False)

    @property
    def error(self) -> str | None:
        if self.returncode == 0:
            return None
        errors = [ln for ln in self.output.splitlines() if ln.startswith("Error")]
        tail = errors or self.output.strip().splitlines() or ["?"]
        return (tail[0] if errors else tail[-1])[:300]


def tidalmq_command() -> list[str]:
    """The `tidalmq` command a user runs: the console script installed next to this interpreter
    (what `pip install` makes: it imports tidalmq_broker.cli and calls main), so a move timed
    from the command's launch includes the real command's start; `python -m` where there is
    none."""
    script = Path(sys.executable).with_name("tidalmq")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tidalmq_broker.cli"]


def run_reassign_execute(
    bootstrap: str,
    moves: Mapping[tuple[str, int], Sequence[int]],
    *,
    throttle_bytes: int | None = None,
    plan: Mapping[str, Any] | None = None,
    tidalmq_cli: bool = False,
    additional: bool = False,
    on_submitted: Callable[[], None] | None = None,
) -> ToolRun:
    """``kafka-reassign-partitions --execute`` (or ``tidalmq reassign --execute``, its TidalMQ
    counterpart, when ``tidalmq_cli``), streaming its output to timestamp the submission.
    ``additional``: ``--additional``, submitted while earlier reassignments are in progress
    (without it the tool refuses to start while any is)."""
    document = dict(plan) if plan is not None else reassignment_plan(moves)
    with tempfile.TemporaryDirectory(prefix="sbs-plan-") as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(document))
        args = ["--execute", "--reassignment-json-file", str(path)]
        if throttle_bytes is not None:
            args += ["--throttle", str(throttle_bytes)]
        if additional:
            args.append("--additional")
        if tidalmq_cli:
            tool = "tidalmq reassign"
            cmd = [*tidalmq_command(), "reassign", "--bootstrap-server", bootstrap, *args]
        else:
            tool = "kafka-reassign-partitions"
            cmd = tool_command("kafka-reassign-partitions", *args, bootstrap=bootstrap)
        launched = time.time()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        submitted = None
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if submitted is None and "Successfully started partition reassignment" in line:
                submitted = time.time()
                if on_submitted is not None:
                    on_submitted()
        rc = proc.wait(300)
        return ToolRun(tool, rc, launched, time.time(), submitted, "".join(lines))


# --------------------------------------------------------------------------------------------
# confluent-kafka drivers


def ck_produce(
    bootstrap: str,
    topic: str,
    *,
    count: int,
    record_size: int = 1024,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Produce ``count`` records as fast as librdkafka takes them (acks=all); throughput over
    first produce() to flush() done, latency per record from produce() to its acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **(config or {})})
    latencies: list[float] = []
    errors = [0]

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors[0] += 1
        else:
            latencies.append(msg.latency())

    payload = os.urandom(record_size)
    # make sure the connection and metadata are there before the clock starts
    producer.list_topics(topic, timeout=30)
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 500 == 0:
            producer.poll(0)
    left = producer.flush(600)
    elapsed = time.perf_counter() - started
    if left or errors[0]:
        raise RuntimeError(f"confluent-kafka produce: {left} unflushed, {errors[0]} failed")
    return {
        "records": count,
        "seconds": round(elapsed, 3),
        "mib_per_sec": round(count * record_size / MIB / elapsed, 2),
        "records_per_sec": round(count / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "avg_ms": round(statistics.fmean(latencies) * 1000, 2),
    }


def ck_consume(
    bootstrap: str, topic: str, *, count: int, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Read ``count`` records from the start with a confluent-kafka consumer in a new group.

    ``mib_per_sec`` is over the fetch: from the partitions' assignment (librdkafka starts
    fetching then) to the last record, like kafka-consumer-perf-test's fetch.MB.sec, which also
    leaves out joining the group; ``total_s`` includes joining."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sbs-{uuid.uuid4().hex[:10]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    assigned: list[float] = []
    started = time.perf_counter()
    n = 0
    nbytes = 0
    try:
        consumer.subscribe([topic], on_assign=lambda c, parts: assigned.append(time.perf_counter()))
        deadline = time.monotonic() + timeout_s
        while n < count and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"consume error: {err}")
                n += 1
                nbytes += len(msg.value() or b"")
        ended = time.perf_counter()
    finally:
        consumer.close()
    if n < count or not assigned:
        raise RuntimeError(f"confluent-kafka consume read {n} of {count} records")
    fetch_s = max(ended - assigned[0], 1e-6)
    return {
        "records": n,
        "mib": round(nbytes / MIB, 1),
        "fetch_s": round(fetch_s, 3),
        "total_s": round(ended - started, 3),
        "mib_per_sec": round(nbytes / MIB / fetch_s, 2),
    }


def fill_topic(bootstrap: str, topic: str, mib: float, record_size: int = 1024) -> dict[str, Any]:
    """Fill a topic with kafka-producer-perf-test (acks=all, larger batches for speed)."""
    from bench.kafka.harness import producer_perf_test

    records = max(1, int(mib * MIB) // record_size)
    started = time.time()
    result, _ = producer_perf_test(
        bootstrap,
        topic,
        num_records=records,
        record_size=record_size,
        properties={"linger.ms": "20", "batch.size": str(512 * 1024)},
        timeout=3600,
    )
    return {
        "records": records,
        "mib": round(records * record_size / MIB, 1),
        "seconds": round(time.time() - started, 1),
        "mib_per_sec": result.mb_per_sec,
    }


# --------------------------------------------------------------------------------------------
# Starting the systems


@contextlib.contextmanager
def single_broker(kind: str, workdir: Path, storage: str) -> Iterator[System]:
    """One broker of either kind (Kafka: combined broker+controller node)."""
    path = workdir / f"{kind}-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True)
    store: ObjectStorage | None = None
    system: System | None = None
    try:
        if kind == "kafka":
            system = KafkaSystem(path, brokers=1)
        else:
            store = ObjectStorage(storage, path)
            system = TidalSingle(path, store)
        yield system
    finally:
        if system is not None:
            system.stop()
        if store is not None:
            store.stop()
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def cluster(kind: str, workdir: Path, storage: str, brokers: int) -> Iterator[System]:
    path = workdir / f"{kind}-{brokers}b-{uuid.uuid4().hex[:4]}"
    path.mkdir(parents=True)
    store: ObjectStorage | None = None
    system: System | None = None
    try:
        if kind == "kafka":
            system = KafkaSystem(path, brokers=brokers)
        else:
            store = ObjectStorage(storage, path)
            system = TidalCluster(path, store, brokers)
        yield system
    finally:
        if system is not None:
            system.stop()
        if store is not None:
            store.stop()
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# What a results page records about the run


def environment(storage: str, *, kafka: bool = True) -> dict[str, Any]:
    """The machine, the versions and the commit a run measured (``kafka=False``: without the
    Kafka release and Java, for runs that measure TidalMQ only)."""
    from importlib import metadata

    import confluent_kafka
    import tidalmq_broker

    mem = next(
        (
            ln.split()[1]
            for ln in Path("/proc/meminfo").read_text().splitlines()
            if ln.startswith("MemTotal")
        ),
        "0",
    )
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.machine(),
    )
    src = Path(tidalmq_broker.__file__).resolve().parent

    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(src), *args], capture_output=True, text=True, check=False
        )
        return proc.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "not a git checkout"
    # "modified" covers the broker and the controller it runs (tidalmq_controller, beside it)
    dirty = bool(git("status", "--porcelain", "--", ".", "../tidalmq_controller"))
    java = (
        subprocess.run(
            [java_executable(), "-version"], capture_output=True, text=True, check=False
        ).stderr.splitlines()
        if kafka
        else []
    )
    env = {
        "cores": os.cpu_count(),
        "ram_gib": round(int(mem) / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "kafka": assemble().version if kafka else "not used",
        "java": java[0] if java else "?",
        "python": platform.python_version(),
        "tidalmq": f"{tidalmq_broker.__version__} ({commit}{', modified' if dirty else ''}; "
        f"{src.relative_to(REPO) if src.is_relative_to(REPO) else src})",
        "confluent_kafka": f"{metadata.version('confluent-kafka')} (librdkafka {confluent_kafka.libversion()[0]})",
        "tidalmq_storage": storage,
    }
    if storage == "minio":
        from tests.support.s3_server import MINIO_VERSION

        env["minio"] = MINIO_VERSION
    return env
