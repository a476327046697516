"""Topic names, partition counts and configs: their definitions and defaults, their validation
(Kafka's rules), and what a topic's effective configs mean for the records written to it
(ProduceRules)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS = 10_000
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


class InvalidTopic(ValueError):
    """INVALID_TOPIC_EXCEPTION"""


class InvalidPartitions(ValueError):
    """INVALID_PARTITIONS"""


class InvalidConfig(ValueError):
    """INVALID_CONFIG"""


class StaticConfig(ValueError):
    """INVALID_REQUEST: a broker config that only a restart changes (Kafka's wording)."""


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopic("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopic(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(
            f"topic name is {len(name)} characters, the maximum is {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL.match(name):
        raise InvalidTopic(
            f"topic name {name!r} has characters outside ASCII alphanumerics, '.', '_' and '-'"
        )


def validate_partition_count(count: int) -> None:
    if count < 1:
        raise InvalidPartitions(f"number of partitions must be at least 1, got {count}")
    if count > MAX_PARTITIONS:
        raise InvalidPartitions(f"number of partitions {count} exceeds the limit {MAX_PARTITIONS}")


# Topic configs TidalMQ knows, with Kafka's defaults (as strings, as Kafka reports them).
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": str(7 * 24 * 3600 * 1000),
    "retention.bytes": "-1",
    "max.message.bytes": str(1024 * 1024 + 12),
    "segment.bytes": str(64 * 1024 * 1024),
    "message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "min.insync.replicas": "1",
    # the log cleaner's (docs/compaction.md): Kafka 4.3's defaults
    "delete.retention.ms": str(24 * 3600 * 1000),
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(2**63 - 1),
    "segment.ms": str(7 * 24 * 3600 * 1000),
    # Set and cleared by kafka-reassign-partitions --throttle. TidalMQ copies no data when a
    # partition moves, so they are recorded (and reported) but limit nothing.
    "leader.replication.throttled.replicas": "",
    "follower.replication.throttled.replicas": "",
    # KIP-937's bounds on a CreateTime record's timestamp (Kafka 4's defaults: any age, at most
    # an hour ahead)
    "message.timestamp.before.max.ms": str(2**63 - 1),
    "message.timestamp.after.max.ms": str(3600 * 1000),
    # taken off segment.ms per segment (docs/topic-configs.md)
    "segment.jitter.ms": "0",
    # Kafka's, described and taken but with no effect here (docs/topic-configs.md)
    "segment.index.bytes": str(10 * 1024 * 1024),
    "flush.messages": str(2**63 - 1),
    "flush.ms": str(2**63 - 1),
    "index.interval.bytes": "4096",
    "file.delete.delay.ms": "60000",
    "unclean.leader.election.enable": "false",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "preallocate": "false",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
    "local.retention.bytes": "-2",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}

# Broker configs that can be changed at runtime (Kafka's dynamic broker configs TidalMQ accepts),
# with Kafka's defaults. Keyed in ClusterMetadata.broker_configs by broker id, "" for the
# cluster-wide default. The replication throttles are what kafka-reassign-partitions --throttle
# sets; a TidalMQ move copies no data, so they are recorded and reported but limit nothing.
DYNAMIC_BROKER_CONFIG_DEFAULTS: dict[str, str] = {
    "leader.replication.throttled.rate": str(2**63 - 1),
    "follower.replication.throttled.rate": str(2**63 - 1),
    "replica.alter.log.dirs.io.max.bytes.per.second": str(2**63 - 1),
}
CLUSTER_DEFAULT = ""  # the broker-config scope of `kafka-configs --entity-default`


# --------------------------------------------------------------------------- topic configs
# One definition per topic config TidalMQ knows, as Apache Kafka 4.3 defines it (its LogConfig:
# type, range or allowed values), in Kafka's order, which is the order Kafka checks them in (the
# first invalid one is the one reported). `only`/`why` narrow what TidalMQ takes where its design
# differs (docs/topic-configs.md); those refusals come after Kafka's own checks, so a value Kafka
# refuses gets Kafka's message.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
_LONG_MAX = LONG_MAX
# Kafka's segment.bytes minimum since 4.0 (KIP-1030). `internal.segment.bytes`, Kafka's internal
# override "for testing only", takes any size and wins over segment.bytes (effective_segment_bytes)
SEGMENT_BYTES_MIN = 1024 * 1024
INTERNAL_SEGMENT_BYTES = "internal.segment.bytes"
CLEANUP_POLICIES = ("compact", "delete")
# Kafka's BrokerCompressionType names, in the order its message lists them
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    name: str
    type: str  # Kafka's ConfigDef type: INT, LONG, DOUBLE, BOOLEAN, STRING or LIST
    at_least: float | None = None
    at_most: float | None = None
    or_equal: int | None = None  # a value also taken outside the range (gzip's level -1)
    one_of: tuple[str, ...] = ()  # STRING: the value, LIST: each item
    replicas: bool = False  # LIST of partition:broker pairs or "*" (ThrottledReplicaListValidator)
    internal: bool = False  # Kafka's internal configs: no default, described only when set
    only: tuple[str, ...] = ()  # what TidalMQ takes of Kafka's valid values (empty: all)
    why: str = ""  # why TidalMQ takes only `only`
    doc: str = ""  # what it does here, one or two sentences (the CRDs' descriptions)


# Kafka's other configs are each taken as Kafka takes them, with a reason for what they do here
# in docs/topic-configs.md; the ones that mean nothing on object storage ("no effect") or only
# with Kafka's tiered storage, which TidalMQ does not offer, change nothing but are described.
_NO_UNCLEAN_ELECTION = (
    "a partition's acknowledged records are in object storage, from which any broker leads "
    "it, so there is never an out-of-sync replica to elect and lose records with"
)
TOPIC_CONFIG_DEFS: tuple[TopicConfigDef, ...] = (
    TopicConfigDef(
        "segment.bytes",
        "INT",
        at_least=SEGMENT_BYTES_MIN,
        doc="Size at which a partition's compacted segments are cut, in bytes (Kafka: the size "
        "at which the active segment rolls). Default: 67108864 (64 MiB; Kafka's is 1 GiB): a "
        "compaction holds one segment in memory.",
    ),
    TopicConfigDef(
        "segment.ms",
        "LONG",
        at_least=1,
        doc="Age (by its first batch's timestamp) at which a segment stops taking merges of new records, in "
        "milliseconds, or earlier at half of retention.ms (delete policy) or at "
        "max.compaction.lag.ms (compacted) when lower (Kafka: the age at which the active "
        "segment rolls).",
    ),
    TopicConfigDef(
        "segment.jitter.ms",
        "LONG",
        at_least=0,
        doc="Most milliseconds taken off the age at which a segment stops taking merges "
        "(at most segment.ms), an amount of its own for each segment (derived from its object key, the "
        "same on every broker), so partitions do not all cut at once (Kafka: a random amount "
        "per segment taken off segment.ms).",
    ),
    TopicConfigDef(
        "segment.index.bytes",
        "INT",
        at_least=4,
        doc="Kafka: size of a segment's index files, in bytes. Taken, no effect: a partition's "
        "index is in its checkpoint in object storage.",
    ),
    TopicConfigDef(
        "flush.messages",
        "LONG",
        at_least=1,
        doc="Kafka: fsync the log after this many messages. Taken, no effect: a record is "
        "acknowledged only once durable in object storage.",
    ),
    TopicConfigDef(
        "flush.ms",
        "LONG",
        at_least=0,
        doc="Kafka: fsync the log after this many milliseconds. Taken, no effect: a record is "
        "acknowledged only once durable in object storage.",
    ),
    TopicConfigDef(
        "retention.bytes",
        "LONG",
        doc="Under cleanup.policy delete: a partition's oldest segment is deleted while the "
        "partition would still hold at least this many bytes without it (-1: no size limit). "
        "Records not yet compacted into a segment wait for it.",
    ),
    TopicConfigDef(
        "retention.ms",
        "LONG",
        at_least=-1,
        doc="Under cleanup.policy delete: a segment is deleted once its newest record's "
        "timestamp is older than this many milliseconds (-1: no time limit). Records not yet "
        "compacted into a segment wait for it.",
    ),
    TopicConfigDef(
        "max.message.bytes",
        "INT",
        at_least=0,
        doc="Largest record batch a Produce may carry, in bytes, as the producer compressed it.",
    ),
    TopicConfigDef(
        "index.interval.bytes",
        "INT",
        at_least=0,
        doc="Kafka: bytes between offset index entries. Taken, no effect: a compacted segment's "
        "index has an entry every --index-granule-bytes, a broker setting the same for every "
        "topic.",
    ),
    TopicConfigDef(
        "delete.retention.ms",
        "LONG",
        at_least=0,
        doc="How long a compacted topic keeps a tombstone (a record with a key and no value) and "
        "a transaction marker whose transaction's records are all gone, once the log cleaner "
        "has first passed over it, in milliseconds.",
    ),
    TopicConfigDef(
        "min.compaction.lag.ms",
        "LONG",
        at_least=0,
        doc="Least time a record stays uncompacted, in milliseconds (at most "
        "max.compaction.lag.ms).",
    ),
    TopicConfigDef(
        "max.compaction.lag.ms",
        "LONG",
        at_least=1,
        doc="Longest time a record may wait for compaction, in milliseconds: past it its "
        "partition is compacted whatever min.cleanable.dirty.ratio says (as soon as the log "
        "cleaner has a free thread).",
    ),
    TopicConfigDef(
        "file.delete.delay.ms",
        "LONG",
        at_least=0,
        doc="Kafka: delay before a deleted segment's file is removed, in milliseconds. Taken, no "
        "effect: a replaced segment object goes after --garbage-grace-s, a broker setting the "
        "same for every topic.",
    ),
    TopicConfigDef(
        "min.cleanable.dirty.ratio",
        "DOUBLE",
        at_least=0,
        at_most=1,
        doc="Share of a compacted partition's segments not yet compacted (dirty) above which the "
        "log cleaner compacts it again.",
    ),
    TopicConfigDef(
        "cleanup.policy",
        "LIST",
        one_of=CLEANUP_POLICIES,
        doc="delete (retention by time and size), compact (the latest record per key is kept) "
        "or both, comma-separated (empty: neither, records are kept forever).",
    ),
    TopicConfigDef(
        "unclean.leader.election.enable",
        "BOOLEAN",
        only=("false",),
        why=_NO_UNCLEAN_ELECTION,
        doc="Kafka: let an out-of-sync replica lead, losing records, rather than stay unavailable.",
    ),
    TopicConfigDef(
        "min.insync.replicas",
        "INT",
        at_least=1,
        only=("1",),
        why="every partition has one durable copy in object storage",
        doc="Kafka: least in-sync replicas for a Produce with acks=all.",
    ),
    TopicConfigDef(
        "compression.type",
        "STRING",
        one_of=COMPRESSION_TYPES,
        # Kafka recompresses batches to a topic's codec; TidalMQ never re-encodes a batch, so it
        # takes only "producer" rather than accept a codec and silently not apply it
        only=("producer",),
        why="TidalMQ stores batches as the producer compressed them and never recompresses; "
        "set compression.type on the producer instead",
        doc="Kafka: the codec the broker stores batches in.",
    ),
    # the levels of a topic codec: with compression.type=producer they mean nothing on Kafka
    # either (no effect)
    TopicConfigDef(
        "compression.gzip.level",
        "INT",
        at_least=1,
        at_most=9,
        or_equal=-1,
        doc="Kafka: level of the broker's recompression to gzip. Taken, no effect: TidalMQ "
        "never recompresses.",
    ),
    TopicConfigDef(
        "compression.lz4.level",
        "INT",
        at_least=1,
        at_most=17,
        doc="Kafka: level of the broker's recompression to lz4. Taken, no effect: TidalMQ "
        "never recompresses.",
    ),
    TopicConfigDef(
        "compression.zstd.level",
        "INT",
        at_least=-131072,
        at_most=22,
        doc="Kafka: level of the broker's recompression to zstd. Taken, no effect: TidalMQ "
        "never recompresses.",
    ),
    TopicConfigDef(
        "preallocate",
        "BOOLEAN",
        doc="Kafka: preallocate a new segment's file. Taken, no effect: there are no segment "
        "files.",
    ),
    TopicConfigDef(
        "message.timestamp.type",
        "STRING",
        one_of=("CreateTime", "LogAppendTime"),
        doc="CreateTime: records keep the producer's timestamps (a batch the producer marked "
        "LogAppendTime is stored as CreateTime). LogAppendTime: the broker marks each batch with "
        "its clock as it appends it, and refuses a batch the producer marked so, as Kafka does.",
    ),
    # KIP-937: the range a CreateTime record's timestamp must be in (produce.timestamp_refusal)
    TopicConfigDef(
        "message.timestamp.before.max.ms",
        "LONG",
        at_least=0,
        doc="How far behind the broker's clock a CreateTime record's timestamp may be, in "
        "milliseconds (not checked on a LogAppendTime topic).",
    ),
    TopicConfigDef(
        "message.timestamp.after.max.ms",
        "LONG",
        at_least=0,
        doc="How far ahead of the broker's clock a CreateTime record's timestamp may be, in "
        "milliseconds (not checked on a LogAppendTime topic).",
    ),
    TopicConfigDef(
        "leader.replication.throttled.replicas",
        "LIST",
        replicas=True,
        doc="Kafka: the leader replicas whose replication is throttled ('*' or "
        "partition:broker pairs). Recorded, limit nothing: a move copies no data.",
    ),
    TopicConfigDef(
        "follower.replication.throttled.replicas",
        "LIST",
        replicas=True,
        doc="Kafka: the follower replicas whose replication is throttled ('*' or "
        "partition:broker pairs). Recorded, limit nothing: a move copies no data.",
    ),
    # Kafka's tiered storage (KIP-405): TidalMQ answers as a Kafka whose brokers have it off
    # (remote.log.storage.system.enable=false): remote.storage.enable=true is refused with
    # that Kafka's message (validate_configs, before `only` is looked at), and the others,
    # which only act on a tiered topic, are taken
    TopicConfigDef(
        "remote.storage.enable",
        "BOOLEAN",
        only=("false",),
        why="TidalMQ has one tier, the object store, and no local log to tier from",
        doc="Kafka: tier the topic's log to remote storage (KIP-405).",
    ),
    TopicConfigDef(
        "local.retention.ms",
        "LONG",
        at_least=-2,
        doc="Kafka: milliseconds a tiered topic keeps its local log (-2: retention.ms). Taken, "
        "no effect: only acts on a tiered topic, and TidalMQ has no tiered topics.",
    ),
    TopicConfigDef(
        "local.retention.bytes",
        "LONG",
        at_least=-2,
        doc="Kafka: bytes a tiered topic keeps in its local log (-2: retention.bytes). Taken, "
        "no effect: only acts on a tiered topic, and TidalMQ has no tiered topics.",
    ),
    TopicConfigDef(
        "remote.log.copy.disable",
        "BOOLEAN",
        doc="Kafka: stop copying a tiered topic's segments to remote storage. Taken, no "
        "effect: only acts on a tiered topic, and TidalMQ has no tiered topics.",
    ),
    TopicConfigDef(
        "remote.log.delete.on.disable",
        "BOOLEAN",
        doc="Kafka: delete the remote log when tiering is turned off. Taken, no effect: only "
        "acts on a tiered topic, and TidalMQ has no tiered topics.",
    ),
    TopicConfigDef(
        INTERNAL_SEGMENT_BYTES,
        "INT",
        internal=True,
        doc="Kafka's internal override of segment.bytes, for testing only: any size.",
    ),
)
TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in TOPIC_CONFIG_DEFS}
# what validate_configs(static=True) adds: a static topic's cleanup.policy has no compact
STATIC_CLEANUP_POLICIES = tuple(p for p in CLEANUP_POLICIES if p != "compact")
NO_STATIC_COMPACT = (
    "a logic queue spans several physical partitions, and keys are not compacted across them"
)


