"""Admin APIs through real AdminClients: topics, partitions, configs, groups, offsets."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from kafka.admin import KafkaAdminClient
from tidalmq_broker.admin_client import AdminClient as ProtocolClient

from tests.integration.broker.clients import consume_all, create_topic, producer
from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


def test_topic_lifecycle(local_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": local_broker.bootstrap})
    topic = topic_name()
    admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "3600000"})])[topic].result(
        30
    )

    # duplicate, bad name, bad replication factor, bad config: clear errors
    dup = admin.create_topics([NewTopic(topic, 3, 1)])[topic]
    with pytest.raises(KafkaException, match="already exists"):
        dup.result(30)
    with pytest.raises(KafkaException, match="characters"):
        admin.create_topics([NewTopic("bad name!", 1, 1)])["bad name!"].result(30)
    with pytest.raises(KafkaException, match="replication factor"):
        admin.create_topics([NewTopic(topic + "x", 1, 3)])[topic + "x"].result(30)
    with pytest.raises(KafkaException, match="Unknown topic config name: foo"):
        admin.create_topics([NewTopic(topic + "y", 1, 1, config={"foo": "1"})])[topic + "y"].result(
            30
        )

    md = admin.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 3
    # as in Kafka, every-topic Metadata lists the offsets topic, flagged internal
    assert "__consumer_offsets" in admin.list_topics(timeout=10).topics
    with ProtocolClient(local_broker.bootstrap) as client:
        every = client.call(
            3,
            12,
            {
                "topics": None,
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
    internal = {t.name: t.is_internal for t in every.topics}
    assert internal["__consumer_offsets"] is True and internal[topic] is False

    # grow, and refuse to shrink
    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(30)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 5
    with pytest.raises(KafkaException, match="only grow"):
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)

    # configs: describe shows the override and the defaults, alter changes them
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    res.set_config("retention.ms", "7200000")
    admin.alter_configs([res])[res].result(30)
    assert admin.describe_configs([res])[res].result(30)["retention.ms"].value == "7200000"
    # a topic codec would be accepted and never applied (batches are not re-encoded): refused
    bad = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"compression.type": "lz4"})
    with pytest.raises(KafkaException, match="never recompresses") as refused:
        admin.alter_configs([bad])[bad].result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    zstd = NewTopic(topic + "z", 1, 1, config={"compression.type": "zstd"})
    with pytest.raises(KafkaException, match="never recompresses"):
        admin.create_topics([zstd])[topic + "z"].result(30)

    # delete
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 10
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topic not in admin.list_topics(timeout=10).topics
    with pytest.raises(KafkaException):
        admin.delete_topics([topic])[topic].result(30)


def test_recreated_topic_starts_empty(local_broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": local_broker.bootstrap})
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    # the topic is recreated by the admin client: the producer must not auto-create it in
    # between (a metadata refresh after the deletion would, as in Kafka)
    p = producer(local_broker.bootstrap, **{"allow.auto.create.topics": False})
    for i in range(10):
        p.produce(topic, value=b"old-%d" % i)
    assert p.flush(20) == 0
    admin.delete_topics([topic])[topic].result(30)
    time.sleep(0.5)
    create_topic(local_broker.bootstrap, topic, 1)
    p.produce(topic, value=b"new")
    assert p.flush(20) == 0
    msgs = consume_all(local_broker.bootstrap, topic, 2, timeout_s=8)
    assert [m.value() for m in msgs] == [b"new"]
    assert msgs[0].offset() == 0


def test_list_offsets_earliest_latest_and_by_timestamp(local_broker: BrokerProcess) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    # batches of 5 records (offsets 0-4, 5-9, ...), the later ones compressed: a timestamp
    # inside a batch must find its record, not the batch's first offset
    base = int(time.time() * 1000) - 100_000
    for first in range(0, 20, 5):
        codec = "none" if first < 10 else "zstd"
        p = producer(local_broker.bootstrap, **{"linger.ms": 10_000, "compression.type": codec})
        for i in range(first, first + 5):
            p.produce(topic, value=b"%d" % i, timestamp=base + i * 1000)
        assert p.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": local_broker.bootstrap})
    tp = TopicPartition(topic, 0)

    def lookup(spec: OffsetSpec) -> int:
        return admin.list_offsets({tp: spec})[tp].result(30).offset

    assert lookup(OffsetSpec.earliest()) == 0
    assert lookup(OffsetSpec.latest()) == 20
    assert lookup(OffsetSpec.for_timestamp(base + 5000)) == 5
    assert lookup(OffsetSpec.for_timestamp(base + 5500)) == 6
    assert lookup(OffsetSpec.for_timestamp(base + 8000)) == 8
    assert lookup(OffsetSpec.for_timestamp(base + 16_500)) == 17  # compressed
    found = admin.list_offsets({tp: OffsetSpec.for_timestamp(base + 2500)})[tp].result(30)
    assert (found.offset, found.timestamp) == (3, base + 3000)  # that record's timestamp
    assert lookup(OffsetSpec.for_timestamp(base + 10**9)) == -1
    c = Consumer({"bootstrap.servers": local_broker.bootstrap, "group.id": "ts"})
    found = c.offsets_for_times([TopicPartition(topic, 0, base + 12000)], timeout=10)
    c.close()
    assert found[0].offset == 12


def test_groups_are_listed_described_and_deleted(local_broker: BrokerProcess) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 2)
    p = producer(local_broker.bootstrap)
    for i in range(10):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(20) == 0
    consume_all(local_broker.bootstrap, topic, 10, group="described")
    admin = KafkaAdminClient(bootstrap_servers=local_broker.bootstrap)
    try:
        groups = {g["group_id"]: g for g in admin.list_groups()}
        assert groups["described"]["group_state"] == "Empty"
        assert groups["described"]["protocol_type"] == "consumer"
        desc = admin.describe_groups(["described"])["described"]
        assert desc["group_state"] == "Empty" and desc["error"] is None
        offsets = admin.list_group_offsets({"described": None})["described"]
        assert sum(o.offset for o in offsets.values()) == 10
        assert admin.delete_groups(["described"]) == {"described": "OK"}
        assert "described" not in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()


def test_deleting_a_topic_deletes_its_data(local_broker: BrokerProcess) -> None:
    from pathlib import Path

    objects = Path(local_broker.storage_url.removeprefix("file://"))
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 3)
    p = producer(local_broker.bootstrap)
    for i in range(300):
        p.produce(topic, value=b"x" * 100, partition=i % 3)
    assert p.flush(20) == 0
    # checkpoints to delete: written within a checkpoint interval (5 s) of the writes, later
    # on a loaded machine; waited for, not a fixed 6 s that a slow run could outlast
    prefix = objects / "partitions" / topic
    deadline = time.monotonic() + 60
    while not (prefix.exists() and any(prefix.rglob("checkpoint"))):
        assert time.monotonic() < deadline, "no checkpoint of the topic within 60 s"
        time.sleep(0.2)
    admin = AdminClient({"bootstrap.servers": local_broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)

    def stored() -> list[Path]:
        try:
            return [f for f in prefix.rglob("*") if f.is_file()] if prefix.exists() else []
        except FileNotFoundError:  # a directory deleted while it was listed: not done yet
            return [prefix]

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and stored():
        time.sleep(0.2)
    assert not stored(), "the topic's checkpoints and segments are deleted"
