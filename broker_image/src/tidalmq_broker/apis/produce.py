"""Produce: append record batches (opaque bytes) to the partitions this broker leads.

As in Kafka: a topic the client may not WRITE to answers TOPIC_AUTHORIZATION_FAILED for each of
its partitions (whether or not it exists), and no client appends to an internal topic
(INVALID_TOPIC_EXCEPTION "Cannot append to internal topic"): only the group coordinator writes
`__consumer_offsets`. A compacted topic refuses records without a key (INVALID_RECORD), a topic
records whose CreateTime timestamp is out of its bounds (INVALID_TIMESTAMP, KIP-937), with
Kafka's messages and, from Produce v8, each refused record named in the partition's
`record_errors` (KIP-467; record_refusal). The batches are decompressed for these checks on
compacted topics and for timestamps that may be out of bounds only.

Transactional batches (docs/transactions.md) need the request's transactional id and WRITE on
it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition otherwise, as Kafka answers); the
partitions check their producer epochs and track the transactions. A transactional batch of a
producer with no transaction going on in its partition is first verified with the transaction
coordinator (KIP-890, transactions/verification.py); with transaction version 2 (Produce v12 on a
cluster at `transaction.version` 2) the coordinator adds the partition to the transaction
instead (docs/transactions-v2.md).

A partition this broker does not lead is answered NOT_LEADER_OR_FOLLOWER, from Produce v10 with
its current leader and that leader's endpoint (KIP-951, `leader_hints.current_leaders`), so the producer goes
there without asking Metadata first (docs/architecture/produce-and-fetch.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import INTERNAL_TOPICS, NO_LEADER, TRANSACTION_VERSION
from tidalmq_core.model import TopicPartition
from tidalmq_core.topics import LONG_MAX, ProduceRules

from tidalmq_broker.apis.errors import KafkaError, error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.apis.leader_hints import current_leaders
from tidalmq_broker.partitions import LeaderNotAvailable, NotLeader, PartitionOpening
from tidalmq_broker.protocol import records
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.protocol.fastpath import (
    PRODUCE_LEADER_HINTS_FROM,
    ProducePartition,
    RecordError,
    encode_produce_response,
)
from tidalmq_broker.storage.api import (
    UNVERIFIED,
    Acknowledgement,
    AppendResult,
    ObjectStoreUnavailable,
    PartitionLog,
    VerificationGuard,
)
from tidalmq_broker.transactions.state import TV2
from tidalmq_broker.transactions.verification import produce_error

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

log = logging.getLogger(__name__)


# What became of one partition of a request: refused before appending (an error code, with a
# message or None), refused by the append (the exception), taken (the partition's
# Acknowledgement) or going through the transaction coordinator first (a task)
Outcome = ErrorCode | BaseException | Acknowledgement | asyncio.Future[AppendResult]


@api(0, "Produce", 3, 12)
async def handle_produce(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    acks = body.acks
    # Everything up to the first await runs without suspending, so requests pipelined on one
    # connection append their batches in arrival order. Each partition's append is started
    # here, synchronously (Partition.start_append): no task or coroutine per partition; the
    # request then waits once for the WAL flushes that hold its batches.
    entries: list[tuple[str, int, Outcome, str | None, int]] = []
    # the records that made a partition's batch refused (KIP-467), only when there are some
    refused_records: dict[tuple[str, int], list[RecordError]] | None = None
    if acks not in (-1, 0, 1):
        for topic in body.topic_data:
            for part in topic.partition_data:
                entries.append((topic.name, part.index, ErrorCode.invalid_required_acks, None, 0))
    elif _has_transactional(body) and not (
        body.transactional_id is not None
        and broker.authorizer.allows(
            conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
        )
    ):
        for topic in body.topic_data:
            for part in topic.partition_data:
                entries.append(
                    (
                        topic.name,
                        part.index,
                        ErrorCode.transactional_id_authorization_failed,
                        None,
                        0,
                    )
                )
    else:
        authorizer = broker.authorizer
        handovers = broker.handovers
        # a partition in a handover is held at most this long (handover.py), and never past
        # half of the time the request may take
        hold_s = min(
            broker.settings.produce_handover_wait_ms / 1000,
            _answer_within(body.timeout.total_seconds()) / 2,
        )
        # the partitions in a handover, held after the loop only if nothing was appended here
        handing_over: list[_HandingOver] = []
        started = False  # an append of this request was started here
        for topic in body.topic_data:
            if not authorizer.allows(conn, AclOperation.WRITE, ResourceType.TOPIC, topic.name):
                for part in topic.partition_data:
                    entries.append(
                        (topic.name, part.index, ErrorCode.topic_authorization_failed, None, 0)
                    )
                continue
            if topic.name in INTERNAL_TOPICS:
                for part in topic.partition_data:
                    entries.append(
                        (
                            topic.name,
                            part.index,
                            ErrorCode.invalid_topic_exception,
                            f"Cannot append to internal topic {topic.name}",
                            0,
                        )
                    )
                continue
            info = broker.metadata.topics.get(topic.name)
            compacted, bounds, log_append_time = _NO_RULES if info is None else info.produce_rules()
            for part in topic.partition_data:
                tp = TopicPartition(topic.name, part.index)
                # None: held through its handover (and so behind the appends of it held
                # already, in arrival order)
                plog: PartitionLog | None = None
                held_on: Exception | None = None  # why it is held (None: behind others)
                try:
                    if not handovers.holding(tp):
                        plog = broker.partitions.get_log(tp)
                except Exception as exc:
                    if hold_s <= 0 or not _handing_over(broker, tp, exc):
                        code = error_code(exc)
                        entries.append((topic.name, part.index, code, error_message(exc), 0))
                        continue
                    held_on = exc
                if part.records is None or not part.records:
                    entries.append(
                        (topic.name, part.index, ErrorCode.corrupt_message, "no records", 0)
                    )
                    continue
                # the batch headers, parsed once here for the checks below and the append's
                # (None when malformed: the append parses them again and says how)
                headers = _parsed_headers(part.records)
                if headers is not None and (compacted or bounds is not None or log_append_time):
                    refused = record_refusal(
                        topic.name,
                        part.index,
                        part.records,
                        compacted,
                        bounds,
                        log_append_time=log_append_time,
                        headers=headers,
                    )
                    if refused is not None:
                        entries.append((topic.name, part.index, refused[0], refused[1], 0))
                        if refused_records is None:
                            refused_records = {}
                        refused_records[(topic.name, part.index)] = refused[2]
                        continue
                # the records are a view of this request's own frame buffer (when large
                # enough to have one): the log patches offsets in place instead of copying
                if plog is None:
                    handing_over.append((len(entries), tp, held_on, part.records, headers))
                    entries.append((topic.name, part.index, _DECIDED_BELOW, None, 0))
                    continue
                outcome = _append(broker, plog, part.records, acks, body.transactional_id,
                                  request.api_version, headers)  # fmt: skip
                started = True
                entries.append((topic.name, part.index, outcome, None, len(part.records)))
        for at, tp, held_on, data, headers in handing_over:
            if started:
                # One answer carries every partition of the request: holding these would
                # hold back the acknowledgements of those appended here (a draining broker's
                # partitions that have not moved yet, a target's that have opened) until the
                # slowest handover. They are answered now, as if not held (handover.py).
                why = held_on or LeaderNotAvailable(f"{tp} is being handed over")
                entries[at] = (tp.topic, tp.partition, error_code(why), error_message(why), 0)
            else:
                txn, version = body.transactional_id, request.api_version
                held = _hold(broker, tp, hold_s, held_on, data, acks, txn, version, headers)
                entries[at] = (tp.topic, tp.partition, held, None, len(data))
    if acks == 0:
        for _, _, outcome, _, _ in entries:
            if isinstance(outcome, asyncio.Future):
                outcome.add_done_callback(_log_failure)
            elif isinstance(outcome, Exception):
                log.debug("unacknowledged append failed: %s", outcome)
        return None
    await _all_done(_waits(entries), _answer_within(body.timeout.total_seconds()))
    # the response is written straight to wire format (protocol.fastpath): this runs for every
    # produce request, and building kio entities from dicts cost more than the append itself
    by_topic: dict[str, list[ProducePartition]] = {}
    appended: dict[str, tuple[int, int]] = {}  # per topic: bytes and records appended
    misdirected: list[tuple[str, int]] = []  # answered NOT_LEADER_OR_FOLLOWER (KIP-951)
    for topic_name, index, outcome, message, size in entries:
        answered: ProducePartition
        if isinstance(outcome, ErrorCode):
            answered = (index, outcome.value, -1, -1, -1, message)
            if outcome in _LEADERSHIP_ERRORS and topic_name in broker.metadata.topics:
                # counted per topic for topics that exist only (a client names any topic)
                broker.metrics.produce_errors(topic_name, outcome.name)
        else:
            result = _result(outcome)
            if isinstance(result, BaseException):
                code = error_code(result)
                answered = (index, code.value, -1, -1, -1, error_message(result))
                broker.metrics.produce_errors(topic_name, code.name)
            elif result is None:
                answered = (index, ErrorCode.request_timed_out.value, -1, -1, -1,
                            "the append was not durable within the request timeout")  # fmt: skip
            else:
                answered = (index, 0, result.base_offset, result.log_append_time_ms,
                            result.log_start_offset, message)  # fmt: skip
                if not result.duplicate:
                    count = result.last_offset - result.base_offset + 1
                    broker.metrics.produced_partition(topic_name, index, size, count)
                    so_far = appended.get(topic_name, (0, 0))
                    appended[topic_name] = (so_far[0] + size, so_far[1] + count)
        if answered[1] == _NOT_LEADER:
            misdirected.append((topic_name, index))
        partitions = by_topic.get(topic_name)
        if partitions is None:
            by_topic[topic_name] = [answered]
        else:
            partitions.append(answered)
    for topic_name, (size, count) in appended.items():
        broker.metrics.produced_topic(topic_name, size, count)
    if misdirected and request.api_version >= PRODUCE_LEADER_HINTS_FROM:
        leaders, endpoints = current_leaders(broker.metadata, conn.listener, misdirected)
        broker.metrics.leader_hints("produce", len(leaders))
        return encode_produce_response(
            request.api_version,
            list(by_topic.items()),
            current_leaders=leaders,
            node_endpoints=endpoints,
            record_errors=refused_records,
        )
    if refused_records is not None:
        return encode_produce_response(
            request.api_version, list(by_topic.items()), record_errors=refused_records
        )
    return encode_produce_response(request.api_version, list(by_topic.items()))


_NOT_LEADER = ErrorCode.not_leader_or_follower.value
# a partition in a handover, in `entries` until the request's partitions were all looked at:
# (its place in entries, the partition, why it is handed over, its records, their headers)
_HandingOver = tuple[
    int, TopicPartition, Exception | None, memoryview | bytes, list[records.BatchHeader] | None
]
_DECIDED_BELOW = ErrorCode.leader_not_available  # replaced by its hold or its error
_LEADERSHIP_ERRORS = (ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available)
PRODUCE_IMPLICIT_ADD_FROM = 12  # KIP-890 part 2


def _waits(entries: list[tuple[str, int, Outcome, str | None, int]]) -> list[asyncio.Future[Any]]:
    """The futures a request still waits for: its appends' WAL flushes (and the tasks of
    appends that went through the transaction coordinator first)."""
    waits: list[asyncio.Future[Any]] = []
    for _, _, outcome, _, _ in entries:
        if isinstance(outcome, Acknowledgement):
            durable = outcome.durable
            if durable is not None and not durable.done():
                waits.append(durable)
        elif isinstance(outcome, asyncio.Future) and not outcome.done():
            waits.append(outcome)
    return waits


async def _all_done(waits: list[asyncio.Future[Any]], timeout_s: float) -> None:
    """Until every future in `waits` is done or `timeout_s` passed: one waiter and one timer
    for the whole request, not asyncio.wait's sets and per-call callbacks. The futures are
    never cancelled here (a flush completes them whatever the request does)."""
    if not waits:
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    left = len(waits)

    def one_done(_: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if not left and not waiter.done():
            waiter.set_result(None)

    for fut in waits:
        fut.add_done_callback(one_done)
    timer = loop.call_later(timeout_s, _wake, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
        if left:
            for fut in waits:
                fut.remove_done_callback(one_done)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _result(outcome: Outcome) -> AppendResult | BaseException | None:
    """The append's offsets, why it failed, or None when it is not durable yet (timed out)."""
    if isinstance(outcome, BaseException):
        return outcome
    if isinstance(outcome, Acknowledgement):
        durable = outcome.durable
        if durable is None:
            return outcome.result
        if not durable.done():
            durable.add_done_callback(_log_failure)
            return None
        if durable.cancelled():
            return ObjectStoreUnavailable("the append was cancelled")
        failure = durable.exception()
        return outcome.result if failure is None else failure
    assert isinstance(outcome, asyncio.Future)
    if not outcome.done():
        outcome.add_done_callback(_log_failure)
        return None
    failure = outcome.exception()
    return outcome.result() if failure is None else failure


