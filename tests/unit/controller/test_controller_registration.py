"""Standby controllers register the feature levels they support with the active controller,
and a controller id gone for good is forgotten (docs/transactions-v2.md, "Which levels the
controllers support"; Kafka's ControllerRegistration, KIP-919, and `kafka-metadata-quorum
remove-controller`).

Before this, a standby registered only once it had led: a level could be finalized above what
it supports, and it then refused to lead at a failover; an id gone for good counted forever."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
from tidalmq_broker import cli
from tidalmq_controller import (
    Controller,
    ControllerError,
    ControllerServer,
    ControllerSettings,
    FeatureUpdate,
    HttpControllerClient,
    StandbyRegistration,
)
from tidalmq_controller._features import forget_controller, register_controller
from tidalmq_core import snapshots
from tidalmq_core.control_auth import ControlAuth
from tidalmq_core.metadata import SUPPORTED_FEATURES, TRANSACTION_VERSION, ClusterMetadata
from tidalmq_core.records import (
    MetadataDelta,
    apply_record,
    controller_record,
    epoch_record,
    forget_controller_record,
)

from tests.support.controllers import running_controller
from tests.support.waiting import eventually
from tests.unit.controller.test_controller_features import controller_on, older_build

SETTINGS = ControllerSettings(
    auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01, controller_id="a"
)
TV = TRANSACTION_VERSION
TOKEN = "unit-test-cluster-token-" + "c" * 30
OLDER = {TV: (0, 1)}  # what a standby of an older build supports


def test_a_registration_and_a_forget_are_epoch_records_at_the_current_epoch() -> None:
    """Both repeat the epoch the log is at (an older reader sets the epoch it has: it loads the
    log); the forget carries no `cid`, so a build that knows `cid` but not `forget` ignores it
    and keeps counting the id (it refuses more upgrades, never fewer)."""
    meta = ClusterMetadata("c")
    apply_record(meta, epoch_record(7, "a", SUPPORTED_FEATURES), MetadataDelta())
    rec = controller_record(7, "b", OLDER)
    assert rec == {"t": "epoch", "epoch": 7, "cid": "b", "sf": {TV: [0, 1]}}
    apply_record(meta, rec, MetadataDelta())
    assert meta.controller_epoch == 7
    assert meta.controllers == {"a": dict(SUPPORTED_FEATURES), "b": OLDER}
    gone = forget_controller_record(7, "b")
    assert gone == {"t": "epoch", "epoch": 7, "forget": "b"} and "cid" not in gone
    for _ in range(2):  # idempotent, as every record
        apply_record(meta, gone, MetadataDelta())
        assert meta.controller_epoch == 7 and meta.controllers == {"a": dict(SUPPORTED_FEATURES)}
    assert snapshots.decode(snapshots.encode_bytes(meta)).controllers == {
        "a": dict(SUPPORTED_FEATURES)
    }


def test_what_is_refused_and_what_writes_nothing() -> None:
    meta = ClusterMetadata("c", controller_epoch=4)
    meta.controllers = {"a": dict(SUPPORTED_FEATURES), "b": OLDER}
    # registered already with these ranges: nothing to write (a standby asks every interval)
    assert register_controller(meta, "a", "b", OLDER) == (None, [])
    assert register_controller(meta, "a", "b", {TV: (0, 2)}) == (
        None,
        [controller_record(4, "b", {TV: (0, 2)})],
    )
    assert register_controller(meta, "a", "c", {}) == (None, [controller_record(4, "c", {})])
    refused, records = register_controller(meta, "a", "a", OLDER)
    assert records == [] and refused is not None
    assert refused.startswith("controller id a is the active controller's") and "\n" not in refused
    assert register_controller(meta, "a", "a", dict(SUPPORTED_FEATURES)) == (None, [])
    assert register_controller(meta, "a", "", OLDER)[0] == "a controller registers with an id"
    assert register_controller(meta, "a", "d", {TV: (2, 1)})[0] == (
        f"a supported range of {TV} is lowest <= highest, from 0: 2-1"
    )
    assert forget_controller(meta, "a", "a") == (
        "controller a is the active controller: it cannot be forgotten",
        [],
    )
    assert forget_controller(meta, "a", "x") == (
        "no controller x is registered (registered: a, b)",
        [],
    )
    assert forget_controller(meta, "a", "b") == (None, [forget_controller_record(4, "b")])


@contextlib.asynccontextmanager
async def serving(controller: Controller) -> AsyncIterator[str]:
    """The controller's HTTP API (the cluster token only for the controllers' routes)."""
    server = ControllerServer(controller, ControlAuth([TOKEN]))
    await server.start("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


async def tidalmq(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str, *args: str
) -> tuple[int, str, str]:
    """`tidalmq controller ...` against the controller at `url`, off the event loop (the
    controller answers on it)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["controller", *args, "--controller-url", url, "--control-token-file", str(token_file)]
    code = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    return code, out, err


wait_for = partial(eventually, timeout_s=20.0, poll_s=0.05)  # this module's default wait


