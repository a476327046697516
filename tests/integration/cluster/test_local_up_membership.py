"""`tidalmq local up` as a Kafka user expects it ([U1] items 1-3): the commands find the
cluster from any directory, the bootstrap address (`--port`) answers whatever brokers were
removed, a clean stop is a clean stop (nothing dead, nothing moved at the next start), the
status table lists what is there (dead brokers with how long ago, removed ones gone) and
counts the moves the controller lists.

Real processes: `tidalmq local up`, its brokers, the `tidalmq` commands, Kafka clients."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess, tidalmq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


# ---------------------------------------------------------------------- helpers
def free_port_run(count: int) -> int:
    """A port P with P..P+count-1 all free now (for a fixed --port)."""
    for _ in range(200):
        base = random.randint(20000, 40000)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(120)


def produce(bootstrap: str, topic: str, count: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[bool] = []
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, on_delivery=lambda e, m: acked.append(e is None))
    producer.flush(60)
    return sum(acked)


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{time.time()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaTP(topic, p, 0) for p in range(partitions)])
    seen = 0
    deadline = time.monotonic() + 60
    try:
        while seen < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen += 1
    finally:
        consumer.close()
    return seen


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.1)


def rows(cluster: LocalClusterProcess) -> dict[int, dict[str, object]]:
    return {row["broker"]: row for row in cluster.status()["brokers"]}


def listed_reassignments(cluster: LocalClusterProcess, cwd: Path) -> int:
    """How many moves `tidalmq reassign --list` lists (the controller's own count)."""
    out = tidalmq("reassign", "--bootstrap-server", cluster.bootstrap, "--list", cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    return sum(1 for line in out.stdout.splitlines() if ": replicas " in line)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A directory that is not the repository (nor the data dir's parent)."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


@pytest.fixture
def clusters(data_dir: Path) -> Iterator[Callable[..., LocalClusterProcess]]:
    """Start (and at the end stop) `local up` processes on `data_dir`."""
    started: list[LocalClusterProcess] = []

    def start(brokers: int = 3, port: int = 0) -> LocalClusterProcess:
        c = LocalClusterProcess(data_dir, brokers=brokers, port=port)
        if c.log_path.exists():  # the start waits for the addresses this run prints
            c.log_path.rename(c.log_path.with_suffix(f".{len(started)}.log"))
        started.append(c)
        c.start()
        return c

    yield start
    for c in started:
        c.stop()


# ---------------------------------------------------------------------- item 1
def test_commands_find_the_cluster_from_any_directory_and_a_second_up_refuses(
    clusters: Callable[..., LocalClusterProcess], data_dir: Path, elsewhere: Path
) -> None:
    """[U1]: `local` and `static-topic` commands only worked from the repository directory.
    With TIDALMQ_DATA_DIR they find the running cluster from anywhere; a second `local up` on
    it (found the same way) refuses and names the running one."""
    cluster = clusters(brokers=2)
    env = {"TIDALMQ_DATA_DIR": str(data_dir)}
    status = tidalmq("local", "status", cwd=elsewhere, env=env)
    assert status.returncode == 0, status.stderr
    assert f"bootstrap: {cluster.bootstrap}" in status.stdout
    recover = tidalmq("recover", cwd=elsewhere, env=env)
    assert recover.returncode == 0 and "no lost partitions" in recover.stdout, recover.stderr
    created = tidalmq("static-topic", "create", "ledger", "--queues", "2", cwd=elsewhere, env=env)
    assert created.returncode == 0, created.stdout + created.stderr

    second = tidalmq("local", "up", "--port", "0", "--controller-port", "0", cwd=elsewhere, env=env)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "Traceback" not in second.stderr
    line = second.stderr.strip()
    assert f"pid {cluster.proc.pid}, bootstrap {cluster.bootstrap}" in line  # type: ignore[union-attr]
    assert {row["state"] for row in cluster.status()["brokers"]} == {"alive"}
    # without the variable nor a cluster in the home directory: no cluster, said in one line
    nowhere = tidalmq(
        "local", "status", cwd=elsewhere, env={"HOME": str(elsewhere), "TIDALMQ_DATA_DIR": ""}
    )
    assert nowhere.returncode == 2 and "no local cluster is running" in nowhere.stderr


# ---------------------------------------------------------------------- item 2
def test_the_bootstrap_port_answers_after_broker_0_is_removed(
    clusters: Callable[..., LocalClusterProcess], elsewhere: Path
) -> None:
    """[U1]: after `remove-broker 0` and a restart the cluster came back on 9093-9095 and
    every command against 127.0.0.1:9092 got "Connection refused". Ports go lowest first."""
    port = free_port_run(4)
    first = clusters(brokers=3, port=port)
    create_topic(first.bootstrap, "kept", 6)
    assert produce(first.bootstrap, "kept", 120) == 120
    first.remove_broker(0)
    assert 0 not in rows(first), "a removed broker leaves the table"
    first.stop()

    second = clusters(brokers=3, port=port)
    boot = f"127.0.0.1:{port}"
    assert second.bootstrap.split(",")[0] == boot, second.output
    assert sorted(rows(second)) == [1, 2], "no new broker 0, none removed listed"
    assert {row["address"] for row in rows(second).values()} == {boot, f"127.0.0.1:{port + 1}"}
    assert second.status()["moves_done"] == 0, "a restart moved partitions"
    assert consume_all(boot, "kept", 6, 120) == 120  # through the bootstrap address alone

    # while it runs: the broker on --port removed, the next one added listens there again
    holder = next(b for b, row in rows(second).items() if row["address"] == boot)
    second.remove_broker(holder)
    added = second.add_broker()
    assert rows(second)[added]["address"] == boot
    assert consume_all(boot, "kept", 6, 120) == 120
    out = tidalmq("local", "status", "--data-dir", str(second.data_dir), cwd=elsewhere)
    assert out.returncode == 0 and f"bootstrap: {boot}," in out.stdout, out.stdout + out.stderr


# ---------------------------------------------------------------------- item 3
def test_a_clean_stop_is_a_clean_stop_even_when_one_broker_is_slow_to_close(
    clusters: Callable[..., LocalClusterProcess], elsewhere: Path
) -> None:
    """[U1]: a broker stopped by Ctrl-C was "dead (session timed out)" at the next start and
    every restart reshuffled partitions (25 moves, 22 leaderless, nothing to rebalance). Here
    one broker hangs through the stop (it is killed 7.5 s in, past the 6 s session timeout of
    the others, which exited at once): still nothing is declared dead, and the next start, with
    the cluster's 4 brokers for `--brokers 3`, moves nothing."""
    first = clusters(brokers=3)
    create_topic(first.bootstrap, "orders", 12)
    assert produce(first.bootstrap, "orders", 240) == 240
    first.add_broker()  # a 4th: the fair-share moves
    first.wait_settled()
    leaders = first.leaders("orders")
    assert first.status()["moves_in_flight"] == listed_reassignments(first, elsewhere) == 0
    slow = first.broker_pids()[3]
    os.kill(slow, signal.SIGSTOP)  # it will not close: SIGKILLed by the stop
    try:
        first.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(slow, signal.SIGCONT)
    log = first.log_path.read_text()
    assert "session timed out" not in log, log[-3000:]

    second = clusters(brokers=3)
    assert "restarting the 4 brokers of this cluster" in second.output
    status = second.status()
    assert {row["broker"]: row["state"] for row in status["brokers"]} == dict.fromkeys(
        range(4), "alive"
    )
    assert status["moves_done"] == 0 and status["moves_in_flight"] == 0, status
    assert status["leaderless"] == 0
    assert second.leaders("orders") == leaders
    assert consume_all(second.bootstrap, "orders", 12, 240) == 240
    time.sleep(8)  # past a session timeout: still nobody dead, nothing moved
    status = second.status()
    assert {row["state"] for row in status["brokers"]} == {"alive"}
    assert status["moves_done"] == 0
    assert "session timed out" not in second.log_path.read_text()


def test_dead_brokers_are_listed_with_how_long_ago_until_replaced_or_removed(
    clusters: Callable[..., LocalClusterProcess], elsewhere: Path
) -> None:
    cluster = clusters(brokers=3)
    create_topic(cluster.bootstrap, "t", 6)
    cluster.kill_broker(2)
    wait_until(lambda: rows(cluster)[2]["state"] == "dead")
    cluster.wait_settled()
    out = tidalmq("local", "status", "--data-dir", str(cluster.data_dir), cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["2"])
    assert "dead for " in line and "replaces it" in line, out.stdout
    assert cluster.status()["moves_in_flight"] == listed_reassignments(cluster, elsewhere)

    assert cluster.add_broker() == 2, "add-broker replaces the dead broker"
    cluster.wait_settled()
    assert rows(cluster)[2]["state"] == "alive"

    cluster.kill_broker(1)
    removed = tidalmq(
        "local", "remove-broker", "1", "--data-dir", str(cluster.data_dir), cwd=elsewhere
    )
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert sorted(rows(cluster)) == [0, 2], "a removed broker leaves the table"
    cluster.wait_settled()
    assert cluster.status()["leaderless"] == 0