def _append(
    broker: Broker,
    plog: PartitionLog,
    data: memoryview | bytes,
    acks: int,
    transactional_id: str | None,
    version: int,
    headers: list[records.BatchHeader] | None = None,
) -> Outcome:
    """Start the append of one partition's records: now (the partition's Acknowledgement, or
    the exception that refused it), or behind KIP-890's verification when they open the
    producer's transaction there (a task: then in arrival order among those that waited).
    Logs without a synchronous start (static topics' logic queues) and an idempotent retry's
    wait for the original get a task as well."""
    verifier = None
    add = False
    if transactional_id is not None:
        # transaction version 2 (KIP-890 part 2): Produce v12 adds the partition to the
        # transaction itself (no AddPartitionsToTxn); below v12, or at level 1, it is verified
        add = version >= PRODUCE_IMPLICIT_ADD_FROM and (
            broker.metadata.feature_level(TRANSACTION_VERSION) >= TV2
        )
        verifier = broker.txn_partitions if add else broker.txn_verifier
    header = _transactional_header(data, headers) if verifier is not None else None
    if header is None or verifier is None or transactional_id is None:
        return _start(plog, data, acks, headers=headers)
    pid, epoch = header.producer_id, header.producer_epoch
    if not verifier.pending(plog.tp, pid) and plog.in_transaction(pid, epoch):
        # refused if a marker ends the transaction before the append starts (KIP-890's guard)
        return _start(plog, data, acks, UNVERIFIED, headers)
    guard = plog.start_verification(pid)  # taken before the question: a marker voids it

    async def append_verified() -> AppendResult:
        try:
            return await plog.append(data, acks=acks, owned=True, verification=guard)
        finally:
            plog.end_verification(pid, guard)

    def enqueue(code: int) -> asyncio.Future[AppendResult]:
        if code != ErrorCode.none:
            plog.end_verification(pid, guard)
            answer, message = produce_error(code, version)
            raise KafkaError(ErrorCode(answer), message)
        return asyncio.ensure_future(append_verified())

    return asyncio.ensure_future(
        verifier.gate(plog.tp, transactional_id, pid, epoch, enqueue, add=add)
    )


