"""`__consumer_offsets` never gets time or size retention: the group coordinator trims its log
with snapshots, and retention would delete the offsets of any group idle for 7 days."""

from __future__ import annotations

from tidalmq_broker.apis.configs import _fixed_config_change, _topic_configs
from tidalmq_broker.partitions import partition_config
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.retention import retention_log_start
from tidalmq_core.metadata import OFFSETS_TOPIC, TopicInfo

WEEK_MS = 7 * 24 * 3600 * 1000


def _offsets_topic(configs: dict[str, str] | None = None) -> TopicInfo:
    # as the controller creates it (no configs), or as an older cluster's metadata holds it
    return TopicInfo(OFFSETS_TOPIC, "id", [], dict(configs or {}), internal=True)


def test_offsets_topic_has_no_retention_whatever_its_metadata_says() -> None:
    for configs in ({}, {"retention.ms": "1000", "retention.bytes": "10"}):
        config = partition_config(_offsets_topic(configs))
        assert (config.retention_ms, config.retention_bytes) == (-1, -1)
    # other topics keep Kafka's default
    assert partition_config(TopicInfo("orders", "id", [])).retention_ms == WEEK_MS


def test_retention_keeps_a_month_old_group_log() -> None:
    now_ms = 10 * 4 * WEEK_MS
    old = [
        IndexEntry(i * 10, i * 10 + 9, f"data/s{i}", 0, 1000, now_ms - 4 * WEEK_MS)
        for i in range(3)
    ]
    config = partition_config(_offsets_topic())
    kept = retention_log_start(
        old,
        now_ms=now_ms,
        retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes,
    )
    assert kept is None
    default = partition_config(TopicInfo("orders", "id", []))
    assert (
        retention_log_start(
            old,
            now_ms=now_ms,
            retention_ms=default.retention_ms,
            retention_bytes=default.retention_bytes,
        )
        == 30
    )


def test_describe_configs_reports_the_fixed_values() -> None:
    configs = {c["name"]: c for c in _topic_configs(_offsets_topic(), include_synonyms=False)}
    assert configs["cleanup.policy"]["value"] == "compact"
    assert configs["retention.ms"]["value"] == "-1"
    assert configs["retention.bytes"]["value"] == "-1"
    assert configs["retention.ms"]["read_only"] and not configs["retention.ms"]["is_default"]
    # Kafka's offsets.topic.segment.bytes: the log cleaner's unit on the internal topics
    assert configs["segment.bytes"]["value"] == str(100 * 1024 * 1024)
    assert configs["segment.bytes"]["read_only"] and not configs["segment.bytes"]["is_default"]
    assert configs["max.message.bytes"]["is_default"]
    assert not configs["max.message.bytes"]["read_only"]


def test_the_internal_topics_open_compacted() -> None:
    config = partition_config(_offsets_topic())
    assert config.compacted and "delete" not in config.cleanup_policy
    assert config.retention_ms == -1 and config.segment_bytes == 100 * 1024 * 1024


def test_altering_a_fixed_config_is_refused() -> None:
    topic = _offsets_topic()
    assert "fixed at -1" in (_fixed_config_change(topic, {"retention.ms": "1000"}) or "")
    assert _fixed_config_change(topic, {"retention.ms": "-1", "max.message.bytes": "1000"}) is None
    assert _fixed_config_change(TopicInfo("orders", "id", []), {"retention.ms": "1"}) is None