def narrowing(d: TopicConfigDef, *, static: bool = False) -> str:
    """What TidalMQ takes of a config where that is less than Kafka takes (its `only` and
    `why`; a static topic's cleanup.policy), as sentences; empty where it takes all Kafka
    takes."""
    text = f"TidalMQ takes only {', '.join(d.only)}: {d.why}." if d.only else ""
    if static and d.name == "cleanup.policy":
        text += f" A static topic takes only {', '.join(STATIC_CLEANUP_POLICIES)}."
    return text.strip()


def documentation(d: TopicConfigDef, *, static: bool = False) -> str:
    """A config's documentation as DescribeConfigs returns it when asked
    (IncludeDocumentation, v3+): its `doc`, then what TidalMQ narrows. The CRDs' descriptions
    are the same sentences with Kafka's type and check between them
    (tidalmq_operator.crd_configs.description)."""
    return f"{d.doc} {narrowing(d, static=static)}".strip()


def _java_trim(value: str) -> str:
    """Java's String.trim (what Kafka's ConfigDef applies before parsing): characters up to
    U+0020 off both ends."""
    return value.strip(_JAVA_BLANKS)


_JAVA_BLANKS = "".join(chr(c) for c in range(33))  # what String.trim takes off: U+0000..U+0020


_INTEGER = re.compile(r"[+-]?\d+")  # Java's Integer/Long.parseLong: Unicode digits too
_DECIMAL = re.compile(r"[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?)", re.ASCII)
_HEX_FLOAT = re.compile(
    r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?"
)


