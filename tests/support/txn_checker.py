"""A checker in the style of Jepsen's Kafka transaction workload, and a consume-transform-produce
copier, over librdkafka (confluent-kafka); one implementation run against TidalMQ
(tests/integration/compat/test_exactly_once.py) and Apache Kafka
(tests/integration/apache_kafka/test_transactions.py), each test bringing its own faults.

- Producers commit or abort transactions of 1-6 records over every partition of a topic; then a
  read_committed consumer must see no aborted record, every committed record exactly once and
  in the partition it was sent to, a transaction whose outcome the producer could not learn
  whole or not at all, each producer's records in order within a partition, nothing else.
- The copier reads a topic fed throughout by an idempotent producer and writes each batch to
  the same partition of a sink in a transaction that commits its consumer positions too
  (send_offsets_to_transaction): the sink must equal the input, each record once, in order.
- Optionally (``java_copier_log``), the same copy with Kafka's Java clients
  (bench/kafka/java/TransactionalCopier.java, sendOffsetsToTransaction) from the same input
  to a sink of its own, judged the same way.

Use: ``w = TransactionsWorkload(bootstrap)``; create ``w.topics`` (``w.partitions`` each);
``w.start()``; inflict faults; ``w.stop(describe)``; ``w.check()``."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench.kafka.harness import HERE, java_client_command, java_thread_stacks
from tests.support.threads import thread_stacks

# How the checker reads what the producers left: only committed records may show. (Made
# read_uncommitted, the checker reports the aborted records it then sees: that is how it was
# shown able to fail, see docs/transactions.md "Tests".)
CHECKED_ISOLATION = "read_committed"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class History:
    """What the producers did: records of committed, aborted and unknown transactions (an
    error while committing: its outcome is not known to the client)."""

    committed: list[tuple[bytes, int]] = field(default_factory=list)  # (value, partition)
    aborted: list[tuple[bytes, int]] = field(default_factory=list)
    unknown: list[list[tuple[bytes, int]]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the longest transaction, from its begin until settled (committed, aborted, or given up),
    # and when it began (time.monotonic()): what to look at when a transaction outlived its
    # timeout and was fenced (its producer gets _FENCED)
    slowest: tuple[float, float] = (0.0, 0.0)

    def took(self, began: float) -> None:
        with self.lock:
            self.slowest = max(self.slowest, (time.monotonic() - began, began))

    def slowest_since(self, start: float) -> str:
        took, began = self.slowest
        return f"slowest transaction {took:.1f} s, begun at {began - start:.1f} s"


# librdkafka sends TxnOffsetCommit (send_offsets_to_transaction) through the producer's
# coordinator cache. A request that finds the cached group coordinator down waits for one of the
# producer's broker connections to change state before it asks FindCoordinator again, and never
# times out (confluentinc/librdkafka#5456, #5511, open in 2.16). When that coordinator is gone
# for good (kill -9: once the controller declares it dead, the Metadata response stops listing
# it and librdkafka terminates its connection thread), nothing changes state any more and the
# call never returns: the copier hung in it for 70 minutes in CI. Closing idle connections (after
# 3-5 s: librdkafka's jitter) makes such changes, so the request asks again and finds the
# partition's new leader. Not shorter: the idle check ignores requests in flight, so a slow
# answer would cost a reconnect and a retry. The copier's producer must close idle connections:
# tests/unit/transactions/test_copier_idle_connections.py.
COPIER_PRODUCER = {"connections.max.idle.ms": 5000}


def copier_producer(bootstrap: str, tid: str, conf: dict[str, Any] | None = None) -> Producer:
    """The copier's transactional producer (COPIER_PRODUCER: the hang workaround), initialised;
    `conf` adds settings."""
    return transactional_producer(bootstrap, tid, {**COPIER_PRODUCER, **(conf or {})})


# The clients' transaction timeout: longer than a transaction caught by the kill -9 takes to
# finish. One begun just before it waits for the dead broker's coordinators to move (the
# session timeout: 3 s on Kafka, 6 s on TidalMQ) and, for the copier's TxnOffsetCommit, for
# the idle close that wakes it (COPIER_PRODUCER, up to 5 s more): measured up to 14.1 s (Kafka)
# and 12.4 s (TidalMQ). At 10 s the coordinator aborted such transactions and fenced their
# producer, which then started again; the checks passed, but the run took up to 93 s instead
# of 40-60 s (docs/transactions.md "Against Apache Kafka").
TRANSACTION_TIMEOUT_MS = 30_000


def transactional_producer(
    bootstrap: str, tid: str, conf: dict[str, Any] | None = None
) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "linger.ms": 2,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            **(conf or {}),
        }
    )
    try:
        p.init_transactions(30)
    except BaseException:
        del p  # not kept alive by the exception's traceback (see run_producer)
        raise
    return p


def run_producer(
    bootstrap: str, topic: str, partitions: int, index: int, stop: threading.Event, h: History
) -> None:
    """Transactions of 1-6 records over random partitions until `stop`: four of five commit,
    the rest abort. Values are `producer/transaction/record`, in the order sent."""
    rng = random.Random(index)
    tid = unique(f"checker-{index}")
    p = transactional_producer(bootstrap, tid)
    try:
        txn = 0
        while not stop.is_set():
            txn += 1
            sent = []
            began = time.monotonic()
            try:
                p.begin_transaction()
                for i in range(rng.randint(1, 6)):
                    partition = rng.randrange(partitions)
                    value = f"{index}/{txn}/{i}".encode()
                    p.produce(topic, value, partition=partition)
                    sent.append((value, partition))
                if rng.random() < 0.8:
                    try:
                        p.commit_transaction(30)
                    except KafkaException as exc:
                        with h.lock:
                            h.unknown.append(sent)
                            h.errors[exc.args[0].name()] += 1
                        raise
                    with h.lock:
                        h.committed.extend(sent)
                else:
                    # written first (abort_transaction alone drops what is still queued in the
                    # client): the aborted records are in the log, followed by the abort marker
                    assert p.flush(30) == 0, "records of a transaction to abort not acknowledged"
                    p.abort_transaction(30)
                    with h.lock:
                        h.aborted.extend(sent)
            except KafkaException as exc:
                error = exc.args[0]
                with h.lock:
                    h.errors[error.name()] += 1
                    if sent and not any(sent is u for u in h.unknown):
                        h.aborted.extend(sent)  # never committed: it must not show
                if error.txn_requires_abort():
                    try:
                        p.abort_transaction(30)
                        continue
                    except KafkaException:
                        pass
                if not error.retriable() or error.fatal():
                    p = transactional_producer(bootstrap, tid)  # fences the previous incarnation
            finally:
                h.took(began)
        p.flush(10)
    finally:
        # A KafkaException of this loop outlived the thread (the test passed, yet CI's producer
        # went on reconnecting to the stopped cluster until the process ended): its traceback
        # holds this frame, and the frame its locals. Without the producer, at least.
        del p


def feed(
    bootstrap: str, topic: str, partitions: int, stop: threading.Event, fed: list[int]
) -> None:
    """The copier's input: plain idempotent records `c/n`, over every partition, until `stop`
    (how many, appended to `fed`, once all are acknowledged)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    try:
        n = 0
        while not stop.is_set():
            for _ in range(5):
                p.produce(topic, f"c/{n}".encode(), partition=n % partitions)
                n += 1
            p.poll(0)
            time.sleep(0.05)  # about 100 records a second: the producers above keep their pace
        assert p.flush(60) == 0, "input records not acknowledged"
        fed.append(n)
    finally:
        del p  # not kept alive by an exception's traceback (see run_producer)