def _handing_over(broker: Broker, tp: TopicPartition, exc: Exception) -> bool:
    """Whether `exc`, why `tp` cannot be appended to here now, is a handover that ends by
    itself in a moment: the partition opening here, or leaderless in this broker's image (its
    move between the close on its source and the election of its target)."""
    if isinstance(exc, PartitionOpening):
        return True
    if not isinstance(exc, NotLeader):
        return False
    topic = broker.metadata.topics.get(tp.topic)
    if topic is None or topic.kind == "static" or not 0 <= tp.partition < len(topic.partitions):
        return False
    return topic.partitions[tp.partition].leader == NO_LEADER


def _hold(
    broker: Broker,
    tp: TopicPartition,
    wait_s: float,
    held_on: Exception | None,
    data: memoryview | bytes,
    acks: int,
    transactional_id: str | None,
    version: int,
    headers: list[records.BatchHeader] | None,
) -> asyncio.Future[AppendResult]:
    """Hold the append of `data` to `tp` through its handover (handover.py): started when the
    partition serves here, answered NOT_LEADER_OR_FOLLOWER when the image names another leader
    (the response then names it), or past `wait_s` with the error it was held on (`held_on`;
    None when it was held behind other appends of `tp`)."""
    handovers = broker.handovers
    answer: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
    # answered past its wait: the error it was last held on
    last = [held_on or LeaderNotAvailable(f"{tp} is being handed over")]
    held_at = time.monotonic()

    def retry() -> bool:
        if answer.done():
            return True
        try:
            plog = broker.partitions.get_log(tp)
        except Exception as exc:
            if _handing_over(broker, tp, exc):
                last[0] = exc
                return False
            answer.set_exception(exc)
            outcome = "redirected" if isinstance(exc, NotLeader) else "failed"
            handovers.settled(outcome, held_at)
            return True
        handovers.settled("served", held_at)
        _settle(answer, _append(broker, plog, data, acks, transactional_id, version, headers))
        return True

    def expire() -> None:
        if not answer.done():
            answer.set_exception(last[0])

    # a request cancelled meanwhile (its connection closed) never reads the answer: marked
    # read here, or an expired hold's error would be logged as never retrieved
    answer.add_done_callback(_log_failure)
    handovers.hold(tp, retry, expire, wait_s)
    return answer


