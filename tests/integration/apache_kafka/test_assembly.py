"""The assembled Apache Kafka release: cached, complete, and the harness's parsers and argument
placement (checked on real tool output captured from Kafka 4.3.1 and on garbage)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bench.kafka import harness
from bench.kafka.harness import (
    TOOLS,
    KafkaDist,
    parse_consumer_perf,
    parse_producer_perf,
    parse_table,
    run_tool,
    tool_args,
)

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]


def test_second_assembly_costs_seconds_and_gives_the_same_directory(
    apache_kafka_dist: KafkaDist,
) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(REPO / "bench/kafka/assemble.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KAFKA_VERSION": apache_kafka_dist.version},
    )
    elapsed = time.monotonic() - started
    assert Path(proc.stdout.strip()) == apache_kafka_dist.home
    assert elapsed < 5, f"warm assembly took {elapsed:.1f}s"
    assert "resolving" not in proc.stderr, "a warm assembly must not run Maven"


def test_release_is_the_pinned_kafka_4(apache_kafka_dist: KafkaDist) -> None:
    version = apache_kafka_dist.version
    assert version == harness.pinned_version()
    assert version.startswith("4.")
    jars = {p.name for p in apache_kafka_dist.lib.glob("*.jar")}
    for artifact in (
        "kafka_2.13",
        "kafka-server",
        "kafka-metadata",
        "kafka-storage",
        "kafka-tools",
        "kafka-clients",
        "kafka-raft",
    ):
        assert f"{artifact}-{version}.jar" in jars
    assert any(j.startswith("log4j-slf4j-impl-") for j in jars)
    assert (apache_kafka_dist.home / "VERSION").read_text().strip() == version


def test_every_tool_name_maps_to_a_class_in_the_release(apache_kafka_dist: KafkaDist) -> None:
    missing = {
        name: spec.main_class
        for name, spec in TOOLS.items()
        if not apache_kafka_dist.class_exists(spec.main_class)
    }
    assert not missing, f"main classes absent from Kafka {apache_kafka_dist.version}: {missing}"
    assert not apache_kafka_dist.class_exists("kafka.admin.TopicCommand")  # sanity: moved in 4.x


@pytest.mark.parametrize(
    "tool", ["kafka-topics", "kafka-consumer-groups", "kafka-configs", "kafka-reassign-partitions"]
)
def test_tools_report_the_pinned_version(tool: str, apache_kafka_dist: KafkaDist) -> None:
    proc = run_tool(tool, "--version", check=True)
    assert proc.stdout.split()[0] == apache_kafka_dist.version


def test_launcher_script_lists_and_runs_tools(apache_kafka_dist: KafkaDist) -> None:
    launcher = str(REPO / "bench/kafka/kafka")
    listed = subprocess.run([launcher, "tools"], capture_output=True, text=True, check=True)
    names = {line.split()[0] for line in listed.stdout.splitlines()}
    assert names == set(TOOLS)
    version = subprocess.run(
        [launcher, "tool", "kafka-storage", "version-mapping"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert version.returncode == 0, version.stderr
    assert "metadata.version" in version.stdout
    unknown = subprocess.run([launcher, "tool", "kafka-nope"], capture_output=True, text=True)
    assert unknown.returncode == 1
    assert "unknown Kafka tool" in unknown.stderr


def test_bootstrap_goes_where_each_tool_takes_it() -> None:
    b = "127.0.0.1:1234"
    assert tool_args("kafka-topics", ["--list"], b) == ["--bootstrap-server", b, "--list"]
    assert tool_args("kafka-metadata-quorum", ["describe", "--status"], b)[:2] == [
        "--bootstrap-server",
        b,
    ]
    assert tool_args("kafka-cluster", ["cluster-id"], b) == ["cluster-id", "--bootstrap-server", b]
    assert tool_args("kafka-e2e-latency", ["t", "10", "all", "100"], b)[0] == b
    assert tool_args("kafka-replica-verification.sh", [], b) == ["--broker-list", b]
    assert tool_args("kafka-topics", ["--list"], None) == ["--list"]
    with pytest.raises(ValueError, match="does not talk to a cluster"):
        tool_args("kafka-storage", ["info"], b)
    with pytest.raises(ValueError, match="unknown Kafka tool"):
        tool_args("kafka-topic", [], b)


PRODUCER_OUTPUT = """\
Warmup first 5000 records. Steady state results will print after the complete test summary.
12000 records sent, 2399.5 records/sec (2.34 MB/sec), 1500.3 ms avg latency, 2100.0 ms max latency.
20000 records sent, 7087.172218 records/sec (0.68 MB/sec), 201.91 ms avg latency, 1078.00 ms max latency, 148 ms 50th, 378 ms 95th, 427 ms 99th, 464 ms 99.9th.
15000 steady state records sent, 12335.526316 records/sec (1.18 MB/sec), 239.04 ms avg latency, 464.00 ms max latency, 276 ms 50th, 389 ms 95th, 430 ms 99th, 464 ms 99.9th.
"""

CONSUMER_OUTPUT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-21 23:21:10:890, 2026-11-21 23:21:13:579, 48.8281, 18.1585, 50000, 18594.2730, 1761, 928, 52.6165, 53879.3103
"""


def test_producer_perf_parser_reads_whole_run_and_steady_state() -> None:
    whole = parse_producer_perf(PRODUCER_OUTPUT)
    assert whole.records == 20000
    assert whole.records_per_sec == pytest.approx(7087.172218)
    assert whole.mb_per_sec == pytest.approx(0.68)
    assert (whole.p50_ms, whole.p95_ms, whole.p99_ms, whole.p999_ms) == (148, 378, 427, 464)
    assert whole.max_latency_ms == pytest.approx(1078.0)
    steady = parse_producer_perf(PRODUCER_OUTPUT, steady_state=True)
    assert steady.records == 15000
    assert steady.steady_state
    assert steady.p50_ms == 276
    with pytest.raises(ValueError, match="summary"):
        parse_producer_perf(PRODUCER_OUTPUT.splitlines()[1])  # progress line only
    with pytest.raises(ValueError, match="steady-state"):
        parse_producer_perf(PRODUCER_OUTPUT.splitlines()[2], steady_state=True)


def test_consumer_perf_parser_reads_the_summary_row() -> None:
    result = parse_consumer_perf("some warning\n" + CONSUMER_OUTPUT)
    assert result.records == 50000
    assert result.data_mb == pytest.approx(48.8281)
    assert result.mb_per_sec == pytest.approx(18.1585)
    assert result.fetch_records_per_sec == pytest.approx(53879.3103)
    assert result.rebalance_ms == 1761
    with pytest.raises(ValueError):
        parse_consumer_perf(CONSUMER_OUTPUT.splitlines()[0])
    with pytest.raises(ValueError, match="does not match"):
        parse_consumer_perf(CONSUMER_OUTPUT.splitlines()[0] + "\n1, 2, 3\n")


def test_table_parser_reads_consumer_group_output() -> None:
    output = (
        "\nConsumer group 'g1' has no active members.\n\n"
        "GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  CLIENT-ID\n"
        "g1     jt     0          324             324             0    -            -     -\n"
        "g1     jt     1          336             340             4    -            -     -\n"
    )
    rows = parse_table(output, "GROUP")
    assert [(r["PARTITION"], r["LAG"]) for r in rows] == [("0", "0"), ("1", "4")]
    assert parse_table("nothing here", "GROUP") == []
