"""The APIs Apache Kafka 4's tools and AdminClient need beyond produce and consume, at the
protocol level (the broker's own codec as the client): DescribeTopicPartitions with its cursor,
DescribeProducers from the partitions' producer state, DescribeLogDirs / AlterReplicaLogDirs,
dynamic broker configs and list-config operations, and the clear refusal of transactions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.admin_client import AdminClient

from tests.integration.broker.clients import create_topic, producer
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

TOPIC, BROKER = 2, 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("tool-apis")
    with BrokerProcess(f"file://{base / 'objects'}", base / "logs") as proc:
        yield proc


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[AdminClient]:
    with AdminClient(broker.bootstrap) as client:
        yield client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    p = producer(bootstrap, **{"enable.idempotence": True})
    for i in range(count):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert p.flush(30) == 0


# ---------------------------------------------------------------- DescribeTopicPartitions
def describe_topics(
    admin: AdminClient, names: list[str], limit: int, cursor: dict[str, Any] | None = None
) -> Any:
    return admin.call(
        75,
        0,
        {
            "topics": [{"name": n} for n in names],
            "response_partition_limit": limit,
            "cursor": cursor,
        },
    )


def test_describe_topic_partitions_pages_with_a_cursor(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    run = uuid.uuid4().hex[:6]
    a, b, missing = f"dtp-{run}-a", f"dtp-{run}-b", f"dtp-{run}-z-missing"
    create_topic(broker.bootstrap, a, 3)
    create_topic(broker.bootstrap, b, 2)

    pages = []
    cursor = None
    while True:
        resp = describe_topics(admin, [missing, b, a], 2, cursor)
        pages.append([(t.name, [p.partition_index for p in t.partitions]) for t in resp.topics])
        if resp.next_cursor is None:
            break
        cursor = {
            "topic_name": resp.next_cursor.topic_name,
            "partition_index": resp.next_cursor.partition_index,
        }
    # sorted by name, at most two partitions a page, the cursor resuming mid-topic
    assert pages == [[(a, [0, 1])], [(a, [2]), (b, [0])], [(b, [1]), (missing, [])]]

    full = describe_topics(admin, [a, missing], 100)
    found, unknown = full.topics
    assert found.error_code == ErrorCode.none and found.name == a and not found.is_internal
    assert found.topic_id.int != 0
    for p in found.partitions:
        assert p.error_code == ErrorCode.none and p.leader_id == 0 and p.leader_epoch >= 0
        assert p.replica_nodes == (0,) and p.isr_nodes == (0,)
        assert p.eligible_leader_replicas == () and p.last_known_elr == ()
    assert unknown.error_code == ErrorCode.unknown_topic_or_partition and unknown.partitions == ()

    # no names: every topic, Kafka's internal one flagged
    every = {t.name: t.is_internal for t in describe_topics(admin, [], 2000).topics}
    assert every[a] is False and every[b] is False and every["__consumer_offsets"] is True
    # a cursor naming a topic that was not asked for is a bad request
    bad = describe_topics(admin, [a], 10, {"topic_name": b, "partition_index": 0})
    assert [t.error_code for t in bad.topics] == [ErrorCode.invalid_request]


# ---------------------------------------------------------------- DescribeProducers
def describe_producers(admin: AdminClient, topic: str, *partitions: int) -> dict[int, Any]:
    resp = admin.call(61, 0, {"topics": [{"name": topic, "partition_indexes": list(partitions)}]})
    (t,) = resp.topics
    return {p.partition_index: p for p in t.partitions}


def test_describe_producers_reports_idempotent_producers(tmp_path: Path) -> None:
    proc = BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs")
    proc.start()
    try:
        topic = unique("producers")
        create_topic(proc.bootstrap, topic, 2)
        produce(proc.bootstrap, topic, 0, 25)
        with AdminClient(proc.bootstrap) as admin:
            parts = describe_producers(admin, topic, 0, 1, 7)
            (active,) = parts[0].active_producers
            assert parts[0].error_code == ErrorCode.none
            assert active.producer_id >= 0 and active.producer_epoch == 0
            assert active.last_sequence == 24  # sequences 0..24
            assert active.last_timestamp > 0
            assert active.coordinator_epoch == -1 and active.current_txn_start_offset == -1
            assert parts[1].error_code == ErrorCode.none and parts[1].active_producers == ()
            assert parts[7].error_code == ErrorCode.unknown_topic_or_partition
            (unknown,) = describe_producers(admin, unique("nope"), 0).values()
            assert unknown.error_code == ErrorCode.unknown_topic_or_partition
        # the state is the partition's durable producer state: it survives a crash
        proc.restart(crash=True)
        with AdminClient(proc.bootstrap) as admin:
            (after,) = describe_producers(admin, topic, 0)[0].active_producers
        assert (after.producer_id, after.last_sequence) == (active.producer_id, 24)
    finally:
        proc.stop()


# ---------------------------------------------------------------- log directories
def test_log_dirs_name_the_object_store(broker: BrokerProcess, admin: AdminClient) -> None:
    topic = unique("logdirs")
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 1, 10)
    here = broker.storage_url.removeprefix("file://")

    every = admin.call(35, 4, {"topics": None})
    assert every.error_code == ErrorCode.none
    (result,) = every.results
    assert result.error_code == ErrorCode.none and result.log_dir == here
    assert result.total_bytes == -1 and result.usable_bytes == -1  # object storage: unknown
    names = {t.name for t in result.topics}
    assert topic in names and "__consumer_offsets" in names

    some = admin.call(35, 4, {"topics": [{"topic": topic, "partitions": [1]}]})
    (result,) = some.results
    (t,) = result.topics
    (p,) = t.partitions
    assert (t.name, p.partition_index, p.offset_lag, p.is_future_key) == (topic, 1, 0, False)
    assert p.partition_size > 10 * 2  # ten stored records

    def alter(path: str, partitions: list[int]) -> list[ErrorCode]:
        resp = admin.call(
            34, 2, {"dirs": [{"path": path, "topics": [{"name": topic, "partitions": partitions}]}]}
        )
        return [p.error_code for t in resp.results for p in t.partitions]

    assert alter(here, [0, 1]) == [ErrorCode.none, ErrorCode.none]  # already there
    assert alter(here, [9]) == [ErrorCode.unknown_topic_or_partition]
    assert alter("/elsewhere", [0]) == [ErrorCode.log_dir_not_found]


# ---------------------------------------------------------------- configs
def describe_configs(admin: AdminClient, kind: int, name: str) -> Any:
    resp = admin.call(
        32,
        4,
        {
            "resources": [
                {"resource_type": kind, "resource_name": name, "configuration_keys": None}
            ],
            "include_synonyms": True,
            "include_documentation": False,
        },
    )
    (result,) = resp.results
    return result


def alter_configs(
    admin: AdminClient, kind: int, name: str, *ops: tuple[str, int, str | None]
) -> Any:
    resp = admin.call(
        44,
        1,
        {
            "resources": [
                {
                    "resource_type": kind,
                    "resource_name": name,
                    "configs": [
                        {"name": n, "config_operation": op, "value": v} for n, op, v in ops
                    ],
                }
            ],
            "validate_only": False,
        },
    )
    (result,) = resp.responses
    return result


def test_broker_configs_are_per_broker_and_cluster_wide(admin: AdminClient) -> None:
    rate = "leader.replication.throttled.rate"
    other = describe_configs(admin, BROKER, "5")
    assert other.error_code == ErrorCode.invalid_request
    assert other.error_message == "Unexpected broker id, expected 0 or empty string, but received 5"

    assert alter_configs(admin, BROKER, "", (rate, 0, "300")).error_code == ErrorCode.none
    try:
        default = describe_configs(admin, BROKER, "")
        assert [(c.name, c.value, c.config_source) for c in default.configs] == [(rate, "300", 3)]
        own = {c.name: c for c in describe_configs(admin, BROKER, "0").configs}
        assert own[rate].value == "300" and own[rate].config_source == 3
        assert [s.source for s in own[rate].synonyms] == [3, 5]
        assert own["num.partitions"].read_only and own["num.partitions"].config_source == 4
        assert own["auto.create.topics.enable"].config_type == 1  # BOOLEAN
    finally:
        assert alter_configs(admin, BROKER, "", (rate, 1, None)).error_code == ErrorCode.none
    assert describe_configs(admin, BROKER, "").configs == ()

    static = alter_configs(admin, BROKER, "0", ("num.partitions", 0, "3"))
    assert static.error_code == ErrorCode.invalid_request
    assert static.error_message == "Cannot update these configs dynamically: [num.partitions]"


def test_throttled_replica_lists_append_and_subtract(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic = unique("lists")
    create_topic(broker.bootstrap, topic, 3)
    name = "leader.replication.throttled.replicas"

    def value() -> str:
        configs = {c.name: c for c in describe_configs(admin, TOPIC, topic).configs}
        assert configs[name].config_type == 7  # LIST
        return configs[name].value

    assert value() == ""
    assert alter_configs(admin, TOPIC, topic, (name, 2, "0:1,1:2")).error_code == ErrorCode.none
    assert alter_configs(admin, TOPIC, topic, (name, 2, "1:2,2:0")).error_code == ErrorCode.none
    assert value() == "0:1,1:2,2:0"
    assert alter_configs(admin, TOPIC, topic, (name, 3, "1:2")).error_code == ErrorCode.none
    assert value() == "0:1,2:0"
    wrong = alter_configs(admin, TOPIC, topic, ("retention.ms", 2, "5"))
    assert wrong.error_code == ErrorCode.invalid_config
    bad = alter_configs(admin, TOPIC, topic, (name, 0, "zero:one"))
    assert bad.error_code == ErrorCode.invalid_config
    assert "[partitionId]:[brokerId]" in bad.error_message, bad.error_message  # Kafka's words


# ---------------------------------------------------------------- transactions
def test_transaction_coordinator_found_and_producer_ids_fenced(admin: AdminClient) -> None:
    """FindCoordinator key type 1 creates __transaction_state on first use (retriable
    COORDINATOR_NOT_AVAILABLE meanwhile), then names this broker; InitProducerId with a
    transactional id gives a producer id and bumps its epoch on every call."""
    deadline = time.monotonic() + 30
    while True:
        found = admin.call(10, 4, {"key_type": 1, "coordinator_keys": ["tx-1"]})
        (coordinator,) = found.coordinators
        if coordinator.error_code == ErrorCode.none or time.monotonic() > deadline:
            break
        assert coordinator.error_code == ErrorCode.coordinator_not_available, coordinator
        time.sleep(0.2)
    assert coordinator.error_code == ErrorCode.none and coordinator.port > 0, coordinator
    body = {
        "transactional_id": "tx-1",
        "transaction_timeout": 60000,
        "producer_id": -1,
        "producer_epoch": -1,
    }
    first, second = admin.call(22, 4, body), admin.call(22, 4, body)
    assert first.error_code == second.error_code == ErrorCode.none
    assert first.producer_id == second.producer_id >= 0
    assert (first.producer_epoch, second.producer_epoch) == (0, 1)
    idempotent = admin.call(22, 4, {**body, "transactional_id": None})
    assert idempotent.error_code == ErrorCode.none and idempotent.producer_id >= 0


# ---------------------------------------------------------------- groups
def test_list_groups_types_and_describe_missing_group(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic, group = unique("groups"), unique("g")
    create_topic(broker.bootstrap, topic, 1)
    commit = admin.call(
        8,
        8,
        {
            "group_id": group,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 0,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
    )
    assert commit.topics[0].partitions[0].error_code == ErrorCode.none

    def listed(**filters: list[str]) -> dict[str, Any]:
        resp = admin.call(16, 5, {"states_filter": [], "types_filter": [], **filters})
        return {g.group_id: g for g in resp.groups}

    assert listed()[group].group_type == "classic"
    assert listed()[group].group_state == "Empty"
    assert group in listed(types_filter=["Classic"])  # case-insensitive, as in Kafka
    assert listed(types_filter=["consumer"]) == {}
    assert group in listed(states_filter=["empty"])
    assert group not in listed(states_filter=["Stable"])

    resp = admin.call(
        15, 6, {"groups": [group, "no-such-group"], "include_authorized_operations": False}
    )
    found, missing = resp.groups
    assert found.error_code == ErrorCode.none and found.group_state == "Empty"
    assert missing.error_code == ErrorCode.group_id_not_found
    assert missing.error_message == "Group no-such-group not found."
    old = admin.call(15, 5, {"groups": ["no-such-group"], "include_authorized_operations": False})
    assert old.groups[0].error_code == ErrorCode.none and old.groups[0].group_state == "Dead"


# ---------------------------------------------------------------- newest versions Kafka 4 uses
def test_metadata_v13_describe_cluster_v2_and_reassignments_v1(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    topic = unique("v13")
    create_topic(broker.bootstrap, topic, 1)
    meta = admin.call(
        3,
        13,
        {
            "topics": [{"topic_id": None, "name": topic}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    assert meta.error_code == ErrorCode.none
    assert [(t.name, t.error_code) for t in meta.topics] == [(topic, ErrorCode.none)]

    cluster = admin.call(
        60,
        2,
        {
            "include_cluster_authorized_operations": False,
            "endpoint_type": 1,
            "include_fenced_brokers": True,
        },
    )
    assert cluster.error_code == ErrorCode.none
    assert [(b.broker_id, b.is_fenced) for b in cluster.brokers] == [(0, False)]

    def reassign(replicas: list[int], allow_rf_change: bool) -> ErrorCode:
        resp = admin.call(
            45,
            1,
            {
                "timeout": 30000,
                "allow_replication_factor_change": allow_rf_change,
                "topics": [
                    {"name": topic, "partitions": [{"partition_index": 0, "replicas": replicas}]}
                ],
            },
        )
        return resp.responses[0].partitions[0].error_code

    # one replica per partition: two is a bad assignment, or a forbidden RF change under v1
    assert reassign([0, 1], True) == ErrorCode.invalid_replica_assignment
    assert reassign([0, 1], False) == ErrorCode.invalid_replication_factor
    assert reassign([0], False) == ErrorCode.none  # already there: nothing to move


def test_elect_leaders_is_never_needed(broker: BrokerProcess, admin: AdminClient) -> None:
    topic = unique("elect")
    create_topic(broker.bootstrap, topic, 2)

    def elect(kind: int, partitions: list[dict[str, Any]] | None) -> dict[tuple[str, int], Any]:
        resp = admin.call(
            43, 2, {"election_type": kind, "topic_partitions": partitions, "timeout": 30000}
        )
        assert resp.error_code == ErrorCode.none
        return {
            (t.topic, p.partition_id): p
            for t in resp.replica_election_results
            for p in t.partition_result
        }

    one = elect(0, [{"topic": topic, "partitions": [1, 5]}])
    assert one[(topic, 1)].error_code == ErrorCode.election_not_needed
    assert one[(topic, 5)].error_code == ErrorCode.unknown_topic_or_partition
    every = elect(1, None)
    assert every[(topic, 0)].error_code == ErrorCode.election_not_needed
    assert not any(t == "__consumer_offsets" for t, _ in every)
