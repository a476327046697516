"""Kafka Streams 4.3.1's WordCountDemo topology with its default, compacted changelog topic, as a
scenario run against any bootstrap address (TidalMQ in tests/integration/compat, Apache Kafka in
tests/integration/apache_kafka): the topology counts words, and an instance restarted with its
local state wiped restores the counts from the changelog (which Streams creates with
cleanup.policy=compact) and goes on."""

from __future__ import annotations

import struct
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from bench.kafka.harness import (
    FAST_START_OPTS,
    HERE,
    TOOLS_LOG4J,
    KafkaDist,
    assemble_streams,
    java_executable,
)


def start(dist: KafkaDist, bootstrap: str, app: str, topics: tuple[str, str], state: Path,
          log: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    # Kafka Streams and RocksDB are not in the broker and tools classpath: their own
    # directory, assembled from bench/kafka/streams/pom.xml (the .ci/prebuild does it early)
    classpath = ":".join([dist.classpath, assemble_streams().classpath])
    cmd = [
        java_executable(), "-Xmx256m", *FAST_START_OPTS, f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp", classpath, str(HERE / "java" / "StreamsWordCount.java"),
        bootstrap, app, *topics, str(state),
    ]  # fmt: skip
    with log.open("a") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def read_counts(consumer: Consumer, counts: dict[str, int], want: dict[str, int],
                app: subprocess.Popen[bytes], log: Path) -> None:  # fmt: skip
    deadline = time.monotonic() + 60
    while counts != want and time.monotonic() < deadline:
        assert app.poll() is None, f"Streams exited {app.returncode}:\n{log.read_text()[-3000:]}"
        msg = consumer.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        key, value = msg.key(), msg.value()
        assert key is not None and value is not None
        counts[key.decode()] = struct.unpack(">q", value)[0]
    assert counts == want, log.read_text()[-3000:]


def stop(app: subprocess.Popen[bytes]) -> None:
    app.terminate()
    try:
        app.wait(30)
    except subprocess.TimeoutExpired:
        app.kill()
        app.wait(10)


def word_count_restores_from_the_changelog(dist: KafkaDist, bootstrap: str, tmp_path: Path) -> None:
    """Count words, stop, check the changelog is compacted, start a new instance with no local
    state: the counts come back from the changelog and the next line adds to them."""
    app_id = f"wordcount-{uuid.uuid4().hex[:8]}"
    topics = (f"{app_id}-in", f"{app_id}-out")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(15)
    log = tmp_path / "streams.log"
    producer = Producer({"bootstrap.servers": bootstrap})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{app_id}-reader",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topics[1]])
    counts: dict[str, int] = {}
    try:
        app = start(dist, bootstrap, app_id, topics, tmp_path / "state", log)
        try:
            for line in ("a b c", "a b", "a"):
                producer.produce(topics[0], value=line.encode())
            assert producer.flush(10) == 0
            read_counts(consumer, counts, {"a": 3, "b": 2, "c": 1}, app, log)
        finally:
            stop(app)
        changelog = f"{app_id}-KSTREAM-AGGREGATE-STATE-STORE-0000000003-changelog"
        resource = ConfigResource(ConfigResource.Type.TOPIC, changelog)
        configs = admin.describe_configs([resource])[resource].result(15)
        assert configs["cleanup.policy"].value == "compact"
        # a new instance with no local state: the counts come back from the changelog
        app = start(dist, bootstrap, app_id, topics, tmp_path / "state-2", log)
        try:
            producer.produce(topics[0], value=b"a c")
            assert producer.flush(10) == 0
            read_counts(consumer, counts, {"a": 4, "b": 2, "c": 2}, app, log)
        finally:
            stop(app)
    finally:
        consumer.close()