def _settle(answer: asyncio.Future[AppendResult], outcome: Outcome) -> None:
    """Complete `answer` with what the append `outcome` comes to (as `_result` reads it), once
    its WAL flush (or its task) is done."""
    if isinstance(outcome, ErrorCode):
        answer.set_exception(KafkaError(outcome, None))
        return
    pending = outcome.durable if isinstance(outcome, Acknowledgement) else outcome
    if isinstance(pending, asyncio.Future) and not pending.done():
        pending.add_done_callback(lambda _: _settled(answer, outcome))
    else:
        _settled(answer, outcome)


def _settled(answer: asyncio.Future[AppendResult], outcome: Outcome) -> None:
    if answer.done():
        return
    result = _result(outcome)
    if isinstance(result, BaseException):
        answer.set_exception(result)
    else:
        assert result is not None  # done: _result is None only for what is still running
        answer.set_result(result)


def _start(
    plog: PartitionLog,
    data: memoryview | bytes,
    acks: int,
    verification: VerificationGuard | None = None,
    headers: list[records.BatchHeader] | None = None,
) -> Outcome:
    start = getattr(plog, "start_append", None)  # a Partition's (storage/partition.py)
    if start is None:
        # KIP-890's guard only when there is one (verification off: the call as before it)
        guarded = {} if verification is None else {"verification": verification}
        return asyncio.ensure_future(plog.append(data, acks=acks, owned=True, **guarded))
    try:
        taken = start(data, acks=acks, owned=True, verification=verification, headers=headers)
    except Exception as exc:  # refused: a StorageError says why (error_code maps it)
        return exc
    if isinstance(taken, Acknowledgement):
        return taken
    retry: Awaitable[AppendResult] = taken  # an idempotent retry: waits for its original
    return asyncio.ensure_future(retry)


