"""Produce appends held through a partition's handover (handover.py, [L1] item 4): tried again
in arrival order when their partition changes, held again in their places while it is still
handed over, answered with the error they were held on past their wait and never started
afterwards; and the produce handler's hold (apis/produce.py `_hold`): started when the partition
opens here, answered NOT_LEADER_OR_FOLLOWER once the image names another leader."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.produce import _hold, _result
from tidalmq_broker.handover import Handovers
from tidalmq_broker.metrics import HANDOVER_HOLDS
from tidalmq_broker.partitions import NotLeader, PartitionOpening
from tidalmq_broker.storage.api import Acknowledgement, AppendResult
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta

TP = TopicPartition("orders", 0)
OTHER = TopicPartition("orders", 1)


def count(broker: int, outcome: str) -> float:
    return float(HANDOVER_HOLDS.labels(str(broker), outcome)._value.get())


class Held:
    """A held append that settles on its `ready`-th try; records its tries and its expiry."""

    def __init__(self, name: str, log: list[str], ready: int = 1) -> None:
        self.name, self.log, self.ready, self.tries = name, log, ready, 0

    def retry(self) -> bool:
        self.tries += 1
        if self.tries >= self.ready:
            self.log.append(self.name)
            return True
        return False

    def expire(self) -> None:
        self.log.append(f"{self.name} expired")


async def test_held_appends_are_tried_again_in_arrival_order() -> None:
    handovers, log = Handovers(9001), []
    for name in ("a", "b", "c"):
        h = Held(name, log)
        handovers.hold(TP, h.retry, h.expire, 5.0)
    other = Held("x", log)
    handovers.hold(OTHER, other.retry, other.expire, 5.0)
    assert handovers.holding(TP) and handovers.held() == 4
    handovers.changed(TP)
    assert log == ["a", "b", "c"]
    assert not handovers.holding(TP) and handovers.holding(OTHER)


async def test_one_still_handed_over_keeps_itself_and_every_later_one_in_place() -> None:
    handovers, log = Handovers(9002), []
    first, second = Held("a", log, ready=2), Held("b", log)
    handovers.hold(TP, first.retry, first.expire, 5.0)
    handovers.hold(TP, second.retry, second.expire, 5.0)
    handovers.changed(TP)
    # a is still in its handover: b, although ready, must not go before it
    assert log == [] and second.tries == 0 and handovers.held() == 2
    late = Held("c", log)
    handovers.hold(TP, late.retry, late.expire, 5.0)  # arrives meanwhile: behind them
    handovers.changed(TP)
    assert log == ["a", "b", "c"]
    assert not handovers.holding(TP)


async def test_past_its_wait_a_held_append_gets_its_error_and_is_never_started() -> None:
    handovers, log = Handovers(9003), []
    h = Held("a", log)
    before = count(9003, "timed_out")
    handovers.hold(TP, h.retry, h.expire, 0.02)
    await asyncio.sleep(0.06)
    assert log == ["a expired"] and not handovers.holding(TP)
    handovers.changed(TP)  # the partition opens after all: nothing to start
    assert log == ["a expired"] and h.tries == 0
    assert count(9003, "timed_out") == before + 1


async def test_a_metadata_delta_wakes_the_partitions_it_names_only() -> None:
    handovers, log = Handovers(9004), []
    a, b = Held("a", log), Held("b", log)
    handovers.hold(TP, a.retry, a.expire, 5.0)
    handovers.hold(TopicPartition("payments", 3), b.retry, b.expire, 5.0)
    handovers.metadata_changed(MetadataDelta(partitions={OTHER}))
    assert log == []
    handovers.metadata_changed(MetadataDelta(partitions={TP}))
    assert log == ["a"]
    handovers.metadata_changed(MetadataDelta(topics={"payments"}))  # a changed topic: all of it
    assert log == ["a", "b"]


async def test_a_stopping_broker_answers_every_held_append_at_once() -> None:
    handovers, log = Handovers(9005), []
    for name in ("a", "b"):
        h = Held(name, log)
        handovers.hold(TP, h.retry, h.expire, 5.0)
    handovers.release_all()
    assert log == ["a expired", "b expired"] and handovers.held() == 0


# ------------------------------------------------------------------ the produce handler's hold
OFFSETS = AppendResult(41, 41, -1, 0)


class Partitions:
    """get_log as a broker's PartitionManager answers it: `state` says what it raises now."""

    def __init__(self) -> None:
        self.state: BaseException | None = PartitionOpening(f"{TP} is opening on this broker")
        self.appended: list[bytes] = []
        self.flush: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def get_log(self, tp: TopicPartition) -> Any:
        if self.state is not None:
            raise self.state
        return self

    def start_append(self, data: bytes, **_: Any) -> Acknowledgement:
        self.appended.append(bytes(data))
        return Acknowledgement(OFFSETS, self.flush)


