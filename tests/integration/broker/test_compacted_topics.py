"""Compacted topics end to end on TidalMQ (docs/compaction.md): the scenario of
tests/support/compacted_topic.py (many updates per key from a real producer, tombstones, a real
consumer from the start that sees exactly the latest value per key at the offset it was written,
tombstones until delete.retention.ms and then not; compact,delete retention), which
tests/integration/apache_kafka/test_compacted_topics.py also runs on the real Kafka; here also
the broker's cleaner metrics and the same log after kill -9 of the broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess
from tests.support.compacted_topic import (
    COMPACT_DELETE_CONFIGS,
    SMALL_SEGMENTS,
    TOPIC_CONFIGS,
    an_update_after_the_clean_is_the_latest,
    compact_and_delete,
    create_compacted_topic,
    latest_value_per_key,
    read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# the cleaner looks every 0.2 s; WAL ranges become segments after 0.3 s idle
FAST_CLEANER = {
    "TIDALMQ_COMPACTION_INTERVAL_S": "0.2",
    "TIDALMQ_COMPACTION_IDLE_S": "0.3",
    "TIDALMQ_CLEANER_BACKOFF_MS": "200",
    "TIDALMQ_RETENTION_CHECK_INTERVAL_S": "0.5",
}


@pytest.fixture
def compacting_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(
        f"file://{tmp_path / 'objects'}", tmp_path / "logs", env=FAST_CLEANER
    ) as proc:
        yield proc


def test_a_consumer_from_the_start_reads_the_latest_value_per_key(
    compacting_broker: BrokerProcess,
) -> None:
    b = compacting_broker.bootstrap
    topic = topic_name()
    create_compacted_topic(b, topic, {**TOPIC_CONFIGS, **SMALL_SEGMENTS})
    end, cleaned = latest_value_per_key(b, topic, drops_tombstones_without_new_data=True)
    metrics = compacting_broker.metrics()
    assert 'tidalmq_storage_cleaner_records_total{action="superseded",broker="0"}' in metrics
    assert (
        'tidalmq_storage_cleaner_records_total{action="tombstone_expired",broker="0"} 2.0'
        in metrics
    )

    # kill -9 and a restart on the same store: the cleaned log is what the next broker reads,
    # and an update after it is the key's latest value
    compacting_broker.restart(crash=True)
    assert read_all(b, topic, end) == cleaned
    an_update_after_the_clean_is_the_latest(b, topic, end, cleaned)


def test_compact_delete_retention_drops_old_segments_and_the_cleaner_the_rest(
    compacting_broker: BrokerProcess,
) -> None:
    topic = topic_name()
    create_compacted_topic(
        compacting_broker.bootstrap,
        topic,
        {**COMPACT_DELETE_CONFIGS, **SMALL_SEGMENTS},
    )
    compact_and_delete(compacting_broker.bootstrap, topic)
