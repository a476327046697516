"""AlterUserScramCredentials through the controller, validated as Kafka's controller does
(ScramControlManager), committed to the metadata log, pushed to brokers; and the bootstrap users."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import (
    Controller,
    ControllerSettings,
    ObjectStoreMetadataLog,
    ScramAlterResult,
    ScramDeletion,
    ScramUpsertion,
    parse_bootstrap,
)
from tidalmq_controller._scram_credentials import alter, bootstrap
from tidalmq_core import scram
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata

from tests.support.controllers import running_controller
from tests.support.fake_broker import FakeBroker

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)
SHA256, SHA512 = scram.SCRAM_SHA_256.type, scram.SCRAM_SHA_512.type
DUPLICATE = (92, "A user credential cannot be altered twice in the same request")


def upsert(name: str, mech: int = SHA512, iterations: int = 4096, pw: str = "pw") -> ScramUpsertion:
    hash_name = scram.BY_TYPE[mech].hash if mech in scram.BY_TYPE else "sha256"
    salted = scram.hi(pw.encode(), b"salt-" + name.encode(), iterations, hash_name)
    return ScramUpsertion(name, mech, iterations, b"salt-" + name.encode(), salted)


def errors(results: list[ScramAlterResult]) -> dict[str, tuple[int, str | None]]:
    return {r.user: (r.error_code, r.error_message) for r in results}


def test_validation_as_kafka_controller() -> None:
    image = ClusterMetadata("c")
    existing = {"SCRAM-SHA-256": scram.new_credential(scram.SCRAM_SHA_256, "x")}
    existing512 = {"SCRAM-SHA-512": scram.new_credential(scram.SCRAM_SHA_512, "x")}
    image.scram_credentials = {"old": existing, "twice": existing512}
    results, records = alter(
        image,
        [
            ScramDeletion("old", SHA256),
            ScramDeletion("ghost", SHA512),
            ScramDeletion("", SHA512),
            ScramDeletion("twice", SHA512),
            ScramDeletion("twice", SHA512),
        ],
        [
            upsert("alice"),
            upsert("bob", SHA256, 16384),
            upsert("few", iterations=4095),
            upsert("many", iterations=16385),
            upsert("weird", mech=0),
            upsert("old"),
            upsert("carol"),
            upsert("carol", SHA256),
        ],
    )
    assert errors(results) == {
        "alice": (0, None),
        "bob": (0, None),
        "ghost": (91, "Attempt to delete a user credential that does not exist"),
        "": (93, "Username must not be empty"),
        "twice": DUPLICATE,
        "few": (93, "Too few iterations"),
        "many": (93, "Too many iterations"),
        "weird": (33, "Unknown SCRAM mechanism"),
        # a user altered twice in one request: both alterations dropped, as Kafka does (so
        # kafka-configs sets two mechanisms of one user in two calls)
        "old": DUPLICATE,
        "carol": DUPLICATE,
    }
    assert [(r["t"], r["user"], r["mech"]) for r in records] == [
        ("scram", "alice", "SCRAM-SHA-512"),
        ("scram", "bob", "SCRAM-SHA-256"),
    ]
    # the keys come from the salted password: the password "pw" checks against them
    cred = scram.ScramCredential.from_json(records[0]["cred"])
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, "pw")
    assert cred.iterations == 4096 and cred.salt == b"salt-alice"


def test_bootstrap_entries_and_only_absent_credentials() -> None:
    users = parse_bootstrap("admin:SCRAM-SHA-512:pa:ss,word\n\n# comment\nadmin:scram-sha-256:x")
    assert [(u.user, u.mechanism, u.password) for u in users] == [
        ("admin", "SCRAM-SHA-512", "pa:ss,word"),
        ("admin", "SCRAM-SHA-256", "x"),
    ]
    assert "pa:ss" not in repr(users)
    for bad in ("admin:SCRAM-SHA-512", "admin::pw", ":SCRAM-SHA-512:pw", "a:SCRAM-SHA-1:pw"):
        with pytest.raises(ValueError, match="scram bootstrap entry 1"):
            parse_bootstrap(bad)
    image = ClusterMetadata("c")
    image.scram_credentials = {
        "admin": {"SCRAM-SHA-256": scram.new_credential(scram.SCRAM_SHA_256, "y")}
    }
    records = bootstrap(image, users)
    assert [(r["user"], r["mech"]) for r in records] == [("admin", "SCRAM-SHA-512")]
    cred = scram.ScramCredential.from_json(records[0]["cred"])
    assert scram.password_matches(scram.SCRAM_SHA_512, cred, "pa:ss,word")


def test_bootstrap_file(tmp_path: Path) -> None:
    f = tmp_path / "users"
    f.write_text("ops:SCRAM-SHA-256:secret\n")
    users = parse_bootstrap("", str(f))
    assert [(u.user, u.mechanism) for u in users] == [("ops", "SCRAM-SHA-256")]
    with pytest.raises(ValueError, match="scram bootstrap file"):
        parse_bootstrap("", str(tmp_path / "missing"))


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    async with running_controller(tmp_path, SETTINGS) as c:
        yield c


async def test_committed_pushed_and_kept_across_a_controller_restart(
    controller: Controller, tmp_path: Path
) -> None:
    broker = FakeBroker(controller, 1)
    await controller.register_broker(BrokerInfo(1, "127.0.0.1", 9001), broker)
    created = await controller.bootstrap_scram_credentials(parse_bootstrap("admin:SCRAM-SHA-512:a"))
    assert created == ["admin:SCRAM-SHA-512"]
    assert (
        await controller.bootstrap_scram_credentials(parse_bootstrap("admin:SCRAM-SHA-512:b")) == []
    )
    results, version = await controller.alter_scram_credentials([], [upsert("alice")])
    assert errors(results) == {"alice": (0, None)}
    assert version == controller.journal.committed_version
    for _ in range(500):
        if "alice" in broker.image.scram_credentials:
            break
        await asyncio.sleep(0.01)
    assert set(broker.image.scram_credentials) == {"admin", "alice"}
    results, _ = await controller.alter_scram_credentials([ScramDeletion("alice", SHA512)], [])
    assert errors(results) == {"alice": (0, None)}
    await controller.stop()
    again = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), SETTINGS)
    await again.start()
    try:
        creds = again.metadata.scram_credentials
        assert set(creds) == {"admin"}
        # the first password stayed: a bootstrap never overwrites a credential
        assert scram.password_matches(scram.SCRAM_SHA_512, creds["admin"]["SCRAM-SHA-512"], "a")
    finally:
        await again.stop()
