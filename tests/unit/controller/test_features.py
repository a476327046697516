"""UpdateFeatures (`kafka-features upgrade|downgrade`): the controller's rules (Kafka's
FeatureControlManager), the `feature` record it commits and keeps across a restart, and the
broker's answer at each version through kio, as the Java admin client reads it; the levels
brokers register as supported, which block an upgrade some broker cannot serve and a broker's
registration at a level it cannot serve (docs/transactions-v2.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tidalmq_broker.broker
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis import KAFKA_APIS  # (importing it registers the handlers)
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.settings import BrokerSettings
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerServer,
    ControllerSettings,
    FeatureUpdate,
    HttpControllerClient,
    LocalControllerClient,
    ObjectStoreMetadataLog,
    UnsupportedFeatureLevel,
    UpgradeType,
)
from tidalmq_controller._features import registration_refused, update
from tidalmq_core import snapshots
from tidalmq_core.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
from tidalmq_core.control_auth import ControlAuth, broker_token
from tidalmq_core.metadata import (
    PLAINTEXT,
    TRANSACTION_VERSION,
    BrokerInfo,
    ClusterMetadata,
    Endpoint,
)
from tidalmq_core.records import MetadataDelta, apply_record, broker_record

from tests.support.controllers import running_controller

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)
TV = TRANSACTION_VERSION
UP, SAFE, UNSAFE = UpgradeType.UPGRADE, UpgradeType.SAFE_DOWNGRADE, UpgradeType.UNSAFE_DOWNGRADE
ALL_FAILED = "The update failed for all features since the following feature had an error: "


def at(level: int) -> ClusterMetadata:
    meta = ClusterMetadata("c", version=5)
    meta.features[TV] = level
    return meta


@pytest.mark.parametrize(
    ("level", "kind", "why"),
    [
        (3, UP, "The controller only supports versions 0-2"),
        (-1, UP, "A feature version cannot be less than 0."),
        (2, 7, "The controller does not support the given upgrade type."),
        (0, UP, "Can't downgrade the version of this feature without setting the upgrade type"),
        (2, SAFE, "Can't downgrade to a newer version."),
    ],
)
def test_refusals_name_the_update_and_the_reason(level: int, kind: int, why: str) -> None:
    refused, records = update(at(1), [FeatureUpdate(TV, level, kind)])
    assert refused is not None and refused.startswith(
        f"Invalid update version {level} for feature {TV}. {why}"
    )
    assert records == []


def test_upgrades_and_downgrades_write_one_record_each_and_nothing_when_unchanged() -> None:
    assert update(at(1), [FeatureUpdate(TV, 2, UP)]) == (
        None,
        [{"t": "feature", "name": TV, "level": 2}],
    )
    for kind in (SAFE, UNSAFE):
        assert update(at(2), [FeatureUpdate(TV, 1, kind)])[1] == [
            {"t": "feature", "name": TV, "level": 1}
        ]
    assert update(at(2), [FeatureUpdate(TV, 2, UP)]) == (None, [])
    # a feature this code does not know is not supported at any level; and the request is all
    # or nothing: the good update of the same request is not written either
    refused, records = update(at(1), [FeatureUpdate(TV, 2, UP), FeatureUpdate("share.version", 1)])
    assert refused == (
        "Invalid update version 1 for feature share.version. "
        "The controller does not support this feature."
    )
    assert records == []


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SETTINGS) as c:
        yield c


async def test_the_level_is_committed_and_kept_across_restarts_unless_set_at_start(
    controller: Controller, tmp_path: Path
) -> None:
    assert controller.metadata.feature_level(TV) == 1
    refused, version = await controller.update_features([FeatureUpdate(TV, 2)], validate_only=True)
    assert refused is None and controller.metadata.feature_level(TV) == 1  # validated only
    refused, version = await controller.update_features([FeatureUpdate(TV, 2)])
    assert refused is None and version == controller.journal.committed_version
    assert controller.metadata.feature_level(TV) == 2
    await controller.stop()

    def restarted(settings: ControllerSettings) -> Controller:
        store = LocalDirObjectStore(tmp_path / "objects")
        return Controller(ObjectStoreMetadataLog(store), settings)

    again = restarted(SETTINGS)  # no level set at start: the metadata's stays
    await again.start()
    try:
        assert again.metadata.feature_level(TV) == 2
        refused, _ = await again.update_features([FeatureUpdate(TV, 1)])
        assert refused is not None and "without setting the upgrade type" in refused
        refused, _ = await again.update_features([FeatureUpdate(TV, 1, SAFE)])
        assert refused is None and again.metadata.feature_level(TV) == 1
    finally:
        await again.stop()
    pinned = restarted(dataclasses.replace(SETTINGS, transaction_version=2))
    await pinned.start()  # a level set at start wins at that start
    try:
        assert pinned.metadata.feature_level(TV) == 2
    finally:
        await pinned.stop()


async def call(b: Any, version: int, body: dict[str, Any]) -> Any:
    """UpdateFeatures as a client reads it: request and response through kio."""
    request = decode_request(encode_request(57, version, 1, body)[4:], supported_versions())
    conn = SimpleNamespace(principal="User:bob", host="10.0.0.1", listener="PLAINTEXT")
    answer = await REGISTRY[57].handler(b, request, conn)  # type: ignore[arg-type]
    return decode_response(57, version, encode_response(57, version, 1, answer)[4:])[1]


def broker(controller: Controller, *bindings: AclBinding) -> Any:
    authorizer = Authorizer(enabled=bool(bindings))
    authorizer.load(list(bindings))

    async def wait_metadata(version: int, timeout_s: float) -> bool:
        return controller.metadata.version >= version

    return SimpleNamespace(
        authorizer=authorizer,
        controller=LocalControllerClient(controller),
        wait_metadata=wait_metadata,
    )


def tv(level: int, kind: int = UP) -> dict[str, Any]:
    return {"feature": TV, "max_version_level": level, "upgrade_type": kind}


async def test_update_features_answers_as_kafka_at_each_version(controller: Controller) -> None:
    assert REGISTRY[57].min_version == 0 and REGISTRY[57].max_version == 2
    b = broker(controller)
    # v1: a dry run answers each feature, writes nothing
    r = await call(b, 1, {"feature_updates": [tv(2)], "validate_only": True})
    assert r.error_code == ErrorCode.none
    assert [(x.feature, x.error_code) for x in r.results] == [(TV, ErrorCode.none)]
    assert controller.metadata.feature_level(TV) == 1
    # v2 (Kafka 4's admin client): a top-level NONE only
    r = await call(b, 2, {"feature_updates": [tv(2)]})
    assert (r.error_code, r.error_message) == (ErrorCode.none, None)
    assert controller.metadata.feature_level(TV) == 2
    # refused: one top-level error naming the feature, no result per feature
    r = await call(b, 1, {"feature_updates": [tv(3)]})
    assert r.error_code == ErrorCode.invalid_update_version
    assert r.error_message == (
        ALL_FAILED + f"Invalid update version 3 for feature {TV}. "
        "The controller only supports versions 0-2"
    )
    assert r.results == ()
    # v0's allow_downgrade is a safe downgrade
    r = await call(
        b,
        0,
        {"feature_updates": [{"feature": TV, "max_version_level": 1, "allow_downgrade": True}]},
    )
    assert r.error_code == ErrorCode.none and controller.metadata.feature_level(TV) == 1


async def test_update_features_needs_alter_on_the_cluster(controller: Controller) -> None:
    describe = AclBinding(
        ResourceType.CLUSTER,
        "kafka-cluster",
        PatternType.LITERAL,
        "User:bob",
        "*",
        AclOperation.DESCRIBE,
        PermissionType.ALLOW,
    )
    r = await call(broker(controller, describe), 2, {"feature_updates": [tv(2)]})
    assert r.error_code == ErrorCode.cluster_authorization_failed
    assert controller.metadata.feature_level(TV) == 1
    alter = dataclasses.replace(describe, operation=AclOperation.ALTER)
    r = await call(broker(controller, alter), 2, {"feature_updates": [tv(2)]})
    assert r.error_code == ErrorCode.none and controller.metadata.feature_level(TV) == 2


# ---------------------------------------------------------------- the brokers' supported levels
def registered(
    meta: ClusterMetadata, broker_id: int, supported: dict[str, tuple[int, int]] | None
) -> ClusterMetadata:
    meta.brokers[broker_id] = BrokerInfo(
        broker_id, "127.0.0.1", 9092 + broker_id, supported_features=supported
    )
    return meta


def test_an_upgrade_needs_every_registered_broker_to_support_the_level() -> None:
    meta = registered(registered(at(1), 1, {TV: (0, 2)}), 2, {TV: (0, 1)})
    refused, records = update(meta, [FeatureUpdate(TV, 2)])
    assert (
        refused == f"Invalid update version 2 for feature {TV}. Broker 2 only supports versions 0-1"
    )
    assert records == []
    # a dead (or draining) broker's registration counts too, as a fenced one does on Kafka: it
    # comes back with the code it registered with
    meta.brokers[2].state = "dead"
    assert update(meta, [FeatureUpdate(TV, 2)])[0] == refused
    # a broker that does not list the feature supports level 0 of it only
    registered(meta, 2, {})
    assert update(meta, [FeatureUpdate(TV, 2)])[0] == (
        f"Invalid update version 2 for feature {TV}. Broker 2 does not support this feature."
    )
    # the levels it supports pass: a downgrade, the current level, and 2 once it serves it
    registered(meta, 2, {TV: (0, 1)})
    assert update(meta, [FeatureUpdate(TV, 0, UNSAFE)]) == (
        None,
        [{"t": "feature", "name": TV, "level": 0}],
    )
    assert update(meta, [FeatureUpdate(TV, 1)]) == (None, [])
    registered(meta, 2, {TV: (0, 2)})
    assert update(meta, [FeatureUpdate(TV, 2)])[1] == [{"t": "feature", "name": TV, "level": 2}]
    # the controller's own range is checked first, as Kafka's
    assert "The controller only supports versions 0-2" in str(update(meta, [FeatureUpdate(TV, 3)]))


def test_a_registration_from_an_older_build_blocks_only_new_levels_above_1() -> None:
    """A broker registered by a build from before the ranges (no field) serves 0-1, which every
    build does, and the level finalized now: it never blocks the current level."""
    legacy = registered(at(1), 1, None)
    assert update(legacy, [FeatureUpdate(TV, 2)])[0] == (
        f"Invalid update version 2 for feature {TV}. Broker 1 only supports versions 0-1"
    )
    assert update(legacy, [FeatureUpdate(TV, 0, UNSAFE)])[0] is None
    assert registration_refused(legacy, legacy.brokers[1]) is None
    # a cluster already at 2 (raised before brokers registered ranges) keeps working: the
    # level stands, it can go down and back up to it
    legacy_at_2 = registered(at(2), 1, None)
    assert update(legacy_at_2, [FeatureUpdate(TV, 2)]) == (None, [])
    assert update(legacy_at_2, [FeatureUpdate(TV, 1, SAFE)])[0] is None
    assert registration_refused(legacy_at_2, legacy_at_2.brokers[1]) is None


def test_a_broker_cannot_register_at_a_finalized_level_it_does_not_support() -> None:
    old = BrokerInfo(3, "127.0.0.1", 9095, supported_features={TV: (0, 1)})
    assert registration_refused(at(2), old) == (
        f"Unable to register because the broker does not support finalized version 2 of {TV}. "
        "The broker wants a version between 0 and 1, inclusive."
    )
    assert registration_refused(at(1), old) is None
    # a feature the broker does not list: level 0 only (at level 1, the default, refused)
    assert registration_refused(
        ClusterMetadata("c"), dataclasses.replace(old, supported_features={})
    )
    assert registration_refused(at(0), dataclasses.replace(old, supported_features={})) is None
    # a feature only the broker knows is at 0 here: a range without 0 is refused, as on Kafka
    newer = dataclasses.replace(old, supported_features={TV: (0, 2), "share.version": (1, 1)})
    assert registration_refused(at(1), newer) == (
        "Unable to register because the broker does not support finalized version 0 of "
        "share.version. The broker wants a version between 1 and 1, inclusive."
    )


def test_supported_ranges_in_records_and_snapshots_and_their_absence() -> None:
    meta = registered(registered(at(1), 1, {TV: (0, 2)}), 2, None)
    # the broker record: "sf" when sent, absent for an older build's registration
    recs = [broker_record(meta.brokers[1]), broker_record(meta.brokers[2])]
    assert recs[0]["sf"] == {TV: [0, 2]} and "sf" not in recs[1]
    replayed = ClusterMetadata("c")
    for rec in recs:
        apply_record(replayed, rec, MetadataDelta())
    assert replayed.brokers[1].supported_features == {TV: (0, 2)}
    assert replayed.brokers[2].supported_features is None
    # a record written before the field (as older controllers wrote it) loads: no ranges
    older = {
        "t": "broker",
        "id": 4,
        "host": "h",
        "port": 1,
        "rack": None,
        "url": "",
        "inc": "x",
        "state": "alive",
    }
    apply_record(replayed, older, MetadataDelta())
    assert replayed.brokers[4].supported_features is None
    # both snapshot forms keep them beside the brokers, never in a broker's own document (a
    # reader older than the field builds BrokerInfo from every key it finds)
    doc = meta.to_json()
    assert all("supported_features" not in b for b in doc["brokers"].values())
    assert doc["broker_features"] == {"1": {TV: [0, 2]}}
    assert BrokerInfo.from_json(doc["brokers"]["1"]).supported_features is None
    for loaded in (ClusterMetadata.from_json(doc), snapshots.decode(snapshots.encode_bytes(meta))):
        assert loaded.brokers[1].supported_features == {TV: (0, 2)}
        assert loaded.brokers[2].supported_features is None
    # documents and snapshots from before the field load: every broker without ranges
    del doc["broker_features"]
    assert ClusterMetadata.from_json(doc).brokers[1].supported_features is None
    assert "broker_features" not in registered(at(1), 1, None).to_json()
    header, _, rest = snapshots.encode_bytes(meta).partition(b"\n")
    header_doc = json.loads(header)
    del header_doc["broker_features"]
    old_snapshot = json.dumps(header_doc).encode() + b"\n" + rest
    assert snapshots.decode(old_snapshot).brokers[1].supported_features is None


async def test_a_broker_supporting_less_blocks_the_upgrade_until_it_goes_or_serves_it(
    controller: Controller,
) -> None:
    def info(broker_id: int, incarnation: str, high: int) -> BrokerInfo:
        return BrokerInfo(
            broker_id,
            "127.0.0.1",
            9092 + broker_id,
            incarnation=incarnation,
            supported_features={TV: (0, high)},
        )

    await controller.register_broker(info(1, "a", 2), None)
    await controller.register_broker(info(2, "a", 1), None)
    assert controller.metadata.brokers[2].supported_features == {TV: (0, 1)}
    refused, _ = await controller.update_features([FeatureUpdate(TV, 2)])
    assert (
        refused == f"Invalid update version 2 for feature {TV}. Broker 2 only supports versions 0-1"
    )
    assert controller.metadata.feature_level(TV) == 1
    # broker 2 restarts running code that serves 2: the upgrade passes
    await controller.register_broker(info(2, "b", 2), None)
    refused, _ = await controller.update_features([FeatureUpdate(TV, 2)])
    assert refused is None and controller.metadata.feature_level(TV) == 2
    # a broker of the older code cannot join now; nothing of it is written
    version = controller.journal.committed_version
    with pytest.raises(
        UnsupportedFeatureLevel, match=r"finalized version 2 of transaction\.version"
    ):
        await controller.register_broker(info(3, "a", 1), None)
    assert 3 not in controller.metadata.brokers
    assert controller.journal.committed_version == version
    # back at 1, broker 3 joins and blocks the next upgrade until it is removed
    assert (await controller.update_features([FeatureUpdate(TV, 1, SAFE)]))[0] is None
    await controller.register_broker(info(3, "a", 1), None)
    assert "Broker 3 only supports versions 0-1" in str(
        await controller.update_features([FeatureUpdate(TV, 2)])
    )
    await controller.remove_broker(3, incarnation="a")
    assert (await controller.update_features([FeatureUpdate(TV, 2)]))[0] is None


async def test_the_ranges_and_the_refusal_travel_over_http(controller: Controller) -> None:
    token = "unit-test-cluster-token-" + "f" * 30
    server = ControllerServer(controller, ControlAuth([token]))
    await server.start("127.0.0.1", 0)
    client = HttpControllerClient(f"http://127.0.0.1:{server.port}", token=broker_token(token, 1))
    try:
        assert (await controller.update_features([FeatureUpdate(TV, 2)]))[0] is None
        old = BrokerInfo(1, "127.0.0.1", 9093, incarnation="a", supported_features={TV: (0, 1)})
        with pytest.raises(UnsupportedFeatureLevel) as refused:
            await client.register_broker(old, None)
        assert str(refused.value) == (
            f"Unable to register because the broker does not support finalized version 2 of "
            f"{TV}. The broker wants a version between 0 and 1, inclusive."
        )
        assert 1 not in controller.metadata.brokers
        await client.register_broker(
            dataclasses.replace(old, supported_features={TV: (0, 2)}), None
        )
        assert controller.metadata.brokers[1].supported_features == {TV: (0, 2)}
    finally:
        await client.close()
        await server.stop()


async def test_a_refused_broker_retries_with_one_line_per_attempt(
    controller: Controller, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker's own registration loop against a controller at a level its code does not
    serve: one warning line per attempt naming Kafka's reason, no traceback, not registered."""
    assert (await controller.update_features([FeatureUpdate(TV, 2)]))[0] is None
    monkeypatch.setattr(tidalmq_broker.broker, "SUPPORTED_FEATURES", {TV: (0, 1)})
    b = tidalmq_broker.broker.Broker(BrokerSettings(broker_id=5), apis=KAFKA_APIS)
    b.advertised = [Endpoint(PLAINTEXT, "127.0.0.1", 9097, PLAINTEXT)]
    b.controller = LocalControllerClient(controller)
    caplog.set_level(logging.WARNING, logger="tidalmq_broker.broker")

    def attempts() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "tidalmq_broker.broker"]

    registering = asyncio.create_task(b._register_until_done())
    try:
        for _ in range(500):
            if len(attempts()) >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        registering.cancel()
    assert len(attempts()) >= 2
    for record in attempts():
        line = record.getMessage()
        assert record.exc_info is None and "\n" not in line
        assert line.startswith(
            "registration with the controller failed (Unable to register because the broker "
            f"does not support finalized version 2 of {TV}. The broker wants a version between "
            "0 and 1, inclusive.); retrying in "
        ), line
    assert 5 not in controller.metadata.brokers