def run_copier(
    bootstrap: str,
    source: str,
    sink: str,
    partitions: int,
    stop: threading.Event,
    h: History,
    catch_up_s: float,
) -> None:
    """Consume-transform-produce with librdkafka's transactional API: each batch read from
    `source` is written to the same partition of `sink` in a transaction that also commits the
    consumer's positions (send_offsets_to_transaction). After any error the transaction is
    settled (aborted, or fenced by a new incarnation, which completes or aborts it first) and
    the consumer rewinds to the group's committed offsets, so every input record lands in the
    sink exactly once, in order, if transactional offsets are committed with their records.
    After `stop`, it goes on until the end of its input, for `catch_up_s` at most."""
    group, tid = unique("copier"), unique("copier-txn")
    p = copier_producer(bootstrap, tid)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    parts = [TopicPartition(source, p) for p in range(partitions)]
    c.assign([TopicPartition(source, p, 0) for p in range(partitions)])
    try:
        stopped_at: float | None = None
        while stopped_at is None or time.monotonic() < stopped_at + catch_up_s:
            if stopped_at is None and stop.is_set():
                stopped_at = time.monotonic()
            batch = [m for m in c.consume(100, 0.2) if m.error() is None]
            if not batch:
                if stop.is_set() and all(
                    pos.offset >= c.get_watermark_offsets(pos, timeout=10, cached=False)[1]
                    for pos in c.position(parts)
                ):
                    break
                continue
            began = time.monotonic()
            try:
                p.begin_transaction()
                for m in batch:
                    p.produce(sink, m.value(), partition=m.partition())
                p.send_offsets_to_transaction(c.position(parts), c.consumer_group_metadata(), 30)
                p.commit_transaction(30)
            except KafkaException as exc:
                h.errors[exc.args[0].name()] += 1
                try:
                    p.abort_transaction(30)
                except KafkaException:
                    # fences the previous incarnation
                    p = copier_producer(bootstrap, tid)
                committed = c.committed(parts, timeout=30)
                c.assign([TopicPartition(source, t.partition, max(t.offset, 0)) for t in committed])
            finally:
                h.took(began)
        c.close()
        p.flush(10)
    finally:
        del c, p  # not kept alive by an exception's traceback (see run_producer)


