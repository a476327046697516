"""Snapshots (tidalmq_core.snapshots) and broker updates (tidalmq_core.updates): an image
written as JSON lines reads back as the same image, in lines of bounded size; a damaged one is
refused; `roll` makes the next snapshot from the previous one and the batches after it. And,
property-style over random sequences of records: snapshot -> decode gives the same image, and
replaying batches a snapshot already covers (fuzzy replay) changes nothing."""

from __future__ import annotations

import copy
import json
import random

import pytest
from tidalmq_core import snapshots, updates
from tidalmq_core.metadata import (
    NO_LEADER,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    PartitionState,
    TopicInfo,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    apply_batch,
    apply_record,
    broker_configs_record,
    broker_record,
    broker_removed_record,
    broker_state_record,
    cluster_record,
    deletion_record,
    epoch_record,
    floors_record,
    marker_record,
    partition_record,
    partitions_added_record,
    producer_ids_record,
    static_topic_record,
    topic_configs_record,
    topic_record,
    topic_removed_record,
)
from tidalmq_core.static_mapping import initial_mapping


def rich_image() -> ClusterMetadata:
    meta = ClusterMetadata(
        cluster_id="cid",
        controller_epoch=7,
        version=42,
        brokers={
            0: BrokerInfo(0, "a", 9092, rack="r1", control_url="http://a:1", incarnation="i0"),
            2: BrokerInfo(2, "b", 9094, state="draining"),
        },
        next_producer_id=3000,
        pending_deletions=[("old", "id-0"), ("older", "id-x")],
        broker_configs={"": {"leader.replication.throttled.rate": "10"}, "2": {"x": "y"}},
        static_topics={"s": initial_mapping("s", 3, [0, 2, 0], brokers=[0, 2], now_ms=5)},
        store_marker=True,
    )
    plain = [
        PartitionState(i % 3, i, [i % 3], created=i % 2 == 0, end_offset_floor=i) for i in range(5)
    ]
    plain[1].leader = NO_LEADER  # compact still: one replica, nothing else set
    moving = PartitionState(
        NO_LEADER, 3, [0], original_replicas=[0], target_replicas=[2], move_started_ms=99
    )
    lost = PartitionState(
        2, 1, [2], created=True, lost=DataLoss(10, 4, 77, 2, "checkpoint missing")
    )
    meta.topics = {
        "t": TopicInfo("t", "id-t", plain, configs={"retention.ms": "5"}),
        "u": TopicInfo("u", "id-u", [moving, lost, PartitionState(0, 0, [0], accepted_from=12)]),
        "__sq.s": TopicInfo(
            "__sq.s", "id-p", [PartitionState(0, 0, [0])], internal=True, kind="physical"
        ),
        "empty": TopicInfo("empty", "id-e", []),
    }
    return meta


def test_a_snapshot_reads_back_as_the_same_image() -> None:
    meta = rich_image()
    data = snapshots.encode_bytes(meta)
    assert snapshots.decode(data) == meta
    assert snapshots.decode(memoryview(data)).to_json() == meta.to_json()


def test_common_partitions_are_short_arrays_and_lines_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshots, "CHUNK", 2)
    meta = rich_image()
    lines = list(snapshots.encode(meta))
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    header = json.loads(lines[0])
    assert header["version"] == 42 and header["topics"] == 4
    rows = [json.loads(line) for line in lines[1:] if b'"rows"' in line]
    t_rows = [r for r in rows if r["n"] == "t"]
    assert [r["from"] for r in t_rows] == [0, 2, 4], "five partitions in lines of two"
    assert t_rows[0]["rows"][0] == [0, 0, 0, 1, 0]  # [replica, leader, epoch, created, floor]
    assert t_rows[0]["rows"][1] == [1, NO_LEADER, 1, 0, 1]
    (u_rows,) = [r for r in rows if r["n"] == "u"][:1]
    assert isinstance(u_rows["rows"][0], dict), "a moving partition is written whole"
    assert snapshots.decode(b"".join(lines)) == meta


