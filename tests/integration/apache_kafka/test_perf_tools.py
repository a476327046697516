"""kafka-producer-perf-test and kafka-consumer-perf-test against the real Apache Kafka, their
output parsed into numbers (the side-by-side benchmark reuses these helpers)."""

from __future__ import annotations

import uuid

import pytest

from bench.kafka.harness import KafkaCluster, consumer_perf_test, producer_perf_test, run_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

RECORDS = 20_000
SIZE = 1024


def test_producer_then_consumer_perf_numbers(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic = f"perf-{uuid.uuid4().hex[:8]}"
    run_tool(
        "kafka-topics", "--create", "--topic", topic, "--partitions", "1", bootstrap=b, check=True
    )

    produced, proc = producer_perf_test(b, topic, num_records=RECORDS, record_size=SIZE, acks="all")
    assert produced.records == RECORDS
    assert produced.records_per_sec > 0
    assert produced.mb_per_sec == pytest.approx(produced.records_per_sec * SIZE / 2**20, rel=0.02)
    assert produced.p50_ms <= produced.p95_ms <= produced.p99_ms <= produced.p999_ms
    assert produced.p999_ms <= produced.max_latency_ms + 1
    assert "records sent" in proc.stdout

    offsets = run_tool("kafka-get-offsets", "--topic", topic, bootstrap=b, check=True)
    assert offsets.stdout.split() == [f"{topic}:0:{RECORDS}"]

    consumed, _ = consumer_perf_test(b, topic, num_records=RECORDS)
    assert consumed.records == RECORDS
    assert consumed.data_mb == pytest.approx(RECORDS * SIZE / 2**20, rel=1e-3)
    assert consumed.mb_per_sec > 0
    assert consumed.fetch_records_per_sec >= consumed.records_per_sec > 0
