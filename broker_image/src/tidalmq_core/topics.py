"""Validation of topic names, partition counts and configs (Kafka's rules)."""

from __future__ import annotations

import re

from tidalmq_core.metadata import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_CONFIG_DEFAULTS,
    READ_ONLY_TOPIC_CONFIGS,
    TOPIC_CONFIG_DEFAULTS,
)

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


_INT_CONFIGS = {
    "retention.ms": -1,
    "retention.bytes": -1,
    "max.message.bytes": 0,
    "segment.bytes": 14,
    "min.insync.replicas": 1,
    "delete.retention.ms": 0,
    "min.compaction.lag.ms": 0,
    "max.compaction.lag.ms": 1,
    "segment.ms": 1,
}
_LONG_MAX = 2**63 - 1
CLEANUP_POLICIES = ("compact", "delete")
# "*" or a comma-separated list of partition:broker pairs (Kafka's ThrottledReplicaListValidator)
_THROTTLED_REPLICAS = re.compile(r"^(\*|\d+:\d+(\s*,\s*\d+:\d+)*)?$")
_REPLICA_LIST_CONFIGS = frozenset(
    {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
)
_ENUM_CONFIGS = {
    "message.timestamp.type": {"CreateTime", "LogAppendTime"},
    # Kafka recompresses batches to a topic's codec; TidalMQ never re-encodes a batch, so it
    # takes only "producer" rather than accept a codec and silently not apply it
    "compression.type": {"producer"},
}
_ENUM_REASONS = {
    "compression.type": "TidalMQ stores batches as the producer compressed them and never "
    "recompresses; set compression.type on the producer instead",
}


def validate_configs(configs: dict[str, str | None], *, static: bool = False) -> dict[str, str]:
    """Check names and values; returns the overrides to store (None values dropped). `static`:
    the configs of a static topic, whose logic queues span several physical partitions, so
    keys cannot be compacted across them (refused, as transactions are)."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        if name not in TOPIC_CONFIG_DEFAULTS:
            raise InvalidConfig(f"unknown topic config {name!r}")
        if value is None:
            continue
        if name in READ_ONLY_TOPIC_CONFIGS and value != TOPIC_CONFIG_DEFAULTS[name]:
            raise InvalidConfig(
                f"{name} is fixed at {TOPIC_CONFIG_DEFAULTS[name]}: every partition has one "
                "durable copy in object storage"
            )
        if name in _INT_CONFIGS:
            try:
                number = int(value)
            except ValueError:
                raise InvalidConfig(f"{name} must be an integer, got {value!r}") from None
            if number < _INT_CONFIGS[name]:
                raise InvalidConfig(f"{name} must be at least {_INT_CONFIGS[name]}, got {number}")
            if number > _LONG_MAX:
                raise InvalidConfig(f"{name} must be at most {_LONG_MAX}, got {number}")
        if name == "cleanup.policy" and "compact" in cleanup_policy(value) and static:
            raise InvalidConfig(
                "cleanup.policy=compact is not offered for static topics: a logic queue spans "
                "several physical partitions, and keys are not compacted across them"
            )
        if name == "min.cleanable.dirty.ratio":
            _ratio(name, value)
        if name in _ENUM_CONFIGS and value not in _ENUM_CONFIGS[name]:
            allowed = ", ".join(sorted(_ENUM_CONFIGS[name]))
            reason = f": {_ENUM_REASONS[name]}" if name in _ENUM_REASONS else ""
            raise InvalidConfig(f"{name} must be one of {allowed}; got {value!r}{reason}")
        if name in _REPLICA_LIST_CONFIGS and not _THROTTLED_REPLICAS.match(value.strip()):
            raise InvalidConfig(
                f"{name} must be '*' or a list of partition:broker pairs, got {value!r}"
            )
        out[name] = value
    _check_compaction_lags(out)
    return out


def cleanup_policy(value: str) -> frozenset[str]:
    """The items of a `cleanup.policy` value, checked as Kafka 4.3 does: a comma-separated
    list of `compact` and `delete` (either order), each at most once; empty means neither
    (infinite retention, no cleaning)."""
    items = [item.strip() for item in value.split(",")] if value.strip() else []
    for item in items:
        if item not in CLEANUP_POLICIES:
            raise InvalidConfig(
                f"Invalid value {item} for configuration cleanup.policy: String must be one "
                f"of: {', '.join(CLEANUP_POLICIES)}"
            )
    if len(set(items)) != len(items):
        raise InvalidConfig(
            f"Invalid value {value} for configuration cleanup.policy: Values must not be "
            "duplicated."
        )
    return frozenset(items)


def _ratio(name: str, value: str) -> None:
    try:
        ratio = float(value)
    except ValueError:
        raise InvalidConfig(f"{name} must be a number, got {value!r}") from None
    if not 0 <= ratio <= 1:  # also refuses NaN
        raise InvalidConfig(
            f"Invalid value {value} for configuration {name}: Value must be "
            + ("at least 0" if ratio < 0 else "no more than 1")
        )


def _check_compaction_lags(configs: dict[str, str]) -> None:
    """Kafka's cross check (LogConfig.validateValues), against the effective values."""
    low = int(configs.get("min.compaction.lag.ms", TOPIC_CONFIG_DEFAULTS["min.compaction.lag.ms"]))
    high = int(configs.get("max.compaction.lag.ms", TOPIC_CONFIG_DEFAULTS["max.compaction.lag.ms"]))
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