def _parse_number(d: TopicConfigDef, raw: str) -> int | float:
    """The value as Kafka's ConfigDef parses an INT, LONG or DOUBLE, or its refusal."""
    text = _java_trim(raw)
    number: int | float | None = None
    if d.type == "DOUBLE":
        if _DECIMAL.fullmatch(text):
            number = float(text.rstrip("fFdD"))
        elif _HEX_FLOAT.fullmatch(text):
            number = float.fromhex(text.rstrip("fFdD"))
    elif _INTEGER.fullmatch(text):
        low, high = (INT_MIN, INT_MAX) if d.type == "INT" else (LONG_MIN, LONG_MAX)
        number = int(text) if low <= int(text) <= high else None
    if number is None:
        raise InvalidConfig(
            f"Invalid value {raw} for configuration {d.name}: Not a number of type {d.type}"
        )
    return number


def _parse_boolean(d: TopicConfigDef, raw: str) -> bool:
    """Kafka's BOOLEAN parse: "true" or "false" in any case, after trimming."""
    text = _java_trim(raw).lower()
    if text not in ("true", "false"):
        raise InvalidConfig(
            f"Invalid value {raw} for configuration {d.name}: "
            "Expected value to be either true or false"
        )
    return text == "true"


def _java_number(number: int | float) -> str:
    """How Java prints the parsed value in Kafka's range messages (Double.toString)."""
    if isinstance(number, int):
        return str(number)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    if number == 0 or 1e-3 <= abs(number) < 1e7:
        text = repr(number)
        return text if "." in text or "e" in text else text + ".0"
    # Java's computerized scientific notation of the shortest round-trip digits
    shortest = Decimal(repr(abs(number))).as_tuple()
    digits = "".join(map(str, shortest.digits)).lstrip("0")
    exponent = len(digits) + int(shortest.exponent) - 1
    digits = digits.rstrip("0") or "0"
    sign = "-" if number < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _list_items(raw: str) -> list[str]:
    """Kafka's LIST parse: empty (after trimming) is no items, else split on commas with the
    blanks around them."""
    text = _java_trim(raw)
    return re.split(r"\s*,\s*", text) if text else []


