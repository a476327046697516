"""UpdateFeatures (`kafka-features upgrade|downgrade`): the controller's rules (Kafka's
FeatureControlManager), the `feature` record it commits and keeps across a restart, and the
broker's answer at each version through kio, as the Java admin client reads it
(docs/transactions-v2.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.registry import REGISTRY, supported_versions
from tidalmq_broker.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerSettings,
    FeatureUpdate,
    LocalControllerClient,
    ObjectStoreMetadataLog,
    UpgradeType,
)
from tidalmq_controller._features import update
from tidalmq_core.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
from tidalmq_core.metadata import TRANSACTION_VERSION, ClusterMetadata

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
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), SETTINGS)
    await c.start()
    yield c
    await c.stop()


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
        ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:bob", "*",
        AclOperation.DESCRIBE, PermissionType.ALLOW,
    )  # fmt: skip
    r = await call(broker(controller, describe), 2, {"feature_updates": [tv(2)]})
    assert r.error_code == ErrorCode.cluster_authorization_failed
    assert controller.metadata.feature_level(TV) == 1
    alter = dataclasses.replace(describe, operation=AclOperation.ALTER)
    r = await call(broker(controller, alter), 2, {"feature_updates": [tv(2)]})
    assert r.error_code == ErrorCode.none and controller.metadata.feature_level(TV) == 2
