"""A Topic's configs through the operator's topic handler to the controller: every config the
CRD offers (in the types its schema gives them) reaches the topic as the broker's text, and a
value the schema cannot refuse (a string of digits out of range, the compaction lags crossed)
becomes an InvalidSpec refusal on the resource (kopf's PermanentError: an Error condition), not
a crash, with the topic left as it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from tidalmq_controller import Controller, ControllerSettings
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.metadata import BrokerInfo
from tidalmq_core.topics import TOPIC_CONFIG_DEFS
from tidalmq_operator.handlers import reconcile_topic
from tidalmq_operator.runtime import TopicWish

from tests.support.fake_broker import FakeBroker

SETTINGS = ControllerSettings(auto_rebalance=False, offsets_topic_partitions=1, tick_s=0.01)

# A value other than Kafka's default for each config the Topic CRD offers, as its YAML holds it
TYPED: dict[str, Any] = {
    "segment.bytes": 2097152,
    "segment.ms": "3600000",
    "segment.jitter.ms": 10,
    "segment.index.bytes": 4096,
    "flush.messages": 1000,
    "flush.ms": 1000,
    "retention.bytes": -1,
    "retention.ms": 86400000,
    "max.message.bytes": 2000000,
    "index.interval.bytes": 8192,
    "delete.retention.ms": 3600000,
    "min.compaction.lag.ms": 10,
    "max.compaction.lag.ms": 600000,
    "file.delete.delay.ms": 0,
    "min.cleanable.dirty.ratio": 0.25,
    "cleanup.policy": "compact,delete",
    "unclean.leader.election.enable": False,
    "min.insync.replicas": 1,
    "compression.type": "producer",
    "compression.gzip.level": -1,
    "compression.lz4.level": 10,
    "compression.zstd.level": -5,
    "preallocate": True,
    "message.timestamp.type": "LogAppendTime",
    "message.timestamp.before.max.ms": 60000,
    "message.timestamp.after.max.ms": 60000,
    "leader.replication.throttled.replicas": "*",
    "follower.replication.throttled.replicas": "0:1,1:2",
    "remote.storage.enable": False,
    "local.retention.ms": -2,
    "local.retention.bytes": 1000,
    "remote.log.copy.disable": True,
    "remote.log.delete.on.disable": False,
}
AS_KAFKA_TEXT = {
    name: str(v).lower() if isinstance(v, bool) else str(v) for name, v in TYPED.items()
}


class FakeRuntime:
    """What reconcile_topic uses of the OperatorRuntime."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.topics: dict[str, TopicWish] = {}
        self.published = 0

    def require_controller(self) -> Controller:
        return self.controller

    async def publish(self) -> None:
        self.published += 1


@pytest.fixture
async def rt() -> AsyncIterator[FakeRuntime]:
    c = Controller(MemoryMetadataLog(), SETTINGS)
    await c.start()
    await c.register_broker(BrokerInfo(1, "127.0.0.1", 9001), FakeBroker(c, 1))
    yield FakeRuntime(c)
    await c.stop()


async def reconcile(rt: FakeRuntime, configs: dict[str, Any], generation: int) -> None:
    spec = {"partitions": 1, "configs": configs}
    meta = {"generation": generation, "uid": "uid-orders"}
    await reconcile_topic(spec=spec, name="orders", meta=meta, memo={"runtime": rt})


def test_the_cases_are_every_offered_config() -> None:
    assert list(TYPED) == [d.name for d in TOPIC_CONFIG_DEFS if not d.internal]


async def test_every_config_reaches_the_topic_as_kafka_text(rt: FakeRuntime) -> None:
    await reconcile(rt, TYPED, generation=1)
    assert rt.topics["orders"].error is None
    assert rt.controller.metadata.topics["orders"].configs == AS_KAFKA_TEXT
    # a change of one of them is applied (replacing the configs, as the spec says)
    await reconcile(rt, {**TYPED, "preallocate": False, "retention.ms": -1}, generation=2)
    configs = rt.controller.metadata.topics["orders"].configs
    assert configs["preallocate"] == "false" and configs["retention.ms"] == "-1"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"segment.bytes": "4096"}, "Value must be at least 1048576"),
        ({"segment.ms": str(2**63)}, "Not a number of type LONG"),
        ({"compression.gzip.level": 0}, "between 1 and 9 or equal to -1"),
        ({"min.compaction.lag.ms": 700000}, "conflict topic config setting"),
        ({"unclean.leader.election.enable": True}, "TidalMQ takes only false"),
        ({"remote.storage.enable": True}, "Tiered Storage functionality is disabled"),
    ],
)
async def test_a_refused_value_is_an_invalid_spec_not_a_crash(
    rt: FakeRuntime, bad: dict[str, Any], message: str
) -> None:
    await reconcile(rt, TYPED, generation=1)
    with pytest.raises(kopf.PermanentError, match=message):
        await reconcile(rt, {**TYPED, **bad}, generation=2)
    wish = rt.topics["orders"]
    assert wish.error is not None and wish.error[0] == "InvalidSpec" and message in wish.error[1]
    assert wish.generation == 2
    assert rt.controller.metadata.topics["orders"].configs == AS_KAFKA_TEXT  # left as it was