class JavaCopier:
    """bench/kafka/java/TransactionalCopier.java as a child process: it prints RUNNING once it
    reads; closing its standard input makes it copy until its input's end and print its report
    (stderr goes to `log`)."""

    def __init__(
        self, bootstrap: str, source: str, sink: str, log: Path, group: str, tid: str
    ) -> None:
        self.log = log
        self.tid = tid
        self.running = threading.Event()
        self.lines: list[str] = []
        self._err = log.open("ab")
        self.proc = subprocess.Popen(
            java_client_command(
                bootstrap,
                source,
                sink,
                group,
                tid,
                source=HERE / "java" / "TransactionalCopier.java",
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == "RUNNING":
                self.running.set()

    def wait_running(self, timeout_s: float = 60.0) -> None:
        if not self.running.wait(timeout_s):
            self.kill()
            raise AssertionError(f"the Java copier did not start:\n{self._tail()}")

    def stop(self, timeout_s: float) -> dict[str, Any]:
        """Closes its input and waits (`timeout_s` at most) for its report; past that, the
        failure says where its threads were."""
        stdin: IO[str] | None = self.proc.stdin
        if stdin is not None:
            stdin.close()
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGQUIT)  # a thread dump on stdout; it goes on
            time.sleep(2)
            self.kill()
            self._reader.join(10)
            stacks = "\n".join(java_thread_stacks("".join(self.lines)))
            raise AssertionError(
                f"the Java copier did not stop:\n{stacks}\n{self._tail()}"
            ) from None
        self._reader.join(10)
        self._err.close()
        reports = [line for line in self.lines if line.startswith("{")]
        assert code == 0 and reports, (code, self.lines[-5:], self._tail())
        report: dict[str, Any] = json.loads(reports[-1])
        return report

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._err.close()  # closing twice is harmless

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def read_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    at_least: int,
    isolation: str = "read_committed",
    quiet_s: float = 2.0,
) -> dict[int, list[bytes]]:
    """Every partition of `topic` from the start, until `at_least` records and then `quiet_s`
    more (60 s at most); the values per partition, in order."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("checker-reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[bytes]] = defaultdict(list)
    deadline = time.monotonic() + 60
    quiet_until = None
    try:
        while time.monotonic() < (quiet_until or deadline):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got[m.partition()].append(m.value())
            if quiet_until is None and sum(map(len, got.values())) >= at_least:
                quiet_until = time.monotonic() + quiet_s
    finally:
        c.close()
    return got


def history_problems(h: History, got: dict[int, list[bytes]]) -> dict[str, list[Any]]:
    """What the records read (per partition, in order) break of the producers' history: empty
    when nothing."""
    seen = Counter(v for values in got.values() for v in values)
    where = {v: p for p, values in got.items() for v in values}
    out_of_order = []
    for partition, values in got.items():
        last: dict[str, tuple[int, int]] = {}
        for v in values:
            producer, txn, i = v.decode().split("/")
            pos = (int(txn), int(i))
            if producer in last and pos <= last[producer]:
                out_of_order.append((partition, v))
            last[producer] = pos
    known = {v for v, _ in h.committed} | {v for v, _ in h.aborted}
    known |= {v for u in h.unknown for v, _ in u}
    problems: dict[str, list[Any]] = {
        "duplicates": sorted(v for v, n in seen.items() if n > 1),
        "lost": sorted(v for v, _ in h.committed if v not in seen),
        "aborted read": sorted(v for v, _ in h.aborted if v in seen),
        "misplaced": sorted(v for v, p in h.committed if v in where and where[v] != p),
        "partial": [u for u in h.unknown if 0 < sum(v in seen for v, _ in u) < len(u)],
        "out of order": out_of_order,
        "unexpected": sorted(v for v in seen if v not in known),
    }
    return {k: v for k, v in problems.items() if v}


@dataclass
class TransactionsWorkload:
    """The checked producers, the copier and its feed, as daemon threads (a client call that
    never returns fails the test, not the process's exit)."""

    bootstrap: str
    partitions: int = 3
    producers: int = 3
    copier_catch_up_s: float = 90.0  # after the stop, for the copier to reach its input's end
    topic: str = field(default_factory=lambda: unique("checked"))
    source: str = field(default_factory=lambda: unique("copier-in"))
    sink: str = field(default_factory=lambda: unique("copier-out"))
    history: History = field(default_factory=History)
    copier: History = field(default_factory=History)
    stopping: threading.Event = field(default_factory=threading.Event)
    fed: list[int] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    # the Java copier: its stderr goes there; None: not run
    java_copier_log: Path | None = None
    java_sink: str = field(default_factory=lambda: unique("java-copier-out"))
    java_copier: JavaCopier | None = None
    java_report: dict[str, Any] = field(default_factory=dict)
    java_copier_fenced: bool = False  # fence_java_copier() ran
    started_at: float = 0.0  # time.monotonic() at start()

    @property
    def topics(self) -> list[str]:
        java = [self.java_sink] if self.java_copier_log is not None else []
        return [self.topic, self.source, self.sink, *java]

    def start(self) -> None:
        b, n = self.bootstrap, self.partitions
        self.started_at = time.monotonic()
        if self.java_copier_log is not None:
            # running (a JVM compiling its source takes seconds) before the faults can start
            self.java_copier = JavaCopier(
                b,
                self.source,
                self.java_sink,
                self.java_copier_log,
                unique("java-copier"),
                unique("java-copier-txn"),
            )
            self.java_copier.wait_running()
        self.threads = [
            threading.Thread(
                target=run_producer,
                args=(b, self.topic, n, i, self.stopping, self.history),
                name=f"producer-{i}",
                daemon=True,
            )
            for i in range(self.producers)
        ]
        self.threads += [
            threading.Thread(
                target=feed,
                args=(b, self.source, n, self.stopping, self.fed),
                name="feed",
                daemon=True,
            ),
            threading.Thread(
                target=run_copier,
                args=(
                    b,
                    self.source,
                    self.sink,
                    n,
                    self.stopping,
                    self.copier,
                    self.copier_catch_up_s,
                ),
                name="copier",
                daemon=True,
            ),
        ]
        for t in self.threads:
            t.start()

    def fence_java_copier(self) -> None:
        """Another incarnation of the Java copier's transactional id (librdkafka's
        init_transactions) fences the copier's producer mid-copy: its next transactional call
        fails, so does its abort (the producer is fenced), and it goes on with a new producer,
        a path nothing showed the broker faults of these tests to take; `check` then asserts it
        did and that the copy is still exact. The fencing producer is fenced in its turn by the
        copier's next incarnation and does nothing more."""
        assert self.java_copier is not None
        p = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": self.java_copier.tid}
        )
        p.init_transactions(30)
        self.java_copier_fenced = True
        del p

    def wait_java_copying(self, timeout_s: float = 30.0) -> None:
        """Until the Java copier has written to its sink (a JVM gets going slower than the
        Python clients on a loaded machine), so that faults inflicted next land mid-copy."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": unique("java-progress")})
        deadline = time.monotonic() + timeout_s
        try:
            while not any(
                c.get_watermark_offsets(
                    TopicPartition(self.java_sink, p), timeout=10, cached=False
                )[1]
                for p in range(self.partitions)
            ):
                assert time.monotonic() < deadline, (
                    f"the Java copier wrote nothing in {timeout_s} s"
                )
                time.sleep(0.2)
        finally:
            c.close()

    def stop(self, describe: Callable[[], object], join_s: float = 60.0) -> None:
        """Stops the clients and waits for every thread (the copier catching up, then `join_s`
        more). A thread left fails with where it is stuck and `describe()` (the cluster)."""
        self.stopping.set()
        deadline = time.monotonic() + self.copier_catch_up_s + join_s
        for t in self.threads:
            t.join(max(deadline - time.monotonic(), 0))
        left = [t for t in self.threads if t.is_alive()]
        if left:
            if self.java_copier is not None:
                self.java_copier.kill()
            raise AssertionError(
                f"client threads did not stop: {[t.name for t in left]}\n"
                f"{thread_stacks(left)}\ncluster: {describe()}"
            )
        if self.java_copier is not None:
            # the input is complete now (the feed has stopped): the copy catches up and ends
            self.java_report = self.java_copier.stop(self.copier_catch_up_s + join_s)

    def check(self, min_committed: int = 20, min_fed: int = 100) -> str:
        """Asserts the history and the copy; returns what ran, for the test's output."""
        h, n = self.history, self.partitions
        summary = (
            f"committed {len(h.committed)}, aborted {len(h.aborted)}, unknown "
            f"{len(h.unknown)} records; client errors {dict(h.errors)}; "
            f"{h.slowest_since(self.started_at)}"
        )
        print(summary)
        got = read_all(self.bootstrap, self.topic, n, len(h.committed), CHECKED_ISOLATION)
        # the run did commit transactions (at least a few dozen records: a loaded machine once
        # committed only 49 in 10 s, producers to a killed broker waiting for its failover)
        assert len(h.committed) > min_committed, h
        problems = history_problems(h, got)
        assert not problems, {**{k: v[:10] for k, v in problems.items()}, "errors": dict(h.errors)}

        # consume-transform-produce: the sink holds every input record once, in the input's order
        assert self.fed and self.fed[0] > min_fed, self.fed  # the input kept coming throughout
        # every input record is acknowledged: all there, no need to wait for more
        inputs = read_all(self.bootstrap, self.source, n, self.fed[0], "read_uncommitted", 0)
        assert sum(map(len, inputs.values())) == self.fed[0]
        outputs = read_all(self.bootstrap, self.sink, n, self.fed[0])
        copied_summary = (
            f"copier: {self.fed[0]} records; client errors {dict(self.copier.errors)}; "
            f"{self.copier.slowest_since(self.started_at)}"
        )
        print(copied_summary)
        problems = copy_problems(inputs, outputs, n)
        assert not problems, {**problems, "errors": dict(self.copier.errors)}
        if self.java_copier is None:
            return f"{summary}\n{copied_summary}"
        # the Java copier's sink, read as the checked topic is: the copies of the transactions
        # it aborted (on purpose, and after errors) would show as duplicates, lost commits as
        # missing records
        java_outputs = read_all(self.bootstrap, self.java_sink, n, self.fed[0], CHECKED_ISOLATION)
        java_summary = f"Java copier: {self.java_report}"
        print(java_summary)
        assert self.java_report["aborted"] > 0, self.java_report  # there was something to hide
        if self.java_copier_fenced:  # it went on with a new producer
            assert self.java_report["producers"] >= 2, self.java_report
        problems = copy_problems(inputs, java_outputs, n)
        assert not problems, {**problems, "Java copier": self.java_report}
        return f"{summary}\n{copied_summary}\n{java_summary}"


