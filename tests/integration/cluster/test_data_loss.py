"""[O2] item 3 on a real local cluster: a lost object store is detected, never served as empty.

The issue's scenario: 3,000 acknowledged records from an idempotent producer, a clean stop, the
store's partition data and WAL deleted (the metadata kept, in the data dir), a restart: no
partition serves from 0, Produce and Fetch answer KAFKA_STORAGE_ERROR, `local status` lists the
lost partitions, and `tidalmq recover --accept-data-loss` continues them after the old end.
Also: the whole store wiped under a running cluster, and a wrong --storage-url on an existing
data dir: both stop serving (KAFKA_STORAGE_ERROR, /readyz 503, tidalmq_store_lost 1), and
nothing is created at offset 0."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic
from kio.schema.errors import ErrorCode
from tidalmq_broker.admin_client import AdminClient

from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300, func_only=True)]

TOPIC = "orders"
PARTITIONS = 3
ENV = {"TIDALMQ_IDENTITY_CHECK_INTERVAL_MS": "300"}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "cluster"


@pytest.fixture
def started(data_dir: Path) -> Iterator[Callable[..., LocalClusterProcess]]:
    """Start (and at the end stop) local clusters on `data_dir`."""
    running: list[LocalClusterProcess] = []

    def start(storage_url: str = "") -> LocalClusterProcess:
        c = LocalClusterProcess(data_dir, brokers=2, storage_url=storage_url, env=ENV)
        if c.log_path.exists():  # the start waits for the addresses this run prints
            c.log_path.rename(c.log_path.with_suffix(f".{len(running)}.log"))
        running.append(c)
        c.start()
        return c

    yield start
    for c in running:
        c.stop()


def create_topic(bootstrap: str) -> None:
    admin = KafkaAdmin({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)


def produce_acknowledged(bootstrap: str, count: int) -> dict[int, list[int]]:
    """`count` records with an idempotent producer; the acknowledged offsets per partition."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    acked: dict[int, list[int]] = {}
    errors: list[str] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.setdefault(msg.partition(), []).append(msg.offset())

    for i in range(count):
        producer.produce(
            TOPIC, key=b"k%d" % i, value=b"v%d" % i, partition=i % PARTITIONS, on_delivery=done
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert sum(len(v) for v in acked.values()) == count
    return acked


def produce_once(bootstrap: str, partition: int) -> tuple[KafkaError | None, int]:
    """One record, no retries: the broker's own answer (error, offset)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": False,
            "retries": 0,
            "acks": "all",
            "message.timeout.ms": 15000,
        }
    )
    out: list[tuple[KafkaError | None, int]] = []
    producer.produce(
        TOPIC,
        value=b"after",
        partition=partition,
        on_delivery=lambda err, msg: out.append((err, msg.offset())),
    )
    producer.flush(30)
    assert out, "no delivery report"
    return out[0]


def leader_address(cluster: LocalClusterProcess, partition: int) -> str:
    meta = cluster.metadata()
    leader = meta["topics"][TOPIC]["partitions"][partition]["leader"]
    broker = meta["brokers"][str(leader)]
    return f"{broker['host']}:{broker['port']}"


def fetch_error(cluster: LocalClusterProcess, partition: int, offset: int = 0) -> int:
    """Fetch at the protocol level from the partition's leader: its error code."""
    with AdminClient(leader_address(cluster, partition)) as client:
        resp = client.call(
            1,
            4,
            {
                "replica_id": -1,
                "max_wait": 100,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {
                                "partition": partition,
                                "fetch_offset": offset,
                                "partition_max_bytes": 1 << 20,
                            }
                        ],
                    }
                ],
            },
        )
    return int(resp.responses[0].partitions[0].error_code)