def _check_kafka(d: TopicConfigDef, raw: str) -> None:
    """Kafka 4.3's check of one value: its type, then its range or allowed values."""
    if d.type == "BOOLEAN":
        _parse_boolean(d, raw)
        return
    if d.type in ("INT", "LONG", "DOUBLE"):
        number = _parse_number(d, raw)
        if d.or_equal is not None and d.at_least is not None and d.at_most is not None:
            # Kafka's validator for gzip's level: a range, or one value outside it
            if number != d.or_equal and not d.at_least <= number <= d.at_most:
                raise InvalidConfig(
                    f"Invalid value {_java_number(number)} for configuration {d.name}: Value "
                    f"must be between {_java_number(int(d.at_least))} and "
                    f"{_java_number(int(d.at_most))} or equal to {d.or_equal}"
                )
            return
        if d.at_least is not None and number < d.at_least:
            bound = f"at least {_java_number(d.at_least)}"
        elif d.at_most is not None and number > d.at_most:  # NaN passes, as in Kafka
            bound = f"no more than {_java_number(d.at_most)}"
        else:
            return
        raise InvalidConfig(
            f"Invalid value {_java_number(number)} for configuration {d.name}: "
            f"Value must be {bound}"
        )
    if d.type == "STRING":
        value = _java_trim(raw)
        if d.one_of and value not in d.one_of:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {d.name}: String must be one of: "
                + ", ".join(d.one_of)
            )
        return
    items = _list_items(raw)
    if d.replicas:
        if all(re.fullmatch(r"([0-9]+:[0-9]+)?", i.strip()) for i in items) or (
            "".join(items).strip() == "*"
        ):
            return
        raise InvalidConfig(
            f"Invalid value [{', '.join(items)}] for configuration {d.name}: {d.name} must be "
            "the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
        )
    if any(not item for item in items):
        raise InvalidConfig(f"Configuration '{d.name}' values must not be empty.")
    for item in items:
        if d.one_of and item not in d.one_of:
            raise InvalidConfig(
                f"Invalid value {item} for configuration {d.name}: String must be one of: "
                + ", ".join(d.one_of)
            )