def corrupt(data: bytes, line: int, new: bytes | None) -> bytes:
    lines = data.rstrip(b"\n").split(b"\n")
    if new is None:
        del lines[line]
    else:
        lines[line] = new
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize(
    "damage",
    [
        "format",
        "not json",
        "a topic line missing",
        "rows out of order",
        "rows of an unknown topic",
        "header field missing",
        "a topic's last rows missing",
    ],
)
def test_a_damaged_snapshot_is_refused(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "CHUNK", 2)
    data = snapshots.encode_bytes(rich_image())
    lines = data.rstrip(b"\n").split(b"\n")
    header = json.loads(lines[0])
    index: dict[str, int] = {}
    for i, line in enumerate(lines[1:], 1):
        doc = json.loads(line)
        index[doc["topic"] if "topic" in doc else f"{doc['n']}{doc['from']}"] = i
    if damage == "format":
        header["format"] = 99
        bad = corrupt(data, 0, json.dumps(header).encode())
    elif damage == "not json":
        bad = corrupt(data, 3, b"{not json")
    elif damage == "a topic line missing":
        bad = corrupt(data, index["empty"], None)
    elif damage == "rows out of order":
        bad = corrupt(data, index["t2"], None)
    elif damage == "rows of an unknown topic":
        bad = data + b'{"n":"nope","from":0,"rows":[[0,0,0,0,0]]}\n'
    elif damage == "header field missing":
        del header["brokers"]
        bad = corrupt(data, 0, json.dumps(header).encode())
    else:
        bad = corrupt(data, index["t4"], None)  # t's partition 4: the file looks complete
    with pytest.raises(snapshots.SnapshotError):
        snapshots.decode(bad)


def test_roll_applies_only_the_batches_after_the_snapshot() -> None:
    meta = rich_image()
    previous = snapshots.encode_bytes(meta)
    tp = TopicPartition("t", 0)
    batches = [
        (41, [partitions_added_record("t", [9], at=5)]),  # covered by the snapshot: skipped
        (42, [partitions_added_record("t", [9], at=5)]),  # covered by the snapshot: skipped
        (43, [partition_record(tp, leader=2, leader_epoch=8)]),
        (44, [topic_removed_record("empty")]),
    ]
    rolled = snapshots.decode(snapshots.roll(previous, batches))
    expected = copy.deepcopy(meta)
    apply_batch(expected, batches[2][1], 43)
    apply_batch(expected, batches[3][1], 44)
    assert rolled == expected
    assert rolled.version == 44 and len(rolled.topics["t"].partitions) == 5


def test_roll_of_a_new_cluster_starts_from_its_empty_image() -> None:
    empty = ClusterMetadata(cluster_id="")
    data = snapshots.roll(None, [(1, [cluster_record("c"), epoch_record(1)])], empty)
    meta = snapshots.decode(data)
    assert (meta.cluster_id, meta.controller_epoch, meta.version) == ("c", 1, 1)
    with pytest.raises(snapshots.SnapshotError):
        snapshots.roll(None, [])


def test_an_update_carries_a_snapshot_and_batches_as_they_are() -> None:
    snap = snapshots.encode_bytes(rich_image())
    batches = [
        json.dumps({"v": 43, "epoch": 7, "ts": 1, "r": [epoch_record(8)]}).encode(),
        json.dumps({"v": 44, "epoch": 8, "ts": 2, "r": []}).encode(),
    ]
    parts = updates.encode(42, snap, batches)
    assert parts[-2:] == [b + b"\n" for b in batches], "batches are sent as stored"
    got = updates.decode(b"".join(parts))
    assert got.base == 42 and got.snapshot == snap
    assert got.batches == [(43, [epoch_record(8)]), (44, [])]
    assert got.last_version == 44
    plain = updates.decode(b"".join(updates.encode(44, None, [])))
    assert (plain.base, plain.snapshot, plain.batches, plain.last_version) == (44, None, [], 44)


def test_a_damaged_update_is_refused() -> None:
    with pytest.raises(updates.UpdateError):
        updates.decode(b'{"base": 1}\n')
    with pytest.raises(updates.UpdateError):
        updates.decode(b'{"base": 1, "snapshot": 0}\n{"v": 2}\n')


# ------------------------------------------------------------------ property-style: random logs
TOPICS = ["a", "b", "c", "__sq.s"]
# every record type, with how often it is drawn
KINDS = dict(
    p=30,
    topic=6,
    tgone=2,
    grow=4,
    configs=2,
    floors=5,
    broker=3,
    bstate=2,
    bgone=1,
    bconfigs=2,
    pids=2,
    static=2,
    deleted=2,
    marker=1,
    epoch=1,
    cluster=1,
)
IDS = ["id-1", "id-2"]


