"""Topic config validation as Apache Kafka 4.3 does it, as one list of cases run three ways: on
TidalMQ's validation table itself (tests/unit/core/test_topic_config_validation.py), on a
TidalMQ broker (tests/integration/broker/test_topic_config_validation.py) and on the real
Apache Kafka (tests/integration/apache_kafka/test_topic_config_validation.py), so a case that
only TidalMQ passes shows up.

KAFKA_ACCEPTS and KAFKA_REFUSES are what Kafka 4.3.1 answers (CreateTopics: INVALID_CONFIG with
the message given, exactly). TIDALMQ_NARROWS are values Kafka takes that TidalMQ's design
refuses (docs/topic-configs.md): Kafka must accept them, TidalMQ refuse them with a message
saying why."""

from __future__ import annotations

import time
import uuid
import warnings

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.support.waiting import wait_for

KAFKA_ACCEPTS: list[dict[str, str]] = [
    {"segment.bytes": "1048576"},
    {"segment.bytes": " 1048576 "},
    {"segment.bytes": "+2097152"},
    # Kafka's internal override, "for testing only": any size (docs/topic-configs.md)
    {"internal.segment.bytes": "4096"},
    {"internal.segment.bytes": "1"},
    {"segment.ms": "1"},
    {"retention.ms": "-1"},
    {"retention.ms": "\t100\n"},
    {"retention.bytes": "-2"},
    {"max.message.bytes": "0"},
    {"delete.retention.ms": "0"},
    {"min.compaction.lag.ms": "100", "max.compaction.lag.ms": "100"},
    {"max.compaction.lag.ms": str(2**63 - 1)},
    {"min.cleanable.dirty.ratio": "0"},
    {"min.cleanable.dirty.ratio": "1"},
    {"min.cleanable.dirty.ratio": "1e-2"},
    {"min.cleanable.dirty.ratio": ".5"},
    {"min.cleanable.dirty.ratio": "0.5d"},
    {"min.cleanable.dirty.ratio": "0x1p-1"},
    {"min.cleanable.dirty.ratio": "NaN"},  # Kafka's range check lets NaN through
    {"cleanup.policy": ""},
    {"cleanup.policy": " "},
    {"cleanup.policy": "compact"},
    {"cleanup.policy": " compact , delete "},
    {"cleanup.policy": "compact,compact"},  # Kafka 4.3 takes repeats
    {"message.timestamp.type": "LogAppendTime"},
    {"compression.type": "producer"},
    {"min.insync.replicas": "1"},
    {"leader.replication.throttled.replicas": "*"},
    {"leader.replication.throttled.replicas": ""},
    {"follower.replication.throttled.replicas": "0:1, 1:2"},
    {"follower.replication.throttled.replicas": "0:1,"},
    # Kafka's configs that mean nothing on object storage: taken, described, no effect
    {"segment.jitter.ms": "0"},
    {"segment.jitter.ms": "60000"},
    {"segment.index.bytes": "4"},
    {"flush.messages": "1"},
    {"flush.ms": "0"},
    {"index.interval.bytes": "0"},
    {"file.delete.delay.ms": "0"},
    {"preallocate": "true"},
    {"preallocate": " FALSE "},  # Kafka's BOOLEAN: any case, trimmed
    {"unclean.leader.election.enable": "false"},
    # the levels of a topic codec (KIP-390)
    {"compression.gzip.level": "-1"},
    {"compression.gzip.level": "9"},
    {"compression.lz4.level": "17"},
    {"compression.zstd.level": "-131072"},
    {"compression.zstd.level": "22"},
    # KIP-937's bounds
    {"message.timestamp.before.max.ms": "0"},
    {"message.timestamp.after.max.ms": str(2**63 - 1)},
    # tiered storage, off (as on a Kafka whose brokers do not enable it)
    {"remote.storage.enable": "false"},
    {"local.retention.ms": "-2"},
    {"local.retention.bytes": "1000", "retention.bytes": "10"},
    {"remote.log.copy.disable": "true"},
    {"remote.log.delete.on.disable": "true"},
]


def _invalid(value: str, name: str, why: str) -> str:
    return f"Invalid value {value} for configuration {name}: {why}"


