"""kafka-producer-perf-test, kafka-consumer-perf-test and the Apache Kafka Java client (default
producer, idempotence on; a consumer group) against one TidalMQ broker; and what is refused
(transactions) fails at once with a clear error."""

from __future__ import annotations

import pytest

from bench.kafka.harness import (
    consumer_perf_test,
    java_consume,
    java_produce,
    parse_table,
    producer_perf_test,
    run_tool,
)
from tests.integration.compat.conftest import create_topic, name, tool
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

RECORDS = 20_000
RECORD_SIZE = 1024
MB = 2**20


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    out = tool("kafka-get-offsets", "--topic", topic, bootstrap=bootstrap).split()
    return {int(line.split(":")[1]): int(line.split(":")[2]) for line in out}


def test_producer_and_consumer_perf_tests(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("perf")
    create_topic(b, topic, 3)
    produced, proc = producer_perf_test(b, topic, num_records=RECORDS, record_size=RECORD_SIZE)
    assert produced.records == RECORDS, proc.stdout
    assert produced.records_per_sec > 0 and produced.mb_per_sec > 0
    # the tool's MB/s is records/s times the record size (2**20 bytes a MB), to its rounding
    assert produced.mb_per_sec == pytest.approx(
        produced.records_per_sec * RECORD_SIZE / MB, rel=0.02, abs=0.02
    )
    assert 0 <= produced.p50_ms <= produced.p95_ms <= produced.p99_ms <= produced.p999_ms
    assert produced.p999_ms <= produced.max_latency_ms
    assert produced.avg_latency_ms <= produced.max_latency_ms
    # every acknowledged record is in the topic, spread over its partitions
    ends = _end_offsets(b, topic)
    assert sum(ends.values()) == RECORDS and len(ends) == 3, ends

    consumed, proc = consumer_perf_test(b, topic, num_records=RECORDS, timeout_ms=60_000)
    assert consumed.records == RECORDS, proc.stdout
    assert consumed.data_mb == pytest.approx(RECORDS * RECORD_SIZE / MB, abs=0.01)
    assert consumed.mb_per_sec > 0 and consumed.records_per_sec > 0
    assert consumed.fetch_mb_per_sec >= consumed.mb_per_sec * 0.99  # fetch time excludes joins
    assert consumed.rebalance_ms >= 0 and consumed.fetch_ms > 0


def test_java_default_producer_is_idempotent_and_group_consumes_all(
    tidalmq: BrokerProcess,
) -> None:
    b = tidalmq.bootstrap
    topic, group = name("java"), name("jg")
    create_topic(b, topic, 3)
    count = 3000
    produced = java_produce(b, topic, count)
    assert produced["enable_idempotence"] is True and produced["acks"] == "-1", produced
    assert produced["acked"] == count and produced["contiguous"] is True, produced
    # DescribeProducers (api 61) reports the idempotent producer on every partition it wrote
    assert produced["describe_producers_error"] is None, produced
    assert len(produced["producer_ids"]) == 1 and produced["producer_ids"][0] >= 0, produced
    assert sorted(map(int, produced["partitions"])) == [0, 1, 2]
    assert all(p["first"] == 0 for p in produced["partitions"].values()), produced
    assert sum(p["count"] for p in produced["partitions"].values()) == count

    consumed = java_consume(b, topic, group, count, timeout_ms=120_000)
    assert consumed["received"] == count and consumed["distinct_keys"] == count, consumed
    assert consumed["assignment"] == [0, 1, 2]
    committed = {int(p): o for p, o in consumed["committed"].items()}
    assert committed == {int(p): v["last"] + 1 for p, v in produced["partitions"].items()}

    rows = parse_table(
        tool("kafka-consumer-groups", "--describe", "--group", group, bootstrap=b), "GROUP"
    )
    assert {int(r["PARTITION"]): int(r["CURRENT-OFFSET"]) for r in rows} == committed
    assert all(r["LAG"] == "0" for r in rows), rows


def test_the_java_transactional_producer_commits(tidalmq: BrokerProcess) -> None:
    """Kafka's own producer with a transactional id (kafka-producer-perf-test
    --transactional-id): every record committed, one commit marker per transaction after
    them, and kafka-transactions lists the id."""
    b = tidalmq.bootstrap
    topic, tid = name("txn"), name("tx")
    create_topic(b, topic)
    proc = run_tool(
        "kafka-producer-perf-test",
        "--topic",
        topic,
        "--num-records",
        "10",
        "--record-size",
        "10",
        "--throughput",
        "-1",
        "--transactional-id",
        tid,
        "--command-property",
        "max.block.ms=60000",
        bootstrap=b,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert _end_offsets(b, topic)[0] >= 11, out  # 10 records and at least one commit marker

    listed = run_tool("kafka-transactions", "list", bootstrap=b, check=True).stdout
    assert tid in listed, listed
