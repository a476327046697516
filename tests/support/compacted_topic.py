"""A compacted topic end to end, as a scenario run against any bootstrap address (TidalMQ in
tests/integration/broker/test_compacted_topics.py, Apache Kafka in
tests/integration/apache_kafka/test_compacted_topics.py): a topic created with
cleanup.policy=compact through a real AdminClient, many updates per key from a real producer,
tombstones, and a real consumer from the start that sees exactly the latest value per key at
the offset it was written, the tombstones until delete.retention.ms and, after the next clean,
not.

The assertions are on the outcome, never on when the cleaner runs: both brokers clean only
segments that are no longer active, so the scenario ends with one record on a key of its own
written more than segment.ms after the tombstones. Kafka rolls a segment only on an append whose
timestamp is segment.ms past the segment's first one (TidalMQ's segment.ms also closes an idle
segment); without that record the tombstones would stay in Kafka's active segment, uncleaned.
A key's record in the active segment does not supersede its older ones on Kafka either, so that
record's key is used once."""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.topic_config_validation import describe_topic_configs
from tests.support.waiting import wait_for

KEYS = 20
UPDATES = 30
ALL_KEYS = [b"key-%d" % k for k in range(KEYS)]
DELETED = {b"key-3", b"key-7"}
SEGMENT_MS = 500
DELETE_RETENTION_MS = 3000
# how long a clean may take to show, tried every half second (each try reads the whole topic)
CLEAN_WITHIN_S = 25
CLEAN_POLL_S = 0.5

TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    # the last segment leaves the active part after half a second (on Kafka: with the next
    # append after that)
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    # long enough for the reader to see the tombstones kept between the clean and the horizon
    "delete.retention.ms": str(DELETE_RETENTION_MS),
}

# several 4 KiB segments, so a clean works on groups of closed segments: Kafka 4.x refuses
# segment.bytes under 1 MiB, and its internal, test-only internal.segment.bytes (which TidalMQ
# takes too, docs/topic-configs.md) sets any size
SMALL_SEGMENTS = {"internal.segment.bytes": "4096"}

Row = tuple[int, bytes, bytes | None]


