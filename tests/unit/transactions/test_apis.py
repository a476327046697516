"""The transaction coordinator's APIs in process, every version each one offers, through kio's
schemas both ways (what a client reads): InitProducerId with a transactional id,
AddPartitionsToTxn (v0-v3 from clients, v4+ batched and verify-only from brokers),
AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions, ListTransactions, and the
authorization Kafka applies."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
from kio.schema.errors import ErrorCode
from tidalmq_broker.groups.coordinator import GroupSettings, GroupShard
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.storage.api import AppendResult
from tidalmq_broker.transactions.coordinator import Marker, TxnSettings, TxnShard
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import OFFSETS_TOPIC, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition

from tests.unit.test_kafka_api_gaps import allow, call


class MemoryLog:
    """Just enough of a partition log for a shard: appends are acknowledged at once."""

    def __init__(self) -> None:
        self.leader_epoch = 1
        self.log_start_offset = 0
        self.high_watermark = 0

    async def append(self, records: bytes, *, acks: int = -1, owned: bool = False) -> AppendResult:
        self.high_watermark += 1
        return AppendResult(self.high_watermark - 1, self.high_watermark - 1, -1, 0)


async def no_markers(markers: list[Marker]) -> dict[TopicPartition, int]:
    return {m.tp: ErrorCode.none for m in markers}


async def fake_broker(*bindings: Any, enabled: bool = True) -> Any:
    meta = ClusterMetadata("c", version=3)
    meta.topics = {
        "orders": TopicInfo("orders", str(uuid.UUID(int=1)), [PartitionState(0, 0, [0])] * 2),
        OFFSETS_TOPIC: TopicInfo(
            OFFSETS_TOPIC, str(uuid.UUID(int=3)), [PartitionState(0, 0, [0])], internal=True
        ),
    }
    authorizer = Authorizer(enabled=enabled)
    authorizer.load(list(bindings))
    pids = iter(range(7000, 8000))

    async def allocate() -> int:
        return next(pids)

    shard = TxnShard(
        0,
        MemoryLog(),
        TxnSettings(max_timeout_ms=60_000),
        no_markers,  # type: ignore[arg-type]
        allocate,
    )
    await shard.load()
    groups = GroupShard(0, MemoryLog(), GroupSettings())  # type: ignore[arg-type]
    await groups.load()
    return SimpleNamespace(
        metadata=meta,
        authorizer=authorizer,
        txn_verifier=None,  # tests/unit/transactions/test_txn_offsets.py
        transactions=SimpleNamespace(shard=lambda tid: shard, shards=lambda: [shard]),
        groups=SimpleNamespace(partition_for=lambda g: 0, shard=lambda g: groups),
        _shards=(shard, groups),
    )


def everything() -> list[Any]:
    return [
        allow(rt, "*", AclOperation.ALL)
        for rt in (
            ResourceType.TRANSACTIONAL_ID,
            ResourceType.TOPIC,
            ResourceType.GROUP,
            ResourceType.CLUSTER,
        )
    ]


async def init(b: Any, version: int, tid: str, timeout_ms: int = 30_000) -> dict[str, Any]:
    return await call(
        b,
        22,
        version,
        {
            "transactional_id": tid,
            "transaction_timeout": timeout_ms,
            "producer_id": -1,
            "producer_epoch": -1,
        },
    )


async def add_partitions(b: Any, version: int, tid: str, pid: int, epoch: int) -> list[int]:
    topics = [{"name": "orders", "partitions": [0, 1]}]
    if version >= 4:
        answer = await call(
            b,
            24,
            version,
            {
                "transactions": [
                    {
                        "transactional_id": tid,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "verify_only": False,
                        "topics": topics,
                    }
                ]
            },
        )
        results = answer["results_by_transaction"][0]["topic_results"]
    else:
        answer = await call(
            b,
            24,
            version,
            {
                "v3_and_below_transactional_id": tid,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": topics,
            },
        )
        results = answer["results_by_topic_v3_and_below"]
    return [p["partition_error_code"] for t in results for p in t["results_by_partition"]]


async def test_every_version_runs_a_transaction_through() -> None:
    b = await fake_broker(*everything())
    for version in range(6):
        tid = f"t{version}"
        first = await init(b, min(version, 5), tid)
        assert first["error_code"] == ErrorCode.none and first["producer_epoch"] == 0, first
        pid = first["producer_id"]
        assert await add_partitions(b, version, tid, pid, 0) == [ErrorCode.none] * 2
        offsets = await call(
            b,
            25,
            min(version, 4),
            {"transactional_id": tid, "producer_id": pid, "producer_epoch": 0, "group_id": "g"},
        )
        assert offsets["error_code"] == ErrorCode.none
        commit = await call(
            b,
            28,
            version,
            {
                "transactional_id": tid,
                "group_id": "g",
                "producer_id": pid,
                "producer_epoch": 0,
                "topics": [
                    {
                        "name": "orders",
                        "partitions": [
                            {
                                "partition_index": 1,
                                "committed_offset": 5,
                                "committed_metadata": None,
                            }
                        ],
                    }
                ],
            },
        )
        assert commit["topics"][0]["partitions"][0]["error_code"] == ErrorCode.none
        end = await call(
            b,
            26,
            version,
            {"transactional_id": tid, "producer_id": pid, "producer_epoch": 0, "committed": True},
        )
        assert end["error_code"] == ErrorCode.none
    (shard, groups) = b._shards
    assert shard.txns["t5"].partitions == {("orders", 0), ("orders", 1), (OFFSETS_TOPIC, 0)}
    assert groups.pending  # until the marker

    async def fetch_offset(stable: bool) -> tuple[int, int]:
        answer = await call(
            b,
            9,
            7,
            {
                "group_id": "g",
                "require_stable": stable,
                "topics": [{"name": "orders", "partition_indexes": [1]}],
            },
        )
        part = answer["topics"][0]["partitions"][0]
        return part["error_code"], part["committed_offset"]

    assert await fetch_offset(True) == (ErrorCode.unstable_offset_commit, -1)
    assert await fetch_offset(False) == (ErrorCode.none, -1)  # not committed yet
    pid5 = shard.txns["t5"].producer_id
    await groups.complete_txn(shard.txns["t4"].producer_id, False)  # t4 aborted: its offset dropped
    assert await fetch_offset(True) == (ErrorCode.unstable_offset_commit, -1)  # t5's still open
    await groups.complete_txn(pid5, True)
    for pid in [shard.txns[f"t{i}"].producer_id for i in range(4)]:
        await groups.complete_txn(pid, False)
    assert await fetch_offset(True) == (ErrorCode.none, 5)
    described = await call(b, 65, 0, {"transactional_ids": ["t5", "nope"]})
    t5, nope = described["transaction_states"]
    assert (t5["transaction_state"], t5["producer_epoch"]) == ("PrepareCommit", 0)
    assert sorted((t["topic"], sorted(t["partitions"])) for t in t5["topics"]) == [
        (OFFSETS_TOPIC, [0]),
        ("orders", [0, 1]),
    ]
    assert nope["error_code"] == ErrorCode.transactional_id_not_found
    for version in range(3):
        body: dict[str, Any] = {
            "state_filters": ["PrepareCommit", "Bogus"],
            "producer_id_filters": [],
        }
        if version >= 1:
            body["duration_filter"] = -1
        if version >= 2:
            body["transactional_id_pattern"] = "t[0-3]"
        listed = await call(b, 66, version, body)
        ids = sorted(s["transactional_id"] for s in listed["transaction_states"])
        assert ids == (["t0", "t1", "t2", "t3"] if version >= 2 else [f"t{i}" for i in range(6)])
        assert list(listed["unknown_state_filters"]) == ["Bogus"]


async def test_fencing_codes_by_version_and_verify_only() -> None:
    b = await fake_broker(*everything())
    first = await init(b, 4, "z")
    pid = first["producer_id"]
    assert (await init(b, 4, "z"))["producer_epoch"] == 1
    # the old epoch: PRODUCER_FENCED from v2 (KIP-588), INVALID_PRODUCER_EPOCH before
    assert await add_partitions(b, 1, "z", pid, 0) == [ErrorCode.invalid_producer_epoch] * 2
    assert await add_partitions(b, 3, "z", pid, 0) == [ErrorCode.producer_fenced] * 2
    assert await add_partitions(b, 3, "z", pid, 1) == [ErrorCode.none] * 2
    verify = await call(
        b,
        24,
        5,
        {
            "transactions": [
                {
                    "transactional_id": "z",
                    "producer_id": pid,
                    "producer_epoch": 1,
                    "verify_only": True,
                    "topics": [{"name": "orders", "partitions": [0]}],
                }
            ]
        },
    )
    result = verify["results_by_transaction"][0]["topic_results"][0]["results_by_partition"]
    assert result[0]["partition_error_code"] == ErrorCode.none
    assert (await init(b, 4, "z", timeout_ms=60_001))["error_code"] == (
        ErrorCode.invalid_transaction_timeout
    )


async def test_authorization_as_kafka() -> None:
    b = await fake_broker(
        allow(ResourceType.TRANSACTIONAL_ID, "ok", AclOperation.WRITE),
        allow(ResourceType.TRANSACTIONAL_ID, "ok", AclOperation.DESCRIBE),
    )
    assert (await init(b, 4, "other"))["error_code"] == (
        ErrorCode.transactional_id_authorization_failed
    )
    pid = (await init(b, 4, "ok"))["producer_id"]
    # WRITE on the transactional id, not on the topic
    assert await add_partitions(b, 3, "ok", pid, 0) == [ErrorCode.topic_authorization_failed] * 2
    v5 = await call(b, 24, 5, {"transactions": []})  # broker to broker: CLUSTER_ACTION
    assert v5["error_code"] == ErrorCode.cluster_authorization_failed
    offsets = await call(
        b,
        25,
        4,
        {"transactional_id": "ok", "producer_id": pid, "producer_epoch": 0, "group_id": "g"},
    )
    assert offsets["error_code"] == ErrorCode.group_authorization_failed
    listed = await call(b, 66, 0, {"state_filters": [], "producer_id_filters": []})
    assert [s["transactional_id"] for s in listed["transaction_states"]] == ["ok"]