def validate_configs(configs: dict[str, str | None], *, static: bool = False) -> dict[str, str]:
    """Check names and values as Kafka 4.3 does (the names first, then each value in Kafka's
    order, then the cross checks), then what TidalMQ's design narrows; returns the overrides to
    store (None values dropped). `static`: the configs of a static topic, whose logic queues
    span several physical partitions, so keys cannot be compacted across them (refused, as
    transactions are)."""
    for name in configs:
        if name not in TOPIC_CONFIGS:
            raise InvalidConfig(f"Unknown topic config name: {name}")
    given = {name: value for name, value in configs.items() if value is not None}
    for d in TOPIC_CONFIG_DEFS:
        if d.name in given:
            _check_kafka(d, given[d.name])
    _check_compaction_lags(given)
    if config_flag("remote.storage.enable", given.get("remote.storage.enable", "false")):
        # Kafka's own refusal (LogConfig.validateRemoteStorageOnlyIfSystemEnabled) on a cluster
        # without tiered storage, which is what TidalMQ is: its one store is the object store
        raise InvalidConfig(
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
            "with remote log storage."
        )
    for d in TOPIC_CONFIG_DEFS:
        value = given.get(d.name)
        if value is None or not d.only:
            continue
        value = _java_trim(value)
        if d.type == "BOOLEAN":
            allowed = _parse_boolean(d, value) in [_parse_boolean(d, v) for v in d.only]
        elif d.type in ("INT", "LONG", "DOUBLE"):
            allowed = _parse_number(d, value) in [_parse_number(d, v) for v in d.only]
        else:
            allowed = value in d.only
        if not allowed:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {d.name}: TidalMQ takes only "
                f"{', '.join(d.only)}: {d.why}"
            )
    for name, value in given.items():  # described as Kafka describes them: "true", "false"
        if TOPIC_CONFIGS[name].type == "BOOLEAN":
            given[name] = str(_parse_boolean(TOPIC_CONFIGS[name], value)).lower()
    if static and "compact" in cleanup_policy(given.get("cleanup.policy", "delete")):
        raise InvalidConfig(
            f"cleanup.policy=compact is not offered for static topics: {NO_STATIC_COMPACT}"
        )
    return given


