"""The one place where TidalMQ's exceptions become Kafka error codes."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode
from tidalmq_controller import (
    ControllerError,
    ControllerFenced,
    InternalTopic,
    InvalidReplicaAssignment,
    NoBrokers,
    TopicAlreadyExists,
    UnknownTopic,
)
from tidalmq_core.topics import InvalidConfig, InvalidPartitions, InvalidTopic, StaticConfig

from tidalmq_broker.partitions import LeaderNotAvailable, NotLeader, UnknownPartition
from tidalmq_broker.server.ratelog import REQUEST_ERRORS, describe
from tidalmq_broker.storage import api as storage

log = logging.getLogger(__name__)


class KafkaError(Exception):
    """An error the handler wants reported with a specific code and message."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


_CODES: list[tuple[type[BaseException], ErrorCode]] = [
    # storage
    (storage.PartitionFenced, ErrorCode.not_leader_or_follower),
    (storage.PartitionClosing, ErrorCode.not_leader_or_follower),
    (storage.OffsetOutOfRange, ErrorCode.offset_out_of_range),
    (storage.UnsupportedMessageFormat, ErrorCode.unsupported_for_message_format),
    (storage.CorruptRecord, ErrorCode.corrupt_message),
    (storage.RecordTooLarge, ErrorCode.message_too_large),
    (storage.InvalidRecord, ErrorCode.invalid_record),
    (storage.OutOfOrderSequence, ErrorCode.out_of_order_sequence_number),
    (storage.ProducerCatchingUp, ErrorCode.not_leader_or_follower),
    (storage.InvalidProducerEpoch, ErrorCode.invalid_producer_epoch),
    (storage.UnknownProducerId, ErrorCode.unknown_producer_id),
    (storage.InvalidTxnState, ErrorCode.invalid_txn_state),
    (storage.TransactionCoordinatorFenced, ErrorCode.transaction_coordinator_fenced),
    (storage.StorageError, ErrorCode.kafka_storage_error),
    # partition leadership
    (NotLeader, ErrorCode.not_leader_or_follower),
    (LeaderNotAvailable, ErrorCode.leader_not_available),
    (UnknownPartition, ErrorCode.unknown_topic_or_partition),
    # controller and validation
    (TopicAlreadyExists, ErrorCode.topic_already_exists),
    (UnknownTopic, ErrorCode.unknown_topic_or_partition),
    (NoBrokers, ErrorCode.invalid_replication_factor),
    (InvalidReplicaAssignment, ErrorCode.invalid_replica_assignment),
    (ControllerFenced, ErrorCode.not_controller),
    # as Kafka refuses to append to or delete records of an internal topic
    (InternalTopic, ErrorCode.invalid_topic_exception),
    (InvalidTopic, ErrorCode.invalid_topic_exception),
    (InvalidPartitions, ErrorCode.invalid_partitions),
    (InvalidConfig, ErrorCode.invalid_config),
    (StaticConfig, ErrorCode.invalid_request),
    (ControllerError, ErrorCode.invalid_request),
    (TimeoutError, ErrorCode.request_timed_out),
]


def error_code(exc: BaseException) -> ErrorCode:
    if isinstance(exc, KafkaError):
        return exc.code
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    # one line, rate-limited: a client can make this happen at will (traceback at DEBUG)
    REQUEST_ERRORS.error(log, "unexpected error mapped to UNKNOWN_SERVER_ERROR: %s", describe(exc))
    log.debug("unexpected error mapped to UNKNOWN_SERVER_ERROR", exc_info=exc)
    return ErrorCode.unknown_server_error


def error_message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
