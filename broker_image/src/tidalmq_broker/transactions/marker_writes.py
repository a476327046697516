"""Writing transaction markers on the partitions this broker leads (docs/transactions.md): the
path of WriteTxnMarkers (apis/txn_markers.py) and of a coordinator in this process
(transactions/markers.py). Each partition's answer comes once its marker is durable; then the
host's `txn_marker_listeners` are told (the group coordinator materialises a transaction's
pending offsets on `__consumer_offsets`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from tidalmq_core.model import TopicPartition

from tidalmq_broker.apis.errors import error_code
from tidalmq_broker.partitions import PartitionManager

log = logging.getLogger(__name__)

MarkerListener = Callable[[TopicPartition, int, int, bool], Awaitable[None]]
"""Called after a marker is durable: (partition, producer id, producer epoch, committed)."""


class MarkerTopic(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def partition_indexes(self) -> Sequence[int]: ...


class Marker(Protocol):
    """One entry of WriteTxnMarkersRequest.Markers (kio's class has these attributes)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def producer_epoch(self) -> int: ...

    @property
    def transaction_result(self) -> bool: ...

    @property
    def topics(self) -> Sequence[MarkerTopic]: ...

    @property
    def coordinator_epoch(self) -> int: ...


class MarkerHost(Protocol):
    """What writing markers uses of the broker (the Broker is one): its partitions, and who is
    told of each marker written."""

    partitions: PartitionManager
    txn_marker_listeners: list[MarkerListener]


async def write_markers(host: MarkerHost, markers: Sequence[Marker]) -> list[dict[str, Any]]:
    """Write every marker on the partitions this broker leads; the response's `markers`.
    The appends start in request order (one partition's markers stay in that order) and are
    awaited together."""
    outcomes: dict[tuple[int, str, int], asyncio.Future[None] | ErrorCode] = {}
    for i, marker in enumerate(markers):
        for topic in marker.topics:
            for index in topic.partition_indexes:
                tp = TopicPartition(topic.name, index)
                try:
                    plog = host.partitions.get_log(tp)
                except Exception as exc:
                    outcomes[(i, topic.name, index)] = error_code(exc)
                    continue
                outcomes[(i, topic.name, index)] = asyncio.ensure_future(
                    _write(host, plog, tp, marker)
                )
    pending = [o for o in outcomes.values() if isinstance(o, asyncio.Future)]
    if pending:
        await asyncio.wait(pending)

    def code(i: int, topic: str, index: int) -> ErrorCode:
        outcome = outcomes[(i, topic, index)]
        if isinstance(outcome, ErrorCode):
            return outcome
        exc = outcome.exception()
        return ErrorCode.none if exc is None else error_code(exc)

    return answer(markers, lambda i, t, p: code(i, t, p))


async def _write(host: MarkerHost, plog: Any, tp: TopicPartition, marker: Marker) -> None:
    await plog.write_txn_marker(
        marker.producer_id,
        marker.producer_epoch,
        commit=marker.transaction_result,
        coordinator_epoch=marker.coordinator_epoch,
    )
    for listener in host.txn_marker_listeners:
        try:
            await listener(tp, marker.producer_id, marker.producer_epoch, marker.transaction_result)
        except Exception:  # the marker is written: the coordinator must not write it again
            log.exception("%s: a transaction marker listener failed", tp)


def answer(
    markers: Sequence[Marker], code: Callable[[int, str, int], ErrorCode]
) -> list[dict[str, Any]]:
    return [
        {
            "producer_id": m.producer_id,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p, "error_code": code(i, t.name, p)}
                        for p in t.partition_indexes
                    ],
                }
                for t in m.topics
            ],
        }
        for i, m in enumerate(markers)
    ]