def produce(
    bootstrap: str,
    topic: str,
    updates: range,
    keys: list[bytes],
    tombstones: set[bytes],
    timestamp_ms: int = 0,
) -> list[Row]:
    """Every record written (offset, key, value): rounds `updates` over `keys`, a tombstone for
    each of `tombstones`, then, segment.ms later, one record that rolls the segment. The
    updates carry `timestamp_ms` as their CreateTime (0: the producer's clock)."""
    written: list[Row] = []
    failed: list[str] = []

    def done(err: object, msg: object) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            written.append((msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for round_ in updates:
        for key in keys:
            value = b"v%d-%s" % (round_, b"x" * 40)
            producer.produce(topic, key=key, value=value, on_delivery=done, timestamp=timestamp_ms)
        producer.flush(10)  # one round per few batches: many batches, many segments
    for key in sorted(tombstones):
        producer.produce(topic, key=key, value=None, on_delivery=done)
    assert producer.flush(10) == 0 and not failed, failed
    # Kafka's roll rule is the time between the segment's first record and an append: this
    # wait is that rule's condition, not a guess at the cleaner's timing. The record's key is
    # one of its own: a key's record in Kafka's active segment does not supersede older ones
    time.sleep(SEGMENT_MS / 1000 + 0.2)
    roll_key = b"roll-%d" % updates.start
    producer.produce(topic, key=roll_key, value=b"rolled", on_delivery=done)
    assert producer.flush(10) == 0 and not failed, failed
    return sorted(written)


def read_all(bootstrap: str, topic: str, end: int) -> list[Row]:
    """Every record from the start up to `end`, by a consumer that commits nothing."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        rows: list[Row] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            offset, key = msg.offset(), msg.key()
            assert offset is not None
            error = msg.error()
            if error is not None:
                if error.code() == -191:  # _PARTITION_EOF
                    if offset >= end:  # the high watermark: all read
                        return rows
                    continue
                raise KafkaException(error)
            assert key is not None  # a compacted topic takes keyed records only
            rows.append((offset, key, msg.value()))
        raise AssertionError(f"did not reach offset {end}: {rows[-3:]}")
    finally:
        consumer.close()


def latest(written: list[Row], *, tombstones: bool) -> list[Row]:
    last = {key: offset for offset, key, _ in written}
    return [row for row in written if last[row[1]] == row[0] and (row[2] is not None or tombstones)]


def create_compacted_topic(bootstrap: str, topic: str, configs: Mapping[str, str]) -> None:
    """Create the topic and check the broker reports the compaction configs it was given."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=dict(configs))])[topic].result(15)
    described = describe_topic_configs(admin, topic)
    assert described["cleanup.policy"].value == configs["cleanup.policy"]
    assert described["min.cleanable.dirty.ratio"].value == configs["min.cleanable.dirty.ratio"]
    assert described["max.compaction.lag.ms"].value == str(2**63 - 1)
    assert described["max.compaction.lag.ms"].is_default


def latest_value_per_key(
    bootstrap: str, topic: str, *, drops_tombstones_without_new_data: bool
) -> tuple[int, list[Row]]:
    """Write the updates and tombstones, wait for the cleaner: a consumer from the start reads
    the latest record per key at the offset it was written, the tombstones too. Once
    delete.retention.ms has passed since that clean, updates of the other keys make the cleaner run again
    and the tombstones are gone. Returns the end offset and the last read.

    Kafka cleans a log only when its dirty part (closed segments written since the last clean)
    is at least min.cleanable.dirty.ratio of it: a tombstone past its delete horizon stays until
    new data comes. TidalMQ's cleaner also drops it with no new data in the partition
    (`drops_tombstones_without_new_data`, checked before the new updates)."""
    written = produce(bootstrap, topic, range(UPDATES), ALL_KEYS, DELETED)
    end = written[-1][0] + 1
    assert len(written) == KEYS * UPDATES + len(DELETED) + 1 == end
    seen: list[list[Row]] = []

    def reads(expected: list[Row]) -> bool:
        seen.append(read_all(bootstrap, topic, end))
        return seen[-1] == expected

    wait_for(
        "the cleaner",
        lambda: reads(latest(written, tombstones=True)),
        timeout_s=CLEAN_WITHIN_S,
        poll_s=CLEAN_POLL_S,
    )
    kept = time.monotonic()
    if drops_tombstones_without_new_data:
        wait_for(
            "the tombstones' delete horizon",
            lambda: reads(latest(written, tombstones=False)),
            timeout_s=CLEAN_WITHIN_S,
            poll_s=CLEAN_POLL_S,
        )
    # the tombstones' horizon is delete.retention.ms after the clean that first kept them,
    # which was before they were read
    time.sleep(max(0.0, kept + DELETE_RETENTION_MS / 1000 - time.monotonic()))
    live = [key for key in ALL_KEYS if key not in DELETED]
    written += produce(bootstrap, topic, range(UPDATES, UPDATES + 1), live, set())
    end = written[-1][0] + 1
    wait_for(
        "a clean past the delete horizon",
        lambda: reads(latest(written, tombstones=False)),
        timeout_s=CLEAN_WITHIN_S,
        poll_s=CLEAN_POLL_S,
    )
    assert not {key for _, key, _ in seen[-1]} & DELETED
    return end, seen[-1]


def an_update_after_the_clean_is_the_latest(
    bootstrap: str, topic: str, end: int, cleaned: list[Row]
) -> None:
    """An update written after the clean lands at the end offset, after the cleaned log (less
    the key's older record if a clean already ran since: TidalMQ's cleaner may, once its segment
    is idle for segment.ms; Kafka's waits for the next roll)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b"key-0", value=b"after")
    assert producer.flush(10) == 0
    rows = read_all(bootstrap, topic, end + 1)
    assert rows[-1] == (end, b"key-0", b"after")
    assert rows[:-1] in (cleaned, [row for row in cleaned if row[1] != b"key-0"])


# compact,delete: retention.ms outlasts the test, the old updates are an hour older than that
RETENTION_MS = 60_000
COMPACT_DELETE_CONFIGS = {
    **TOPIC_CONFIGS,
    "cleanup.policy": "compact,delete",
    "retention.ms": str(RETENTION_MS),
}
RECENT_KEYS = ALL_KEYS[: KEYS // 2]


def log_start(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        consumer.close()


def compact_and_delete(bootstrap: str, topic: str) -> None:
    """cleanup.policy=compact,delete: updates of every key timestamped an hour past retention.ms,
    then updates of half the keys now. Retention deletes whole segments from the start while
    their newest record is past retention.ms, the cleaner compacts the rest: the log start moves
    past 0 but not past the first recent record, and a consumer from the start reads the latest
    record of each key at or above the log start, at its offset.

    How far the log start moves is the brokers' segment layout: Kafka's segment rolls at the
    first recent record (its timestamp is segment.ms past the segment's first), so every old
    record goes; TidalMQ's segments are cut by size and may put the last old records in the
    segment of the first recent one, which then stays, compacted."""
    old = int(time.time() * 1000) - 3_600_000 - RETENTION_MS
    written = produce(bootstrap, topic, range(UPDATES // 2), ALL_KEYS, set(), timestamp_ms=old)
    recent = produce(bootstrap, topic, range(UPDATES // 2, UPDATES), RECENT_KEYS, set())
    # the first record with a recent timestamp is the one that rolled the old updates' segment
    first_recent, end = written[-1][0], recent[-1][0] + 1
    written += recent
    seen: list[tuple[int, list[Row]]] = []

    def cleaned() -> bool:
        start, rows = log_start(bootstrap, topic), read_all(bootstrap, topic, end)
        seen.append((start, rows))
        kept = [row for row in latest(written, tombstones=False) if row[0] >= start]
        return 0 < start <= first_recent and rows == kept

    try:
        wait_for(
            "retention and the cleaner", cleaned, timeout_s=CLEAN_WITHIN_S, poll_s=CLEAN_POLL_S
        )
    except AssertionError:
        start, rows = seen[-1]
        raise AssertionError(f"log start {start} (0 < it <= {first_recent}): {rows}") from None
    # every recent key's latest update is there, whatever the layout
    assert {*RECENT_KEYS, b"roll-%d" % (UPDATES // 2)} <= {key for _, key, _ in seen[-1][1]}
