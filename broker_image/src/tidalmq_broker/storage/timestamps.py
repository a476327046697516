"""ListOffsets by timestamp inside stored batches: Kafka's answer is the first record (at or
after the log start) whose timestamp is at least the target, with that record's timestamp.
Only a batch whose max timestamp reaches the target is looked into, and its records are only
walked (decompressed if they must be), never re-encoded."""

from __future__ import annotations

import logging

from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import TimestampLookup

log = logging.getLogger(__name__)


def first_record_at(
    data: bytes | memoryview, timestamp_ms: int, log_start: int, where: object
) -> TimestampLookup | None:
    """The first record of the whole batches in `data` at or after `log_start` with a
    timestamp >= `timestamp_ms`; None if they hold none. `where` names the log in warnings."""
    for h in records.iter_headers(data):
        if h.max_timestamp < timestamp_ms or h.last_offset < log_start:
            continue
        try:
            for offset, timestamp in records.iter_record_timestamps(data, h):
                if offset >= log_start and timestamp >= timestamp_ms:
                    return TimestampLookup(offset, timestamp)
        except records.InvalidRecordBatch as exc:
            log.warning(
                "%s: cannot read the records of the batch at %d (%s); answering with the batch",
                where, h.base_offset, exc,
            )  # fmt: skip
            return TimestampLookup(max(h.base_offset, log_start), h.max_timestamp)
    return None