def list_offsets_error(cluster: LocalClusterProcess, partition: int) -> int:
    with AdminClient(leader_address(cluster, partition)) as client:
        resp = client.call(
            2,
            1,
            {
                "replica_id": -1,
                "topics": [
                    {"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}
                ],
            },
        )
    return int(resp.topics[0].partitions[0].error_code)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidalmq_broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def eventually(check: Callable[[], Any], timeout_s: float = 15.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s}s: {what} (last: {last!r})")


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(port: int, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return [line for line in resp.read().decode().splitlines() if line.startswith(name)]


def storage_error(err: KafkaError | None) -> bool:
    return err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR


def assert_store_lost(cluster: LocalClusterProcess, problem: str) -> None:
    """Every broker stops serving: KAFKA_STORAGE_ERROR, /readyz 503 with the reason, metric 1."""
    eventually(
        lambda: storage_error(produce_once(cluster.bootstrap, 0)[0]),
        20,
        "produce answers KAFKA_STORAGE_ERROR",
    )
    # each broker checks the marker on its own: partition 1's leader may be a moment later
    eventually(
        lambda: fetch_error(cluster, 1) == ErrorCode.kafka_storage_error,
        10,
        "fetch answers KAFKA_STORAGE_ERROR",
    )
    for row in cluster.status()["brokers"]:
        port = row["http_port"]
        _status, body = eventually(lambda p=port: (s := readyz(p))[0] == 503 and s, 10, "readyz")
        assert problem in body
        assert any(line.endswith(" 1.0") for line in metric(port, "tidalmq_store_lost{")), port
    # the controller checks the marker on its own interval too
    eventually(
        lambda: problem in (cluster.status()["store_problem"] or ""),
        30,
        "local status shows the store problem",
    )


def test_deleted_partition_data_is_lost_until_accepted_and_continues_after_the_old_end(
    started: Callable[..., LocalClusterProcess], data_dir: Path
) -> None:
    cluster = started()
    create_topic(cluster.bootstrap)
    acked = produce_acknowledged(cluster.bootstrap, 3000)
    ends = {p: max(offsets) + 1 for p, offsets in acked.items()}
    assert sum(ends.values()) == 3000
    time.sleep(2.5)  # the brokers' heartbeats carry the last high watermarks
    cluster.stop()

    objects = data_dir / "objects"
    assert (objects / "cluster" / "identity").exists()
    assert (data_dir / "metadata").is_dir()  # the metadata is kept apart from the store
    shutil.rmtree(objects / "partitions")
    shutil.rmtree(objects / "wal")

    cluster = started()
    # no partition serves from 0: writes and reads fail with the storage error
    for p in range(PARTITIONS):
        err, _ = eventually(
            lambda p=p: (r := produce_once(cluster.bootstrap, p))[0] and r, 20, "produce fails"
        )
        assert storage_error(err), err
        assert fetch_error(cluster, p) == ErrorCode.kafka_storage_error
        assert list_offsets_error(cluster, p) == ErrorCode.kafka_storage_error
    assert not list((objects / "partitions").glob(f"{TOPIC}/*/*/checkpoint"))

    def lost_rows() -> dict[int, dict[str, Any]]:
        status = json.loads(
            cli("local", "status", "--data-dir", str(data_dir), "--output", "json").stdout
        )
        return {r["partition"]: r for r in status["lost"] if r["topic"] == TOPIC}

    # a broker refuses the partition at once; its report reaches the controller a moment later
    lost = eventually(
        lambda: (rows := lost_rows()) and sorted(rows) == list(range(PARTITIONS)) and rows,
        20,
        "every partition reported lost",
    )
    assert sorted(lost) == list(range(PARTITIONS))
    for p, row in lost.items():
        assert (row["expected_end"], row["found_end"]) == (ends[p], 0)
        assert row["missing_offsets"] == ends[p] and row["reason"] == "checkpoint missing"
    table = cli("local", "status", "--data-dir", str(data_dir)).stdout
    assert "LOST PARTITIONS" in table and f"{TOPIC}-0" in table
    dry = cli("recover", "--data-dir", str(data_dir))
    assert dry.returncode == 0 and f"{TOPIC}-1" in dry.stdout and "dry run" in dry.stdout

    done = cli("recover", "--accept-data-loss", TOPIC, "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    for p in range(PARTITIONS):
        assert (
            f"recovered {TOPIC}-{p}: continues at offset {ends[p]}; {ends[p]} offsets given up"
            in done.stdout
        )
    again = cli("recover", "--accept-data-loss", TOPIC, "--data-dir", str(data_dir))
    assert again.returncode == 1 and "nothing to recover" in again.stderr

    # serving again, after the old end: no offset is reused
    for p in range(PARTITIONS):
        err, offset = eventually(
            lambda p=p: (r := produce_once(cluster.bootstrap, p))[0] is None and r,
            30,
            "produce succeeds after the accept",
        )
        assert offset == ends[p]
    new = produce_acknowledged(cluster.bootstrap, 30)
    assert all(min(offsets) > ends[p] for p, offsets in new.items())
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "dl-check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaTP(TOPIC, p, ends[p]) for p in range(PARTITIONS)])
    got: Counter[int] = Counter()
    deadline = time.monotonic() + 30
    while sum(got.values()) < PARTITIONS + 30 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            assert msg.offset() >= ends[msg.partition()]
            got[msg.partition()] += 1
    consumer.close()
    assert sum(got.values()) == PARTITIONS + 30
    assert cluster.status()["lost"] == [] or all(
        r["topic"] != TOPIC for r in cluster.status()["lost"]
    )
    log = cluster.log_path.read_text(errors="replace")
    assert "DATA LOST" in log and "data loss accepted" in log


def test_a_store_wiped_under_a_running_cluster_stops_serving(
    started: Callable[..., LocalClusterProcess], data_dir: Path
) -> None:
    cluster = started()
    create_topic(cluster.bootstrap)
    produce_acknowledged(cluster.bootstrap, 300)
    objects = data_dir / "objects"
    for name in ("partitions", "wal", "cluster"):
        shutil.rmtree(objects / name, ignore_errors=True)
    assert_store_lost(cluster, "store identity marker missing")
    assert not (objects / "partitions").exists() or not list(
        (objects / "partitions").rglob("checkpoint")
    )


def test_a_wrong_storage_url_on_an_existing_data_dir_serves_nothing(
    started: Callable[..., LocalClusterProcess], data_dir: Path, tmp_path: Path
) -> None:
    cluster = started()
    create_topic(cluster.bootstrap)
    produce_acknowledged(cluster.bootstrap, 300)
    time.sleep(1.5)
    cluster.stop()

    empty = tmp_path / "empty-store"
    empty.mkdir()
    cluster = started(storage_url=f"file://{empty}")
    assert_store_lost(cluster, "store identity marker missing")
    assert not (empty / "partitions").exists(), "a partition was created in the wrong store"
    assert not (empty / "cluster").exists(), "the controller wrote into the wrong store"
