"""Exactly-once end to end with real clients on a 3-broker local cluster, through kill -9 and
partition moves (each test kills one broker of its own; the cluster is shared by the module).

- Kafka Streams with processing.guarantee=exactly_once_v2 (bench/kafka/java/StreamsCount.java,
  Kafka Streams 4.3.1; its changelogs forced to cleanup.policy=delete until the broker
  compacts): words are counted while a broker is killed with kill -9 and then while the Streams
  application itself is killed with kill -9 and started again. A read_committed consumer of
  the output sees, for every word, the counts 1, 2, ..., n exactly once each and in order: no
  increment applied twice, none lost, nothing aborted seen.
- A checker in the style of Jepsen's Kafka transaction workload over librdkafka's
  transactional producers (confluent-kafka) and a read_committed consumer: producers commit or
  abort transactions over all partitions while one partition moves and a broker is killed;
  then no aborted record is visible, every committed record exactly once, a transaction whose
  outcome the producer could not learn is seen whole or not at all, and each producer's
  records keep their order within a partition. Meanwhile a consume-transform-produce copier
  (librdkafka, send_offsets_to_transaction) copies a topic fed throughout: its output is
  the input, each record once and in order; and so does Kafka's Java transactional producer
  (bench/kafka/java/TransactionalCopier.java, sendOffsetsToTransaction, one transaction in ten
  aborted on purpose) from the same input to a sink of its own, whose partition 0 moves too,
  and whose producer is fenced by another incarnation of its transactional id (it goes on with
  a new producer).
  All are tests/support/txn_checker.py, which
  tests/integration/apache_kafka/test_transactions.py runs against Apache Kafka too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess
from tests.support.streams_exactly_once import counts_survive_a_broker_and_an_app_kill_9
from tests.support.txn_checker import TransactionsWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(
        tmp_path_factory.mktemp("exactly-once") / "cluster",
        brokers=3,
        # a few __transaction_state partitions, created inside the test's time; a dead broker
        # is noticed within seconds; the killed application's open transaction is aborted
        # within half a second of its timeout (Streams: 10 s)
        env={
            "TIDALMQ_TRANSACTION_STATE_PARTITIONS": "4",
            "TIDALMQ_SESSION_TIMEOUT_S": "6",
            "TIDALMQ_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "500",
        },
    ) as c:
        yield c


KILLED: set[int] = set()  # brokers of the module's cluster killed so far


def alive(cluster: LocalClusterProcess) -> list[int]:
    return [
        r["broker"]
        for r in cluster.status()["brokers"]
        if r["state"] != "dead" and r["broker"] not in KILLED
    ]


def victim(cluster: LocalClusterProcess, topic: str) -> int:
    """A live broker leading some of the topic's partitions (never the last one alive);
    remembered as killed."""
    live = alive(cluster)
    assert len(live) >= 2, cluster.status()
    chosen = next((b for b in cluster.leaders(topic) if b in live), live[-1])
    KILLED.add(chosen)
    return chosen


def test_exactly_once_v2_counts_survive_a_broker_and_an_app_kill_9(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    """tests/support/streams_exactly_once.py's scenario (the same run against Apache Kafka in
    tests/integration/apache_kafka/test_exactly_once_streams.py): topics with one replica (the
    data is in object storage; a live broker takes a dead one's partitions), the killed broker
    stays dead (the module's next test kills another)."""
    counts_survive_a_broker_and_an_app_kill_9(
        cluster.bootstrap,
        tmp_path,
        replication_factor=1,
        kill_broker=lambda topic: cluster.kill_broker(victim(cluster, topic)),
    )


# ------------------------------------------------------------------ transactions checker
RUN_S = 10.0


def test_transactions_checker_under_a_move_and_a_broker_kill_9(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    """The checker, the copier and the Java copier of tests/support/txn_checker.py (the same
    run against Apache Kafka in tests/integration/apache_kafka/test_transactions.py) through
    partition moves and a kill -9."""
    w = TransactionsWorkload(cluster.bootstrap, java_copier_log=tmp_path / "java-copier.log")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(t, w.partitions, 1) for t in w.topics]).values():
        f.result(30)
    w.start()
    time.sleep(RUN_S / 4)
    w.wait_java_copying()
    live = alive(cluster)
    # moves in the middle of transactions: the checked topic's partition 0 and the Java
    # copier's output partition 0, each to another live broker
    moves = {
        tp: next(b for b in live if b != cluster.leaders(tp[0])[0])
        for tp in [(w.topic, 0), (w.java_sink, 0)]
    }
    result = cluster.reassign(moves)
    assert all(r["error"] is None for r in result["results"]), result
    w.fence_java_copier()  # its producer fenced: the copier goes on with a new one
    time.sleep(RUN_S / 4)
    cluster.kill_broker(victim(cluster, w.topic))  # and a kill -9
    time.sleep(RUN_S / 2)
    w.stop(cluster.status)
    cluster.wait_settled(60)
    w.check()
