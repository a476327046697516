"""A confluent_kafka producer fed from a daemon thread until stopped, and the fixture helper
that abandons one a failed test left running (instead of letting it produce to a stopped
cluster for the rest of the session). Subclasses set `producer`, `_stop`, `_thread` (running
their `_run`) and `flush_s`, how long `stop` waits for the last deliveries."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Self, TypeVar

from confluent_kafka import Producer


class ProducerThread:
    producer: Producer
    flush_s: float
    _stop: threading.Event
    _thread: threading.Thread

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops producing and asserts every record sent was delivered."""
        self._stop.set()
        self._thread.join(30)
        remaining = self.producer.flush(self.flush_s)
        if remaining:  # their delivery callbacks hold this object and with it the producer
            self.producer.purge()  # (a cycle the collector cannot see): released by the purge
            self.producer.flush(1)
        assert remaining == 0, f"{remaining} records never delivered"

    def abandon(self) -> None:
        """Stops producing without waiting for deliveries (the test failed already)."""
        self._stop.set()
        self._thread.join(30)
        self.producer.purge()
        self.producer.flush(1)


P = TypeVar("P", bound=ProducerThread)


def started_then_abandoned(make: Callable[[str], P]) -> Iterator[Callable[[str], P]]:
    """A fixture's body: yields a function that starts `make(topic)`; after the test, abandons
    every one started (a stopped one has nothing left to abandon)."""
    started: list[P] = []

    def start(topic: str) -> P:
        started.append(make(topic).start())
        return started[-1]

    yield start
    for producer in started:
        producer.abandon()
