"""Process lifecycle: `tidalmq broker`'s SIGTERM stop is bounded by --stop-deadline-s.

Real processes: the broker, Kafka clients, an S3 server of the test's own, frozen with SIGSTOP
so that every flush and checkpoint write hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker_process import BrokerProcess
from tests.support.s3_server import start_s3_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(300)


class BackgroundProducer:
    """Produces to every partition of `topic` until stopped, counting acknowledgements."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.acked = 0
        self._stop = threading.Event()
        self._config = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 30000,
            "log_level": 0,
        }
        self._topic, self._partitions = topic, partitions
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _done(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked += 1

    def _run(self) -> None:
        producer = Producer(self._config)
        i = 0
        while not self._stop.is_set():
            try:
                producer.produce(
                    self._topic, b"x" * 200, partition=i % self._partitions, on_delivery=self._done
                )
                i += 1
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.flush(1)

    def wait_acked(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked < count:
            assert time.monotonic() < deadline, f"only {self.acked} records acknowledged"
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def frozen() -> Iterator[list[int]]:
    """Pids a test stopped with SIGSTOP: woken and killed at the end, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def freeze(pid: int, frozen: list[int]) -> None:
    frozen.append(pid)
    os.kill(pid, signal.SIGSTOP)


def test_broker_sigterm_stop_is_bounded_by_its_deadline_when_the_store_hangs(
    tmp_path: Path, frozen: list[int]
) -> None:
    """`tidalmq broker`: SIGTERM while the object store answers nothing (frozen S3 server, so
    every flush and checkpoint write hangs): it exits --stop-deadline-s after the signal."""
    store = start_s3_server("moto")  # its own: it gets frozen
    deadline_s = 3.0
    broker = BrokerProcess(
        store.url("bounded"),
        tmp_path,
        env={**store.env(), "TIDALMQ_STOP_DEADLINE_S": str(deadline_s)},
    )
    try:
        broker.start()
        create_topic(broker.bootstrap, "t", 4)
        producer = BackgroundProducer(broker.bootstrap, "t", 4)
        try:
            producer.wait_acked(200)
            assert store.process is not None
            freeze(store.process.pid, frozen)
            time.sleep(0.5)  # appends now wait for a PUT that never returns
            assert broker.proc is not None
            signalled = time.monotonic()
            broker.proc.send_signal(signal.SIGTERM)
            try:
                code = broker.proc.wait(deadline_s + 15)
            except subprocess.TimeoutExpired:
                pytest.fail(f"broker still running {deadline_s + 15:g}s after SIGTERM")
            took = time.monotonic() - signalled
        finally:
            producer.stop()
        print(f"broker exited {took:.2f}s after SIGTERM (deadline {deadline_s:g}s)")
        assert took < deadline_s + 1.5
        assert code == 1  # stopped by the deadline, not cleanly
        assert (
            f"broker 0 not stopped {deadline_s:g}s after SIGTERM: exiting now" in broker.tail_log()
        )
    finally:
        broker.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(store.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
        store.stop()
