"""The feature levels controllers support (docs/transactions-v2.md, "Which levels the
controllers support"): each controller registers them when it claims the log (its `epoch`
record), UpdateFeatures refuses a level some registered controller does not support (as Kafka's
QuorumFeatures does for every controller of the quorum), and a controller whose code does not
support a finalized level refuses to take the role without deposing the one that leads, in one
line, also when it is a broker's embedded controller."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tidalmq_controller._controller
import tidalmq_controller._features
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerSettings,
    FeatureUpdate,
    ObjectStoreMetadataLog,
    UnsupportedFinalizedLevel,
)
from tidalmq_controller._features import update
from tidalmq_core import snapshots
from tidalmq_core.metadata import TRANSACTION_VERSION, ClusterMetadata
from tidalmq_core.records import MetadataDelta, apply_record, epoch_record, feature_record

from tests.support.controllers import running_controller

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)
TV = TRANSACTION_VERSION


def controller_on(tmp_path: Path, controller_id: str) -> Controller:
    store = LocalDirObjectStore(tmp_path / "objects")
    return Controller(
        ObjectStoreMetadataLog(store), dataclasses.replace(SETTINGS, controller_id=controller_id)
    )


def older_build(monkeypatch: pytest.MonkeyPatch, high: int = 1) -> None:
    """This process runs as a build whose code supports transaction.version 0..high only."""
    for module in (tidalmq_controller._controller, tidalmq_controller._features):
        monkeypatch.setattr(module, "SUPPORTED_FEATURES", {TV: (0, high)})


def with_controllers(level: int, **controllers: dict[str, tuple[int, int]]) -> ClusterMetadata:
    meta = ClusterMetadata("c", version=5)
    meta.features[TV] = level
    meta.controllers = dict(controllers)
    return meta


def test_an_upgrade_needs_every_registered_controller_to_support_the_level() -> None:
    meta = with_controllers(1, a={TV: (0, 2)}, b={TV: (0, 1)}, c={})
    refused, records = update(meta, [FeatureUpdate(TV, 2)])
    assert refused == (
        f"Invalid update version 2 for feature {TV}. Controller b only supports versions 0-1"
    )
    assert records == []
    del meta.controllers["b"]
    refused, _ = update(meta, [FeatureUpdate(TV, 1 + 1)])
    assert (
        refused
        == f"Invalid update version 2 for feature {TV}. Controller c does not support this feature."
    )
    del meta.controllers["c"]
    assert update(meta, [FeatureUpdate(TV, 2)]) == (None, [feature_record(TV, 2)])
    # levels every controller supports stay allowed, whatever the others do
    low = with_controllers(1, b={TV: (0, 1)})
    assert update(low, [FeatureUpdate(TV, 0, 2)]) == (None, [feature_record(TV, 0)])


def test_the_registration_in_epoch_records_and_snapshots_and_its_absence() -> None:
    rec = epoch_record(7, "operator", {TV: (0, 2)})
    assert rec == {"t": "epoch", "epoch": 7, "cid": "operator", "sf": {TV: [0, 2]}}
    meta = ClusterMetadata("c")
    apply_record(meta, rec, MetadataDelta())
    assert meta.controller_epoch == 7 and meta.controllers == {"operator": {TV: (0, 2)}}
    # a later claim by the same controller replaces its registration; an older build's claim
    # (no id) registers nothing and leaves the others
    apply_record(meta, epoch_record(8, "operator", {TV: (0, 1)}), MetadataDelta())
    apply_record(meta, epoch_record(9), MetadataDelta())
    assert meta.controller_epoch == 9 and meta.controllers == {"operator": {TV: (0, 1)}}
    doc = meta.to_json()
    assert doc["controller_features"] == {"operator": {TV: [0, 1]}}
    for loaded in (ClusterMetadata.from_json(doc), snapshots.decode(snapshots.encode_bytes(meta))):
        assert loaded.controllers == {"operator": {TV: (0, 1)}}
    # documents and snapshots from before it load with none; none registered writes no key
    del doc["controller_features"]
    assert ClusterMetadata.from_json(doc).controllers == {}
    assert "controller_features" not in ClusterMetadata("c").to_json()
    header, _, rest = snapshots.encode_bytes(meta).partition(b"\n")
    header_doc = json.loads(header)
    del header_doc["controller_features"]
    assert snapshots.decode(json.dumps(header_doc).encode() + b"\n" + rest).controllers == {}


async def test_each_controller_registers_its_levels_when_it_claims_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller of an older build that led once (a standby of another build at a
    failover) blocks the upgrade, named, until it claims the log again with a build that
    supports the level."""
    async with running_controller(tmp_path, dataclasses.replace(SETTINGS, controller_id="a")) as a:
        assert a.metadata.controllers == {"a": {TV: (0, 2)}}
    with monkeypatch.context() as older:
        older_build(older)
        b = controller_on(tmp_path, "b")
        await b.start()
        await b.stop()
    a = controller_on(tmp_path, "a")
    await a.start()
    try:
        assert a.metadata.controllers == {"a": {TV: (0, 2)}, "b": {TV: (0, 1)}}
        version = a.journal.committed_version
        refused, _ = await a.update_features([FeatureUpdate(TV, 2)])
        assert refused == (
            f"Invalid update version 2 for feature {TV}. Controller b only supports versions 0-1"
        )
        assert a.metadata.feature_level(TV) == 1 and a.journal.committed_version == version
    finally:
        await a.stop()
    b = controller_on(tmp_path, "b")  # b again, now on this build
    await b.start()
    try:
        assert b.metadata.controllers["b"] == {TV: (0, 2)}
        refused, _ = await b.update_features([FeatureUpdate(TV, 2)])
        assert refused is None and b.metadata.feature_level(TV) == 2
    finally:
        await b.stop()


