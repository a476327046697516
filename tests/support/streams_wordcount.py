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

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from bench.kafka.harness import (
    FAST_START_OPTS,
    HERE,
    TOOLS_LOG4J,
    KafkaDist,
    assemble_streams,
    java_executable,
)


def start(
    dist: KafkaDist, bootstrap: str, app: str, topics: tuple[str, str], state: Path, log: Path
) -> subprocess.Popen[bytes]:
    # Kafka Streams and RocksDB are not in the broker and tools classpath: their own
    # directory, assembled from bench/kafka/streams/pom.xml (the .ci/prebuild does it early)
    classpath = ":".join([dist.classpath, assemble_streams().classpath])
    cmd = [
        java_executable(),
        "-Xmx256m",
        *FAST_START_OPTS,
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp",
        classpath,
        str(HERE / "java" / "StreamsWordCount.java"),
        bootstrap,
        app,
        *topics,
        str(state),
    ]
    with log.open("a") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


STORE = "KSTREAM-AGGREGATE-STATE-STORE-0000000003"  # the count() store's (and its topics') name


def read_counts(
    consumer: Consumer,
    counts: dict[str, int],
    want: dict[str, int],
    app: subprocess.Popen[bytes],
    log: Path,
    admin: AdminClient,
    app_id: str,
) -> None:
    """Read the output topic until the counts are `want`, 60 s at most: a wait takes 3-5 s on
    a quiet machine, up to about 22 s measured on 2 cores at load 13-18 (the JVM's start, then
    the group's rebalances). On a failure, says where the words stopped: the Streams log, both
    groups and the topics' offsets."""
    deadline = time.monotonic() + 60
    while counts != want and time.monotonic() < deadline:
        if app.poll() is not None:
            raise AssertionError(
                f"Streams exited {app.returncode}\n{diagnosis(consumer, admin, app_id, log)}"
            )
        msg = consumer.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        key, value = msg.key(), msg.value()
        assert key is not None and value is not None
        counts[key.decode()] = struct.unpack(">q", value)[0]
    assert counts == want, diagnosis(consumer, admin, app_id, log)


def diagnosis(consumer: Consumer, admin: AdminClient, app_id: str, log: Path) -> str:
    """What a failure needs to be understood from the CI output alone: the end of the Streams
    log, the Streams app's and the reader's groups (state, members and their partitions,
    committed offsets) and each topic's log start and end offsets, from input to output."""
    lines = ["--- Streams log (end):", log.read_text()[-3000:]]
    try:
        positions = consumer.position(consumer.assignment())
        lines.append(f"--- reader's assignment and positions: {_partitions(positions)}")
    except Exception as exc:  # a diagnosis never hides the failure it explains
        lines.append(f"--- reader's assignment and positions: {exc!r}")
    groups = [app_id, f"{app_id}-reader"]
    try:
        described = admin.describe_consumer_groups(groups, request_timeout=10)
        for group in groups:
            d = described[group].result(15)
            members = [
                f"{m.client_id} {_partitions(m.assignment.topic_partitions)}" for m in d.members
            ]
            lines.append(f"--- group {group}: {d.state.name}, members {members}")
            request = [ConsumerGroupTopicPartitions(group)]
            committed = admin.list_consumer_group_offsets(request, request_timeout=10)
            offsets = committed[group].result(15).topic_partitions or []
            lines.append(f"    committed {[(t.topic, t.partition, t.offset) for t in offsets]}")
    except Exception as exc:
        lines.append(f"--- groups: {exc!r}")
    topics = [
        f"{app_id}-in",
        f"{app_id}-{STORE}-repartition",
        f"{app_id}-{STORE}-changelog",
        f"{app_id}-out",
    ]
    for topic in topics:
        try:
            meta = admin.list_topics(topic, timeout=10).topics[topic]
            if meta.error is not None:
                lines.append(f"--- topic {topic}: {meta.error}")
                continue
            tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
            ends = []
            for tp in tps:
                start = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(15).offset
                end = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(15).offset
                ends.append(f"{tp.partition}: {start}..{end}")
            lines.append(f"--- topic {topic}: offsets {', '.join(ends)}")
        except Exception as exc:
            lines.append(f"--- topic {topic}: {exc!r}")
    return "\n".join(lines)


def _partitions(tps: list[TopicPartition] | None) -> list[str]:
    return [f"{tp.topic}-{tp.partition}@{tp.offset}" for tp in tps or []]


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
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{app_id}-reader",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topics[1]])
    counts: dict[str, int] = {}
    try:
        app = start(dist, bootstrap, app_id, topics, tmp_path / "state", log)
        try:
            for line in ("a b c", "a b", "a"):
                producer.produce(topics[0], value=line.encode())
            assert producer.flush(10) == 0
            read_counts(consumer, counts, {"a": 3, "b": 2, "c": 1}, app, log, admin, app_id)
        finally:
            stop(app)
        changelog = f"{app_id}-{STORE}-changelog"
        resource = ConfigResource(ConfigResource.Type.TOPIC, changelog)
        configs = admin.describe_configs([resource])[resource].result(15)
        assert configs["cleanup.policy"].value == "compact"
        # a new instance with no local state: the counts come back from the changelog
        app = start(dist, bootstrap, app_id, topics, tmp_path / "state-2", log)
        try:
            producer.produce(topics[0], value=b"a c")
            assert producer.flush(10) == 0
            read_counts(consumer, counts, {"a": 4, "b": 2, "c": 2}, app, log, admin, app_id)
        finally:
            stop(app)
    finally:
        consumer.close()
