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
  the input, each record once and in order. Both are tests/support/txn_checker.py, which
  tests/integration/apache_kafka/test_transactions.py runs against Apache Kafka too."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import streams_count_command
from tests.integration.compat.conftest import name
from tests.support.local_cluster import LocalClusterProcess
from tests.support.txn_checker import TransactionsWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
PER_PHASE = 300  # input records in each of the three phases
PARTITIONS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(
        tmp_path_factory.mktemp("exactly-once") / "cluster", brokers=3,
        # a few __transaction_state partitions, created inside the test's time; a dead broker
        # is noticed within seconds; the killed application's open transaction is aborted
        # within half a second of its timeout (Streams: 10 s)
        env={"TIDALMQ_TRANSACTION_STATE_PARTITIONS": "4", "TIDALMQ_SESSION_TIMEOUT_S": "6",
             "TIDALMQ_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "500"},
    ) as c:  # fmt: skip
        yield c


KILLED: set[int] = set()  # brokers of the module's cluster killed so far


def alive(cluster: LocalClusterProcess) -> list[int]:
    return [r["broker"] for r in cluster.status()["brokers"]
            if r["state"] != "dead" and r["broker"] not in KILLED]  # fmt: skip


def victim(cluster: LocalClusterProcess, topic: str) -> int:
    """A live broker leading some of the topic's partitions (never the last one alive);
    remembered as killed."""
    live = alive(cluster)
    assert len(live) >= 2, cluster.status()
    chosen = next((b for b in cluster.leaders(topic) if b in live), live[-1])
    KILLED.add(chosen)
    return chosen


class StreamsApp:
    """The Streams application as a child process; RUNNING on its stdout once it runs."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        self.running = threading.Event()
        out = log.open("ab")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL
        )
        threading.Thread(target=self._watch, args=(out,), daemon=True).start()

    def _watch(self, out: object) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            out.write(line)  # type: ignore[attr-defined]
            out.flush()  # type: ignore[attr-defined]
            if line.strip() == b"RUNNING":
                self.running.set()

    def wait_running(self, timeout_s: float = 120) -> None:
        if not self.running.wait(timeout_s):
            self.kill()
            raise AssertionError(f"Streams did not start:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def produce_words(
    bootstrap: str, topic: str, start: int, count: int, pace_s: float = 0.0
) -> Counter[str]:
    """`count` words from input record `start` on; `pace_s` between records (0: at once)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent: Counter[str] = Counter()
    for i in range(start, start + count):
        word = WORDS[i % len(WORDS)]
        p.produce(topic, word.encode(), key=str(i).encode())
        sent[word] += 1
        if pace_s:
            p.poll(0)
            time.sleep(pace_s)
    assert p.flush(60) == 0, "input not acknowledged"
    return sent


def committed_counts(bootstrap: str, topic: str, expected: Counter[str]) -> dict[str, list[int]]:
    """Every count the output holds per word, read with read_committed from the start, until
    each word reached its expected count (or the deadline)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": name("reader"),
                  "isolation.level": "read_committed", "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: dict[str, list[int]] = defaultdict(list)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen[m.key().decode()].append(int.from_bytes(m.value(), "big", signed=True))
            if all(seen[w] and seen[w][-1] >= n for w, n in expected.items()):
                end = time.monotonic() + 1.0  # then nothing more may arrive
                while time.monotonic() < end:
                    m = c.poll(0.2)
                    if m is not None and m.error() is None:
                        seen[m.key().decode()].append(int.from_bytes(m.value(), "big"))
                break
    finally:
        c.close()
    return dict(seen)


def test_exactly_once_v2_counts_survive_a_broker_and_an_app_kill_9(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}")

    bootstrap = cluster.bootstrap
    source, sink, app_id = name("words"), name("counts"), name("wordcount")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (source, sink)]).values():
        f.result(30)
    command = streams_count_command(bootstrap, source, sink, app_id, tmp_path / "state")
    log = tmp_path / "streams.log"
    expected = produce_words(bootstrap, source, 0, PER_PHASE)
    app = StreamsApp(command, log)
    try:
        app.wait_running()
        mark("running")
        # the second phase arrives over about 3 s: a broker is killed with kill -9 as it
        # starts, the application in its middle (records processed in a transaction not yet
        # committed: counted again after the restart, which must not show)
        second: list[Counter[str]] = []
        producing = threading.Thread(target=lambda: second.append(
            produce_words(bootstrap, source, PER_PHASE, PER_PHASE, pace_s=0.01)))  # fmt: skip
        producing.start()
        cluster.kill_broker(victim(cluster, source))
        mark("broker killed")
        time.sleep(1.5)
        app.kill()
        mark("application killed")
        producing.join(60)
        expected += second[0]  # kill -9 of the application with a transaction likely open
        expected += produce_words(bootstrap, source, 2 * PER_PHASE, PER_PHASE)
        mark("third phase produced")
        app = StreamsApp(command, log)
        app.wait_running()
        mark("running again")
        seen = committed_counts(bootstrap, sink, expected)
        mark("counts read")
    finally:
        app.stop()
    problems = {
        w: (len(got), got[:5], got[-5:])
        for w, n in expected.items()
        if (got := seen.get(w, [])) != list(range(1, n + 1))
    }
    assert not problems, f"counts not exactly 1..n per word: {problems}\n{log.read_text()[-2000:]}"


# ------------------------------------------------------------------ transactions checker
RUN_S = 10.0


def test_transactions_checker_under_a_move_and_a_broker_kill_9(
    cluster: LocalClusterProcess,
) -> None:
    """The checker and the copier of tests/support/txn_checker.py (the same run against Apache
    Kafka in tests/integration/apache_kafka/test_transactions.py) through a partition move and
    a kill -9."""
    w = TransactionsWorkload(cluster.bootstrap)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(t, w.partitions, 1) for t in w.topics]).values():
        f.result(30)
    w.start()
    time.sleep(RUN_S / 4)
    live = alive(cluster)
    leader = cluster.leaders(w.topic)[0]
    target = next(b for b in live if b != leader)
    result = cluster.reassign({(w.topic, 0): target})  # a move in the middle of transactions
    assert all(r["error"] is None for r in result["results"]), result
    time.sleep(RUN_S / 4)
    cluster.kill_broker(victim(cluster, w.topic))  # and a kill -9
    time.sleep(RUN_S / 2)
    w.stop(cluster.status)
    cluster.wait_settled(60)
    w.check()
