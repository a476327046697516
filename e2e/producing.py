"""Producing to a TidalMQ release and reading everything back: the check every end-to-end test of
a change under load ends with (nothing acknowledged lost, nothing read twice, order kept).

`RateProducer` is an idempotent producer (acks=all, retrying for minutes) writing numbered
records at a fixed rate; it remembers each acknowledgement's partition and offset. `verify` /
`verify_all` then read the topics from the start with a fresh consumer group and check each
acknowledged record is there once, at its acknowledged offset, in order within its partition.

`RecordLoad` is load and nothing more: records of one value at fixed rates, to chosen
partitions or the partitioner's, counting acknowledgements. Both are a `PacedProducer`, the one
fixed-rate producer thread of the end-to-end tests (and of bench/restart_timeouts.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Self

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from e2e.kube import logs_dir

# Records of ServingProbe (test_tidalmq_on_kubernetes.py) carry this key: not the RateProducer's,
# the read-back leaves them out.
PROBE_KEY = b"probe"


# librdkafka's debug contexts for the e2e producers (e.g. "broker,topic,msg,metadata"), off unless
# set: each producer's log goes to <build cache>/logs/e2e-clients/<client.id>.log (timestamps of
# this process, as delivered by poll)
CLIENT_DEBUG_ENV = "TIDALMQ_E2E_CLIENT_DEBUG"


def client_debug(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """`config` with librdkafka's debug log to a file when CLIENT_DEBUG_ENV is set."""
    contexts = os.environ.get(CLIENT_DEBUG_ENV)
    if not contexts:
        return dict(config)
    client_id = f"{name}-{uuid.uuid4().hex[:6]}"
    path = logs_dir() / "e2e-clients" / f"{client_id}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(f"e2e.client.{client_id}")
    logger.propagate = False
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    def error(err: Any) -> None:  # the client's error events (all brokers down, ...)
        logger.error("ERROR EVENT %s", err)

    return {
        **config,
        "client.id": client_id,
        "debug": contexts,
        "logger": logger,
        "error_cb": error,
    }


class PacedProducer:
    """A confluent-kafka producer fed from its own thread on a fixed schedule until stopped:
    `_send` once every `interval` seconds, a late step followed at once by the next (the
    schedule is kept, not restarted). `_send` returns False when the producer's queue was full
    and the step is to be tried again at once (the schedule does not advance). Subclasses say
    what a step sends and how they stop."""

    def __init__(self, config: Mapping[str, Any], interval: float) -> None:
        self.producer = Producer(client_debug(config, type(self).__name__))
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _send(self) -> bool:
        raise NotImplementedError

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            if not self._send():
                continue
            self.producer.poll(0)
            next_at += self.interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def start(self) -> Self:
        self._thread.start()
        return self


class RateProducer(PacedProducer):
    """An idempotent producer at a fixed rate; remembers (produced, acked, partition, offset)."""

    def __init__(self, servers: str, topic: str, rate: int = 400) -> None:
        super().__init__(
            {
                "bootstrap.servers": servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 300000,
                "retry.backoff.ms": 50,
                "topic.metadata.refresh.interval.ms": 2000,
                # brokers advertise pod IPs here (broker.advertise=podIP): a drained node replaces
                # every broker at once, and only the bootstrap Service's IP is still valid; go back
                # to it after 20 s without a broker instead of librdkafka's 5 minutes (the chart's
                # README says the same to users)
                "metadata.recovery.rebootstrap.trigger.ms": 20000,
            },
            1.0 / rate,
        )
        self.topic = topic
        self.rate = rate
        self.records: list[tuple[float, float, int, int, int]] = []
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()

    def _send(self) -> bool:
        seq = self.sent
        produced = time.time()

        def done(err: Any, msg: Any, seq: int = seq, produced: float = produced) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                with self._lock:
                    self.records.append((produced, time.time(), msg.partition(), msg.offset(), seq))

        try:
            self.producer.produce(
                self.topic, key=b"k%d" % (seq % 101), value=b"%d" % seq, on_delivery=done
            )
        except BufferError:
            self.producer.poll(0.05)
            return False
        self.sent += 1
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        remaining = self.producer.flush(300)
        if remaining:  # their delivery callbacks hold this object and with it the producer
            self.producer.purge()  # (a cycle the collector cannot see): released by the purge
            self.producer.flush(1)
        assert remaining == 0, f"{remaining} records never delivered"

    def abandon(self) -> None:
        """Stops producing without waiting for deliveries (the test failed already)."""
        self._stop.set()
        self._thread.join(10)
        self.producer.purge()
        self.producer.flush(1)

    def worst_wait_by_partition(self, start: float, end: float) -> dict[int, float]:
        out: dict[int, float] = {}
        with self._lock:
            for produced, acked, partition, _, _ in self.records:
                if start <= produced <= end:
                    out[partition] = max(out.get(partition, 0.0), acked - produced)
        return out

    def worst_wait(self) -> float:
        """The longest any record waited for its acknowledgement (seconds)."""
        with self._lock:
            return max((acked - produced for produced, acked, *_ in self.records), default=0.0)