def config_number(name: str, value: str) -> int | float:
    """A stored INT, LONG or DOUBLE topic config's value, parsed as Kafka parses it (values are
    stored as the client sent them: " 5 ", "+5" and "0.5d" are valid)."""
    return _parse_number(TOPIC_CONFIGS[name], value)


def config_flag(name: str, value: str) -> bool:
    """A BOOLEAN topic config's value, parsed as Kafka parses it (" TRUE " is true)."""
    return _parse_boolean(TOPIC_CONFIGS[name], value)


def effective_segment_bytes(configs: Mapping[str, str]) -> int:
    """The size segments are cut at: `internal.segment.bytes` when set (Kafka's LogConfig
    .segmentSize(); at least 1, as Kafka's roll on every append is a segment per batch), else
    `segment.bytes`."""
    internal = configs.get(INTERNAL_SEGMENT_BYTES)
    if internal is not None:
        return max(1, int(config_number(INTERNAL_SEGMENT_BYTES, internal)))
    return int(config_number("segment.bytes", configs["segment.bytes"]))


def cleanup_policy(value: str) -> frozenset[str]:
    """The items of a `cleanup.policy` value, checked as Kafka 4.3 does: a comma-separated
    list of `compact` and `delete` (either order, repeats taken once); empty means neither
    (infinite retention, no cleaning)."""
    _check_kafka(TOPIC_CONFIGS["cleanup.policy"], value)
    return frozenset(_list_items(value))