async def test_a_controller_does_not_take_the_role_at_a_level_it_does_not_support(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At level 2, a controller of a build supporting 0-1 refuses to start with one line
    naming the level, and claims nothing: the controller leading meanwhile keeps its role."""
    async with running_controller(tmp_path, dataclasses.replace(SETTINGS, controller_id="a")) as a:
        assert (await a.update_features([FeatureUpdate(TV, 2)]))[0] is None
        epoch = a.metadata.controller_epoch
        with monkeypatch.context() as older:
            older_build(older)
            standby = controller_on(tmp_path, "b")
            with pytest.raises(UnsupportedFinalizedLevel) as refused:
                await standby.start()
        why = str(refused.value)
        assert "\n" not in why
        assert why.startswith(
            f"the cluster's finalized version 2 of feature {TV} is not supported by this "
            "controller (it supports 0-1): it does not take the controller role"
        ), why
        # nothing claimed: the leading controller still commits, at its epoch
        assert (await a.update_features([FeatureUpdate(TV, 1, 2)]))[0] is None
        assert a.metadata.controller_epoch == epoch and a.metadata.feature_level(TV) == 1
        assert "b" not in a.metadata.controllers


async def write_level(tmp_path: Path, level: int) -> None:
    """A cluster whose metadata a newer build finalized at `level` (above this build's)."""
    async with running_controller(tmp_path, SETTINGS) as c:
        await c.commit([feature_record(TV, level)])


def test_a_broker_with_an_embedded_controller_says_it_in_one_line(tmp_path: Path) -> None:
    """`tidalmq broker` hosting the controller, on a log finalized at a level above this
    build's: exit code 1 and one line on stderr, no traceback."""
    asyncio.run(write_level(tmp_path, 3))
    env = {**os.environ, "TIDALMQ_LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "broker",
            "--broker-id",
            "1",
            "--storage-url",
            f"file://{tmp_path / 'objects'}",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--http-port",
            "0",
            "--control-port",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"tidalmq broker 1: cannot start: the cluster's finalized version 3 of feature {TV} is "
        "not supported by this controller (it supports 0-2): it does not take the controller "
        "role; run a build that supports it, or lower the level first (kafka-features "
        "downgrade) with one"
    ], done.stderr
