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
# the value's format when it carries transaction version 2 fields (docs/transactions-v2.md);
# values without them stay at FORMAT, so a cluster at transaction.version 1 writes what it did
TV2_FORMAT = 2


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
    tv2 = {
        "txn_version": meta.txn_version,
        "next_pid": meta.next_producer_id,
        "prev_pid": meta.previous_producer_id,
    }
    if tv2 != {"txn_version": 0, "next_pid": -1, "prev_pid": -1}:
        doc.update(tv2, v=TV2_FORMAT)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_value(transactional_id: str, data: bytes) -> TxnMetadata:
    doc = json.loads(data)
    if int(doc.get("v", FORMAT)) > TV2_FORMAT:
        # written by newer code: misreading it could lose a transaction's producer id
        raise ValueError(f"transaction state format {doc['v']} is newer than this broker's")
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
        txn_version=int(doc.get("txn_version", 0)),
        next_producer_id=int(doc.get("next_pid", -1)),
        previous_producer_id=int(doc.get("prev_pid", -1)),
    )