KAFKA_REFUSES: list[tuple[dict[str, str], str]] = [
    (
        {"segment.bytes": "4096"},
        _invalid("4096", "segment.bytes", "Value must be at least 1048576"),
    ),
    (
        {"segment.bytes": "1048575"},
        _invalid("1048575", "segment.bytes", "Value must be at least 1048576"),
    ),
    (
        {"segment.bytes": "2147483648"},
        _invalid("2147483648", "segment.bytes", "Not a number of type INT"),
    ),
    (
        {"segment.bytes": "1_048_576"},
        _invalid("1_048_576", "segment.bytes", "Not a number of type INT"),
    ),
    (
        {"segment.bytes": "1048576.0"},
        _invalid("1048576.0", "segment.bytes", "Not a number of type INT"),
    ),
    (
        {"internal.segment.bytes": "abc"},
        _invalid("abc", "internal.segment.bytes", "Not a number of type INT"),
    ),
    ({"segment.ms": "0"}, _invalid("0", "segment.ms", "Value must be at least 1")),
    (
        {"segment.ms": str(2**63)},
        _invalid(str(2**63), "segment.ms", "Not a number of type LONG"),
    ),
    ({"retention.ms": "-2"}, _invalid("-2", "retention.ms", "Value must be at least -1")),
    ({"retention.ms": "soon"}, _invalid("soon", "retention.ms", "Not a number of type LONG")),
    ({"max.message.bytes": "-1"}, _invalid("-1", "max.message.bytes", "Value must be at least 0")),
    (
        {"delete.retention.ms": "-1"},
        _invalid("-1", "delete.retention.ms", "Value must be at least 0"),
    ),
    (
        {"min.compaction.lag.ms": "-1"},
        _invalid("-1", "min.compaction.lag.ms", "Value must be at least 0"),
    ),
    (
        {"max.compaction.lag.ms": "0"},
        _invalid("0", "max.compaction.lag.ms", "Value must be at least 1"),
    ),
    (
        {"min.compaction.lag.ms": "200", "max.compaction.lag.ms": "100"},
        "conflict topic config setting min.compaction.lag.ms (200) > max.compaction.lag.ms (100)",
    ),
    (
        {"min.cleanable.dirty.ratio": "1.5"},
        _invalid("1.5", "min.cleanable.dirty.ratio", "Value must be no more than 1"),
    ),
    (  # the parsed value, as Java prints it
        {"min.cleanable.dirty.ratio": "5."},
        _invalid("5.0", "min.cleanable.dirty.ratio", "Value must be no more than 1"),
    ),
    (
        {"min.cleanable.dirty.ratio": "-0.1"},
        _invalid("-0.1", "min.cleanable.dirty.ratio", "Value must be at least 0"),
    ),
    (
        {"min.cleanable.dirty.ratio": "Infinity"},
        _invalid("Infinity", "min.cleanable.dirty.ratio", "Value must be no more than 1"),
    ),
    (
        {"min.cleanable.dirty.ratio": "half"},
        _invalid("half", "min.cleanable.dirty.ratio", "Not a number of type DOUBLE"),
    ),
    (
        {"cleanup.policy": "compact,shred"},
        _invalid("shred", "cleanup.policy", "String must be one of: compact, delete"),
    ),
    (
        {"cleanup.policy": "Compact"},
        _invalid("Compact", "cleanup.policy", "String must be one of: compact, delete"),
    ),
    ({"cleanup.policy": "compact,"}, "Configuration 'cleanup.policy' values must not be empty."),
    ({"cleanup.policy": ","}, "Configuration 'cleanup.policy' values must not be empty."),
    (
        {"message.timestamp.type": "createtime"},
        _invalid(
            "createtime",
            "message.timestamp.type",
            "String must be one of: CreateTime, LogAppendTime",
        ),
    ),
    (
        {"compression.type": "brotli"},
        _invalid(
            "brotli",
            "compression.type",
            "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
    ),
    (
        {"min.insync.replicas": "0"},
        _invalid("0", "min.insync.replicas", "Value must be at least 1"),
    ),
    (
        {"leader.replication.throttled.replicas": "*,0:1"},
        _invalid(
            "[*, 0:1]",
            "leader.replication.throttled.replicas",
            "leader.replication.throttled.replicas must be the literal '*' or a list of replicas "
            "in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
        ),
    ),
    ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
    # removed in Kafka 4.0 (with the message formats before v2)
    (
        {"message.downconversion.enable": "true"},
        "Unknown topic config name: message.downconversion.enable",
    ),
    (
        {"segment.jitter.ms": "-1"},
        _invalid("-1", "segment.jitter.ms", "Value must be at least 0"),
    ),
    (
        {"segment.index.bytes": "3"},
        _invalid("3", "segment.index.bytes", "Value must be at least 4"),
    ),
    ({"flush.messages": "0"}, _invalid("0", "flush.messages", "Value must be at least 1")),
    ({"flush.ms": "-1"}, _invalid("-1", "flush.ms", "Value must be at least 0")),
    (
        {"index.interval.bytes": "-1"},
        _invalid("-1", "index.interval.bytes", "Value must be at least 0"),
    ),
    (
        {"file.delete.delay.ms": "-1"},
        _invalid("-1", "file.delete.delay.ms", "Value must be at least 0"),
    ),
    (
        {"preallocate": "yes"},
        _invalid("yes", "preallocate", "Expected value to be either true or false"),
    ),
    (
        {"unclean.leader.election.enable": "1"},
        _invalid(
            "1", "unclean.leader.election.enable", "Expected value to be either true or false"
        ),
    ),
    (
        {"compression.gzip.level": "0"},
        _invalid("0", "compression.gzip.level", "Value must be between 1 and 9 or equal to -1"),
    ),
    (
        {"compression.gzip.level": "10"},
        _invalid("10", "compression.gzip.level", "Value must be between 1 and 9 or equal to -1"),
    ),
    (
        {"compression.lz4.level": "18"},
        _invalid("18", "compression.lz4.level", "Value must be no more than 17"),
    ),
    (
        {"compression.zstd.level": "-131073"},
        _invalid("-131073", "compression.zstd.level", "Value must be at least -131072"),
    ),
    (
        {"message.timestamp.before.max.ms": "-1"},
        _invalid("-1", "message.timestamp.before.max.ms", "Value must be at least 0"),
    ),
    (
        {"message.timestamp.after.max.ms": "soon"},
        _invalid("soon", "message.timestamp.after.max.ms", "Not a number of type LONG"),
    ),
    (
        {"local.retention.ms": "-3"},
        _invalid("-3", "local.retention.ms", "Value must be at least -2"),
    ),
    (
        {"local.retention.bytes": "-3"},
        _invalid("-3", "local.retention.bytes", "Value must be at least -2"),
    ),
    (  # Kafka without tiered storage in its brokers, which is what TidalMQ is
        {"remote.storage.enable": "true"},
        "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
        "with remote log storage.",
    ),
    (
        {"remote.storage.enable": "true", "remote.log.copy.disable": "true"},
        "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
        "with remote log storage.",
    ),
    (  # the values are checked before tiered storage is
        {"remote.storage.enable": "true", "flush.ms": "-1"},
        _invalid("-1", "flush.ms", "Value must be at least 0"),
    ),
    # names first, then the values in Kafka's order of its definitions, whatever the request's
    ({"segment.bytes": "4096", "nope": "1"}, "Unknown topic config name: nope"),
    (
        {"retention.ms": "-5", "segment.bytes": "4096"},
        _invalid("4096", "segment.bytes", "Value must be at least 1048576"),
    ),
]

TIDALMQ_NARROWS: list[tuple[dict[str, str], str]] = [
    ({"min.insync.replicas": "2"}, "every partition has one durable copy in object storage"),
    ({"compression.type": "gzip"}, "never recompresses"),
    ({"unclean.leader.election.enable": "true"}, "never an out-of-sync replica"),
    ({"unclean.leader.election.enable": " True "}, "never an out-of-sync replica"),
]


def describe_topic_configs(
    admin: AdminClient, topic: str, timeout_s: float = 15
) -> dict[str, ConfigEntry]:
    """DescribeConfigs of a topic just created: Kafka's CreateTopics answers once its controller
    has the topic, and a broker answers UNKNOWN_TOPIC_OR_PART until its metadata has it too."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            entries: dict[str, ConfigEntry] = admin.describe_configs([resource])[resource].result(
                timeout_s
            )
            return entries
        except KafkaException as exc:
            unknown = exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def create_error(admin: AdminClient, configs: dict[str, str]) -> str | None:
    """CreateTopics with validate_only: None if accepted, else "ERROR_NAME: message"."""
    topic = f"config-check-{uuid.uuid4().hex[:8]}"
    future = admin.create_topics([NewTopic(topic, 1, 1, config=configs)], validate_only=True)
    return _error(future[topic])


def _error(future: object) -> str | None:
    try:
        future.result(20)  # type: ignore[attr-defined]
    except KafkaException as exc:
        error = exc.args[0]
        return f"{error.name()}: {error.str()}"
    return None


def check_create_topics(bootstrap: str, *, tidalmq: bool) -> None:
    """Every case through CreateTopics (validate_only), all failures reported at once."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wrong: list[str] = []
    for configs in KAFKA_ACCEPTS:
        got = create_error(admin, configs)
        if got is not None:
            wrong.append(f"{configs}: refused with {got}")
    for configs, message in KAFKA_REFUSES:
        got = create_error(admin, configs)
        if got != f"INVALID_CONFIG: {message}":
            wrong.append(f"{configs}: {got}, not INVALID_CONFIG: {message}")
    for configs, why in TIDALMQ_NARROWS:
        got = create_error(admin, configs)
        if tidalmq and (got is None or not got.startswith("INVALID_CONFIG: ") or why not in got):
            wrong.append(f"{configs}: {got}, not INVALID_CONFIG saying {why!r}")
        if not tidalmq and got is not None:
            wrong.append(f"{configs}: Kafka refused with {got}")
    assert not wrong, "\n".join(wrong)


def check_alter_configs(bootstrap: str) -> None:
    """IncrementalAlterConfigs and AlterConfigs check the topic's configs after the change, as
    CreateTopics does, with the same messages; internal.segment.bytes is a topic config like
    another (described when set)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"config-check-{uuid.uuid4().hex[:8]}"
    configs = {"internal.segment.bytes": "4096", "min.compaction.lag.ms": "1000"}
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(20)

    def incremental(name: str, value: str | None, op: AlterConfigOpType) -> str | None:
        change = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[ConfigEntry(name, value, incremental_operation=op)],
        )
        return _error(admin.incremental_alter_configs([change])[change])

    def replace(configs: dict[str, str]) -> str | None:
        change = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config=configs)
        with warnings.catch_warnings():  # the deprecated AlterConfigs is what is checked here
            warnings.simplefilter("ignore", DeprecationWarning)
            return _error(admin.alter_configs([change])[change])

    def described() -> dict[str, str | None]:
        entries = describe_topic_configs(admin, topic)
        return {name: entry.value for name, entry in entries.items()}

    def shows(name: str, value: str) -> None:
        """Until DescribeConfigs shows the accepted change: a broker applies it from the
        metadata log a moment after the answer (Kafka described the old value right after a
        successful IncrementalAlterConfigs, once in a CI run)."""
        wait_for(
            f"DescribeConfigs shows {name}={value}",
            lambda: described()[name] == value,
            timeout_s=10,
            poll_s=0.05,
        )

    set_ = AlterConfigOpType.SET
    assert described()["internal.segment.bytes"] == "4096"
    assert incremental("segment.bytes", "4096", set_) == "INVALID_CONFIG: " + _invalid(
        "4096", "segment.bytes", "Value must be at least 1048576"
    )
    # the cross check is on the topic's configs after the change
    assert incremental("max.compaction.lag.ms", "500", set_) == (
        "INVALID_CONFIG: conflict topic config setting min.compaction.lag.ms (1000) > "
        "max.compaction.lag.ms (500)"
    )
    assert incremental("nope", "1", set_) == "INVALID_CONFIG: Unknown topic config name: nope"
    assert incremental("cleanup.policy", "shred", AlterConfigOpType.APPEND) == (
        "INVALID_CONFIG: "
        + _invalid("shred", "cleanup.policy", "String must be one of: compact, delete")
    )
    assert incremental("remote.storage.enable", "true", set_) == (
        "INVALID_CONFIG: Tiered Storage functionality is disabled in the broker. Topic cannot be "
        "configured with remote log storage."
    )
    assert incremental("preallocate", "True", set_) is None
    shows("preallocate", "true")
    assert described()["preallocate"] == "true"
    assert incremental("internal.segment.bytes", "8192", set_) is None
    shows("internal.segment.bytes", "8192")
    assert described()["internal.segment.bytes"] == "8192"
    assert replace({"segment.ms": "0"}) == "INVALID_CONFIG: " + _invalid(
        "0", "segment.ms", "Value must be at least 1"
    )
    assert replace({"segment.bytes": "2097152"}) is None
    shows("segment.bytes", "2097152")
    after = described()
    assert after["segment.bytes"] == "2097152"
    assert "internal.segment.bytes" not in after  # AlterConfigs replaces them all


# Kafka 4.3.1's defaults of the configs that have no effect on TidalMQ, only bound
# timestamps or only jitter a roll, as a topic with none set describes them
KAFKA_DEFAULTS = {
    "segment.jitter.ms": "0",
    "segment.index.bytes": "10485760",
    "flush.messages": str(2**63 - 1),
    "flush.ms": str(2**63 - 1),
    "index.interval.bytes": "4096",
    "file.delete.delay.ms": "60000",
    "unclean.leader.election.enable": "false",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "preallocate": "false",
    "message.timestamp.before.max.ms": str(2**63 - 1),
    "message.timestamp.after.max.ms": "3600000",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
    "local.retention.bytes": "-2",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}


def check_described_defaults(bootstrap: str) -> None:
    """DescribeConfigs of a topic with no configs set shows Kafka's defaults of these configs;
    one set is described as Kafka describes it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"config-check-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1, config={"preallocate": "TRUE"})])[topic].result(20)
    entries = describe_topic_configs(admin, topic)
    described = {name: entries[name].value for name in KAFKA_DEFAULTS if name in entries}
    expected = {**KAFKA_DEFAULTS, "preallocate": "true"}  # a BOOLEAN as Kafka parsed it
    differ = {n: (described.get(n), v) for n, v in expected.items() if described.get(n) != v}
    assert not differ, f"described, expected: {differ}"
    assert entries["segment.jitter.ms"].is_default
    assert not entries["preallocate"].is_default
