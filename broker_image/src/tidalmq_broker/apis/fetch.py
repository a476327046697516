"""Fetch (with long polling), ListOffsets, OffsetForLeaderEpoch and DeleteRecords.

Authorized as Kafka does, per topic: Fetch READ, ListOffsets and OffsetForLeaderEpoch DESCRIBE,
DeleteRecords DELETE (TOPIC_AUTHORIZATION_FAILED for each partition of a topic refused, whether
or not it exists). No client deletes records of an internal topic (INVALID_TOPIC_EXCEPTION, as
Kafka answers), nor of a topic whose `cleanup.policy` lacks `delete` (POLICY_VIOLATION).

A Fetch reads no more than its connection may still take (`Connection.response_room()`: what is
left of the connection's cap on responses its client has not read, and of the broker's response
budget, server/connection.py) and charges what it read to both. With no room it waits for room
within its max wait time (its client reads, or other responses leave the budget) and then
answers with what fits, possibly nothing: ten consumers pipelining Fetch(50 MiB) without reading
the answers took a broker to 18 GB; now they hold at most their caps. As Kafka does (KIP-74), a
first batch larger than the room is still returned whole, so a consumer always makes progress,
but only when nothing else of its connection is waiting to be read and the budget is not full
of other connections' responses (`Connection.may_overrun`): one batch past the cap at most."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import INTERNAL_TOPICS, ClusterMetadata
from tidalmq_core.model import TopicPartition

from tidalmq_broker.apis.errors import error_code
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.apis.leader_hints import current_leaders
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.protocol.fastpath import (
    FETCH_LEADER_HINTS_FROM,
    FETCH_TOPIC_IDS_FROM,
    EncodedBody,
    FetchPartition,
    FetchTopicKey,
    LeaderAndEpoch,
    encode_fetch_response,
)
from tidalmq_broker.protocol.records import count_records
from tidalmq_broker.storage.api import PartitionLog

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3  # ListOffsets v7 (KIP-734): the record with the greatest timestamp
# the tiered-storage lookups (KIP-1005, KIP-1023), answered as Kafka without remote storage
# answers them (UnifiedLog.fetchOffsetByTimestamp): the whole log is local, so the earliest
# local offset is the log start offset, and nothing is tiered or waiting to be
EARLIEST_LOCAL = -4  # v8+
LATEST_TIERED = -5  # v9+
EARLIEST_PENDING_UPLOAD = -6  # v11+
_NOT_TIERED = {LATEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}  # timestamp -> first version


def check_leader_epoch(plog: PartitionLog, requested: int) -> ErrorCode | None:
    """KIP-320: a client that knows a newer epoch than ours talks to a stale leader; one that
    knows an older epoch must refresh its metadata."""
    if requested < 0 or requested == plog.leader_epoch:
        return None
    if requested > plog.leader_epoch:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.fenced_leader_epoch


_NULL_UUID = uuid.UUID(int=0)
READ_COMMITTED = 1  # isolation_level: only below the last stable offset (docs/transactions.md)


class _FetchPartition:
    __slots__ = (
        "aborted",
        "error",
        "hw",
        "index",
        "key",
        "lso",
        "max_bytes",
        "offset",
        "plog",
        "records",
        "topic",
    )

    def __init__(
        self, key: FetchTopicKey, topic: str, index: int, offset: int, max_bytes: int
    ) -> None:
        self.key = key  # how the request named the topic: its name, or its id from v13
        self.topic = topic  # its name ("" for an unknown topic id)
        self.index = index
        self.offset = offset
        self.max_bytes = max_bytes
        self.plog: PartitionLog | None = None
        self.error: ErrorCode = ErrorCode.none
        self.records: bytes = b""
        self.hw = -1
        self.lso = -1
        self.aborted: list[tuple[int, int]] = []


# errors found before reading: as in Kafka (KafkaApis' "erroneous" partitions), they do not cut
# the wait short for the partitions that are read
_NOT_WAITED_ON = (ErrorCode.topic_authorization_failed, ErrorCode.unknown_topic_id)
# the errors KIP-951 answers with the partition's current leader (Fetch v16+, as Kafka)
_LEADER_HINTED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)


# A topic id as the image spells it (its canonical string), by the id as kio decodes it: str() of
# a UUID costs ten times the lookup. A pure function of the id, so never stale; cleared when full
# (a client naming ever new ids cannot grow it).
_ID_STRINGS: dict[uuid.UUID, str] = {}
_ID_STRINGS_MAX = 4096


def _topic_name(meta: ClusterMetadata, topic_id: uuid.UUID | None) -> str | None:
    """The name of the topic a Fetch v13+ names by id, from the broker's metadata image: O(1),
    through the image's index of topics by id, which every change to the image keeps (a topic
    deleted and re-created under its name has a new id; the old one finds nothing)."""
    if topic_id is None:
        return None
    text = _ID_STRINGS.get(topic_id)
    if text is None:
        if len(_ID_STRINGS) >= _ID_STRINGS_MAX:
            _ID_STRINGS.clear()
        text = _ID_STRINGS[topic_id] = str(topic_id)
    return meta.topics.name_of(text)


@api(1, "Fetch", 4, 17)
async def handle_fetch(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    version = request.api_version
    by_id = version >= FETCH_TOPIC_IDS_FROM
    # v15 (KIP-903) moved the follower's id into a tagged ReplicaState; v17 adds a follower's
    # ReplicaDirectoryId per partition (KIP-858): no follower fetches from TidalMQ, both unread
    replica_id = body.replica_state.replica_id if version >= 15 else body.replica_id
    if replica_id >= 0:
        return _fetch_error(body, ErrorCode.not_leader_or_follower, version)
    parts: list[_FetchPartition] = []
    authorizer = broker.authorizer
    for topic in body.topics:
        key: FetchTopicKey
        if by_id:
            key = topic.topic_id or _NULL_UUID
            name = _topic_name(broker.metadata, topic.topic_id)
            if name is None:  # before authorization, as Kafka: an id names nothing to refuse
                for p in topic.partitions:
                    fp = _FetchPartition(key, "", p.partition, p.fetch_offset, 0)
                    fp.error = ErrorCode.unknown_topic_id
                    parts.append(fp)
                continue
        else:
            key = name = topic.topic
        readable = authorizer.allows(conn, AclOperation.READ, ResourceType.TOPIC, name)
        for p in topic.partitions:
            fp = _FetchPartition(key, name, p.partition, p.fetch_offset, p.partition_max_bytes)
            if not readable:
                fp.error = ErrorCode.topic_authorization_failed
                parts.append(fp)
                continue
            try:
                fp.plog = broker.partitions.get_log(TopicPartition(name, p.partition))
                epoch_error = check_leader_epoch(fp.plog, getattr(p, "current_leader_epoch", -1))
                if epoch_error is not None:
                    fp.error, fp.plog = epoch_error, None
            except Exception as exc:
                fp.error = error_code(exc)
            parts.append(fp)
    max_bytes = body.max_bytes if version >= 3 else 0x7FFFFFFF
    deadline = time.monotonic() + body.max_wait.total_seconds()
    min_bytes = max(body.min_bytes, 1)
    committed = body.isolation_level == READ_COMMITTED
    total = await _read_all(parts, max_bytes, conn, committed)
    # a partition's error answers at once (the client must act on it), except one found before
    # reading (a refusal, an unknown topic id): as in Kafka, the partitions the client may read
    # wait for data as usual
    while total < min_bytes and not any(
        fp.error and fp.error not in _NOT_WAITED_ON for fp in parts
    ):
        remaining = deadline - time.monotonic()
        waitable = [(fp, fp.plog) for fp in parts if fp.plog is not None]
        if remaining <= 0 or not waitable:
            break
        if conn.response_room() <= 0:
            # pushed back: the client has not read what it was sent, or the broker's responses
            # fill the budget. Wait for room, then answer with what fits.
            await conn.wait_response_room(remaining)
            total = await _read_all(parts, max_bytes, conn, committed)
            continue
        waits = [
            asyncio.ensure_future(plog.wait_for_data(fp.offset, remaining, committed=committed))
            for fp, plog in waitable
        ]
        try:
            await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        total = await _read_all(parts, max_bytes, conn, committed)
    # written straight to wire format (protocol.fastpath), the record sets not copied again
    by_topic: dict[FetchTopicKey, list[FetchPartition]] = {}
    misdirected: list[_FetchPartition] = []
    for fp in parts:
        if fp.error:
            if fp.error in _LEADER_HINTED:
                misdirected.append(fp)
        elif fp.records:
            broker.metrics.fetched(fp.topic, fp.index, len(fp.records), count_records(fp.records))
        by_topic.setdefault(fp.key, []).append(
            (
                fp.index,
                fp.error.value,
                fp.hw,
                fp.lso,
                fp.plog.log_start_offset if fp.plog else -1,
                fp.aborted if fp.error == ErrorCode.none else None,
                fp.records,
            )
        )
    if misdirected and version >= FETCH_LEADER_HINTS_FROM:
        return _with_leader_hints(broker, conn, version, list(by_topic.items()), misdirected)
    return encode_fetch_response(version, list(by_topic.items()))


def _with_leader_hints(
    broker: Broker,
    conn: Connection,
    version: int,
    topics: list[tuple[FetchTopicKey, list[FetchPartition]]],
    misdirected: list[_FetchPartition],
) -> EncodedBody:
    """KIP-951 for a consumer: the partitions answered NOT_LEADER_OR_FOLLOWER or
    FENCED_LEADER_EPOCH carry their current leader, the response those leaders' endpoints on
    the client's listener (`leader_hints.current_leaders`, which Produce uses too)."""
    by_name, endpoints = current_leaders(
        broker.metadata, conn.listener, [(fp.topic, fp.index) for fp in misdirected]
    )
    leaders: dict[tuple[FetchTopicKey, int], LeaderAndEpoch] = {}
    for fp in misdirected:
        leader = by_name.get((fp.topic, fp.index))
        if leader is not None:
            leaders[(fp.key, fp.index)] = leader
    broker.metrics.leader_hints("fetch", len(leaders))
    return encode_fetch_response(version, topics, current_leaders=leaders, node_endpoints=endpoints)