class ProduceRules(NamedTuple):
    """What Produce checks a topic's records against, derived from its effective configs only
    (TopicInfo.produce_rules keeps them until the topic's overrides change)."""

    compacted: bool  # cleanup.policy has compact: keyless records are refused
    timestamp_bounds: tuple[int, int] | None  # timestamp_bounds(configs)
    # message.timestamp.type=LogAppendTime: a batch its producer marked so is refused
    log_append_time: bool

    @classmethod
    def of(cls, configs: Mapping[str, str]) -> ProduceRules:
        """The rules of a topic with these effective configs."""
        bounds = timestamp_bounds(configs)
        return cls("compact" in cleanup_policy(configs["cleanup.policy"]), bounds, bounds is None)


def timestamp_bounds(configs: Mapping[str, str]) -> tuple[int, int] | None:
    """A topic's message.timestamp.before.max.ms and after.max.ms (KIP-937), or None when its
    records take the broker's time (LogAppendTime), which Kafka does not check."""
    if configs["message.timestamp.type"].strip() != "CreateTime":
        return None
    before = int(config_number(_BEFORE, configs[_BEFORE]))
    after = int(config_number(_AFTER, configs[_AFTER]))
    return before, after


_BEFORE, _AFTER = "message.timestamp.before.max.ms", "message.timestamp.after.max.ms"


def _check_compaction_lags(configs: dict[str, str]) -> None:
    """Kafka's cross check (LogConfig.validateValues), against the effective values."""
    low = config_number(
        "min.compaction.lag.ms",
        configs.get("min.compaction.lag.ms", TOPIC_CONFIG_DEFAULTS["min.compaction.lag.ms"]),
    )
    high = config_number(
        "max.compaction.lag.ms",
        configs.get("max.compaction.lag.ms", TOPIC_CONFIG_DEFAULTS["max.compaction.lag.ms"]),
    )
    if low > high:
        raise InvalidConfig(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > "
            f"max.compaction.lag.ms ({high})"
        )


def validate_broker_config_scope(scope: str) -> None:
    """A broker-config resource names one broker (its id) or the cluster default ("")."""
    if scope != CLUSTER_DEFAULT and not (scope.isdigit() and int(scope) >= 0):
        raise InvalidConfig(f"broker config resource {scope!r} is neither a broker id nor ''")


def validate_broker_configs(
    configs: dict[str, str | None], static: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Check dynamic broker config changes; returns the overrides to store (None dropped).

    `static` names the broker's other configs, which exist but only change with a restart."""
    out: dict[str, str] = {}
    fixed = sorted(n for n in configs if n not in DYNAMIC_BROKER_CONFIG_DEFAULTS and n in static)
    if fixed:
        raise StaticConfig(f"Cannot update these configs dynamically: [{', '.join(fixed)}]")
    for name, value in configs.items():
        if name not in DYNAMIC_BROKER_CONFIG_DEFAULTS:
            known = ", ".join(sorted(DYNAMIC_BROKER_CONFIG_DEFAULTS))
            raise InvalidConfig(
                f"unknown dynamic broker config {name!r}; TidalMQ changes only these at "
                f"runtime: {known}"
            )
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            raise InvalidConfig(f"{name} must be an integer, got {value!r}") from None
        if number < 0:
            raise InvalidConfig(f"{name} must be at least 0, got {number}")
        out[name] = value
    return out
