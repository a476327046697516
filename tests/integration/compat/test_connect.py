"""Kafka Connect 4.3.1 in distributed mode (the cached Kafka release's connect-runtime) starts
on TidalMQ: it creates its config, offset and status topics with cleanup.policy=compact, reads
them back with DescribeConfigs and refuses to start unless each is exactly compacted
(TopicAdmin.verifyTopicCleanupPolicyOnlyCompact), then joins its worker group and serves its
REST API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from bench.kafka.harness import FAST_START_OPTS, KafkaDist, free_ports, java_executable
from tests.integration.compat.conftest import name
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

LOG4J = """rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


def test_connect_distributed_starts_on_compacted_internal_topics(
    tidalmq: BrokerProcess, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    group = name("connect")
    topics = {kind: f"{group}-{kind}" for kind in ("configs", "offsets", "status")}
    (port,) = free_ports(1)
    worker = tmp_path / "worker.properties"
    worker.write_text(
        "\n".join([
            f"bootstrap.servers={tidalmq.bootstrap}",
            f"group.id={group}",
            "key.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            f"config.storage.topic={topics['configs']}",
            f"offset.storage.topic={topics['offsets']}",
            f"status.storage.topic={topics['status']}",
            "config.storage.replication.factor=1",
            "offset.storage.replication.factor=1",
            "status.storage.replication.factor=1",
            "offset.storage.partitions=2",
            "status.storage.partitions=2",
            f"listeners=http://127.0.0.1:{port}",
            "plugin.discovery=service_load",
        ])
    )  # fmt: skip
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text(LOG4J)
    log_path = tmp_path / "connect.log"
    cmd = [
        java_executable(), "-Xmx256m", *FAST_START_OPTS, f"-Dlog4j2.configurationFile={log4j}",
        "-cp", apache_kafka_dist.classpath, "org.apache.kafka.connect.cli.ConnectDistributed",
        str(worker),
    ]  # fmt: skip
    with log_path.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        connectors = None
        deadline = time.monotonic() + 120
        while connectors is None and time.monotonic() < deadline:
            assert proc.poll() is None, (
                f"Connect exited {proc.returncode}:\n{log_path.read_text()[-4000:]}"
            )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/connectors", timeout=5) as r:
                    connectors = json.loads(r.read())
            except OSError:
                time.sleep(0.5)
        log = log_path.read_text()
        assert connectors == [], log[-4000:]
        assert "Successfully joined group" in log and "Starting connectors and tasks" in log
        # what the worker checked before starting: each topic is exactly compacted
        admin = AdminClient({"bootstrap.servers": tidalmq.bootstrap})
        for topic in topics.values():
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(15)
            assert configs["cleanup.policy"].value == "compact", topic
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