async def _read_all(
    parts: list[_FetchPartition], max_bytes: int, conn: Connection, committed: bool
) -> int:
    """Read every partition once more, within the request's max bytes and the room the
    connection has for responses (what is read is charged to it); returns total bytes.
    `committed` (read_committed): only below each partition's last stable offset."""
    budget = max_bytes
    total = 0
    for fp in parts:
        if fp.plog is None:
            continue
        if fp.records:
            total += len(fp.records)
            budget -= len(fp.records)
            continue
        room = conn.response_room()
        limit = min(fp.max_bytes, budget, room) if total else min(fp.max_bytes, room)
        if limit <= 0:
            fp.hw = fp.plog.high_watermark
            fp.lso = fp.plog.last_stable_offset
            continue
        try:
            result = await fp.plog.read(fp.offset, limit, committed=committed)
        except Exception as exc:
            fp.error, fp.plog = error_code(exc), None
            fp.records = b""
            continue
        size = len(result.records)
        if size > conn.response_room() and not conn.may_overrun(size):
            # a first batch larger than the room left: it goes out only in a response of its
            # own (nothing else of the connection's waiting, the budget not full of others),
            # or a connection's pipelined fetches would each pass its cap by a batch
            fp.hw = result.high_watermark
            fp.lso = result.last_stable_offset
            continue
        conn.charge_response(size)
        fp.records = result.records
        fp.hw = result.high_watermark
        fp.lso = result.last_stable_offset
        fp.aborted = result.aborted or []
        total += len(fp.records)
        budget -= len(fp.records)
    return total


