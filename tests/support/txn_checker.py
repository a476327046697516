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

Use: ``w = TransactionsWorkload(bootstrap)``; create ``w.topics`` (``w.partitions`` each);
``w.start()``; inflict faults; ``w.stop(describe)``; ``w.check()``."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

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


# librdkafka sends TxnOffsetCommit (send_offsets_to_transaction) through the producer's
# coordinator cache. A request that finds the cached group coordinator down waits for one of the
# producer's broker connections to change state before it asks FindCoordinator again, and never
# times out (confluentinc/librdkafka#5456, #5511, open in 2.16). When that coordinator is gone
# for good (kill -9: once the controller declares it dead, the Metadata response stops listing
# it and librdkafka terminates its connection thread), nothing changes state any more and the
# call never returns: the copier hung in it for 70 minutes in CI. Closing idle connections (after
# 3-5 s: librdkafka's jitter) makes such changes, so the request asks again and finds the
# partition's new leader. Not shorter: the idle check ignores requests in flight, so a slow
# answer would cost a reconnect and a retry.
COPIER_PRODUCER = {"connections.max.idle.ms": 5000}


def transactional_producer(
    bootstrap: str, tid: str, conf: dict[str, Any] | None = None
) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2,
                  "transaction.timeout.ms": 10_000, **(conf or {})})  # fmt: skip
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
    p = transactional_producer(bootstrap, tid, COPIER_PRODUCER)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed"})  # fmt: skip
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
                    p = transactional_producer(bootstrap, tid, COPIER_PRODUCER)
                committed = c.committed(parts, timeout=30)
                c.assign([TopicPartition(source, t.partition, max(t.offset, 0)) for t in committed])
        c.close()
        p.flush(10)
    finally:
        del c, p  # not kept alive by an exception's traceback (see run_producer)


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
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("checker-reader"),
                  "isolation.level": isolation, "enable.auto.commit": False})  # fmt: skip
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

    @property
    def topics(self) -> list[str]:
        return [self.topic, self.source, self.sink]

    def start(self) -> None:
        b, n = self.bootstrap, self.partitions
        self.threads = [
            threading.Thread(target=run_producer, args=(b, self.topic, n, i, self.stopping,
                             self.history), name=f"producer-{i}", daemon=True)
            for i in range(self.producers)
        ]  # fmt: skip
        self.threads += [
            threading.Thread(target=feed, args=(b, self.source, n, self.stopping, self.fed),
                             name="feed", daemon=True),
            threading.Thread(target=run_copier, args=(b, self.source, self.sink, n,
                             self.stopping, self.copier, self.copier_catch_up_s),
                             name="copier", daemon=True),
        ]  # fmt: skip
        for t in self.threads:
            t.start()

    def stop(self, describe: Callable[[], object], join_s: float = 60.0) -> None:
        """Stops the clients and waits for every thread (the copier catching up, then `join_s`
        more). A thread left fails with where it is stuck and `describe()` (the cluster)."""
        self.stopping.set()
        deadline = time.monotonic() + self.copier_catch_up_s + join_s
        for t in self.threads:
            t.join(max(deadline - time.monotonic(), 0))
        left = [t for t in self.threads if t.is_alive()]
        if left:
            raise AssertionError(f"client threads did not stop: {[t.name for t in left]}\n"
                                 f"{thread_stacks(left)}\ncluster: {describe()}")  # fmt: skip

    def check(self, min_committed: int = 20, min_fed: int = 100) -> str:
        """Asserts the history and the copy; returns what ran, for the test's output."""
        h, n = self.history, self.partitions
        summary = (f"committed {len(h.committed)}, aborted {len(h.aborted)}, unknown "
                   f"{len(h.unknown)} records; client errors {dict(h.errors)}")  # fmt: skip
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
        copied_summary = f"copier: {self.fed[0]} records; client errors {dict(self.copier.errors)}"
        print(copied_summary)
        for partition in range(n):
            copied, wanted = outputs.get(partition, []), inputs.get(partition, [])
            assert copied == wanted, {
                "partition": partition,
                "duplicates": sorted(v for v, k in Counter(copied).items() if k > 1)[:10],
                "lost": sorted(set(wanted) - set(copied))[:10],
                "lengths": (len(copied), len(wanted)), "errors": dict(self.copier.errors),
            }  # fmt: skip
        return f"{summary}\n{copied_summary}"


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
