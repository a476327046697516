"""Apache Kafka as a yardstick: the real broker, its CLI tools and its Java client.

Everything here is bootstrap-agnostic: the tool runners and perf-test parsers take a bootstrap
address and work the same against Apache Kafka started by :class:`KafkaCluster` and against
TidalMQ. Only the standard library is used, so ``bench/kafka/kafka`` runs with any Python 3.11.

Python API::

    from bench.kafka.harness import KafkaCluster, run_tool, producer_perf_test

    with KafkaCluster(brokers=2) as kafka:
        run_tool("kafka-topics", "--create", "--topic", "t", bootstrap=kafka.bootstrap, check=True)
        result = producer_perf_test(kafka.bootstrap, "t", num_records=10_000, record_size=1024)
        print(result.records_per_sec, result.p99_ms)

CLI (``bench/kafka/kafka`` or ``python -m bench.kafka``): ``assemble``, ``tools``,
``tool NAME ARGS...``, ``start --brokers N --dir DIR``, ``stop --dir DIR``, ``status --dir DIR``,
``java-client ...``, ``perf-producer ...``, ``perf-consumer ...``; see ``--help``.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Self

from bench.cache import cache_dir

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
ASSEMBLE_SCRIPT = HERE / "assemble.sh"
POM = HERE / "pom.xml"
SERVER_LOG4J = HERE / "log4j2-server.properties"
TOOLS_LOG4J = HERE / "log4j2-tools.properties"
JAVA_CLIENT_SOURCE = HERE / "java" / "ClientCheck.java"
JAVA_ACL_CHECK_SOURCE = HERE / "java" / "AclCheck.java"
JAVA_GROUP_PROTOCOL_SOURCE = HERE / "java" / "GroupProtocolCheck.java"
JAVA_RECORD_ERRORS_SOURCE = HERE / "java" / "RecordErrorsCheck.java"
JAVA_CONFIG_DOCS_SOURCE = HERE / "java" / "ConfigDocsCheck.java"
STREAMS_POM = HERE / "streams" / "pom.xml"
STREAMS_COUNT_SOURCE = HERE / "java" / "StreamsCount.java"

# JVM flags of Kafka's own kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS).
JVM_PERFORMANCE_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
# Short-lived tools start in about a third of the time with C1 only, the serial GC and a
# class-data-sharing archive of the tools' classes (kafka-topics --list: 2.6 s -> 1.0 s on this
# loaded 2-core machine). The perf tests, brokers and controllers keep Kafka's own flags above.
FAST_START_OPTS = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Xshare:auto",
    "-Xlog:disable",
    "-Xlog:all=error:stderr",
)
BROKER_HEAP = "1g"
CONTROLLER_HEAP = "512m"
TOOL_HEAP = "512m"
STARTED_MARKER = "Kafka Server started"


def pinned_version() -> str:
    """The Kafka release pinned in bench/kafka/pom.xml (overridable with KAFKA_VERSION)."""
    override = os.environ.get("KAFKA_VERSION")
    if override:
        return override
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> in {POM}")
    return match.group(1)


def cache_root() -> Path:
    return cache_dir()


# --------------------------------------------------------------------------------------------
# Assembly and the tool table


@dataclass(frozen=True)
class KafkaDist:
    """An assembled Kafka release: ``home/lib/*.jar`` is the whole runtime classpath."""

    home: Path
    version: str

    @property
    def lib(self) -> Path:
        return self.home / "lib"

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")

    def java_command(
        self,
        main_class: str,
        args: Sequence[str] = (),
        *,
        heap: str = TOOL_HEAP,
        log4j: Path = TOOLS_LOG4J,
        jvm_opts: Sequence[str] = (),
        fast_start: bool = False,
        create_archive: Path | None = None,
    ) -> list[str]:
        """The java command line; ``fast_start`` for short-lived tools (see FAST_START_OPTS).

        A fast-start command uses the CDS archive if there is one, else writes one to
        ``create_archive`` at exit (if given); see :func:`run_tool`.
        """
        opts: list[str] = list(JVM_PERFORMANCE_OPTS)
        if fast_start:
            opts = ["-Djava.awt.headless=true", *FAST_START_OPTS]
            if self.cds_archive.exists():
                opts.append(f"-XX:SharedArchiveFile={self.cds_archive}")
            elif create_archive is not None:
                opts.append(f"-XX:ArchiveClassesAtExit={create_archive}")
        return [
            java_executable(),
            f"-Xmx{heap}",
            *opts,
            f"-Dlog4j2.configurationFile={log4j}",
            *jvm_opts,
            "-cp",
            self.classpath,
            main_class,
            *args,
        ]

    @property
    def cds_archive(self) -> Path:
        """Class-data-sharing archive of the tools' classes, per release and per JVM."""
        java = os.path.realpath(java_executable())
        tag = hashlib.sha256(java.encode()).hexdigest()[:10]
        return self.home / f"tools-{tag}.jsa"

    def class_exists(self, class_name: str) -> bool:
        entry = class_name.replace(".", "/") + ".class"
        for jar in self.lib.glob("*.jar"):
            with zipfile.ZipFile(jar) as zf:
                try:
                    zf.getinfo(entry)
                except KeyError:
                    continue
                return True
        return False


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("java is not on PATH (Apache Kafka 4.x needs Java 17 or newer)")
    return found


_assemble_lock = threading.Lock()


@cache
def _assemble_cached(version: str, cache_dir: str, part: str = "") -> KafkaDist:
    env = {**os.environ, "KAFKA_VERSION": version, "TIDALMQ_CACHE_DIR": cache_dir}
    if part:  # an extra classpath beside the main one (bench/kafka/<part>/pom.xml)
        env.update(KAFKA_PART=part, KAFKA_POM=str(HERE / part / "pom.xml"))
    proc = subprocess.run(
        ["bash", str(ASSEMBLE_SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"assembling Apache Kafka {version} failed (exit {proc.returncode}):\n{proc.stderr}"
        )
    home = Path(proc.stdout.strip().splitlines()[-1])
    return KafkaDist(home=home, version=version)


def assemble(version: str | None = None) -> KafkaDist:
    """Resolve the pinned Kafka release into the cache (seconds when already there)."""
    with _assemble_lock:
        return _assemble_cached(version or pinned_version(), str(cache_root()))


def assemble_streams(version: str | None = None) -> KafkaDist:
    """Kafka Streams of the pinned release (bench/kafka/streams/pom.xml), in a classpath
    directory of its own used beside the main one (see streams_classpath)."""
    with _assemble_lock:
        return _assemble_cached(version or pinned_version(), str(cache_root()), "streams")


def assemble_connect_file(version: str | None = None) -> KafkaDist:
    """Kafka Connect's FileStream connectors of the pinned release
    (bench/kafka/connect-file/pom.xml), in a classpath directory of its own used beside the
    main one, which carries connect-runtime."""
    with _assemble_lock:
        return _assemble_cached(version or pinned_version(), str(cache_root()), "connect-file")


def streams_count_command(
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    app_id: str,
    state_dir: Path,
    guarantee: str = "exactly_once_v2",
) -> list[str]:
    """The word-counting Kafka Streams application (java/StreamsCount.java, a single-file
    source program) with processing.guarantee `guarantee`, as a command line."""
    dist, streams = assemble(), assemble_streams()
    return [
        java_executable(),
        f"-Xmx{TOOL_HEAP}",
        *FAST_START_OPTS,
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp",
        f"{dist.classpath}{os.pathsep}{streams.classpath}",
        str(STREAMS_COUNT_SOURCE),
        bootstrap,
        input_topic,
        output_topic,
        app_id,
        str(state_dir),
        guarantee,
    ]


# How a tool takes the address of the cluster it talks to.
PREPEND = "prepend"  # --bootstrap-server ADDR before everything (global option, argparse tools)
AFTER_SUBCOMMAND = "after-subcommand"  # kafka-cluster SUBCOMMAND --bootstrap-server ADDR
POSITIONAL = "positional"  # kafka-e2e-latency ADDR topic ...
BROKER_LIST = "broker-list"  # --broker-list ADDR
NO_BOOTSTRAP = None


@dataclass(frozen=True)
class ToolSpec:
    main_class: str
    bootstrap: str | None = PREPEND
    perf: bool = False  # a benchmark: runs with Kafka's JVM flags, not the fast-start ones


# The bin/*.sh scripts of Apache Kafka 4.x and the main classes they run (checked against the
# 4.3 jars: the tools moved from kafka.admin/kafka.tools into org.apache.kafka.tools.*, except
# kafka-configs and kafka-storage, which are still Scala).
TOOLS: dict[str, ToolSpec] = {
    "kafka-server-start": ToolSpec("kafka.Kafka", NO_BOOTSTRAP),
    "kafka-storage": ToolSpec("kafka.tools.StorageTool", NO_BOOTSTRAP),
    "kafka-configs": ToolSpec("kafka.admin.ConfigCommand"),
    "kafka-topics": ToolSpec("org.apache.kafka.tools.TopicCommand"),
    "kafka-console-producer": ToolSpec("org.apache.kafka.tools.ConsoleProducer"),
    "kafka-console-consumer": ToolSpec("org.apache.kafka.tools.consumer.ConsoleConsumer"),
    "kafka-console-share-consumer": ToolSpec(
        "org.apache.kafka.tools.consumer.ConsoleShareConsumer"
    ),
    "kafka-consumer-groups": ToolSpec("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"),
    "kafka-share-groups": ToolSpec("org.apache.kafka.tools.consumer.group.ShareGroupCommand"),
    "kafka-streams-groups": ToolSpec("org.apache.kafka.tools.streams.StreamsGroupCommand"),
    "kafka-groups": ToolSpec("org.apache.kafka.tools.GroupsCommand"),
    "kafka-reassign-partitions": ToolSpec(
        "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
    ),
    "kafka-producer-perf-test": ToolSpec("org.apache.kafka.tools.ProducerPerformance", perf=True),
    "kafka-consumer-perf-test": ToolSpec("org.apache.kafka.tools.ConsumerPerformance", perf=True),
    "kafka-share-consumer-perf-test": ToolSpec(
        "org.apache.kafka.tools.ShareConsumerPerformance", perf=True
    ),
    "kafka-e2e-latency": ToolSpec("org.apache.kafka.tools.EndToEndLatency", POSITIONAL, perf=True),
    "kafka-broker-api-versions": ToolSpec("org.apache.kafka.tools.BrokerApiVersionsCommand"),
    "kafka-metadata-quorum": ToolSpec("org.apache.kafka.tools.MetadataQuorumCommand"),
    "kafka-get-offsets": ToolSpec("org.apache.kafka.tools.GetOffsetShell"),
    "kafka-delete-records": ToolSpec("org.apache.kafka.tools.DeleteRecordsCommand"),
    "kafka-leader-election": ToolSpec("org.apache.kafka.tools.LeaderElectionCommand"),
    "kafka-log-dirs": ToolSpec("org.apache.kafka.tools.LogDirsCommand"),
    "kafka-features": ToolSpec("org.apache.kafka.tools.FeatureCommand"),
    "kafka-cluster": ToolSpec("org.apache.kafka.tools.ClusterTool", AFTER_SUBCOMMAND),
    "kafka-acls": ToolSpec("org.apache.kafka.tools.AclCommand"),
    "kafka-delegation-tokens": ToolSpec("org.apache.kafka.tools.DelegationTokenCommand"),
    "kafka-transactions": ToolSpec("org.apache.kafka.tools.TransactionsCommand"),
    "kafka-client-metrics": ToolSpec("org.apache.kafka.tools.ClientMetricsCommand"),
    "kafka-replica-verification": ToolSpec(
        "org.apache.kafka.tools.ReplicaVerificationTool", BROKER_LIST
    ),
    "kafka-verifiable-producer": ToolSpec("org.apache.kafka.tools.VerifiableProducer"),
    "kafka-verifiable-consumer": ToolSpec("org.apache.kafka.tools.VerifiableConsumer"),
    "kafka-streams-application-reset": ToolSpec("org.apache.kafka.tools.StreamsResetter"),
    "kafka-dump-log": ToolSpec("org.apache.kafka.tools.DumpLogSegments", NO_BOOTSTRAP),
    "kafka-jmx": ToolSpec("org.apache.kafka.tools.JmxTool", NO_BOOTSTRAP),
}


def tool_args(name: str, args: Sequence[str], bootstrap: str | None) -> list[str]:
    """The argument list of tool ``name``, with the bootstrap address put where it belongs."""
    spec = _spec(name)
    if bootstrap is None:
        return list(args)
    if spec.bootstrap == PREPEND:
        return ["--bootstrap-server", bootstrap, *args]
    if spec.bootstrap == AFTER_SUBCOMMAND:
        if not args:
            raise ValueError(f"{name} needs a subcommand before --bootstrap-server")
        return [args[0], "--bootstrap-server", bootstrap, *args[1:]]
    if spec.bootstrap == POSITIONAL:
        return [bootstrap, *args]
    if spec.bootstrap == BROKER_LIST:
        return ["--broker-list", bootstrap, *args]
    raise ValueError(f"{name} does not talk to a cluster; pass no bootstrap")


def _spec(name: str) -> ToolSpec:
    try:
        return TOOLS[name.removesuffix(".sh")]
    except KeyError:
        raise ValueError(
            f"unknown Kafka tool {name!r}; known: {', '.join(sorted(TOOLS))}"
        ) from None


def tool_command(
    name: str,
    *args: str,
    bootstrap: str | None = None,
    dist: KafkaDist | None = None,
    heap: str = TOOL_HEAP,
    create_archive: Path | None = None,
) -> list[str]:
    dist = dist or assemble()
    spec = _spec(name)
    return dist.java_command(
        spec.main_class,
        tool_args(name, args, bootstrap),
        heap=heap,
        fast_start=not spec.perf,
        create_archive=create_archive,
    )


class ToolError(subprocess.CalledProcessError):
    """A Kafka tool exited non-zero; the message carries the tails of its stdout (a Java
    check's report) and of its stderr (its progress, the exception), each its own: a long
    stderr does not push the report out."""

    def __str__(self) -> str:
        out = (self.stdout or "").strip().splitlines()[-10:]
        err = (self.stderr or "").strip().splitlines()[-30:]
        return "\n".join([super().__str__(), "stdout (tail):", *out, "stderr (tail):", *err])


def run_tool(
    name: str,
    *args: str,
    bootstrap: str | None = None,
    input: str | None = None,
    timeout: float = 180.0,
    check: bool = False,
    dist: KafkaDist | None = None,
    heap: str = TOOL_HEAP,
) -> subprocess.CompletedProcess[str]:
    """Run one Kafka CLI tool (by its script name, e.g. ``kafka-topics``) to completion.

    The first successful non-perf tool run also writes the CDS archive the later ones start from.
    """
    dist = dist or assemble()
    archive = dist.cds_archive
    tmp_archive = None
    if not _spec(name).perf and not archive.exists():
        tmp_archive = archive.with_name(f".{archive.name}.{os.getpid()}.{uuid.uuid4().hex}")
    cmd = tool_command(
        name, *args, bootstrap=bootstrap, dist=dist, heap=heap, create_archive=tmp_archive
    )
    try:
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if tmp_archive is not None and proc.returncode == 0 and tmp_archive.exists():
            tmp_archive.replace(archive)
    finally:
        if tmp_archive is not None:
            tmp_archive.unlink(missing_ok=True)
    if check and proc.returncode != 0:
        raise ToolError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return proc


# --------------------------------------------------------------------------------------------
# Console producer / consumer helpers


def console_produce(
    bootstrap: str,
    topic: str,
    lines: Sequence[str],
    *,
    key_separator: str | None = None,
    properties: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Send ``lines`` with kafka-console-producer (one record each; optional ``key<sep>value``)."""
    args = ["--topic", topic]
    if key_separator is not None:
        args += ["--reader-property", "parse.key=true"]
        args += ["--reader-property", f"key.separator={key_separator}"]
    for k, v in (properties or {}).items():
        args += ["--command-property", f"{k}={v}"]
    payload = "".join(f"{line}\n" for line in lines)
    return run_tool(
        "kafka-console-producer",
        *args,
        bootstrap=bootstrap,
        input=payload,
        timeout=timeout,
        check=True,
    )


def console_consume(
    bootstrap: str,
    topic: str,
    max_messages: int,
    *,
    group: str | None = None,
    from_beginning: bool = True,
    print_key: bool = False,
    timeout_ms: int = 30_000,
    properties: Mapping[str, str] | None = None,
) -> list[str]:
    """Read up to ``max_messages`` records with kafka-console-consumer; returns the lines."""
    args = ["--topic", topic, "--max-messages", str(max_messages), "--timeout-ms", str(timeout_ms)]
    if from_beginning:
        args.append("--from-beginning")
    if group is not None:
        args += ["--group", group]
    if print_key:
        args += ["--formatter-property", "print.key=true"]
    for k, v in (properties or {}).items():
        args += ["--command-property", f"{k}={v}"]
    proc = run_tool(
        "kafka-console-consumer",
        *args,
        bootstrap=bootstrap,
        timeout=timeout_ms / 1000 + 120,
        check=False,
    )
    lines = proc.stdout.splitlines()
    # On --timeout-ms the console consumer logs a TimeoutException and exits 1 (or 0, by
    # version); short reads are for the caller to judge, anything else is an error.
    if proc.returncode != 0 and "TimeoutException" not in proc.stderr:
        raise ToolError(
            proc.returncode, ["kafka-console-consumer", *args], proc.stdout, proc.stderr
        )
    return lines


def parse_table(output: str, first_column: str) -> list[dict[str, str]]:
    """Rows of a whitespace-aligned table such as kafka-consumer-groups prints.

    The header is the first line whose first word is ``first_column`` (e.g. "GROUP"); each
    following non-empty line up to a blank line or another header is a row keyed by the header.
    """
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for raw in output.splitlines():
        words = raw.split()
        if words and words[0] == first_column:
            header = words
            continue
        if header is None:
            continue
        if not words:
            header = None
            continue
        if len(words) != len(header):
            raise ValueError(f"row {words} does not match header {header}")
        rows.append(dict(zip(header, words, strict=True)))
    return rows


# --------------------------------------------------------------------------------------------
# Perf tests: run and parse


_PRODUCER_SUMMARY = re.compile(
    r"^(?P<records>\d+) (?P<steady>steady state )?records sent, "
    r"(?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, "
    r"(?P<p50>[\d.]+) ms 50th, (?P<p95>[\d.]+) ms 95th, (?P<p99>[\d.]+) ms 99th, "
    r"(?P<p999>[\d.]+) ms 99\.9th\.$"
)


@dataclass(frozen=True)
class ProducerPerfResult:
    """A summary line of kafka-producer-perf-test (latencies in ms, MB = 2**20 B)."""

    records: int
    records_per_sec: float
    mb_per_sec: float
    avg_latency_ms: float
    max_latency_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    steady_state: bool = False


def parse_producer_perf(output: str, *, steady_state: bool = False) -> ProducerPerfResult:
    """Parse the summary of kafka-producer-perf-test.

    The whole-run summary is the line with percentiles; the periodic progress lines have none.
    With ``--warmup-records`` the tool adds a "steady state" summary, returned when
    ``steady_state=True``.
    """
    for raw in output.splitlines():
        m = _PRODUCER_SUMMARY.match(raw.strip())
        if m is None or bool(m["steady"]) != steady_state:
            continue
        return ProducerPerfResult(
            records=int(m["records"]),
            records_per_sec=float(m["rps"]),
            mb_per_sec=float(m["mbps"]),
            avg_latency_ms=float(m["avg"]),
            max_latency_ms=float(m["max"]),
            p50_ms=float(m["p50"]),
            p95_ms=float(m["p95"]),
            p99_ms=float(m["p99"]),
            p999_ms=float(m["p999"]),
            steady_state=steady_state,
        )
    kind = "steady-state summary" if steady_state else "summary"
    raise ValueError(f"no kafka-producer-perf-test {kind} line in output:\n{output[-2000:]}")


_CONSUMER_COLUMNS = {
    "start.time": "start_time",
    "end.time": "end_time",
    "data.consumed.in.MB": "data_mb",
    "MB.sec": "mb_per_sec",
    "data.consumed.in.nMsg": "records",
    "nMsg.sec": "records_per_sec",
    "rebalance.time.ms": "rebalance_ms",
    "fetch.time.ms": "fetch_ms",
    "fetch.MB.sec": "fetch_mb_per_sec",
    "fetch.nMsg.sec": "fetch_records_per_sec",
}


@dataclass(frozen=True)
class ConsumerPerfResult:
    """The summary of kafka-consumer-perf-test (MB = 2**20 B; fetch_* exclude rebalancing)."""

    start_time: str
    end_time: str
    data_mb: float
    mb_per_sec: float
    records: int
    records_per_sec: float
    rebalance_ms: float
    fetch_ms: float
    fetch_mb_per_sec: float
    fetch_records_per_sec: float


def parse_consumer_perf(output: str) -> ConsumerPerfResult:
    """Parse the header and summary row of kafka-consumer-perf-test (without detailed stats)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        header = [h.strip() for h in line.split(",")]
        if header[:2] != ["start.time", "end.time"] or i + 1 >= len(lines):
            continue
        values = [v.strip() for v in lines[i + 1].split(",")]
        if len(values) != len(header):
            raise ValueError(f"consumer perf row {values} does not match header {header}")
        row = dict(zip(header, values, strict=True))
        missing = set(_CONSUMER_COLUMNS) - set(row)
        if missing:
            raise ValueError(f"consumer perf output lacks columns {sorted(missing)}")
        return ConsumerPerfResult(
            start_time=row["start.time"],
            end_time=row["end.time"],
            data_mb=float(row["data.consumed.in.MB"]),
            mb_per_sec=float(row["MB.sec"]),
            records=int(row["data.consumed.in.nMsg"]),
            records_per_sec=float(row["nMsg.sec"]),
            rebalance_ms=float(row["rebalance.time.ms"]),
            fetch_ms=float(row["fetch.time.ms"]),
            fetch_mb_per_sec=float(row["fetch.MB.sec"]),
            fetch_records_per_sec=float(row["fetch.nMsg.sec"]),
        )
    raise ValueError(f"no kafka-consumer-perf-test summary in output:\n{output[-2000:]}")


def producer_perf_test(
    bootstrap: str,
    topic: str,
    *,
    num_records: int,
    record_size: int = 1024,
    throughput: int = -1,
    acks: str = "all",
    properties: Mapping[str, str] | None = None,
    timeout: float = 1800.0,
) -> tuple[ProducerPerfResult, subprocess.CompletedProcess[str]]:
    """Run kafka-producer-perf-test (``--producer-props acks=...``) and parse its summary."""
    props = [f"acks={acks}", *(f"{k}={v}" for k, v in (properties or {}).items())]
    proc = run_tool(
        "kafka-producer-perf-test",
        *producer_perf_args(topic, num_records, record_size, throughput, props),
        bootstrap=bootstrap,
        timeout=timeout,
        check=True,
    )
    return parse_producer_perf(proc.stdout), proc


def producer_perf_args(
    topic: str, num_records: int, record_size: int, throughput: int, props: Sequence[str]
) -> list[str]:
    return [
        "--topic",
        topic,
        "--num-records",
        str(num_records),
        "--record-size",
        str(record_size),
        "--throughput",
        str(throughput),
        "--producer-props",
        *props,
    ]


def consumer_perf_test(
    bootstrap: str,
    topic: str,
    *,
    num_records: int,
    timeout_ms: int = 30_000,
    group: str | None = None,
    properties: Mapping[str, str] | None = None,
    timeout: float = 1800.0,
) -> tuple[ConsumerPerfResult, subprocess.CompletedProcess[str]]:
    """Run kafka-consumer-perf-test over ``num_records`` from the start and parse its summary."""
    args = ["--topic", topic, "--num-records", str(num_records), "--timeout", str(timeout_ms)]
    if group is not None:
        args += ["--group", group]
    for k, v in (properties or {}).items():
        args += ["--command-property", f"{k}={v}"]
    proc = run_tool(
        "kafka-consumer-perf-test", *args, bootstrap=bootstrap, timeout=timeout, check=True
    )
    result = parse_consumer_perf(proc.stdout)
    return result, proc


# --------------------------------------------------------------------------------------------
# kafka-reassign-partitions: plans in, parsed results out


def reassignment_plan(moves: Mapping[tuple[str, int], Sequence[int]]) -> dict[str, Any]:
    """The reassignment JSON moving each (topic, partition) onto the given replica list."""
    return {
        "version": 1,
        "partitions": [
            {"topic": topic, "partition": partition, "replicas": list(replicas)}
            for (topic, partition), replicas in sorted(moves.items())
        ],
    }


def _json_after(output: str, heading: str) -> dict[str, Any]:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(heading):
            for following in lines[i + 1 :]:
                if following.strip().startswith("{"):
                    parsed: dict[str, Any] = json.loads(following)
                    return parsed
    raise ValueError(f"no JSON after {heading!r} in output:\n{output[-2000:]}")


def _run_with_json_file(
    args: Sequence[str], flag: str, document: Mapping[str, Any], bootstrap: str, check: bool
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="kafka-reassign-") as tmp:
        path = Path(tmp) / "input.json"
        path.write_text(json.dumps(document))
        return run_tool(
            "kafka-reassign-partitions", *args, flag, str(path), bootstrap=bootstrap, check=check
        )


def reassign_generate(
    bootstrap: str, topics: Sequence[str], broker_ids: Sequence[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--generate``: returns (current assignment, proposed assignment)."""
    document = {"version": 1, "topics": [{"topic": t} for t in topics]}
    proc = _run_with_json_file(
        ["--generate", "--broker-list", ",".join(map(str, broker_ids))],
        "--topics-to-move-json-file",
        document,
        bootstrap,
        check=True,
    )
    return (
        _json_after(proc.stdout, "Current partition replica assignment"),
        _json_after(proc.stdout, "Proposed partition reassignment configuration"),
    )


def reassign_execute(
    bootstrap: str, plan: Mapping[str, Any], *, throttle_bytes_per_sec: int | None = None
) -> dict[str, Any]:
    """``--execute`` the plan (optionally throttled); returns the rollback (current) assignment."""
    args = ["--execute"]
    if throttle_bytes_per_sec is not None:
        args += ["--throttle", str(throttle_bytes_per_sec)]
    proc = _run_with_json_file(args, "--reassignment-json-file", plan, bootstrap, check=True)
    if "Successfully started partition reassignment" not in proc.stdout:
        raise ToolError(0, ["kafka-reassign-partitions", *args], proc.stdout, proc.stderr)
    return _json_after(proc.stdout, "Current partition replica assignment")


_VERIFY_LINES = (
    (re.compile(r"^Reassignment of partition (\S+) is completed\.$"), "completed"),
    (re.compile(r"^Reassignment of partition (\S+) is still in progress\.$"), "in progress"),
    (
        re.compile(r"^There is no active reassignment of partition (\S+), but replica set is"),
        "not as planned",
    ),
)


def reassign_verify(bootstrap: str, plan: Mapping[str, Any]) -> dict[str, str]:
    """``--verify``: state per "topic-partition": completed, in progress, or not as planned.

    As in Kafka, a verify that finds everything completed also clears the throttles.
    """
    proc = _run_with_json_file(["--verify"], "--reassignment-json-file", plan, bootstrap, False)
    states: dict[str, str] = {}
    for raw in proc.stdout.splitlines():
        for pattern, state in _VERIFY_LINES:
            m = pattern.match(raw.strip())
            if m:
                states[m.group(1).rstrip(",")] = state
    if not states:
        raise ToolError(
            proc.returncode, ["kafka-reassign-partitions", "--verify"], proc.stdout, proc.stderr
        )
    return states


def reassign_cancel(bootstrap: str, plan: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """``--cancel`` the ongoing reassignments of the plan (reverting to the old replicas)."""
    return _run_with_json_file(["--cancel"], "--reassignment-json-file", plan, bootstrap, True)


def wait_reassigned(
    bootstrap: str, plan: Mapping[str, Any], *, timeout: float = 600.0, interval: float = 1.0
) -> float:
    """Poll ``--verify`` until every partition of the plan is completed; returns seconds taken.

    Each poll starts a JVM (about a second here), which bounds the resolution.
    """
    started = time.monotonic()
    while True:
        states = reassign_verify(bootstrap, plan)
        if states and all(state == "completed" for state in states.values()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"reassignment not completed after {timeout:.0f}s: {states}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# Java client checks (bench/kafka/java/ClientCheck.java, run as a single-file source program)


def java_client_command(
    *args: str, dist: KafkaDist | None = None, source: Path = JAVA_CLIENT_SOURCE
) -> list[str]:
    dist = dist or assemble()
    return [
        java_executable(),
        f"-Xmx{TOOL_HEAP}",
        *FAST_START_OPTS,
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp",
        dist.classpath,
        str(source),
        *args,
    ]


class JavaTimedOut(subprocess.TimeoutExpired):
    """A Java check did not finish in time: the message carries where its threads were (the
    JVM's thread dump, taken with SIGQUIT before it was killed) and the tail of what it
    printed, as ToolError's does."""

    def __str__(self) -> str:
        out = self.stdout if isinstance(self.stdout, str) else ""
        err = self.stderr if isinstance(self.stderr, str) else ""
        return "\n".join(
            [
                super().__str__(),
                *java_thread_stacks(out),
                "stderr (tail):",
                *err.strip().splitlines()[-40:],
            ]
        )


def java_thread_stacks(dump: str, threads: Sequence[str] = ("main",)) -> list[str]:
    """The stacks of `threads` (and of every thread whose name starts with "kafka-") in a
    JVM thread dump, as lines; the rest of the output (the check's own lines) is left out."""
    lines: list[str] = []
    keep = False
    for line in dump.splitlines():
        if line.startswith('"'):  # a thread's header: "name" #1 prio=5 ...
            name = line[1:].split('"', 1)[0]
            keep = name in threads or name.startswith("kafka-")
        elif not line.strip():  # a blank line ends a thread's stack
            keep = False
        if keep:
            lines.append(line)
    return lines


def run_java(
    cmd: list[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a JVM to completion. Past `timeout` it is asked for a thread dump (SIGQUIT, printed
    on its stdout), killed, and JavaTimedOut says where it was stuck and what it printed until
    then (subprocess.run's TimeoutExpired says neither)."""
    with subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)  # the dump takes a moment; the JVM goes on running after it
            proc.kill()
            out, err = proc.communicate()
            raise JavaTimedOut(cmd, timeout, out, err) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_java_client(
    *args: str,
    timeout: float = 300.0,
    command_config: str | Path | None = None,
    source: Path = JAVA_CLIENT_SOURCE,
) -> dict[str, Any]:
    """Run ClientCheck (or another single-file check, ``source``) with ``args``; returns its
    JSON report (raises if it fails). ``command_config``: a client.properties every client of
    the check starts from (security)."""
    cmd = java_client_command(*args, source=source)
    env = {**os.environ, "CLIENT_CHECK_CONFIG": str(command_config or "")}
    proc = run_java(cmd, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise ToolError(proc.returncode, cmd, proc.stdout, proc.stderr)
    reports = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not reports:
        raise ToolError(proc.returncode, cmd, proc.stdout, proc.stderr)
    report: dict[str, Any] = json.loads(reports[-1])
    return report


def java_produce(
    bootstrap: str, topic: str, count: int, *, command_config: str | Path | None = None
) -> dict[str, Any]:
    """Produce ``count`` records with a KafkaProducer on default settings (idempotence on)."""
    return run_java_client("produce", bootstrap, topic, str(count), command_config=command_config)


def java_consume(
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    timeout_ms: int = 60_000,
    *,
    command_config: str | Path | None = None,
) -> dict[str, Any]:
    """Consume ``count`` records in consumer group ``group`` from the earliest offset, commit.
    ``timeout_ms``: how long the consumer may go without progress (created, assigned, a new
    record) before it stops short (ClientCheck.java)."""
    return run_java_client(
        "consume",
        bootstrap,
        topic,
        group,
        str(count),
        str(timeout_ms),
        command_config=command_config,
    )


def java_acl_check(
    bootstrap: str,
    topic: str,
    group: str,
    new_topic: str,
    *,
    command_config: str | Path | None = None,
) -> dict[str, str]:
    """What the Java client gets for produce, consume in ``group``, describeConfigs of ``topic``
    and createTopics of ``new_topic``: "ok" or the exception's simple name, per operation
    (java/AclCheck.java)."""
    report = run_java_client(
        bootstrap,
        topic,
        group,
        new_topic,
        command_config=command_config,
        source=JAVA_ACL_CHECK_SOURCE,
        timeout=180,
    )
    return {k: str(v) for k, v in report.items()}


# --------------------------------------------------------------------------------------------
# KRaft clusters on loopback


def kafka_uuid() -> str:
    """A random Kafka Uuid in its string form (URL-safe base64, no padding, no leading '-')."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the kernel calls free right now (never 9092)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port != 9092:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the JVM if the Python process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class KafkaNode:
    node_id: int
    roles: tuple[str, ...]
    dir: Path
    port: int | None  # PLAINTEXT broker listener
    controller_port: int | None
    pid: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    # more broker listeners (KafkaCluster's `listeners`): listener name -> port
    listener_ports: dict[str, int] = field(default_factory=dict)

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles

    @property
    def config_path(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def server_log(self) -> Path:
        return self.log_dir / "server.log"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def address(self) -> str:
        if self.port is None:
            raise ValueError(f"node {self.node_id} has no broker listener")
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and _pid_runs(self.pid, self.config_path)

    def send_signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the node's process; one that has just exited is no error."""
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "roles": list(self.roles),
            "dir": str(self.dir),
            "port": self.port,
            "controller_port": self.controller_port,
            "pid": self.pid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KafkaNode:
        return cls(
            node_id=int(data["node_id"]),
            roles=tuple(data["roles"]),
            dir=Path(data["dir"]),
            port=data["port"],
            controller_port=data["controller_port"],
            pid=data["pid"],
        )


def _pid_runs(pid: int, config_path: Path) -> bool:
    """True if ``pid`` is alive and is the JVM started with ``config_path`` (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and str(config_path).encode() in cmdline


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


class KafkaStartError(RuntimeError):
    pass


class KafkaCluster:
    """A KRaft Apache Kafka cluster on loopback, as a context manager.

    ``brokers=1``: one combined broker+controller node (node id 1).
    ``brokers=N>1``: one dedicated controller (node id 3000) and brokers with node ids 1..N.
    Listeners are on free 127.0.0.1 ports; ``bootstrap`` lists all brokers. Each node lives in
    ``DIR/node-<id>/`` (``server.properties``, ``data/``, ``logs/server.log``, ``console.log``).
    ``DIR/cluster.json`` records the nodes, so ``KafkaCluster.attach(DIR).stop()`` (the CLI's
    ``stop``) works from another process. Without ``dir`` a temporary directory is used and
    removed on stop.

    ``detach=False`` (the default) ties the JVMs to this Python process: they get SIGTERM when it
    dies. ``detach=True`` (the CLI's ``start``) leaves them running after it exits.

    ``listeners``: more broker listeners beside PLAINTEXT, name -> security protocol (e.g.
    ``{"SSL": "SSL", "SASL_SSL": "SASL_SSL"}``), each on a free port of every broker
    (``listener_bootstrap(name)``); their TLS and SASL settings go in ``broker_config``.

    ``broker_config`` / ``controller_config``: more settings for every broker / controller (a
    combined node of a 1-broker cluster gets both).
    """

    CONTROLLER_ID = 3000

    def __init__(
        self,
        brokers: int = 1,
        *,
        dir: Path | str | None = None,
        dist: KafkaDist | None = None,
        broker_heap: str = BROKER_HEAP,
        controller_heap: str = CONTROLLER_HEAP,
        broker_config: Mapping[str, str] | None = None,
        controller_config: Mapping[str, str] | None = None,
        listeners: Mapping[str, str] | None = None,
        detach: bool = False,
        start_timeout: float = 180.0,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self.brokers = brokers
        self._own_dir = dir is None
        self.dir = Path(dir) if dir is not None else Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self.dist = dist
        self.broker_heap = broker_heap
        self.controller_heap = controller_heap
        self.broker_config = dict(broker_config or {})
        self.controller_config = dict(controller_config or {})
        self.listeners = dict(listeners or {})
        self.detach = detach
        self.start_timeout = start_timeout
        self.cluster_id = kafka_uuid()
        self.nodes: dict[int, KafkaNode] = {}
        self.voters = ""
        self._atexit_registered = False

    # -- public view --------------------------------------------------------------------------

    @property
    def broker_nodes(self) -> list[KafkaNode]:
        return [n for n in self.nodes.values() if n.is_broker]

    @property
    def broker_ids(self) -> list[int]:
        return sorted(n.node_id for n in self.broker_nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in sorted(self.broker_nodes, key=lambda n: n.node_id))

    def listener_bootstrap(self, name: str) -> str:
        """The brokers' addresses on one of the `listeners` (PLAINTEXT: `bootstrap`)."""
        if name == "PLAINTEXT":
            return self.bootstrap
        nodes = sorted(self.broker_nodes, key=lambda n: n.node_id)
        return ",".join(f"127.0.0.1:{n.listener_ports[name]}" for n in nodes)

    @property
    def controller_bootstrap(self) -> str:
        return ",".join(
            f"127.0.0.1:{n.controller_port}" for n in self.nodes.values() if n.is_controller
        )

    @property
    def version(self) -> str:
        return self._dist().version

    def _dist(self) -> KafkaDist:
        if self.dist is None:
            self.dist = assemble()
        return self.dist

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Format storage and start every node; returns once all report 'Kafka Server started'."""
        if self.nodes:
            raise RuntimeError("cluster already started")
        self._dist()
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / "cluster.json").exists():
            raise RuntimeError(f"{self.dir} already holds a cluster; stop it or use another dir")
        if self.brokers == 1:
            broker_port, controller_port = free_ports(2)
            self.nodes[1] = KafkaNode(
                1, ("broker", "controller"), self.dir / "node-1", broker_port, controller_port
            )
            self.voters = f"1@127.0.0.1:{controller_port}"
        else:
            ports = free_ports(self.brokers + 1)
            cid = self.CONTROLLER_ID
            self.nodes[cid] = KafkaNode(
                cid, ("controller",), self.dir / f"node-{cid}", None, ports[0]
            )
            self.voters = f"{cid}@127.0.0.1:{ports[0]}"
            for i in range(1, self.brokers + 1):
                self.nodes[i] = KafkaNode(i, ("broker",), self.dir / f"node-{i}", ports[i], None)
        for node in self.broker_nodes:
            node.listener_ports = self._listener_ports()
        try:
            nodes = list(self.nodes.values())
            for node in nodes:
                self._write_config(node)
            self._format(nodes)
            for node in nodes:
                self._launch(node)
            self._save_state()
            self._wait_started(nodes)
        except BaseException:
            self.stop()
            raise
        if not self.detach and not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        return self

    def add_broker(self) -> KafkaNode:
        """Start one more broker (next node id) in the running cluster; returns its node."""
        if not self.nodes:
            raise RuntimeError("cluster not started")
        node_id = max(n.node_id for n in self.broker_nodes) + 1
        (port,) = free_ports(1)
        node = KafkaNode(node_id, ("broker",), self.dir / f"node-{node_id}", port, None)
        node.listener_ports = self._listener_ports()
        self.nodes[node_id] = node
        self._write_config(node)
        self._format([node])
        self._launch(node)
        self._save_state()
        self._wait_started([node])
        return node

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        """SIGTERM one node (controlled shutdown for a broker) and wait for it to exit."""
        self._terminate([self.nodes[node_id]], timeout)
        self._save_state()

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (kill -9: no controlled shutdown, nothing flushed) and reap it;
        ``start_node`` restarts it on its data."""
        node = self.nodes[node_id]
        if node.running():
            node.send_signal(signal.SIGKILL)
        if node.process is not None:
            node.process.wait()
        self._save_state()

    def start_node(self, node_id: int) -> None:
        """Restart a stopped node on its old ports and data."""
        node = self.nodes[node_id]
        if node.running():
            raise RuntimeError(f"node {node_id} is running")
        self._launch(node)
        self._save_state()
        self._wait_started([node], since_restart=True)

    def stop_all(self, timeout: float = 60.0) -> None:
        """A full outage that keeps every node's data and ports: SIGTERM to every broker at once
        (controlled shutdown needs the controller), then to the controllers; ``start_all``
        brings the same cluster back."""
        brokers = [n for n in self.nodes.values() if n.is_broker and not n.is_controller]
        self._terminate(brokers, timeout)
        self._terminate([n for n in self.nodes.values() if n not in brokers], timeout)
        self._save_state()

    def start_all(self) -> None:
        """Every node of a cluster stopped by ``stop_all`` again, on its old ports and data;
        returns once each reports 'Kafka Server started' since this start."""
        nodes = list(self.nodes.values())
        if any(n.running() for n in nodes):
            raise RuntimeError("start_all: some nodes are running")
        offsets = {
            n.node_id: n.server_log.stat().st_size if n.server_log.exists() else 0 for n in nodes
        }
        for node in nodes:
            self._launch(node)
        self._save_state()
        self._wait_started(nodes, offsets=offsets)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop brokers first (controlled shutdown needs the controller), then controllers."""
        brokers = [n for n in self.nodes.values() if n.is_broker and not n.is_controller]
        others = [n for n in self.nodes.values() if n not in brokers]
        self._terminate(brokers, timeout)
        self._terminate(others, timeout)
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        state = self.dir / "cluster.json"
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif state.exists():
            state.unlink()

    @classmethod
    def attach(cls, dir: Path | str) -> KafkaCluster:
        """The cluster recorded in ``dir/cluster.json`` by a (possibly other) process."""
        dir = Path(dir)
        state = json.loads((dir / "cluster.json").read_text())
        cluster = cls(brokers=max(1, len(state["nodes"]) - 1), dir=dir, detach=True)
        cluster.cluster_id = state["cluster_id"]
        cluster.voters = state["voters"]
        cluster.nodes = {n["node_id"]: KafkaNode.from_json(n) for n in state["nodes"]}
        cluster.brokers = len(cluster.broker_nodes)
        cluster.dist = KafkaDist(Path(state["kafka_home"]), state["kafka_version"])
        return cluster

    def status(self) -> dict[str, Any]:
        return {
            "kafka_version": self.version,
            "cluster_id": self.cluster_id,
            "bootstrap": self.bootstrap,
            "controller_bootstrap": self.controller_bootstrap,
            "dir": str(self.dir),
            "nodes": [{**n.to_json(), "running": n.running()} for n in self.nodes.values()],
        }

    # -- internals ----------------------------------------------------------------------------

    def _listener_ports(self) -> dict[str, int]:
        return dict(zip(self.listeners, free_ports(len(self.listeners)), strict=True))

    def _write_config(self, node: KafkaNode) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.log_dir.mkdir(exist_ok=True)
        listeners = []
        if node.port is not None:
            listeners.append(f"PLAINTEXT://127.0.0.1:{node.port}")
        if node.controller_port is not None:
            listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        extra = [f"{name}://127.0.0.1:{port}" for name, port in node.listener_ports.items()]
        listeners += extra
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        protocols += [f"{name}:{self.listeners[name]}" for name in node.listener_ports]
        internal_rf = str(min(self.brokers, 3))
        config: dict[str, str] = {
            "process.roles": ",".join(node.roles),
            "node.id": str(node.node_id),
            "controller.quorum.voters": self.voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(node.data_dir),
        }
        if node.is_broker:
            config |= {
                "advertised.listeners": ",".join([f"PLAINTEXT://127.0.0.1:{node.port}", *extra]),
                "inter.broker.listener.name": "PLAINTEXT",
                "num.partitions": "1",
                "offsets.topic.replication.factor": internal_rf,
                "transaction.state.log.replication.factor": internal_rf,
                "transaction.state.log.min.isr": "1",
                "share.coordinator.state.topic.replication.factor": internal_rf,
                "share.coordinator.state.topic.min.isr": "1",
                "group.initial.rebalance.delay.ms": "0",
                **self.broker_config,
            }
        if node.is_controller:
            config |= self.controller_config
        text = "".join(f"{k}={v}\n" for k, v in config.items())
        node.config_path.write_text(f"# written by bench/kafka/harness.py\n{text}")

    def _format(self, nodes: Sequence[KafkaNode]) -> None:
        dist = self._dist()
        procs = [
            (
                node,
                subprocess.Popen(
                    dist.java_command(
                        TOOLS["kafka-storage"].main_class,
                        [
                            "format",
                            "--config",
                            str(node.config_path),
                            "--cluster-id",
                            self.cluster_id,
                        ],
                        fast_start=True,
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                ),
            )
            for node in nodes
        ]
        failures = []
        for node, proc in procs:
            out, _ = proc.communicate(timeout=180)
            if proc.returncode != 0:
                failures.append(f"node {node.node_id}: exit {proc.returncode}\n{out}")
        if failures:
            raise KafkaStartError("kafka-storage format failed:\n" + "\n".join(failures))

    def _launch(self, node: KafkaNode) -> None:
        heap = self.broker_heap if node.is_broker else self.controller_heap
        cmd = self._dist().java_command(
            TOOLS["kafka-server-start"].main_class,
            [str(node.config_path)],
            heap=heap,
            log4j=SERVER_LOG4J,
            # Like kafka-server-start.sh (-Xmx1G -Xms1G): the heap is sized up front.
            jvm_opts=[f"-Xms{heap}", f"-Dkafka.logs.dir={node.log_dir}"],
        )
        with node.console_log.open("ab") as console:
            node.process = subprocess.Popen(
                cmd,
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=node.dir,
                start_new_session=True,
                # PR_SET_PDEATHSIG fires when the forking *thread* exits, so only from the main
                # thread (fixtures, scripts); elsewhere rely on stop() and atexit.
                preexec_fn=_die_with_parent
                if not self.detach and threading.current_thread() is threading.main_thread()
                else None,
            )
        node.pid = node.process.pid

    def _wait_started(
        self,
        nodes: Sequence[KafkaNode],
        since_restart: bool = False,
        offsets: dict[int, int] | None = None,
    ) -> None:
        """Until each node logged STARTED_MARKER past its server.log offset (``offsets``; with
        ``since_restart`` the current size; else 0) and its port answers."""
        offsets = dict(offsets) if offsets is not None else {n.node_id: 0 for n in nodes}
        if since_restart:
            offsets = {
                n.node_id: n.server_log.stat().st_size if n.server_log.exists() else 0
                for n in nodes
            }
        pending = {n.node_id: n for n in nodes}
        deadline = time.monotonic() + self.start_timeout
        while pending:
            for node_id, node in list(pending.items()):
                if not node.running():
                    raise KafkaStartError(
                        f"Kafka node {node_id} exited during startup; console:\n"
                        f"{_tail(node.console_log)}\nserver.log:\n{_tail(node.server_log)}"
                    )
                if self._logged_started(node, offsets[node_id]) and (
                    node.port is None or _port_open("127.0.0.1", node.port)
                ):
                    del pending[node_id]
            if not pending:
                return
            if time.monotonic() > deadline:
                ids = ", ".join(map(str, pending))
                logs = "\n".join(
                    f"--- node {n.node_id} server.log:\n{_tail(n.server_log)}"
                    for n in pending.values()
                )
                raise KafkaStartError(
                    f"Kafka nodes {ids} not started within {self.start_timeout:.0f}s\n{logs}"
                )
            time.sleep(0.2)

    @staticmethod
    def _logged_started(node: KafkaNode, offset: int) -> bool:
        try:
            with node.server_log.open("rb") as f:
                f.seek(offset)
                return STARTED_MARKER.encode() in f.read()
        except OSError:
            return False

    def _terminate(self, nodes: Sequence[KafkaNode], timeout: float) -> None:
        live = [n for n in nodes if n.running()]
        for node in live:
            node.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in live:
            while node.running() and time.monotonic() < deadline:
                time.sleep(0.1)
            if node.running():
                node.send_signal(signal.SIGKILL)
            if node.process is not None:
                node.process.wait()

    def _save_state(self) -> None:
        if not self.dir.exists() or not self.nodes:
            return
        dist = self._dist()
        state = {
            "kafka_version": dist.version,
            "kafka_home": str(dist.home),
            "cluster_id": self.cluster_id,
            "voters": self.voters,
            "bootstrap": self.bootstrap,
            "nodes": [n.to_json() for n in self.nodes.values()],
        }
        tmp = self.dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.dir / "cluster.json")


# --------------------------------------------------------------------------------------------
# CLI


def _cmd_tool(ns: argparse.Namespace) -> int:
    cmd = tool_command(ns.name, *ns.args, bootstrap=ns.bootstrap)
    os.execvp(cmd[0], cmd)


def _cmd_start(ns: argparse.Namespace) -> int:
    cluster = KafkaCluster(
        brokers=ns.brokers, dir=Path(ns.dir).resolve(), broker_heap=ns.heap, detach=True
    )
    cluster.start()
    print(f"Apache Kafka {cluster.version}: {len(cluster.broker_ids)} broker(s)", file=sys.stderr)
    print(cluster.bootstrap)
    return 0


def _cmd_stop(ns: argparse.Namespace) -> int:
    KafkaCluster.attach(Path(ns.dir).resolve()).stop()
    return 0


def _cmd_status(ns: argparse.Namespace) -> int:
    status = KafkaCluster.attach(Path(ns.dir).resolve()).status()
    print(json.dumps(status, indent=2))
    return 0 if all(n["running"] for n in status["nodes"]) else 1


def _cmd_java_client(ns: argparse.Namespace) -> int:
    cmd = java_client_command(*ns.args)
    os.execvp(cmd[0], cmd)


def _cmd_perf_producer(ns: argparse.Namespace) -> int:
    result, proc = producer_perf_test(
        ns.bootstrap,
        ns.topic,
        num_records=ns.num_records,
        record_size=ns.record_size,
        throughput=ns.throughput,
        acks=ns.acks,
    )
    sys.stderr.write(proc.stdout)
    print(json.dumps(result.__dict__))
    return 0


def _cmd_perf_consumer(ns: argparse.Namespace) -> int:
    result, proc = consumer_perf_test(
        ns.bootstrap, ns.topic, num_records=ns.num_records, timeout_ms=ns.timeout_ms
    )
    sys.stderr.write(proc.stdout)
    print(json.dumps(result.__dict__))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/kafka/kafka",
        description="Apache Kafka (assembled from Maven Central) as TidalMQ's yardstick.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("assemble", help="resolve the pinned release into the cache; print its dir")
    sub.add_parser("tools", help="list the tool names and their main classes")

    p = sub.add_parser("tool", help="run a Kafka CLI tool: tool NAME ARGS...")
    p.add_argument(
        "--bootstrap", help="put this address where the tool takes it (else pass it yourself)"
    )
    p.add_argument("name", help="script name, e.g. kafka-topics")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_tool)

    p = sub.add_parser("start", help="start a KRaft cluster on loopback; print its bootstrap")
    p.add_argument("--brokers", type=int, default=1)
    p.add_argument("--dir", required=True, help="cluster directory (configs, data, logs)")
    p.add_argument("--heap", default=BROKER_HEAP, help="broker -Xmx (default %(default)s)")
    p.set_defaults(func=_cmd_start)

    p = sub.add_parser("stop", help="stop the cluster started in --dir")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=_cmd_stop)

    p = sub.add_parser(
        "status", help="print the cluster in --dir as JSON (exit 1 if a node is down)"
    )
    p.add_argument("--dir", required=True)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("java-client", help="run bench/kafka/java/ClientCheck.java")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_java_client)

    p = sub.add_parser("perf-producer", help="kafka-producer-perf-test, summary as JSON")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, default=500_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--throughput", type=int, default=-1)
    p.add_argument("--acks", default="all")
    p.set_defaults(func=_cmd_perf_producer)

    p = sub.add_parser("perf-consumer", help="kafka-consumer-perf-test, summary as JSON")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--num-records", type=int, default=500_000)
    p.add_argument("--timeout-ms", type=int, default=30_000)
    p.set_defaults(func=_cmd_perf_consumer)

    ns = parser.parse_args(argv)
    if ns.command == "assemble":
        print(assemble().home)
        return 0
    if ns.command == "tools":
        for name, spec in sorted(TOOLS.items()):
            print(f"{name:34} {spec.main_class}")
        return 0
    try:
        code: int = ns.func(ns)
    except (KafkaStartError, ToolError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
