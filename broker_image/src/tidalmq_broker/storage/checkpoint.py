"""The partition checkpoint (the partition's metadata stream) and its fenced store.

A checkpoint is the complete durable state of a partition up to `next_offset`: leader epoch,
owner broker and incarnation, log start offset, the offset index, idempotent-producer state, the
owner's WAL position it is complete up to (WAL objects of that incarnation with a higher sequence
may hold later batches), whether the owner closed it cleanly, and the transaction state (ongoing
transactions, the aborted-transactions index; older checkpoints have none).

It is created with If-None-Match and replaced with If-Match on its etag, so two owners can never
both commit. This module is the one place where a lost race (PreconditionFailed) becomes
PartitionFenced.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from tidalmq_broker.storage.api import PartitionFenced, StorageError
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed

FORMAT_VERSION = 1


class CorruptCheckpoint(StorageError):
    pass


@dataclass(slots=True)
class Checkpoint:
    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    owner_broker: str
    owner_incarnation: str
    wal_position: int  # last WAL sequence of the owner incarnation already reflected; -1 = none
    log_start_offset: int = 0
    next_offset: int = 0
    clean_shutdown: bool = False
    index: list[IndexEntry] = field(default_factory=list)
    producers: dict[str, object] = field(default_factory=dict)
    # transactions (docs/transactions.md): per producer id [first offset of its ongoing
    # transaction or -1, coordinator epoch]; the aborted-transactions index
    transactions: dict[str, list[int]] = field(default_factory=dict)
    aborted_txns: list[list[int]] = field(default_factory=list)
    # the log cleaner's progress (docs/compaction.md): "first_dirty", the offset its next pass
    # maps from, and "horizon", the earliest delete horizon (ms) of a kept tombstone or marker;
    # empty for a partition never cleaned (and not written then: older checkpoints stay as they
    # were, and older brokers ignore the key)
    cleaner: dict[str, int] = field(default_factory=dict)
    written_at_ms: int = 0
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        extra: dict[str, object] = {"cleaner": self.cleaner} if self.cleaner else {}
        return json.dumps(
            {
                "format_version": self.format_version,
                "topic": self.topic,
                "topic_id": self.topic_id,
                "partition": self.partition,
                "leader_epoch": self.leader_epoch,
                "owner": {"broker": self.owner_broker, "incarnation": self.owner_incarnation},
                "wal_position": self.wal_position,
                "log_start_offset": self.log_start_offset,
                "next_offset": self.next_offset,
                "clean_shutdown": self.clean_shutdown,
                "written_at_ms": self.written_at_ms or int(time.time() * 1000),
                "index": [e.to_json() for e in self.index],
                "producers": self.producers,
                "transactions": self.transactions,
                "aborted_txns": self.aborted_txns,
                **extra,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        try:
            raw = json.loads(data)
            version = int(raw["format_version"])
            if version > FORMAT_VERSION:
                raise CorruptCheckpoint(f"checkpoint format {version} is newer than this broker")
            return cls(
                topic=raw["topic"],
                topic_id=raw["topic_id"],
                partition=int(raw["partition"]),
                leader_epoch=int(raw["leader_epoch"]),
                owner_broker=str(raw["owner"]["broker"]),
                owner_incarnation=str(raw["owner"]["incarnation"]),
                wal_position=int(raw["wal_position"]),
                log_start_offset=int(raw["log_start_offset"]),
                next_offset=int(raw["next_offset"]),
                clean_shutdown=bool(raw["clean_shutdown"]),
                index=[IndexEntry.from_json(e) for e in raw["index"]],
                producers=raw["producers"],
                transactions=raw.get("transactions", {}),
                aborted_txns=raw.get("aborted_txns", []),
                cleaner={str(k): int(v) for k, v in raw.get("cleaner", {}).items()},
                written_at_ms=int(raw.get("written_at_ms", 0)),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpoint(f"unreadable checkpoint: {exc}") from exc


class CheckpointStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def load(self, key: str) -> tuple[Checkpoint, str] | None:
        try:
            data, etag = await self.store.get_with_etag(key)
        except ObjectNotFound:
            return None
        return Checkpoint.decode(data), etag

    async def commit(self, key: str, checkpoint: Checkpoint, etag: str | None) -> str:
        """Create (etag None) or replace the checkpoint; returns the new etag.
        Raises PartitionFenced if another writer got there first."""
        checkpoint.written_at_ms = int(time.time() * 1000)
        data = checkpoint.encode()
        try:
            if etag is None:
                return await self.store.put(key, data, if_none_match=True)
            return await self.store.put(key, data, if_match=etag)
        except PreconditionFailed as exc:
            raise PartitionFenced(
                f"checkpoint {key} was changed by another owner "
                f"(ours: epoch {checkpoint.leader_epoch}, broker {checkpoint.owner_broker})"
            ) from exc