def copy_problems(
    inputs: dict[int, list[bytes]], outputs: dict[int, list[bytes]], partitions: int
) -> dict[str, Any]:
    """Where a copier's output (read per partition, in order) differs from its input: the first
    partition that does, with its duplicates and lost records; empty when none."""
    for partition in range(partitions):
        copied, wanted = outputs.get(partition, []), inputs.get(partition, [])
        if copied != wanted:
            return {
                "partition": partition,
                "duplicates": sorted(v for v, k in Counter(copied).items() if k > 1)[:10],
                "lost": sorted(set(wanted) - set(copied))[:10],
                "lengths": (len(copied), len(wanted)),
            }
    return {}


def java_transactions_problems(
    report: dict[str, Any], transactions: int, partitions: int
) -> dict[str, Any]:
    """What bench/kafka/java/TransactionsCheck.java's report breaks (transactions 2, 5, 8, ...
    aborted, the others committed): the read_committed consumer sees every committed record
    once, in order, and no aborted one; the group's offset is the last committed
    transaction's. Empty when nothing."""
    committed = [t for t in range(transactions) if t % 3 != 2]
    problems: dict[str, Any] = {}
    for p in range(partitions):
        wanted = [f"{t}:{p}" for t in committed]
        if report["read"].get(str(p)) != wanted:
            problems[f"read from partition {p}"] = (report["read"].get(str(p)), wanted)
    if sorted(report["committed"]) != sorted(
        f"{t}:{p}" for t in committed for p in range(partitions)
    ):
        problems["committed"] = report["committed"]
    if report["group_offset"] != committed[-1] + 1:
        problems["group offset"] = report["group_offset"]
    return problems
