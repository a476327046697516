"""Validation of topic names, partition counts and configs (Kafka's rules)."""

from __future__ import annotations

import re

from tidalmq_core.metadata import READ_ONLY_TOPIC_CONFIGS, TOPIC_CONFIG_DEFAULTS

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS = 10_000
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


class InvalidTopic(ValueError):
    """INVALID_TOPIC_EXCEPTION"""


class InvalidPartitions(ValueError):
    """INVALID_PARTITIONS"""


class InvalidConfig(ValueError):
    """INVALID_CONFIG"""


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
}
_ENUM_CONFIGS = {
    "cleanup.policy": {"delete"},
    "message.timestamp.type": {"CreateTime", "LogAppendTime"},
    "compression.type": {"producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"},
}


def validate_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """Check names and values; returns the overrides to store (None values dropped)."""
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
        if name in _ENUM_CONFIGS and value not in _ENUM_CONFIGS[name]:
            allowed = ", ".join(sorted(_ENUM_CONFIGS[name]))
            raise InvalidConfig(f"{name} must be one of {allowed}; got {value!r}")
        out[name] = value
    return out
