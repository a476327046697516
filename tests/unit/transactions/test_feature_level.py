"""The cluster's `transaction.version` feature (docs/transactions-v2.md): a controller setting
kept in the cluster metadata, and what ApiVersions answers about it at each version, through
the wire codec (what a Java client reads to decide whether it runs transaction version 2)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from tidalmq_broker.apis.api_versions import handle_api_versions
from tidalmq_broker.protocol.codec import Request, decode_response, encode_response
from tidalmq_controller._settings import ControllerSettings
from tidalmq_core import snapshots
from tidalmq_core.metadata import TRANSACTION_VERSION, ClusterMetadata
from tidalmq_core.records import MetadataDelta, apply_record, feature_record


async def api_versions(meta: ClusterMetadata, version: int) -> Any:
    request = Request(18, version, 7, "c", None, 0)
    body = await handle_api_versions(SimpleNamespace(metadata=meta), request, None)  # type: ignore[arg-type]
    _, decoded = decode_response(18, version, encode_response(18, version, 7, body)[4:])
    return decoded


def test_the_level_defaults_to_1_and_a_record_sets_it() -> None:
    meta = ClusterMetadata("c", version=3)
    assert meta.feature_level(TRANSACTION_VERSION) == 1
    assert "features" not in meta.to_json()  # a level-1 cluster's metadata is as before
    apply_record(meta, feature_record(TRANSACTION_VERSION, 2), MetadataDelta())
    assert meta.feature_level(TRANSACTION_VERSION) == 2
    assert ClusterMetadata.from_json(meta.to_json()).feature_level(TRANSACTION_VERSION) == 2
    # brokers catch up from snapshots too: the level must survive one
    assert snapshots.decode(snapshots.encode_bytes(meta)).feature_level(TRANSACTION_VERSION) == 2
    with pytest.raises(ValueError):
        ControllerSettings(transaction_version=3)


@pytest.mark.parametrize("level", [1, 2])
async def test_api_versions_v3_answers_the_finalized_level(level: int) -> None:
    meta = ClusterMetadata("c", version=12)
    meta.features[TRANSACTION_VERSION] = level
    r = await api_versions(meta, 3)
    assert [(f.name, f.min_version_level, f.max_version_level) for f in r.finalized_features] == [
        (TRANSACTION_VERSION, level, level)
    ]
    assert r.finalized_features_epoch == 12
    # as Kafka below v4: a feature supported from level 0 is left out (KAFKA-17492)
    assert r.supported_features == ()
    v2 = await api_versions(meta, 2)  # no features before v3
    assert [(k.api_key, k.max_version) for k in v2.api_keys] == [
        (k.api_key, k.max_version) for k in r.api_keys
    ]


async def test_api_versions_v4_lists_the_features_supported_from_level_0() -> None:
    """KIP-1022: from v4 a supported feature whose lowest level is 0 is listed (what
    `kafka-features describe` prints), with the same finalized level and epoch as v3."""
    meta = ClusterMetadata("c", version=12)
    r = await api_versions(meta, 4)
    assert [(f.name, f.min_version, f.max_version) for f in r.supported_features] == [
        (TRANSACTION_VERSION, 0, 2)
    ]
    assert [(f.name, f.max_version_level) for f in r.finalized_features] == [
        (TRANSACTION_VERSION, 1)
    ]
    assert r.finalized_features_epoch == 12
    assert (18, 0, 4) in [(k.api_key, k.min_version, k.max_version) for k in r.api_keys]
    assert (57, 0, 2) in [(k.api_key, k.min_version, k.max_version) for k in r.api_keys]
