"""tidalmq_request_cpu_seconds as a broker exports it ([L1] item 1): each produce request a
client sends is counted once under api="Produce", with CPU time that is more than nothing and
no more than the wall time the requests took (one thread cannot spend more)."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tidalmq_broker.admin_client import AdminClient as WireClient
from tidalmq_broker.protocol import records

from tests.integration.broker.clients import create_topic
from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PRODUCE_REQUESTS = 25


def produce_figures(broker: BrokerProcess) -> tuple[float, float, float]:
    """(tidalmq_request_cpu_seconds count, its sum, tidalmq_requests_total) for Produce."""
    count = total = requests = 0.0
    for family in text_string_to_metric_families(broker.metrics()):
        for s in family.samples:
            if s.labels.get("api") != "Produce":
                continue
            if s.name == "tidalmq_request_cpu_seconds_count":
                count += s.value
            elif s.name == "tidalmq_request_cpu_seconds_sum":
                total += s.value
            elif s.name == "tidalmq_requests_total":
                requests += s.value
    return count, total, requests


def test_each_produce_request_is_counted_with_its_cpu(local_broker: BrokerProcess) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    count_before, sum_before, requests_before = produce_figures(local_broker)
    started = time.monotonic()
    with WireClient(local_broker.bootstrap, timeout_s=30) as wire:
        for i in range(PRODUCE_REQUESTS):
            batch = records.build_batch([(b"k", b"value-%d" % i * 64)])
            answer = wire.call(
                0,
                9,
                {
                    "transactional_id": None,
                    "acks": -1,
                    "timeout": 20000,
                    "topic_data": [
                        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}
                    ],
                },
            )
            (partition,) = answer.responses[0].partition_responses
            assert partition.error_code == 0, partition
    elapsed = time.monotonic() - started
    count, cpu_s, requests = produce_figures(local_broker)
    assert count - count_before == PRODUCE_REQUESTS, (count_before, count)
    assert requests - requests_before == PRODUCE_REQUESTS  # the same requests, each counted once
    spent = cpu_s - sum_before
    # decoding and appending a batch costs tens of microseconds at least; one thread's CPU over
    # these requests cannot exceed the wall time they took (a wall clock read would, under load)
    assert PRODUCE_REQUESTS * 10e-6 < spent < elapsed, (spent, elapsed)