def broker(broker_id: int, leader: int) -> Any:
    topic = TopicInfo("orders", "t-1", [PartitionState(leader, 4, [leader])])
    return SimpleNamespace(
        metadata=ClusterMetadata("c", topics={"orders": topic}),
        partitions=Partitions(),
        handovers=Handovers(broker_id),
    )


async def test_an_append_held_while_its_partition_opens_is_started_when_it_opens() -> None:
    b = broker(9006, leader=9006)
    before = count(9006, "served")
    answer = _hold(b, TP, 5.0, PartitionOpening("opening"), b"batch", -1, None, 9, None)
    b.handovers.changed(TP)  # a metadata change, still opening: held again
    assert not answer.done() and b.partitions.appended == []
    b.partitions.state = None  # opened
    b.handovers.changed(TP)
    assert b.partitions.appended == [b"batch"]
    assert not answer.done()  # the WAL flush is not done yet
    b.partitions.flush.set_result(None)
    await asyncio.sleep(0)
    assert _result(answer) == OFFSETS
    assert count(9006, "served") == before + 1


async def test_an_append_held_while_leaderless_is_redirected_once_a_leader_is_named() -> None:
    b = broker(9007, leader=NO_LEADER)
    b.partitions.state = NotLeader(f"{TP} is led by another broker")
    before = count(9007, "redirected")
    answer = _hold(b, TP, 5.0, b.partitions.state, b"batch", -1, None, 10, None)
    b.handovers.changed(TP)  # still no leader in the image
    assert not answer.done()
    b.metadata.topics["orders"].partitions[0] = PartitionState(2, 5, [2])  # the target, elected
    b.handovers.metadata_changed(MetadataDelta(partitions={TP}))
    assert isinstance(_result(answer), NotLeader)  # the response names broker 2 (KIP-951)
    assert b.partitions.appended == []
    assert count(9007, "redirected") == before + 1


async def test_a_held_append_past_its_wait_is_answered_the_error_it_was_held_on() -> None:
    b = broker(9008, leader=9008)
    answer = _hold(b, TP, 0.02, PartitionOpening("opening"), b"batch", -1, None, 9, None)
    await asyncio.sleep(0.06)
    assert isinstance(_result(answer), PartitionOpening)  # LEADER_NOT_AVAILABLE, as before
    b.partitions.state = None
    b.handovers.changed(TP)
    assert b.partitions.appended == []  # never started after it was answered


@pytest.mark.parametrize("leader", [NO_LEADER, 2])
async def test_only_a_leaderless_partition_is_waited_for(leader: int) -> None:
    from tidalmq_broker.apis.produce import _handing_over

    b = broker(9009, leader=leader)
    assert _handing_over(b, TP, NotLeader("x")) is (leader == NO_LEADER)
    assert _handing_over(b, TP, PartitionOpening("x"))
    assert not _handing_over(b, TopicPartition("orders", 7), NotLeader("x"))  # no such partition
    assert not _handing_over(b, TopicPartition("gone", 0), NotLeader("x"))


