"""The report of Kafka clients left alive by tests: which test left which client, whether it was
still alive at the end; a session whose tests leave nothing behind reports nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.kafka_client_leaks import ClientLeaks, rdkafka_handles


class FakeProcess:
    """The clients a process holds; each one has its librdkafka handle."""

    def __init__(self) -> None:
        self.clients: dict[int, str] = {}
        self.scans = 0
        self.collected: list[int] = []  # clients freed by the next garbage collection

    def count(self) -> int:
        return len(self.clients)

    def scan(self) -> dict[int, str]:
        self.scans += 1
        return dict(self.clients)

    def collect(self) -> None:
        for key in self.collected:
            self.clients.pop(key, None)
        self.collected.clear()

    def leaks(self) -> ClientLeaks:
        return ClientLeaks(count=self.count, scan=self.scan, collect=self.collect)


def test_names_the_test_after_which_a_client_first_stayed_alive() -> None:
    process = FakeProcess()
    leaks = process.leaks()
    leaks.after_test("test_a")
    assert process.scans == 0  # no handle alive: the objects are not looked at
    process.clients[1] = "Producer at 0x1"
    leaks.after_test("test_b")
    leaks.after_test("test_c")  # the same client still alive: no scan, not named again
    assert process.scans == 2  # before and after the collection
    process.clients[2] = "AdminClient at 0x2"
    leaks.after_test("test_d")
    leaks.at_end()
    assert list(leaks.summary()) == [
        "test_b: left Producer at 0x1 alive (still alive at the end)",
        "test_d: left AdminClient at 0x2 alive (still alive at the end)",
    ]


def test_a_client_freed_later_is_reported_so() -> None:
    process = FakeProcess()
    leaks = process.leaks()
    process.clients[1] = "Consumer at 0x1"
    leaks.after_test("test_a")
    del process.clients[1]  # a module's fixture let it go, say
    leaks.after_test("test_b")
    leaks.at_end()
    assert list(leaks.summary()) == ["test_a: left Consumer at 0x1 alive (freed later)"]


def test_a_client_only_a_reference_cycle_keeps_is_collected_and_reported_so() -> None:
    process = FakeProcess()
    leaks = process.leaks()
    process.clients[1] = "Producer at 0x1"
    process.collected.append(1)
    leaks.after_test("test_a")
    assert process.clients == {}
    leaks.after_test("test_b")  # nothing alive any more: not looked at again
    assert process.scans == 2
    leaks.at_end()
    assert list(leaks.summary()) == [
        "test_a: left Producer at 0x1 alive "
        "(held only by a reference cycle: freed by a garbage collection)"
    ]


def test_the_same_address_reused_by_a_new_client_is_a_new_leak() -> None:
    process = FakeProcess()
    leaks = process.leaks()
    process.clients[1] = "Producer at 0x1"
    leaks.after_test("test_a")
    del process.clients[1]
    leaks.after_test("test_b")
    process.clients[1] = "Producer at 0x1"
    leaks.after_test("test_c")
    leaks.at_end()
    assert list(leaks.summary()) == [
        "test_a: left Producer at 0x1 alive (freed later)",
        "test_c: left Producer at 0x1 alive (still alive at the end)",
    ]


def test_counts_the_librdkafka_main_threads(tmp_path: Path) -> None:
    for task, name in [("1", "python"), ("2", "rdk:main"), ("3", "rdk:broker1"), ("4", "rdk:main")]:
        (tmp_path / task).mkdir()
        (tmp_path / task / "comm").write_text(name + "\n")
    (tmp_path / "5").mkdir()  # a thread that ended while it was read: no comm any more
    assert rdkafka_handles(tmp_path) == 2
    assert rdkafka_handles(tmp_path / "absent") == 0


SESSION = textwrap.dedent(
    """
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    KEPT = []  # a module global: what keeps a client alive after its test

    def test_keeps_a_producer():
        KEPT.append(Producer({"bootstrap.servers": "127.0.0.1:9"}))

    def test_releases_its_clients():
        p = Producer({"bootstrap.servers": "127.0.0.1:9"})
        c = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
        c.close()

    def test_keeps_only_closed_clients():
        KEPT.append(Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}))
        KEPT[-1].close()
        KEPT.append(Producer({"bootstrap.servers": "127.0.0.1:9"}))
        KEPT[-1].close()

    def test_keeps_an_admin_client_for_a_while():
        KEPT.append(AdminClient({"bootstrap.servers": "127.0.0.1:9"}))

    def test_lets_the_admin_client_go():
        KEPT.pop()

    class Writer:
        def __init__(self):
            self.producer = Producer({"bootstrap.servers": "127.0.0.1:9"})

        def delivered(self, err, msg):
            pass

    def test_leaves_a_writer_in_a_cycle():
        me = {}
        me["me"], me["writer"] = me, Writer()

    def test_leaves_a_record_undelivered():
        # the record's delivery callback holds the writer, which holds the producer, which holds
        # the record: a cycle the collector cannot see (the record is inside librdkafka)
        writer = Writer()
        writer.producer.produce("t", b"v", on_delivery=writer.delivered)
    """
)


def test_a_session_names_the_tests_that_kept_a_real_client(tmp_path: Path) -> None:
    (tmp_path / "test_clients.py").write_text(SESSION)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.kafka_client_leaks",
            "test_clients.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = done.stdout.split("Kafka clients left alive by tests", 1)[1].splitlines()[1:5]
    assert report[0].startswith("test_clients.py::test_keeps_a_producer: left Producer at 0x")
    assert report[0].endswith("alive (still alive at the end)")
    assert report[1].startswith(
        "test_clients.py::test_keeps_an_admin_client_for_a_while: left AdminClient at 0x"
    )
    assert report[1].endswith("alive (freed later)")
    assert report[2].startswith("test_clients.py::test_leaves_a_writer_in_a_cycle: left Producer")
    assert report[2].endswith("(held only by a reference cycle: freed by a garbage collection)")
    assert report[3].startswith("test_clients.py::test_leaves_a_record_undelivered: left Producer")
    assert report[3].endswith("alive (still alive at the end)")
    assert "test_releases_its_clients" not in done.stdout
    assert "test_keeps_only_closed_clients" not in done.stdout