def _fetch_error(body: Any, code: ErrorCode, version: int) -> EncodedBody:
    by_id = version >= FETCH_TOPIC_IDS_FROM
    topics: list[tuple[FetchTopicKey, list[FetchPartition]]] = [
        (
            (t.topic_id or _NULL_UUID) if by_id else t.topic,
            [(p.partition, code.value, -1, -1, -1, None, None) for p in t.partitions],
        )
        for t in body.topics
    ]
    return encode_fetch_response(version, topics, error_code=code.value)


# v8-v11 only add the tiered-storage timestamps above (and v10 a timeout for remote reads,
# which never happen here): kafka-python configured for Kafka 4.x sends v10
@api(2, "ListOffsets", 1, 11)
async def handle_list_offsets(broker: Broker, request: Request, conn: Connection) -> Any:
    version = request.api_version
    committed = getattr(request.body, "isolation_level", 0) == READ_COMMITTED
    topics = []
    for topic in request.body.topics:
        partitions = []
        described = broker.authorizer.allows(
            conn, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name
        )
        for p in topic.partitions:
            out: dict[str, Any] = {
                "partition_index": p.partition_index,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
            }
            if not described:
                out["error_code"] = ErrorCode.topic_authorization_failed
                partitions.append(out)
                continue
            try:
                plog = broker.partitions.get_log(TopicPartition(topic.name, p.partition_index))
                epoch_error = check_leader_epoch(plog, getattr(p, "current_leader_epoch", -1))
                if epoch_error is not None:
                    out["error_code"] = epoch_error
                    partitions.append(out)
                    continue
                out["leader_epoch"] = plog.leader_epoch
                if p.timestamp == EARLIEST or (p.timestamp == EARLIEST_LOCAL and version >= 8):
                    out["offset"] = plog.log_start_offset
                elif p.timestamp in _NOT_TIERED and version >= _NOT_TIERED[p.timestamp]:
                    out["leader_epoch"] = -1  # Kafka's (-1, -1, epoch -1)
                elif p.timestamp == LATEST:
                    out["offset"] = plog.last_stable_offset if committed else plog.high_watermark
                elif p.timestamp == MAX_TIMESTAMP and version >= 7:
                    found = await plog.offset_of_max_timestamp()
                    if found is not None:
                        out["offset"], out["timestamp"] = found.offset, found.timestamp
                else:
                    found = await plog.offset_for_timestamp(p.timestamp)
                    # read_committed: an offset at or past the LSO is not answered (Kafka)
                    if found is not None and not (
                        committed and found.offset >= plog.last_stable_offset
                    ):
                        out["offset"], out["timestamp"] = found.offset, found.timestamp
                out["error_code"] = ErrorCode.none
            except Exception as exc:
                out["error_code"] = error_code(exc)
            partitions.append(out)
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


