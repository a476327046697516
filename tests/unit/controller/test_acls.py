"""CreateAcls and DeleteAcls through the controller, validated as Kafka's broker and controller
do (AclApis, AclControlManager), committed, pushed to brokers, kept across a restart; and the
internal topics no client may delete, grow or reconfigure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerError,
    ControllerSettings,
    InternalTopic,
    NewTopic,
    ObjectStoreMetadataLog,
)
from tidalmq_controller._acls import MAX_RECORDS_PER_REQUEST, create, delete
from tidalmq_core.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from tidalmq_core.metadata import OFFSETS_TOPIC, BrokerInfo, ClusterMetadata

from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)
INVALID_REQUEST = 42
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
READ, WRITE = AclOperation.READ, AclOperation.WRITE


def acl(
    rt: ResourceType = TOPIC,
    name: str = "orders",
    pt: PatternType = LITERAL,
    principal: str = "User:alice",
    op: AclOperation = READ,
    perm: PermissionType = ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


# what Kafka answers each binding (its broker's checks, then its controller's)
REFUSED = [
    (acl(CLUSTER, "other"), "The only valid name for the CLUSTER resource is kafka-cluster"),
    (acl(name=""), "Invalid empty resource name"),
    (acl(ResourceType.ANY), "Invalid resourceType ANY"),
    (acl(ResourceType.UNKNOWN), "Invalid resourceType UNKNOWN"),
    (acl(pt=PatternType.MATCH), "Invalid patternType MATCH"),
    (acl(pt=PatternType.ANY), "Invalid patternType ANY"),
    (acl(pt=PatternType.UNKNOWN), "Invalid patternType UNKNOWN"),
    (acl(op=AclOperation.ANY), "Invalid operation ANY"),
    (acl(op=AclOperation.UNKNOWN), "Invalid operation UNKNOWN"),
    (acl(perm=PermissionType.ANY), "Invalid permissionType ANY"),
    (acl(perm=PermissionType.UNKNOWN), "Invalid permissionType UNKNOWN"),
    (acl(principal="alice"), "Could not parse principal from `alice`"),
    # TidalMQ has no delegation tokens: nothing would enforce these
    (acl(ResourceType.DELEGATION_TOKEN, "t"), "not supported: TidalMQ has no delegation tokens"),
    (acl(ResourceType.USER, "User:bob", op=AclOperation.CREATE_TOKENS), "not supported"),
]


@pytest.mark.parametrize(("binding", "message"), REFUSED)
def test_refused_bindings(binding: AclBinding, message: str) -> None:
    image = ClusterMetadata("c")
    ((result,), records) = create(image, [binding])
    assert result.error_code == INVALID_REQUEST
    assert message in (result.error_message or "")
    assert records == []


def test_created_once_each_with_an_id_of_its_own() -> None:
    image = ClusterMetadata("c")
    ok = [
        acl(),
        acl(CLUSTER, "kafka-cluster", op=AclOperation.ALTER),
        acl(GROUP, "g", PREFIXED, "User:*", perm=DENY, host="10.0.0.1"),
        acl(ResourceType.TRANSACTIONAL_ID, "tx", op=WRITE),
    ]
    results, records = create(image, [*ok, acl(), acl(name="")])
    assert [r.error_code for r in results] == [0, 0, 0, 0, 0, INVALID_REQUEST]
    assert [r["b"] for r in records] == [b.to_json() for b in ok]  # the second acl() is a no-op
    assert len({r["id"] for r in records}) == 4
    image.acls = {r["id"]: AclBinding.from_json(r["b"]) for r in records}
    again, more = create(image, [acl()])  # exists already: a success that writes nothing
    assert again[0].error_code == 0 and more == []


def test_deleted_by_filters_each_listing_what_it_matched() -> None:
    image = ClusterMetadata("c")
    image.acls = {
        "a": acl(),
        "b": acl(name="orders-eu", pt=PREFIXED, op=WRITE),
        "c": acl(GROUP, "g", principal="User:bob"),
        "d": acl(name="*"),
    }
    results, records = delete(
        image,
        [
            AclBindingFilter(TOPIC, "orders-eu-1", PatternType.MATCH),  # what applies to it
            AclBindingFilter(principal="User:bob"),
            AclBindingFilter(TOPIC, pattern_type=PatternType.UNKNOWN),
            AclBindingFilter(TOPIC, "orders", PatternType.ANY),
        ],
    )
    assert results[0].deleted == [image.acls["b"], image.acls["d"]]  # the prefix, the wildcard
    assert results[1].deleted == [image.acls["c"]]
    assert (results[2].error_code, results[2].error_message) == (
        INVALID_REQUEST,
        "Unknown patternFilter.",
    )
    assert results[3].deleted == [image.acls["a"]]
    # one record per binding, even when two filters match it
    assert records == [{"t": "aclgone", "id": i} for i in ("b", "d", "c", "a")]
    _, none = delete(image, [AclBindingFilter(GROUP, "nothing")])
    assert none == []


def test_at_most_kafkas_records_per_request() -> None:
    image = ClusterMetadata("c")
    many = [acl(name=f"t{i}") for i in range(MAX_RECORDS_PER_REQUEST + 1)]
    with pytest.raises(ValueError, match="Cannot create more than 10000 acls"):
        create(image, many)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SETTINGS) as c:
        yield c


async def test_committed_pushed_and_kept_across_a_controller_restart(
    controller: Controller, tmp_path: Path
) -> None:
    broker = FakeBroker(controller, 1)
    await controller.register_broker(BrokerInfo(1, "127.0.0.1", 9001), broker)
    results, version = await controller.create_acls([acl(), acl(GROUP, "g"), acl(name="")])
    assert [r.error_code for r in results] == [0, 0, INVALID_REQUEST]
    assert version == controller.journal.committed_version
    for _ in range(500):
        if len(broker.image.acls) == 2:
            break
        await asyncio.sleep(0.01)
    assert sorted(broker.image.acls.values(), key=str) == sorted([acl(), acl(GROUP, "g")], key=str)
    deleted, _ = await controller.delete_acls([AclBindingFilter(GROUP)])
    assert deleted[0].deleted == [acl(GROUP, "g")]
    with pytest.raises(ControllerError, match="Cannot create more than"):
        await controller.create_acls([acl(name=f"t{i}") for i in range(10_001)])
    await controller.stop()
    again = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), SETTINGS)
    await again.start()
    try:
        assert list(again.metadata.acls.values()) == [acl()]
    finally:
        await again.stop()


async def test_internal_topics_are_never_deleted_grown_or_reconfigured(
    controller: Controller,
) -> None:
    broker = FakeBroker(controller, 1)
    await controller.register_broker(BrokerInfo(1, "127.0.0.1", 9001), broker)
    for _ in range(500):
        if OFFSETS_TOPIC in controller.metadata.topics:
            break
        await asyncio.sleep(0.01)
    grown = await controller.create_partitions(OFFSETS_TOPIC, 5)
    assert isinstance(grown.error, InternalTopic)
    assert "Cannot add partitions to internal topic __consumer_offsets" in str(grown.error)
    for incremental in (True, False):
        altered = await controller.alter_topic_configs(
            OFFSETS_TOPIC, {"retention.ms": "1000"}, incremental=incremental, validate_only=True
        )
        assert isinstance(altered.error, InternalTopic)
    (deleted,) = await controller.delete_topics([OFFSETS_TOPIC])
    assert isinstance(deleted.error, InternalTopic)
    assert len(controller.metadata.topics[OFFSETS_TOPIC].partitions) == 1
    # an ordinary topic still grows and takes configs
    await controller.create_topics([NewTopic("t", 1)])
    assert (await controller.create_partitions("t", 2)).error is None
    changed = await controller.alter_topic_configs(
        "t", {"retention.ms": "1000"}, incremental=True, validate_only=False
    )
    assert changed.error is None