def _parsed_headers(data: memoryview | bytes) -> list[records.BatchHeader] | None:
    """The headers of a partition's batches (records.read_headers: bounds and magic checked,
    not the CRCs, which the append checks), or None when malformed."""
    try:
        return records.read_headers(data)
    except records.InvalidRecordBatch:  # UnsupportedMagic is one
        return None


def _transactional_header(
    data: memoryview | bytes, headers: list[records.BatchHeader] | None = None
) -> records.BatchHeader | None:
    """The first batch's header when it is a transactional data batch (Kafka verifies on the
    first batch of a partition's records, as here); None otherwise or when malformed (the
    append then says how)."""
    if headers is not None:
        h = headers[0]
    else:
        try:
            h = records.read_header(data)
        except (records.InvalidRecordBatch, records.UnsupportedMagic):
            return None
    if h.magic != records.MAGIC_V2 or not h.is_transactional or h.is_control:
        return None
    return h if h.producer_id >= 0 else None


_MAGIC = 16  # of a batch: after base offset, length and partition leader epoch
_ATTRIBUTES = 21  # of a v2 batch: int16 after the magic and crc


# Kafka's messages (LogValidator.processRecordErrors); each refused record's own message goes in
# the response's record errors (KIP-467, Produce v8+)
INVALID_TIMESTAMP = "One or more records have been rejected due to invalid timestamp"
_MAX_LISTED = 3  # record errors repeated in an INVALID_RECORD's message, as Kafka's