class RecordLoad(PacedProducer):
    """Records of one value at fixed rates until stopped, ten steps a second: each step,
    `per_step[p]` records to partition p (None: where the partitioner puts them). Counts the
    acknowledgements and keeps the errors; a record the producer's full queue refuses is not
    sent again. Started by start() or as a context manager; stop() may be called again."""

    STEP_S = 0.1

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        value: bytes,
        per_step: Mapping[int | None, int],
    ) -> None:
        super().__init__(config, self.STEP_S)
        self.topic = topic
        self.value = value
        self.per_step = dict(per_step)
        self.errors: list[str] = []
        self.acked = 0

    def _done(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(str(err))

    def _send(self) -> bool:
        for partition, count in self.per_step.items():
            for _ in range(count):
                try:
                    if partition is None:
                        self.producer.produce(self.topic, self.value, on_delivery=self._done)
                    else:
                        self.producer.produce(
                            self.topic, self.value, partition=partition, on_delivery=self._done
                        )
                except BufferError:
                    self.producer.poll(0.05)
        return True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(30)
        self.producer.flush(60)


def verify(servers: str, topic: str, producer: RateProducer) -> None:
    """Every record `producer` had acknowledged is in `topic` once, at its offset, in order."""
    verify_all(servers, {topic: producer})


def verify_all(servers: str, producers: Mapping[str, RateProducer]) -> int:
    """`verify` for several topics (each written by its own stopped producer) with one consumer
    (`read_to_end`); returns how many records were read."""
    for topic, producer in producers.items():
        assert not producer.errors, (topic, producer.errors[:5])
        assert len(producer.records) == producer.sent, (topic, len(producer.records), producer.sent)
    got = read_to_end(servers, dict.fromkeys(producers))
    for topic, producer in producers.items():
        check_read_back(topic, producer, got[topic])
    return sum(len(rows) for parts in got.values() for rows in parts.values())


def read_to_end(
    servers: str, partitions: Mapping[str, Sequence[int] | None], timeout_s: float = 300
) -> dict[str, dict[int, list[tuple[int, int]]]]:
    """Reads the given partitions of each topic (None: all of them) from their first offset up
    to the high watermark each had when reading began: topic -> partition -> [(offset, value)]
    in offset order, values read as integers (the RateProducer's records; ServingProbe's are
    left out).

    By assignment, not in a consumer group: a group's rebalance while it reads (its coordinator
    moving after a fleet change) would restart partitions from the first offset, having
    committed nothing, and deliver again records the log holds once. A record delivered twice at
    the same offset is kept once; the same record at two offsets is a duplicate in the log, for
    `check_read_back` to find."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"verify-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: dict[tuple[str, int], dict[int, int]] = {}
    try:
        ends = high_watermarks(consumer, partitions)
        behind = {tp for tp, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in behind])
        deadline = time.monotonic() + timeout_s
        while behind and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                if msg.error():
                    raise KafkaException(msg.error())
                tp, offset = (msg.topic(), msg.partition()), msg.offset()
                if offset + 1 >= ends[tp]:
                    behind.discard(tp)
                if msg.key() != PROBE_KEY:
                    got.setdefault(tp, {})[offset] = int(msg.value())
        assert not behind, f"not read to their end within {timeout_s:.0f} s: {sorted(behind)[:10]}"
    finally:
        consumer.close()
    out: dict[str, dict[int, list[tuple[int, int]]]] = {t: {} for t in partitions}
    for (topic, partition), rows in got.items():
        out[topic][partition] = sorted(rows.items())
    return out


def high_watermarks(
    consumer: Consumer, partitions: Mapping[str, Sequence[int] | None]
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> high watermark of the given partitions (None: every partition of
    the topic), each asked until a leader answers, for up to 120 s: partitions may still be
    moving after a fleet change."""
    out: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + 120
    for topic, chosen in partitions.items():
        if chosen is None:
            chosen = list(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        for partition in chosen:
            while True:
                try:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=10
                    )
                    out[(topic, partition)] = high
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
    return out


def check_read_back(
    topic: str, producer: RateProducer, got: Mapping[int, list[tuple[int, int]]]
) -> None:
    """`got` (partition -> (offset, value) as read) against what `producer` had acknowledged."""
    values = [v for part in got.values() for _, v in part]
    if len(values) != len(set(values)):
        where: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for partition, rows in got.items():
            for offset, value in rows:
                where[value].append((partition, offset))
        twice = {v: at for v, at in where.items() if len(at) > 1}
        raise AssertionError(
            f"{topic}: {len(twice)} records are in the log twice, record -> (partition, offset): "
            f"{dict(sorted(twice.items())[:10])}"
        )
    lost = producer.sent - len(values)
    assert len(values) == producer.sent, (
        f"{topic}: read {len(values)}, {producer.sent} were acknowledged ({lost} missing)"
    )
    by_offset = {p: dict(rows) for p, rows in got.items()}
    in_partition = {p: {v for _, v in rows} for p, rows in got.items()}
    for _, _, partition, offset, seq in producer.records:
        if offset is None or offset < 0:
            # librdkafka acknowledges a retried batch without an offset when a later batch of the
            # same producer was acknowledged first (it infers the retry was persisted): such a
            # record must still be in its partition
            assert seq in in_partition.get(partition, set()), (topic, partition, seq, "missing")
        else:
            assert by_offset.get(partition, {}).get(offset) == seq, (topic, partition, offset, seq)
    for rows in got.values():
        seqs = [v for _, v in sorted(rows)]
        assert seqs == sorted(seqs), f"{topic}: out of order within a partition"
