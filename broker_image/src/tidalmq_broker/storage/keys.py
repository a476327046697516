"""The layout of object keys (one place, so that GC, recovery and tests agree).

    wal/<broker>/<incarnation>/<seq>                      one WAL object per flush
    partitions/<topic>/<topic_id>/<partition>/checkpoint  the partition's meta stream
    partitions/<topic>/<topic_id>/<partition>/segments/<base offset>-<unique>

Incarnations sort by start time (zero-padded milliseconds, then a random suffix) and sequence
numbers are zero-padded, so listing a prefix returns WAL objects in write order.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from tidalmq_core.model import TopicPartition

WAL_ROOT = "wal/"
PARTITIONS_ROOT = "partitions/"
_SEQ_DIGITS = 12


def new_incarnation() -> str:
    return f"{int(time.time() * 1000):013d}-{os.urandom(3).hex()}"


def partition_prefix(tp: TopicPartition, topic_id: str) -> str:
    return f"{PARTITIONS_ROOT}{tp.topic}/{topic_id}/{tp.partition}/"


def checkpoint_key(tp: TopicPartition, topic_id: str) -> str:
    return partition_prefix(tp, topic_id) + "checkpoint"


def segment_key(tp: TopicPartition, topic_id: str, base_offset: int) -> str:
    return f"{partition_prefix(tp, topic_id)}segments/{base_offset:020d}-{uuid.uuid4().hex[:12]}"


def wal_prefix(broker: str, incarnation: str) -> str:
    return f"{WAL_ROOT}{broker}/{incarnation}/"


def wal_key(broker: str, incarnation: str, seq: int) -> str:
    return f"{wal_prefix(broker, incarnation)}{seq:0{_SEQ_DIGITS}d}"


@dataclass(frozen=True, slots=True)
class WalKey:
    broker: str
    incarnation: str
    seq: int


def parse_wal_key(key: str) -> WalKey | None:
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "wal" or not parts[3].isdigit():
        return None
    return WalKey(parts[1], parts[2], int(parts[3]))


@dataclass(frozen=True, slots=True)
class PartitionObjectKey:
    topic: str
    topic_id: str
    partition: int
    kind: str  # "checkpoint" or "segment"

    @property
    def checkpoint_key(self) -> str:
        return f"{PARTITIONS_ROOT}{self.topic}/{self.topic_id}/{self.partition}/checkpoint"


def parse_partition_key(key: str) -> PartitionObjectKey | None:
    parts = key.split("/")
    if len(parts) < 5 or parts[0] != "partitions" or not parts[3].isdigit():
        return None
    if len(parts) == 5 and parts[4] == "checkpoint":
        return PartitionObjectKey(parts[1], parts[2], int(parts[3]), "checkpoint")
    if len(parts) == 6 and parts[4] == "segments":
        return PartitionObjectKey(parts[1], parts[2], int(parts[3]), "segment")
    return None