async def test_an_expired_hold_nobody_reads_is_not_reported_as_never_retrieved() -> None:
    """The request of a held partition may be cancelled (its connection closed) and never read
    its answer: its expiry's error must not end up in the loop's 'never retrieved' log."""
    import gc

    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        b = broker(9010, leader=9010)
        answer = _hold(b, TP, 0.01, PartitionOpening("opening"), b"batch", -1, None, 9, None)
        await asyncio.sleep(0.05)
        assert answer.done()
        del answer
        gc.collect()
        assert reported == []
    finally:
        loop.set_exception_handler(None)


# ------------------------------------------------------------------ the produce handler
class TwoPartitions:
    """get_log for TP (in a handover while `handing_over`) and OTHER (serving here)."""

    def __init__(self) -> None:
        self.handing_over: BaseException | None = PartitionOpening(f"{TP} is opening here")
        self.appended: dict[TopicPartition, list[bytes]] = {TP: [], OTHER: []}
        self.flush: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.flush.set_result(None)

    def get_log(self, tp: TopicPartition) -> Any:
        if tp == TP and self.handing_over is not None:
            raise self.handing_over
        return SimpleNamespace(tp=tp, start_append=lambda data, **_: self._append(tp, data))

    def _append(self, tp: TopicPartition, data: bytes) -> Acknowledgement:
        self.appended[tp].append(bytes(data))
        return Acknowledgement(OFFSETS, self.flush)


def produce_broker(broker_id: int) -> Any:
    from tidalmq_broker.metrics import BrokerMetrics
    from tidalmq_broker.security.authorizer import Authorizer
    from tidalmq_broker.settings import BrokerSettings
    from tidalmq_core.metadata import BrokerInfo

    topic = TopicInfo("orders", "t-1", [PartitionState(broker_id, 4, [broker_id])] * 2)
    meta = ClusterMetadata("c", topics={"orders": topic})
    meta.brokers = {broker_id: BrokerInfo(broker_id, "b", 9092)}
    return SimpleNamespace(
        metadata=meta,
        partitions=TwoPartitions(),
        handovers=Handovers(broker_id),
        authorizer=Authorizer(enabled=False),
        settings=BrokerSettings(broker_id=broker_id, controller_url="http://ctl:9690"),
        metrics=BrokerMetrics(broker_id, {0: "Produce"}),
    )


async def produce(b: Any, *partitions: int) -> dict[int, int]:
    """A Produce v9 request with a batch for each of `partitions` of "orders": the error code
    answered per partition."""
    import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
    from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
    from tidalmq_broker.protocol.codec import (
        decode_request,
        decode_response,
        encode_request,
        encode_response,
    )

    from tests.support.storage_helpers import batch

    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [
            {
                "name": "orders",
                "partition_data": [{"index": p, "records": batch(2)} for p in partitions],
            }
        ],
    }
    request = decode_request(encode_request(0, 9, 1, body)[4:], supported_versions())
    conn = SimpleNamespace(principal="User:ANONYMOUS", host="h", listener="PLAINTEXT")
    answer = await REGISTRY[0].handler(b, request, conn)
    response = decode_response(0, 9, encode_response(0, 9, 1, answer)[4:])[1]
    return {p.index: p.error_code for t in response.responses for p in t.partition_responses}


async def test_a_request_with_nothing_else_appended_here_is_held_through_the_handover() -> None:
    b = produce_broker(9011)
    answering = asyncio.ensure_future(produce(b, 0))
    await asyncio.sleep(0.05)
    assert not answering.done() and b.handovers.held() == 1
    b.partitions.handing_over = None  # opened
    b.handovers.changed(TP)
    assert await answering == {0: 0}
    assert len(b.partitions.appended[TP]) == 1


async def test_a_request_with_other_partitions_appended_is_not_held_back_by_a_handover() -> None:
    """One answer carries every partition of a request: holding the one in its handover would
    hold back the acknowledgement of the one appended (a draining broker's partitions that
    have not moved yet, a target's already open) until the handover ends."""
    b = produce_broker(9012)
    answered = await asyncio.wait_for(produce(b, 0, 1), 0.5)
    assert answered == {0: ErrorCode.leader_not_available, 1: 0}
    assert b.handovers.held() == 0
    assert b.partitions.appended == {TP: [], OTHER: [b.partitions.appended[OTHER][0]]}