async def test_a_standby_that_never_led_blocks_a_level_it_lacks_and_then_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Controller a leads; b, a standby of a build supporting transaction.version 0-1, has
    never led but registered at its start. Raising the level to 2 is refused naming b, so
    when a stops, b takes the role. On the code before, the upgrade was accepted and b then
    refused to lead (UnsupportedFinalizedLevel): the cluster had no controller it could run."""
    async with running_controller(tmp_path, SETTINGS) as a, serving(a) as url:
        standby = StandbyRegistration(url, controller_id="b", token=TOKEN, supported_features=OLDER)
        try:
            assert await standby.register_once() is True
            assert await standby.register_once() is False  # registered already: no write
        finally:
            await standby.close()
        assert a.metadata.controllers["b"] == OLDER
        version = a.journal.committed_version
        refused, _ = await a.update_features([FeatureUpdate(TV, 2)])
        assert refused == (
            f"Invalid update version 2 for feature {TV}. Controller b only supports versions 0-1"
        )
        assert a.metadata.feature_level(TV) == 1 and a.journal.committed_version == version
    with monkeypatch.context() as older:
        older_build(older)
        b = controller_on(tmp_path, "b")
        await b.start()  # the failover: b serves the level the cluster is at
        try:
            assert b.metadata.feature_level(TV) == 1
        finally:
            await b.stop()


async def test_forget_unblocks_the_upgrade_and_refuses_the_active_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b registered as a standby and is gone for good: `tidalmq controller forget --id b`
    writes the forget record and UpdateFeatures no longer counts b. Forgetting the active
    controller, or an id not registered, is refused in one line, exit 1, nothing written."""
    async with running_controller(tmp_path, SETTINGS) as a, serving(a) as url:
        assert (await a.register_controller("b", OLDER)) == (a.journal.committed_version, True)
        assert "Controller b only supports" in str(
            (await a.update_features([FeatureUpdate(TV, 2)]))[0]
        )
        code, out, err = await tidalmq(capsys, tmp_path, url, "list")
        assert (code, err) == (0, "")
        assert out.splitlines() == [f"a: supports {TV} 0-2  (active)", f"b: supports {TV} 0-1"]
        version = a.journal.committed_version
        for who, why in (
            ("a", "controller a is the active controller: it cannot be forgotten"),
            ("x", "no controller x is registered (registered: a, b)"),
        ):
            code, out, err = await tidalmq(capsys, tmp_path, url, "forget", "--id", who)
            assert (code, out, err) == (1, "", f"error: {why}\n")
        assert a.journal.committed_version == version
        code, out, err = await tidalmq(capsys, tmp_path, url, "forget", "--id", "b")
        assert (code, err) == (0, "")
        assert out.splitlines() == [
            "controller b forgotten: its feature levels no longer count",
            f"a: supports {TV} 0-2  (active)",
        ]
        assert "b" not in a.metadata.controllers
        assert (await a.update_features([FeatureUpdate(TV, 2)]))[0] is None
        assert a.metadata.feature_level(TV) == 2
    # the forget is in the log: a controller loading it does not count b either
    async with running_controller(tmp_path, SETTINGS) as again:
        assert set(again.metadata.controllers) == {"a"}


async def test_a_running_standby_registers_again_when_it_finds_itself_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The standby's loop asks at start and every interval while it does not lead; the active
    controller writes only when the registration is missing, so a standby still running
    that was forgotten is registered again, and one that leads asks nothing."""
    caplog.set_level(logging.INFO, logger="tidalmq_controller._standby")
    async with running_controller(tmp_path, SETTINGS) as a, serving(a) as url:

        async def running(
            controller_id: str, leading: bool
        ) -> tuple[StandbyRegistration, asyncio.Task[None]]:
            standby = StandbyRegistration(
                url,
                controller_id=controller_id,
                token=TOKEN,
                supported_features=OLDER,
                interval_s=0.2,
            )
            return standby, asyncio.create_task(standby.run(lambda: leading))

        async def stopped(task: asyncio.Task[None]) -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        standby, task = await running("b", leading=False)
        try:
            # the standby counts a registration once its answer is back (the image has it
            # as soon as the record is proposed)
            await wait_for(lambda: standby.registrations == 1)
            await a.forget_controller("b")  # `tidalmq controller forget --id b`
            await wait_for(lambda: standby.registrations == 2)
            assert a.metadata.controllers["b"] == OLDER
            assert any("registered again" in r.getMessage() for r in caplog.records)
        finally:
            await stopped(task)
        # c leads (elsewhere): it registers by claiming the log, and asks nothing
        leader, task = await running("c", leading=True)
        try:
            await asyncio.sleep(1.0)  # five intervals: no attempt may register it
            assert "c" not in a.metadata.controllers and leader.registrations == 0
        finally:
            await stopped(task)


async def test_a_standby_refused_or_unreachable_logs_once_and_keeps_trying(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A standby sharing the active controller's id with other ranges is refused (one line,
    not repeated while the reason stays); an unreachable controller is a ControllerError too."""
    caplog.set_level(logging.WARNING, logger="tidalmq_controller._standby")
    async with running_controller(tmp_path, SETTINGS) as a, serving(a) as url:
        for where, why in ((url, "is the active controller's"), ("http://127.0.0.1:1", "unreach")):
            once = StandbyRegistration(
                where, controller_id="a", token=TOKEN, supported_features=OLDER
            )
            try:
                with pytest.raises(ControllerError, match=why):
                    await once.register_once()
            finally:
                await once.close()
        client = HttpControllerClient(url, token=TOKEN)
        try:  # a malformed range is a fault the standby can log, not a bare 400
            with pytest.raises(ControllerError, match="bad registration"):
                await client._call(
                    "/v1/controllers/register", {"id": "b", "supported_features": {TV: [1]}}
                )
        finally:
            await client.close()
        standby = StandbyRegistration(
            url, controller_id="a", token=TOKEN, supported_features=OLDER, interval_s=0.1
        )
        task = asyncio.create_task(standby.run(lambda: False))
        try:
            await asyncio.sleep(1.0)  # about ten attempts
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "is the active controller's" in lines[0], lines
        assert a.metadata.controllers["a"] == dict(SUPPORTED_FEATURES)
