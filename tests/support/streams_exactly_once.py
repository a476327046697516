"""Kafka Streams exactly_once_v2 through kill -9, as one scenario run against any bootstrap
address: TidalMQ in tests/integration/compat/test_exactly_once.py, Apache Kafka 4.3.1 in
tests/integration/apache_kafka/test_exactly_once_streams.py, so a check that passes only on
TidalMQ shows up. Each test file brings its cluster and its broker faults.

The program is bench/kafka/java/StreamsCount.java (Kafka Streams 4.3.1, the command line from
``bench.kafka.harness.streams_count_command``; its changelogs forced to cleanup.policy=delete):
it counts words, one output record (word, count) per increment. The scenario, in three phases
of ``PER_PHASE`` input records:

1. produced at once, then the application starts;
2. produced over about 3 s: a broker is killed with kill -9 as it starts (``kill_broker``), the
   application itself 1.5 s later (records processed in a transaction not yet committed:
   counted again after the restart, which must not show); ``restart_broker`` starts then, in
   a thread of its own (on Apache Kafka the killed broker comes back; TidalMQ's test leaves
   it dead), beside what follows;
3. produced at once, and the application starts again; once it runs and ``restart_broker`` is
   done, the output is read.

A read_committed consumer of the output must then see, for every word, the counts 1, 2, ..., n
exactly once each and in order: no increment applied twice, none lost, nothing aborted seen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import streams_count_command

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
PER_PHASE = 300  # input records in each of the three phases
PARTITIONS = 2
APP_KILL_AFTER_S = 1.5  # after the broker's kill, in the middle of the second phase


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


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

    def _watch(self, out: BinaryIO) -> None:
        assert self.proc.stdout is not None
        with out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                if line.strip() == b"RUNNING":
                    self.running.set()

    def wait_running(self, timeout_s: float = 120) -> None:
        if not self.running.wait(timeout_s):
            self.kill()
            raise AssertionError(f"Streams did not start:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """kill -9."""
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
    each word reached its expected count (or the deadline), and then 1 s more: nothing more
    may arrive."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: dict[str, list[int]] = defaultdict(list)

    def poll() -> None:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            seen[m.key().decode()].append(int.from_bytes(m.value(), "big", signed=True))

    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            poll()
            if all(seen[w] and seen[w][-1] >= n for w, n in expected.items()):
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    poll()
                break
    finally:
        c.close()
    return dict(seen)


def count_problems(
    expected: Counter[str], seen: dict[str, list[int]]
) -> dict[str, tuple[int, list[int], list[int]]]:
    """Per word whose counts are not exactly 1..n: how many it got, the first and last five."""
    return {
        w: (len(got), got[:5], got[-5:])
        for w, n in expected.items()
        if (got := seen.get(w, [])) != list(range(1, n + 1))
    }


def counts_survive_a_broker_and_an_app_kill_9(
    bootstrap: str,
    work: Path,
    *,
    replication_factor: int,
    kill_broker: Callable[[str], None],
    restart_broker: Callable[[], None] = lambda: None,
    guarantee: str = "exactly_once_v2",
) -> None:
    """The scenario of the module's docstring. `kill_broker(input_topic)` kills a broker with
    kill -9 (one leading some of the input's partitions), `restart_broker()` starts it again
    and returns once it serves; `guarantee` other than exactly_once_v2 (at_least_once) shows
    the check failing."""
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}")

    source, sink, app_id = unique("words"), unique("counts"), unique("wordcount")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(t, PARTITIONS, replication_factor) for t in (source, sink)]
    for f in admin.create_topics(topics).values():
        f.result(30)
    command = streams_count_command(bootstrap, source, sink, app_id, work / "state", guarantee)
    log = work / "streams.log"
    expected = produce_words(bootstrap, source, 0, PER_PHASE)
    app = StreamsApp(command, log)
    pool = ThreadPoolExecutor(1, thread_name_prefix="restart-broker")
    try:
        app.wait_running()
        mark("running")
        second: list[Counter[str]] = []
        producing = threading.Thread(
            target=lambda: second.append(
                produce_words(bootstrap, source, PER_PHASE, PER_PHASE, pace_s=0.01)
            )
        )
        producing.start()
        kill_broker(source)
        mark("broker killed")
        time.sleep(APP_KILL_AFTER_S)  # the fault's timing, not a wait for a condition
        app.kill()
        mark("application killed")
        restarting = pool.submit(restart_broker)
        producing.join(60)
        assert second, "the second phase's input not acknowledged"
        expected += second[0]
        expected += produce_words(bootstrap, source, 2 * PER_PHASE, PER_PHASE)
        mark("third phase produced")
        app = StreamsApp(command, log)
        app.wait_running()
        mark("running again")
        restarting.result(120)
        mark("broker restarted")
        seen = committed_counts(bootstrap, sink, expected)
        mark("counts read")
    finally:
        app.stop()
        pool.shutdown(wait=True)
    problems = count_problems(expected, seen)
    assert not problems, f"counts not exactly 1..n per word: {problems}\n{log.read_text()[-2000:]}"