def record_refusal(
    topic: str,
    partition: int,
    data: bytes | memoryview,
    compacted: bool,
    bounds: tuple[int, int] | None,
    now_ms: int | None = None,
    *,
    log_append_time: bool = False,
    headers: list[records.BatchHeader] | None = None,
) -> tuple[ErrorCode, str, list[RecordError]] | None:
    """Why Kafka's LogValidator would refuse a partition's records for some of them: batch by
    batch, a record without a key on a `compacted` topic, or else a CreateTime timestamp out of
    `bounds` (message.timestamp.before/after.max.ms), or a batch the producer marked
    LogAppendTime where Kafka takes none (misdated), is a record error (its index in its batch
    and Kafka's message); the first batch with any refuses them all, INVALID_TIMESTAMP if one
    is a timestamp's, INVALID_RECORD otherwise, with Kafka's message. None when every record
    passes, or when the batches are malformed (the append then says how). A batch whose
    declared max timestamp is within the upper bound is not opened for its timestamps when the
    lower bound is Kafka's default (no limit), so the default check costs no decompression.

    A batch with the LogAppendTime bit set by its producer: each of its records has the batch's
    max timestamp (as a client reads it). On a CreateTime topic that timestamp is checked against
    the bounds, and the partition clears the bit when it appends the batch (the records then
    have their own timestamps); a LogAppendTime topic (`log_append_time`), or a max timestamp of
    -1 (none), refuses every record of the batch, as Kafka does (docs/topic-configs.md).

    `headers`: the batches' headers if the caller has parsed them (records.read_headers of
    `data`), so that they are not walked again."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    keyless = None  # the message for a record without a key, made when one is found
    try:
        for header in records.iter_headers(data) if headers is None else headers:
            marked = not header.is_control and bool(header.attributes & records.TIMESTAMP_TYPE_MASK)
            misdated = marked and (log_append_time or header.max_timestamp == _NO_TIMESTAMP)
            timed = False  # whether its records' timestamps are read
            if bounds is not None and not header.is_control and not misdated:
                # markers are not checked; a producer's LogAppendTime batch has its max
                # timestamp for every record, so the shortcut holds for it too
                timed = bounds[0] != LONG_MAX or header.max_timestamp - now > bounds[1]
            if not (compacted or timed or misdated):
                continue  # the common case: nothing to open
            errors: list[RecordError] = []
            late = False  # whether a record's timestamp is out of bounds (or misdated)
            if compacted or misdated:
                for index, record in enumerate(records.iter_record_slices(data, header)):
                    timestamp = header.max_timestamp if marked else record.timestamp
                    if compacted and record.key is None:
                        keyless = keyless or (
                            "Compacted topic cannot accept message without key in topic "
                            f"partition {topic}-{partition}"
                        )
                        errors.append((index, keyless))
                    elif misdated:
                        errors.append((index, _misdated_error(record, timestamp)))
                        late = True
                    elif timed and bounds is not None:
                        late_one = _timestamp_error(record.offset, timestamp, now, *bounds)
                        if late_one is not None:
                            errors.append((index, late_one))
                            late = True
            elif timed and bounds is not None:
                for index, (offset, timestamp) in enumerate(
                    records.iter_record_timestamps(data, header)
                ):
                    late_one = _timestamp_error(offset, timestamp, now, *bounds)
                    if late_one is not None:
                        errors.append((index, late_one))
                        late = True
            if late:
                return ErrorCode.invalid_timestamp, INVALID_TIMESTAMP, errors
            if errors:
                listed = ", ".join(
                    f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:_MAX_LISTED]
                )
                return (
                    ErrorCode.invalid_record,
                    (
                        f"One or more records have been rejected due to {len(errors)} record errors "
                        f"in total, and only showing the first three errors at most: [{listed}]"
                    ),
                    errors,
                )
    except (records.InvalidRecordBatch, records.UnsupportedMagic):
        return None
    return None


def _misdated_error(record: records.RecordSlice, timestamp: int) -> str:
    """Kafka's record error (LogValidator.validateTimestamp) for a record of a batch its
    producer marked LogAppendTime where that is not taken, naming the record as Kafka's
    DefaultRecord prints itself."""
    key = 0 if record.key is None else len(record.key)
    return (
        f"Invalid timestamp type in message DefaultRecord(offset={record.offset}, "
        f"timestamp={timestamp}, key={key} bytes, value={records.value_size(record)} bytes). "
        "Producer should not set timestamp type to LogAppendTime."
    )


def _timestamp_error(
    offset: int, timestamp: int, now: int, before_ms: int, after_ms: int
) -> str | None:
    """Kafka's record error (LogValidator.validateTimestamp) for a CreateTime record older than
    `before_ms` or more than `after_ms` ahead of the broker's clock, on Java longs as Kafka
    computes it; None when it is within, or has no timestamp."""
    if timestamp == _NO_TIMESTAMP:
        return None
    diff = _java_long(now - timestamp)  # Kafka's timestampDiff
    if diff <= before_ms and _java_long(-diff) <= after_ms:
        return None
    return (
        f"Timestamp {timestamp} of message with offset {offset} is out of range. The timestamp "
        f"should be within [{_java_long(now - before_ms)}, {_java_long(now + after_ms)}]"
    )


_NO_RULES = ProduceRules(False, None, False)  # a topic not (yet) in this broker's metadata
_NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP: not checked


def _java_long(value: int) -> int:
    """`value` wrapped to a Java long, as Kafka's arithmetic on timestamps is."""
    return (value + 2**63) % 2**64 - 2**63


def _has_transactional(body: Any) -> bool:
    """Whether the request carries transactional batches (Kafka looks at each partition's
    first batch, as here); the partition validates every batch itself."""
    if body.transactional_id is not None:
        return True
    for topic in body.topic_data:
        for part in topic.partition_data:
            data = part.records
            if (
                data is not None
                and len(data) > _ATTRIBUTES + 1
                and data[_MAGIC] == records.MAGIC_V2
                and data[_ATTRIBUTES + 1] & records.TRANSACTIONAL_FLAG
            ):
                return True
    return False


def _answer_within(timeout_s: float) -> float:
    """When a produce request still waiting for its appends is answered REQUEST_TIMED_OUT:
    a little before its timeout (a tenth of it, at most a second), because most clients use the
    same value as their own request timeout (request.timeout.ms) and would otherwise give up at
    the same moment, seeing a timeout of their own instead of the broker's retriable error."""
    timeout_s = max(timeout_s, 0.001)
    return timeout_s - min(1.0, timeout_s / 10)


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("unacknowledged append failed: %s", fut.exception())
