"""Kafka Connect in distributed mode with the FileStream connectors, as a scenario run against
any bootstrap address (TidalMQ in tests/integration/compat, Apache Kafka in
tests/integration/apache_kafka): the cached Kafka release's connect-runtime, with connect-file
assembled beside it (bench/kafka/connect-file/pom.xml).

The worker creates its config, offset and status topics with cleanup.policy=compact, reads them
back with DescribeConfigs and refuses to start unless each is exactly compacted
(TopicAdmin.verifyTopicCleanupPolicyOnlyCompact). Connectors are created through the REST API: a
FileStreamSource copies a file into a topic and a FileStreamSink copies that topic into another
file, byte for byte. A restarted worker resumes both from the offsets it stored (the source's
file position in the offset topic, the sink's group offsets): lines written while it was down
arrive once, and nothing is copied twice."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, ConfigResource

from bench.kafka.harness import (
    FAST_START_OPTS,
    KafkaDist,
    assemble_connect_file,
    free_ports,
    java_executable,
)

LOG4J = """rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


class Worker:
    """One ConnectDistributed worker process and its REST API."""

    def __init__(self, dist: KafkaDist, properties: Path, port: int, log: Path) -> None:
        # connect-file is not in the broker and tools classpath: its own directory, assembled
        # from bench/kafka/connect-file/pom.xml (the .ci/prebuild does it early)
        classpath = ":".join([dist.classpath, assemble_connect_file().classpath])
        log4j = properties.parent / "log4j2.properties"
        log4j.write_text(LOG4J)
        cmd = [
            java_executable(),
            "-Xmx256m",
            *FAST_START_OPTS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(properties),
        ]
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("a") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def wait_for(self, what: str, read: Any, want: Any, timeout_s: float = 90) -> None:
        """Until read() returns want (the worker's REST API or a file)."""
        deadline = time.monotonic() + timeout_s
        result = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (
                f"Connect exited {self.proc.returncode}:\n{self.tail()}"
            )
            try:
                result = read()
            except OSError:  # REST API not up yet, or a 404/409 while the worker rebalances
                result = None
            if result == want:
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what} (last: {result!r}):\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def stop(self) -> None:
        self.proc.terminate()  # a graceful stop: tasks stop and commit their offsets
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def lines(start: int, end: int) -> bytes:
    # ASCII: FileStreamSource stores its position in characters read but skips that many bytes
    # when it resumes, so a file with multi-byte characters is re-read in part after a restart
    # (Kafka's connector, on any broker)
    return b"".join(f"line {i} {'x' * (i % 40)}\n".encode() for i in range(start, end))


def file_round_trip_with_restart(dist: KafkaDist, bootstrap: str, tmp_path: Path) -> None:
    """The whole scenario (module docstring) against `bootstrap`, in `tmp_path`."""
    group = f"connect-{uuid.uuid4().hex[:8]}"
    topics = {kind: f"{group}-{kind}" for kind in ("configs", "offsets", "status")}
    data_topic = f"{group}-data"
    (port,) = free_ports(1)
    properties = tmp_path / "worker.properties"
    properties.write_text(
        "\n".join(
            [
                f"bootstrap.servers={bootstrap}",
                f"group.id={group}",
                # the records are the file's lines as they are: no JSON envelope
                "key.converter=org.apache.kafka.connect.storage.StringConverter",
                "value.converter=org.apache.kafka.connect.storage.StringConverter",
                f"config.storage.topic={topics['configs']}",
                f"offset.storage.topic={topics['offsets']}",
                f"status.storage.topic={topics['status']}",
                "config.storage.replication.factor=1",
                "offset.storage.replication.factor=1",
                "status.storage.replication.factor=1",
                "offset.storage.partitions=2",
                "status.storage.partitions=2",
                "offset.flush.interval.ms=1000",
                f"listeners=http://127.0.0.1:{port}",
                "plugin.discovery=service_load",
            ]
        )
    )
    source, sink = tmp_path / "source.txt", tmp_path / "sink.txt"
    first = lines(0, 200)
    source.write_bytes(first)
    log = tmp_path / "connect.log"

    worker = Worker(dist, properties, port, log)
    try:
        worker.wait_for("the REST API", lambda: worker.request("GET", "/connectors"), [])
        # the REST API answers before the worker has joined its group
        joined = "Successfully joined group"
        worker.wait_for("the worker group", lambda: joined in worker.log.read_text(), True)
        # what the worker checked before starting: each topic is exactly compacted
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for topic in topics.values():
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            configs = admin.describe_configs([resource])[resource].result(15)
            assert configs["cleanup.policy"].value == "compact", topic

        worker.request(
            "POST",
            "/connectors",
            {
                "name": "file-source",
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
                    "tasks.max": "1",
                    "file": str(source),
                    "topic": data_topic,
                    "topic.creation.default.replication.factor": "1",
                    "topic.creation.default.partitions": "1",
                },
            },
        )
        worker.request(
            "POST",
            "/connectors",
            {
                "name": "file-sink",
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
                    "tasks.max": "1",
                    "file": str(sink),
                    "topics": data_topic,
                },
            },
        )
        worker.wait_for("the first copy", lambda: sink.exists() and sink.read_bytes(), first)
        # the source's file position, as the worker stored it in the offset topic
        worker.wait_for("stored offsets", lambda: offsets(worker, "file-source"), [len(first)])
    finally:
        worker.stop()

    second = lines(200, 300)
    with source.open("ab") as out:  # written while no worker runs
        out.write(second)
    worker = Worker(dist, properties, port, log)
    try:
        worker.wait_for("the lines written meanwhile", sink.read_bytes, first + second)
        time.sleep(2)  # a source or sink that restarted from the beginning would copy again
        assert sink.read_bytes() == first + second
        status = worker.request("GET", "/connectors?expand=status")
        for connector in ("file-source", "file-sink"):
            assert status[connector]["status"]["connector"]["state"] == "RUNNING", status
            assert [t["state"] for t in status[connector]["status"]["tasks"]] == ["RUNNING"]
        want = [len(first + second)]
        worker.wait_for("stored offsets", lambda: offsets(worker, "file-source"), want)
    finally:
        worker.stop()


def offsets(worker: Worker, connector: str) -> list[int]:
    """The source connector's stored positions (GET /connectors/NAME/offsets, KIP-875)."""
    answer = worker.request("GET", f"/connectors/{connector}/offsets")
    return [entry["offset"]["position"] for entry in answer["offsets"]]
