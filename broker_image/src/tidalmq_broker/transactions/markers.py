"""How the transaction coordinator's markers reach the partitions' leaders.

A partition this broker leads gets its marker in process (`write_markers`, WriteTxnMarkers'
own path). The markers of partitions other brokers lead go over the
authenticated control plane: POST to the controller's `/v1/transactions/markers`, which passes
them to the leader's control endpoint `/v1/transactions/markers` with that broker's token
(brokers hold only their own token, the controller every broker's). Why not a broker-to-broker
Kafka client speaking WriteTxnMarkers: see docs/transactions.md, "The coordinator".

The answer is a Kafka error code per partition, as WriteTxnMarkers gives: NONE once durable,
NOT_LEADER_OR_FOLLOWER / LEADER_NOT_AVAILABLE / KAFKA_STORAGE_ERROR / REQUEST_TIMED_OUT for
retries (the coordinator looks the leader up again each round).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from tidalmq_controller import ControllerClient
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata
from tidalmq_core.model import TopicPartition

from tidalmq_broker.transactions.coordinator import Marker
from tidalmq_broker.transactions.marker_writes import MarkerHost, write_markers

log = logging.getLogger(__name__)

MAX_MARKERS_PER_CALL = 10_000  # a control call carrying more is refused (bounded input)


class MarkerSenderHost(MarkerHost, Protocol):
    """What the coordinator's marker sender uses of its broker (the Broker is one): who leads
    which partition, its own id, and the controller that forwards markers to other leaders."""

    broker_id: int
    metadata: ClusterMetadata
    controller: ControllerClient


@dataclass(frozen=True, slots=True)
class _Topic:
    name: str
    partition_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One WriteTxnMarkers request entry (apis/txn_markers.py's Marker)."""

    producer_id: int
    producer_epoch: int
    transaction_result: bool
    coordinator_epoch: int
    topics: tuple[_Topic, ...]


async def write_all_here(broker: MarkerHost, markers: list[Marker]) -> dict[TopicPartition, int]:
    """Append markers to partitions this broker leads, through WriteTxnMarkers' own path
    (`write_markers`: the same checks, and its listeners, e.g. the group coordinator settling
    a transaction's offsets); the Kafka error code of each partition."""
    entries = [
        _Entry(
            m.producer_id,
            m.producer_epoch,
            m.commit,
            m.coordinator_epoch,
            (_Topic(m.tp.topic, (m.tp.partition,)),),
        )
        for m in markers
    ]
    answer = await write_markers(broker, entries)
    return {
        TopicPartition(t["name"], p["partition_index"]): int(p["error_code"])
        for entry in answer
        for t in entry["topics"]
        for p in t["partitions"]
    }


def markers_doc(markers: list[Marker]) -> dict[str, Any]:
    return {
        "markers": [
            {
                "topic": m.tp.topic,
                "partition": m.tp.partition,
                "producer_id": m.producer_id,
                "producer_epoch": m.producer_epoch,
                "commit": m.commit,
                "coordinator_epoch": m.coordinator_epoch,
            }
            for m in markers
        ]
    }


def markers_from(doc: Any) -> list[Marker]:
    """The markers of a control call (ValueError when malformed or too many)."""
    entries = doc.get("markers") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_MARKERS_PER_CALL:
        raise ValueError(f"markers: expected a list of at most {MAX_MARKERS_PER_CALL} entries")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("topic"), str):
            raise ValueError("markers: malformed entry")
        out.append(
            Marker(
                TopicPartition(e["topic"], int(e["partition"])),
                int(e["producer_id"]),
                int(e["producer_epoch"]),
                bool(e["commit"]),
                int(e["coordinator_epoch"]),
            )
        )
    return out


class MarkerChannel:
    """The coordinator's MarkerSender: each marker to its partition's current leader."""

    def __init__(self, broker: MarkerSenderHost) -> None:
        self._broker = broker

    async def __call__(self, markers: list[Marker]) -> dict[TopicPartition, int]:
        broker = self._broker
        by_leader: dict[int, list[Marker]] = defaultdict(list)
        results: dict[TopicPartition, int] = {}
        for m in markers:
            topic = broker.metadata.topics.get(m.tp.topic)
            if topic is None or not 0 <= m.tp.partition < len(topic.partitions):
                results[m.tp] = ErrorCode.unknown_topic_or_partition
            elif (leader := topic.partitions[m.tp.partition].leader) == NO_LEADER:
                results[m.tp] = ErrorCode.leader_not_available
            else:
                by_leader[leader].append(m)
        calls = [self._to(leader, batch) for leader, batch in by_leader.items()]
        for answer in await asyncio.gather(*calls):
            results.update(answer)
        return results

    async def _to(self, leader: int, markers: list[Marker]) -> dict[TopicPartition, int]:
        broker = self._broker
        if leader == broker.broker_id:
            return await write_all_here(broker, markers)
        try:
            doc = await broker.controller.forward_txn_markers(leader, markers_doc(markers))
            return {
                TopicPartition(r["topic"], int(r["partition"])): int(r["error_code"])
                for r in doc["results"]
            }
        except Exception as exc:
            log.info("markers for broker %d not delivered (retrying): %s", leader, exc)
            return dict.fromkeys((m.tp for m in markers), ErrorCode.request_timed_out)
