"""The records the transaction coordinator writes to `__transaction_state`.

One record per change of a transactional id: key = the id, value = its whole metadata as a small
versioned JSON document (internal: no client reads them). The log has no compaction yet, so the
state is recovered by replaying the partition from its start: the latest record of each key wins
(what compaction would keep).
"""

from __future__ import annotations

import json
from typing import Any

from tidalmq_broker.groups.records import partition_for_group
from tidalmq_broker.transactions.state import TxnMetadata, TxnState

FORMAT = 1


def partition_for_transactional_id(transactional_id: str, partitions: int) -> int:
    """Kafka's `Utils.abs(transactionalId.hashCode) % transaction.state.log.num.partitions`
    (the same hash as for groups)."""
    return partition_for_group(transactional_id, partitions)


def encode_key(transactional_id: str) -> bytes:
    return json.dumps({"v": FORMAT, "t": transactional_id}, separators=(",", ":")).encode()


def decode_key(data: bytes) -> str:
    return str(json.loads(data)["t"])


def encode_value(meta: TxnMetadata) -> bytes:
    doc: dict[str, Any] = {
        "v": FORMAT,
        "pid": meta.producer_id,
        "epoch": meta.producer_epoch,
        "last_epoch": meta.last_producer_epoch,
        "timeout_ms": meta.timeout_ms,
        "state": meta.state.value,
        "partitions": sorted([t, p] for t, p in meta.partitions),
        "start_ms": meta.start_ms,
        "update_ms": meta.update_ms,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_value(transactional_id: str, data: bytes) -> TxnMetadata:
    doc = json.loads(data)
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=int(doc["pid"]),
        producer_epoch=int(doc["epoch"]),
        last_producer_epoch=int(doc.get("last_epoch", -1)),
        timeout_ms=int(doc["timeout_ms"]),
        state=TxnState(doc["state"]),
        partitions=frozenset((str(t), int(p)) for t, p in doc["partitions"]),
        start_ms=int(doc["start_ms"]),
        update_ms=int(doc["update_ms"]),
    )
