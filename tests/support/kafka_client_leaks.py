"""Names the tests that leave a confluent_kafka client (Producer, Consumer, AdminClient) alive.

A librdkafka client that outlives its test keeps its own threads, reconnecting to brokers that
its test has long stopped: CI once logged `rdkafka#producer-292 ... Connection refused` for three
dead brokers from the middle of the integration run to its end, with no word on which test made
it. After each test this plugin compares the number of librdkafka handles alive in the process
(one `rdk:main` thread each, read from /proc: cheap) with the number already known; only when it
changed does it look for the new clients among the interpreter's objects, before and after a
garbage collection (a client held only by a reference cycle is freed by it, and said to be). The
session's terminal summary names each client found alive after its test, the test that created
it (the test after which it first appeared) and whether it was still alive at the end. It only
reports: whether a client is still referenced depends on the collector's timing, which is not a
reason to fail a test.

Opt-in (`pytest -p tests.support.kafka_client_leaks`): it is not registered in tests/conftest.py,
because a scan that raised once ended a whole CI session with INTERNALERROR. It never raises
now (a client whose probe fails is counted alive; a failed scan is reported, not raised).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# librdkafka names each handle's main thread so (rd_kafka_thread_main); one per client
MAIN_THREAD_NAME = "rdk:main"


def rdkafka_handles(task_dir: Path = Path("/proc/self/task")) -> int:
    """How many librdkafka handles are alive in this process (their `rdk:main` threads)."""
    count = 0
    try:
        tasks = list(task_dir.iterdir())
    except OSError:  # not Linux: nothing to count, nothing reported
        return 0
    for task in tasks:
        try:
            if (task / "comm").read_text().strip() == MAIN_THREAD_NAME:
                count += 1
        except OSError:  # the thread ended meanwhile
            continue
    return count


def live_clients() -> dict[int, str]:
    """The confluent_kafka clients the interpreter holds: id -> a short description."""
    try:
        from confluent_kafka import cimpl
    except ImportError:
        return {}
    kinds: tuple[type, ...] = (cimpl.Producer, cimpl.Consumer, cimpl._AdminClientImpl)
    return {
        id(o): f"{type(o).__name__} at {id(o):#x}"
        for o in gc.get_objects()
        if isinstance(o, kinds) and not _closed(o)
    }


def _closed(client: object) -> bool:
    """A closed client has no librdkafka handle left (nothing runs): not a leak. Its methods
    say so; these two answer locally, without a request."""
    try:
        if hasattr(client, "memberid"):  # a Consumer
            client.memberid()
        elif hasattr(client, "flush") and hasattr(client, "close"):  # a Producer
            client.poll(0)  # serves delivery reports due anyway
    except RuntimeError:
        return True
    except Exception:  # e.g. a fenced transactional producer's fatal error: alive, not closed
        return False
    return False


@dataclass
class Leak:
    client: str
    test: str
    alive_at_end: bool = True
    # held only by a reference cycle: freed by the collection this plugin ran after the test
    # (without it, whenever the collector's next full pass comes: in a long session, minutes)
    cycle: bool = False


@dataclass
class ClientLeaks:
    """Which test left which client alive. `count` and `scan` are the process's handle count and
    its clients, `collect` the garbage collection; tests of this class give their own."""

    count: Callable[[], int] = rdkafka_handles
    scan: Callable[[], dict[int, str]] = live_clients
    collect: Callable[[], object] = gc.collect
    known: dict[int, Leak] = field(default_factory=dict)
    leaks: list[Leak] = field(default_factory=list)

    def after_test(self, nodeid: str) -> None:
        if self.count() == len(self.known):
            return
        before = self.scan()
        self.collect()
        live = self.scan()
        for key, leak in list(self.known.items()):
            if key not in live:
                leak.alive_at_end = False
                del self.known[key]
        for key, client in before.items():
            if key in self.known:
                continue
            leak = Leak(client, nodeid)
            self.leaks.append(leak)
            if key in live:
                self.known[key] = leak
            else:
                leak.alive_at_end, leak.cycle = False, True

    def at_end(self) -> None:
        """Marks the clients freed since the last test (a module's or the session's fixtures)."""
        self.collect()
        live = self.scan()
        for key, leak in self.known.items():
            if key not in live:
                leak.alive_at_end = False

    def summary(self) -> Iterable[str]:
        for leak in self.leaks:
            if leak.cycle:
                until = "held only by a reference cycle: freed by a garbage collection"
            elif leak.alive_at_end:
                until = "still alive at the end"
            else:
                until = "freed later"
            yield f"{leak.test}: left {leak.client} alive ({until})"


_LEAKS_KEY = pytest.StashKey[ClientLeaks]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LEAKS_KEY] = ClientLeaks()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    # after the whole protocol: the test's fixtures are torn down and its arguments released
    result = yield
    leaks = item.config.stash[_LEAKS_KEY]
    try:
        leaks.after_test(item.nodeid)
    except Exception as exc:  # a report must never end the session
        leaks.leaks.append(Leak(f"(scan failed: {exc!r})", item.nodeid, alive_at_end=False))
    return result


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    leaks = config.stash[_LEAKS_KEY]
    if not leaks.leaks:
        return
    try:
        leaks.at_end()
    except Exception as exc:  # the summary is still shown, as of the last test
        terminalreporter.line(f"kafka client leaks: the final scan failed: {exc!r}")
    terminalreporter.section("Kafka clients left alive by tests")
    for line in leaks.summary():
        terminalreporter.line(line)