def random_partition(rng: random.Random) -> PartitionState:
    b = rng.randrange(4)
    part = PartitionState(rng.choice([b, NO_LEADER]), rng.randrange(5), [b])
    if rng.random() < 0.3:
        part.original_replicas, part.target_replicas = [b], [rng.randrange(4)]
        part.move_started_ms = rng.randrange(10**6)
    if rng.random() < 0.1:
        part.replicas = [b, (b + 1) % 4]
    part.created = rng.random() < 0.5
    part.end_offset_floor = rng.randrange(50)
    if rng.random() < 0.1:
        part.lost = DataLoss(rng.randrange(100), rng.randrange(100), 1, b, "lost")
    if rng.random() < 0.1:
        part.accepted_from = rng.randrange(100)
    return part


def random_changes(rng: random.Random) -> dict[str, object]:
    options: dict[str, object] = {
        "leader": rng.choice([NO_LEADER, 0, 1, 2, 3]),
        "leader_epoch": rng.randrange(10),
        "replicas": [rng.randrange(4)],
        "original_replicas": rng.choice([None, [rng.randrange(4)]]),
        "target_replicas": rng.choice([None, [rng.randrange(4)]]),
        "move_started_ms": rng.choice([None, rng.randrange(10**6)]),
        "created": rng.random() < 0.5,
        "end_offset_floor": rng.randrange(100),
        "lost": rng.choice([None, DataLoss(9, 3, 1, 0, "x")]),
        "accepted_from": rng.choice([None, rng.randrange(100)]),
    }
    keys = rng.sample(sorted(options), rng.randint(1, 4))
    return {k: options[k] for k in keys}


