"""The librdkafka hang workaround of the transactional copier (tests/support/txn_checker.py,
COPIER_PRODUCER; docs/transactions.md "A librdkafka limit these tests work around").

send_offsets_to_transaction can wait forever for one of the producer's broker connections to
change state (confluentinc/librdkafka#5456, #5511) once the group coordinator's broker is gone
for good. The copier's producer therefore closes its idle connections: the state changes that
make the request ask FindCoordinator again. This checks that the copier's producer, as the
copier creates it, does change the state of a connection that sits idle, against librdkafka's
own in-process mock cluster (no broker needed). Without the workaround the connection stays up
and the test fails (checked: it did, after 15 s). That closing them does avoid the hang needs
the group coordinator's broker killed at the wrong moment, which the librdkafka copier meets
under the kill -9 of tests/integration/compat/test_exactly_once.py and
tests/integration/apache_kafka/test_transactions.py (before the workaround it hung there for
70 minutes in CI once)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.support.txn_checker import copier_producer, unique

# COPIER_PRODUCER closes after 3-5 s idle (librdkafka's jitter), the statistics come every
# 0.5 s: 15 s leaves room for a loaded machine
IDLE_CLOSED_WITHIN_S = 15.0


def test_the_copier_producer_closes_a_connection_left_idle() -> None:
    lock = threading.Lock()
    brokers: dict[str, dict[str, Any]] = {}

    def on_stats(document: str) -> None:
        with lock:
            brokers.update(json.loads(document)["brokers"])

    p = copier_producer(
        "unused:9092",  # replaced by the mock cluster's address
        unique("copier-idle"),
        {"test.mock.num.brokers": 1, "statistics.interval.ms": 500, "stats_cb": on_stats},
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # the connections init_transactions used are up, nothing is in flight
            p.poll(0.1)
            with lock:
                up = {k for k, b in brokers.items() if b["state"] == "UP"}
                before = {k: brokers[k]["disconnects"] for k in up}
            if up:
                break
            assert time.monotonic() < deadline, brokers
        t0 = time.monotonic()
        while True:
            p.poll(0.1)  # serves the statistics callback; sends nothing
            with lock:
                closed = {k for k in up if brokers[k]["disconnects"] > before[k]}
            if closed:
                break
            assert time.monotonic() < t0 + IDLE_CLOSED_WITHIN_S, (
                f"no idle connection closed in {IDLE_CLOSED_WITHIN_S} s "
                f"(COPIER_PRODUCER's connections.max.idle.ms): {brokers}"
            )
    finally:
        del p
