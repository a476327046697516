"""Apache Kafka's own tools and Java client against TidalMQ.

One TidalMQ broker and one 3-broker local cluster serve the whole package (both on the real S3
server); every test works in topics and groups of its own, so tests do not interfere. The Kafka
tools come from the assembled Apache Kafka release (bench/kafka), each run in its own JVM.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bench.kafka.harness import KafkaDist, run_tool
from tests.support.broker_process import BrokerProcess
from tests.support.local_cluster import LocalClusterProcess

# A move is held half way by stopping its source broker (SIGSTOP) while the Kafka tools verify
# and cancel it; these keep the controller from declaring that broker dead meanwhile.
HOLD_MOVES_ENV = {"TIDALMQ_SESSION_TIMEOUT_S": "60", "TIDALMQ_ELECTION_TIMEOUT_S": "120"}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="package")
def tidalmq(
    s3_server: Any, apache_kafka_dist: KafkaDist, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One TidalMQ broker (with its embedded controller) on the S3 server."""
    logs = tmp_path_factory.mktemp("compat-broker")
    broker = BrokerProcess(
        s3_server.url(prefix=s3_server.unique_prefix("compat")),
        logs,
        # consumer-protocol members (KIP-848) heartbeat every half second, not Kafka's 5 s, so
        # a rebalance completes within a test's time; no other test uses that protocol
        env={**s3_server.env(), "TIDALMQ_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500"},
    )
    broker.start(timeout_s=120)
    try:
        yield broker
    finally:
        code = broker.stop()
        if code not in (0, None):
            print(broker.tail_log())


@pytest.fixture(scope="package")
def tidalmq_cluster(
    s3_server: Any, apache_kafka_dist: KafkaDist, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalClusterProcess]:
    """`tidalmq local up --brokers 3` on the S3 server (brokers 0, 1, 2)."""
    cluster = LocalClusterProcess(
        tmp_path_factory.mktemp("compat-cluster"),
        brokers=3,
        storage_url=s3_server.url(prefix=s3_server.unique_prefix("compat-cluster")),
        # __transaction_state with 6 partitions (2 per broker), not Kafka's 50: created by the
        # first transactional producer, inside a test's time; timed-out transactions aborted
        # within half a second
        env={
            **s3_server.env(),
            **HOLD_MOVES_ENV,
            "TIDALMQ_TRANSACTION_STATE_PARTITIONS": "6",
            "TIDALMQ_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "500",
            # per-partition consumer lag (test_metrics_and_lag.py; off by default), and the
            # ends of partitions led elsewhere committed every 2 s instead of 10 for its waits
            "TIDALMQ_CONSUMER_LAG_PARTITION_METRICS": "true",
            "TIDALMQ_FLOOR_COMMIT_INTERVAL_S": "2",
        },
    )
    cluster.start(timeout_s=180)
    try:
        yield cluster
    finally:
        cluster.stop()


def tool(name: str, *args: str, bootstrap: str) -> str:
    """Run a Kafka tool that must succeed; returns its stdout."""
    return run_tool(name, *args, bootstrap=bootstrap, check=True).stdout


def create_topic(bootstrap: str, topic: str, partitions: int = 1, *extra: str) -> None:
    out = tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--partitions",
        str(partitions),
        *extra,
        bootstrap=bootstrap,
    )
    assert f"Created topic {topic}." in out, out


def describe_topic(bootstrap: str, topic: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """kafka-topics --describe: the topic line and one dict per partition line."""
    out = tool("kafka-topics", "--describe", "--topic", topic, bootstrap=bootstrap)
    return parse_describe(out, topic)


def parse_describe(out: str, topic: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    header: dict[str, str] = {}
    partitions: list[dict[str, str]] = []
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+): ?([^\t]*)", line))
        if fields.get("Topic") != topic:
            continue
        if "Partition" in fields:
            partitions.append({k: v.strip() for k, v in fields.items()})
        else:
            header = {k: v.strip() for k, v in fields.items()}
    return header, partitions