def random_record(rng: random.Random, meta: ClusterMetadata) -> Record:
    """A record of any type, mostly about what exists in `meta` (sometimes not)."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    name = rng.choice(TOPICS)
    topic = meta.topics.get(name)
    if kind == "p":
        count = len(topic.partitions) if topic is not None else 1
        index = rng.randrange(count + 1)  # sometimes beyond the end
        return partition_record(TopicPartition(name, index), **random_changes(rng))
    if kind == "topic":
        parts = [random_partition(rng) for _ in range(rng.randrange(5))]
        if rng.random() < 0.5:
            parts = [PartitionState(b, 0, [b]) for b in (rng.randrange(4) for _ in parts)]
        info = TopicInfo(
            name,
            rng.choice(IDS),
            parts,
            configs=rng.choice([{}, {"retention.ms": str(rng.randrange(9))}]),
            internal=name.startswith("__"),
            kind="physical" if name.startswith("__") else "normal",
        )
        return topic_record(info)
    if kind == "tgone":
        return topic_removed_record(name)
    if kind == "grow":
        return grow_record(name, topic, [rng.randrange(4) for _ in range(rng.randint(1, 3))])
    if kind == "configs":
        return topic_configs_record(name, {"cleanup.policy": rng.choice(["delete", "compact"])})
    if kind == "floors":
        count = len(topic.partitions) if topic is not None else 2
        floors = {i: rng.randrange(100) for i in rng.sample(range(count + 1), min(2, count + 1))}
        topic_id = topic.topic_id if topic is not None and rng.random() < 0.8 else "other"
        return floors_record(name, topic_id, floors)
    broker = rng.randrange(4)
    if kind == "broker":
        info = BrokerInfo(
            broker,
            f"h{broker}",
            9000 + broker,
            rack=rng.choice([None, "r"]),
            incarnation=str(rng.randrange(3)),
        )
        return broker_record(info)
    if kind == "bstate":
        return broker_state_record(broker, rng.choice(["alive", "draining", "dead"]))
    if kind == "bgone":
        return broker_removed_record(broker)
    if kind == "bconfigs":
        return broker_configs_record(rng.choice(["", "1"]), rng.choice([{}, {"k": "v"}]))
    if kind == "pids":
        return producer_ids_record(1000 + rng.randrange(5) * 1000)
    if kind == "static":
        state = initial_mapping(
            "s", 2, [rng.randrange(4), rng.randrange(4)], brokers=None, now_ms=rng.randrange(9)
        )
        return static_topic_record("s", rng.choice([None, state]))
    if kind == "deleted":
        return deletion_record(rng.choice("xyz"), rng.choice(IDS), pending=rng.random() < 0.6)
    if kind == "marker":
        return marker_record(rng.random() < 0.5)
    if kind == "epoch":
        return epoch_record(rng.randrange(6))
    return cluster_record(rng.choice(["c1", "c2"]))


def grow_record(name: str, topic: TopicInfo | None, brokers: list[int]) -> Record:
    return partitions_added_record(name, brokers, at=len(topic.partitions) if topic else 0)


def random_log(seed: int, batches: int = 30) -> list[tuple[int, list[Record]]]:
    """Batches 1..n of random records, as the log stores them (through JSON)."""
    rng = random.Random(seed)
    meta = ClusterMetadata(cluster_id="")
    out: list[tuple[int, list[Record]]] = []
    for version in range(1, batches + 1):
        records: list[Record] = []
        for _ in range(rng.randint(1, 5)):
            rec = json.loads(json.dumps(random_record(rng, meta)))
            apply_record(meta, rec, MetadataDelta())
            records.append(rec)
        meta.version = version
        out.append((version, records))
    return out


def replay(meta: ClusterMetadata, batches: list[tuple[int, list[Record]]]) -> ClusterMetadata:
    for version, records in batches:
        apply_batch(meta, records, version)
    return meta


SEEDS = range(200)


@pytest.mark.parametrize("seed", SEEDS[:1])
def test_random_logs_build_rich_images(seed: int) -> None:
    """The generator reaches the interesting states (else the properties prove little)."""
    kinds: set[str] = set()
    moving = lost = grown = 0
    for s in SEEDS:
        log = random_log(s)
        kinds |= {r["t"] for _, records in log for r in records}
        meta = replay(ClusterMetadata(cluster_id=""), log)
        parts = [p for t in meta.topics.values() for p in t.partitions]
        moving += any(p.moving for p in parts)
        lost += any(p.lost is not None for p in parts)
        grown += any(r["t"] == "grow" and r["name"] in meta.topics for _, rs in log for r in rs)
    assert len(kinds) == 16
    assert min(moving, lost, grown) > len(SEEDS) // 4, (moving, lost, grown)


@pytest.mark.parametrize("seed", SEEDS)
def test_snapshot_of_any_image_decodes_to_the_same_image(seed: int) -> None:
    log = random_log(seed)
    meta = ClusterMetadata(cluster_id="")
    for version, records in log:
        apply_batch(meta, records, version)
        if version % 7 == 0 or version == len(log):
            assert snapshots.decode(snapshots.encode_bytes(meta)) == meta


def same(a: ClusterMetadata, b: ClusterMetadata) -> bool:
    """Equal images, the pending deletions taken as the set they are (a replay may list them
    in another order: nothing depends on it)."""
    a, b = copy.deepcopy(a), copy.deepcopy(b)
    a.pending_deletions.sort()
    b.pending_deletions.sort()
    return a.to_json() == b.to_json() and a == b


@pytest.mark.parametrize("seed", SEEDS)
def test_replaying_batches_a_snapshot_covers_changes_nothing(seed: int) -> None:
    """A reader that loads a snapshot and then applies batches from before it (the snapshot
    already holds them) ends with the same image: records set values, they never add."""
    log = random_log(seed)
    straight = replay(ClusterMetadata(cluster_id=""), copy.deepcopy(log))
    rng = random.Random(seed)
    for _ in range(5):
        k = rng.randrange(len(log) + 1)  # the snapshot is the image after batch k
        j = rng.randrange(1, k + 2)  # replay from batch j <= k + 1
        at_k = replay(ClusterMetadata(cluster_id=""), copy.deepcopy(log[:k]))
        reader = snapshots.decode(snapshots.encode_bytes(at_k))
        replay(reader, copy.deepcopy(log[j - 1 :]))
        assert same(reader, straight), f"snapshot at {k}, replay from {j}"
        # roll skips what the snapshot covers
        rolled = snapshots.roll(snapshots.encode_bytes(at_k), copy.deepcopy(log))
        assert snapshots.decode(rolled) == straight
