"""The consumer group protocol (KIP-848) with Apache Kafka's Java consumer
(`group.protocol=consumer`) against one TidalMQ broker: two consumers share a topic's
partitions, one leaves and the other takes them all, nothing is read twice; then
`kafka-consumer-groups --describe` describes the live group (bench/kafka/java/GroupProtocolCheck.java)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from bench.kafka.harness import (
    JAVA_GROUP_PROTOCOL_SOURCE,
    java_client_command,
    parse_table,
)
from tests.integration.compat.conftest import create_topic, name, tool
from tests.support.broker_process import BrokerProcess

PARTITIONS = 4


def test_java_consumers_share_rebalance_and_commit(tidalmq: BrokerProcess, tmp_path: Path) -> None:
    b = tidalmq.bootstrap
    topic, group = name("kip848"), name("cg")
    create_topic(b, topic, PARTITIONS)
    hold = tmp_path / "hold"
    cmd = java_client_command(
        b, topic, group, str(PARTITIONS), "200", str(hold), source=JAVA_GROUP_PROTOCOL_SOURCE
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not hold.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not hold.exists():
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the check did not reach the live group: {out}\n{err[-3000:]}")
        # the live group: one member (A) with every partition, nothing left to read
        described = tool("kafka-consumer-groups", "--describe", "--group", group, bootstrap=b)
        rows = parse_table(described, "GROUP")
        assert sorted(int(r["PARTITION"]) for r in rows) == list(range(PARTITIONS)), described
        assert {r["CLIENT-ID"] for r in rows} == {"group-protocol-check-a"}, described
        assert all(r["LAG"] == "0" for r in rows), described
        assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 600, described
        state = tool(
            "kafka-consumer-groups", "--describe", "--state", "--group", group, bootstrap=b
        )
        (row,) = parse_table(state, "GROUP")
        assert (row["STATE"], row["#MEMBERS"], row["ASSIGNMENT-STRATEGY"]) == (
            "Stable",
            "1",
            "uniform",
        ), state
        listed = tool("kafka-groups", "--list", "--group-type", "consumer", bootstrap=b)
        assert group in listed.split(), listed
        hold.unlink()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    reports = [line for line in out.splitlines() if line.startswith("{")]
    assert reports, err[-3000:]
    report = json.loads(reports[-1])
    assert proc.returncode == 0 and report["failure"] is None, (report, err[-3000:])
    assert report["alone"] == list(range(PARTITIONS)), report
    shared = report["shared"]
    assert sorted(shared["a"] + shared["b"]) == list(range(PARTITIONS)), report
    assert shared["a"] and shared["b"], report
    assert report["after_leave"] == list(range(PARTITIONS)), report
    assert report["b_read"] > 0, report  # B really consumed its share
    assert report["produced"] == report["read"] == 600 and report["duplicates"] == 0, report
    assert report["errors"] == [], report