@api(23, "OffsetForLeaderEpoch", 2, 4)
async def handle_offset_for_leader_epoch(broker: Broker, request: Request, conn: Connection) -> Any:
    """Offsets are never truncated in TidalMQ (one durable copy), so every epoch a client knows
    ends no earlier than the high watermark: its position is always valid."""
    topics = []
    authorizer = broker.authorizer
    replica = authorizer.allows(
        conn, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME
    )
    for topic in request.body.topics:
        partitions = []
        described = replica or authorizer.allows(
            conn, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.topic
        )
        for p in topic.partitions:
            out: dict[str, Any] = {"partition": p.partition, "leader_epoch": -1, "end_offset": -1}
            if not described:
                out["error_code"] = ErrorCode.topic_authorization_failed
                partitions.append(out)
                continue
            try:
                plog = broker.partitions.get_log(TopicPartition(topic.topic, p.partition))
                epoch_error = check_leader_epoch(plog, p.current_leader_epoch)
                if epoch_error is not None:
                    out["error_code"] = epoch_error
                elif p.leader_epoch > plog.leader_epoch:
                    out["error_code"] = ErrorCode.none
                else:
                    out.update(
                        error_code=ErrorCode.none,
                        leader_epoch=p.leader_epoch,
                        end_offset=plog.high_watermark,
                    )
            except Exception as exc:
                out["error_code"] = error_code(exc)
            partitions.append(out)
        topics.append({"topic": topic.topic, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


def _policy_deletes(broker: Broker, topic: str) -> bool:
    """Kafka refuses DeleteRecords with POLICY_VIOLATION on a partition whose
    `cleanup.policy` lacks `delete` (`Partition.deleteRecordsOnLeader`): a compacted log's
    start moves only by the cleaner."""
    info = broker.metadata.topics.get(topic)
    return info is None or "delete" in info.cleanup_policy()  # None: the lookup answered


@api(21, "DeleteRecords", 0, 2)
async def handle_delete_records(broker: Broker, request: Request, conn: Connection) -> Any:
    topics = []
    for topic in request.body.topics:
        partitions = []
        refused: tuple[ErrorCode, str | None] | None = None
        if not broker.authorizer.allows(conn, AclOperation.DELETE, ResourceType.TOPIC, topic.name):
            refused = ErrorCode.topic_authorization_failed, None
        elif topic.name in INTERNAL_TOPICS:
            refused = (
                ErrorCode.invalid_topic_exception,
                f"Cannot delete records of internal topic {topic.name}",
            )
        for p in topic.partitions:
            out: dict[str, Any] = {"partition_index": p.partition_index, "low_watermark": -1}
            if refused is not None:
                out["error_code"] = refused[0]
                partitions.append(out)
                continue
            try:
                plog = broker.partitions.get_log(TopicPartition(topic.name, p.partition_index))
                target = plog.high_watermark if p.offset == -1 else p.offset
                if not _policy_deletes(broker, topic.name):
                    out["error_code"] = ErrorCode.policy_violation
                elif target > plog.high_watermark or target < 0:
                    out["error_code"] = ErrorCode.offset_out_of_range
                else:
                    out["low_watermark"] = await plog.delete_records_before(target)
                    out["error_code"] = ErrorCode.none
            except Exception as exc:
                out["error_code"] = error_code(exc)
            partitions.append(out)
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}
