"""Data loss ([O2]): an object store that lost its identity, partitions whose data is missing.

Owns: the store's identity check (the marker written for a new cluster, read at start and every
`identity_check_interval_s`; a missing or foreign marker is the store problem, and while there
is one the controller writes nothing into the store), the partitions a broker reported with
their data missing (recorded where they are: moving them would not bring the data back), and
their explicit acceptance (Kafka's unclean leader election: each continues at its end-offset
floor, never reusing an offset), which also rewrites a wiped store's marker.

Must not touch: where partitions are led or moved (leadership decides; this manager only
records and clears `lost`, bumping the epoch so the broker opens the partition again), or the
controller's role (it is told whether the controller is active).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge
from tidalmq_broker.storage.api import StorageError
from tidalmq_broker.storage.identity import (
    MISSING,
    StoreIdentity,
    identity_problem,
    read_identity,
    write_identity,
)
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_core.metadata import ClusterMetadata, DataLoss
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import Record, marker_record, partition_record

from tidalmq_controller._errors import ForeignStore, UnknownTopic
from tidalmq_controller._journal import Journal
from tidalmq_controller._leadership import Leadership
from tidalmq_controller._settings import ControllerSettings

log = logging.getLogger(__name__)

LOST_PARTITIONS = Gauge(
    "tidalmq_controller_lost_partitions",
    "Partitions whose data a broker found missing and whose loss nobody accepted yet",
)
STORE_LOST = Gauge(
    "tidalmq_controller_store_lost",
    "1 while the object store's identity marker is missing or names another cluster",
)


@dataclass(frozen=True, slots=True)
class AcceptedLoss:
    partition: int
    continues_at: int
    loss: DataLoss | None

    @property
    def given_up(self) -> int:
        return self.loss.missing_offsets if self.loss is not None else 0


class DataLossManager:
    """The controller's manager of lost data: the store's identity and lost partitions."""

    def __init__(
        self,
        object_store: ObjectStore | None,
        settings: ControllerSettings,
        journal: Journal,
        leadership: Leadership,
        *,
        commit: Callable[[list[Record]], Awaitable[int]],
        emit: Callable[[str, str, dict[str, Any]], None],
        wake: Callable[[], None],
        spawn: Callable[[Awaitable[Any]], None],
        active: Callable[[], bool],
    ) -> None:
        self._object_store = object_store
        self.settings = settings
        self.journal = journal
        self.leadership = leadership
        self._commit = commit
        self._emit = emit
        self._wake = wake
        self._spawn = spawn
        self._active = active
        self._store_problem: str | None = None

    @property
    def image(self) -> ClusterMetadata:
        if self.journal.image is None:
            raise RuntimeError("controller not started")
        return self.journal.image

    def count_lost(self) -> None:
        """Publish how many partitions are lost and not accepted (after each commit)."""
        LOST_PARTITIONS.set(len(self.leadership.lost))

    @property
    def store_problem(self) -> str | None:
        """Why the object store must not be used (its identity marker is missing, or names
        another cluster), or None."""
        return self._store_problem

    def lost_partitions(self, topic: str | None = None) -> dict[TopicPartition, DataLoss]:
        """Partitions whose data a broker found missing, not accepted yet."""
        out: dict[TopicPartition, DataLoss] = {}
        for tp in sorted(self.leadership.lost):
            if topic is not None and tp.topic != topic:
                continue
            part = self.leadership.partition(tp)
            if part is not None and part.lost is not None:
                out[tp] = part.lost
        return out

    async def partition_lost_data(
        self, broker_id: int, tp: TopicPartition, epoch: int, loss: DataLoss
    ) -> None:
        """A broker found the partition's data missing. Recorded (the partition stays where it
        is: moving it would not bring the data back) until someone accepts the loss."""
        part = self.leadership.partition(tp)
        if part is None or part.leader != broker_id or part.leader_epoch != epoch:
            log.info(
                "ignoring a stale data-loss report of %s at epoch %d from broker %d",
                tp,
                epoch,
                broker_id,
            )
            return
        if part.lost is not None:
            return  # known
        await self._commit(self.leadership.lost_records(tp, loss))
        LOST_PARTITIONS.set(len(self.leadership.lost))
        log.warning(
            "%s: DATA LOST (broker %d: %s): acknowledged up to offset %d, the store holds up to "
            "%d, %d offsets missing; `tidalmq recover --accept-data-loss %s` continues without them",
            tp,
            broker_id,
            loss.reason,
            loss.expected_end,
            loss.found_end,
            loss.missing_offsets,
            tp.topic,
        )
        self._emit(
            "DataLost",
            f"{tp}: data lost ({loss.reason}): expected offsets up to {loss.expected_end}, found "
            f"{loss.found_end}, {loss.missing_offsets} missing",
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "expected_end": loss.expected_end,
                "found_end": loss.found_end,
                "missing_offsets": loss.missing_offsets,
                "broker": broker_id,
                "warning": True,
            },
        )

    async def accept_data_loss(self, topic: str, partitions: list[int] | None = None) -> list[int]:
        """Like Kafka's unclean leader election, and explicit only: each lost partition of the
        topic (those of `partitions`; all when None) continues at its end-offset floor (never
        reusing an offset, so committed offsets and idempotent producers stay valid). Returns
        the partitions recovered."""
        return [a.partition for a in await self.accept_data_loss_detailed(topic, partitions)]

    async def accept_data_loss_detailed(
        self, topic: str, partitions: list[int] | None = None
    ) -> list[AcceptedLoss]:
        info = self.image.topics.get(topic)
        if info is None:
            raise UnknownTopic(f"topic {topic} does not exist")
        problem = self._store_problem
        rewrite_marker = problem is not None
        if problem is not None and problem != MISSING:
            raise ForeignStore(
                f"{problem}: point the cluster at its own object store (accepting a data "
                "loss would write into another cluster's store)"
            )
        wanted = None if partitions is None else set(partitions)
        chosen: list[AcceptedLoss] = []
        for i, part in enumerate(info.partitions):
            if wanted is not None and i not in wanted:
                continue
            # with the marker gone the whole store was wiped: every created partition is
            # lost, whether its broker could report it yet or not
            if part.lost is None and not (rewrite_marker and part.created):
                continue
            start = part.end_offset_floor
            if part.lost is not None:
                start = max(start, part.lost.expected_end, part.lost.found_end)
            chosen.append(AcceptedLoss(i, start, part.lost))
        if not chosen:
            return []
        if rewrite_marker:
            assert self._object_store is not None
            await write_identity(self._object_store, self.image.cluster_id, replace=True)
            log.warning(
                "rewrote the object store's identity marker for cluster %s", self.image.cluster_id
            )
        records: list[Record] = []
        for a in chosen:
            part = info.partitions[a.partition]
            changes: dict[str, Any] = {
                "lost": None,
                "accepted_from": a.continues_at,
                "end_offset_floor": max(part.end_offset_floor, a.continues_at),
            }
            if not part.moving:
                changes["leader_epoch"] = part.leader_epoch + 1  # its broker opens it again
            records.append(partition_record(TopicPartition(topic, a.partition), **changes))
        if rewrite_marker:
            records.append(marker_record(True))
        await self._commit(records)
        LOST_PARTITIONS.set(len(self.leadership.lost))
        if rewrite_marker:
            self._set_store_problem(None)
        for a in chosen:
            tp = TopicPartition(topic, a.partition)
            log.warning(
                "%s: data loss accepted: continues at offset %d (%d offsets given up)",
                tp,
                a.continues_at,
                a.given_up,
            )
            self._emit(
                "DataLossAccepted",
                f"{tp}: data loss accepted; continues at offset {a.continues_at}, "
                f"{a.given_up} offsets given up",
                {
                    "topic": topic,
                    "partition": a.partition,
                    "continues_at": a.continues_at,
                    "given_up": a.given_up,
                    "warning": True,
                },
            )
        self._wake()
        return chosen

    async def first_identity_check(self, meta: ClusterMetadata, new: bool) -> bool:
        """At start: write the store's identity marker for a new cluster (or, once, for one
        whose metadata predates the marker), else read it. True when the store holds our
        marker (the metadata then records `store_marker`)."""
        if self._object_store is None:
            return False
        found: StoreIdentity | None
        try:
            if new or not meta.store_marker:
                found = await write_identity(self._object_store, meta.cluster_id)
            else:
                found = await read_identity(self._object_store)
        except (StorageError, OSError) as exc:
            log.warning(
                "could not check the object store's identity marker (%s); checking again in %.0fs",
                exc,
                self.settings.identity_check_interval_s,
            )
            return meta.store_marker
        self._set_store_problem(identity_problem(found, meta.cluster_id, meta.store_marker))
        return found is not None and found.cluster_id == meta.cluster_id

    async def identity_loop(self) -> None:
        while self._active():
            await asyncio.sleep(self.settings.identity_check_interval_s)
            try:
                await self.check_identity()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("object store identity check failed: %s", exc)

    async def check_identity(self) -> str | None:
        """Read the store's identity marker and compare it with the metadata; returns (and
        records) the problem, None when the store is ours."""
        if self._object_store is None or not self._active():
            return self._store_problem
        meta = self.image
        try:
            found = await read_identity(self._object_store)
        except (StorageError, OSError) as exc:
            log.debug("identity check: store unavailable: %s", exc)
            return self._store_problem  # an unreachable store is not a wiped one
        if found is None and not meta.store_marker:  # an upgrade whose first write failed
            found = await write_identity(self._object_store, meta.cluster_id)
            if found.cluster_id == meta.cluster_id:
                await self._commit([marker_record(True)])
        problem = identity_problem(found, meta.cluster_id, self.image.store_marker)
        self._set_store_problem(problem)
        return problem

    def _set_store_problem(self, problem: str | None) -> None:
        if problem == self._store_problem:
            return
        self._store_problem = problem
        STORE_LOST.set(0 if problem is None else 1)
        if problem is not None:
            log.warning("OBJECT STORE LOST: %s; nothing is written into it", problem)
            self._emit(
                "StoreLost", f"object store lost: {problem}", {"reason": problem, "warning": True}
            )
            if problem == MISSING:
                # a wiped store: if the metadata log shares it, it went too; store what is
                # committed again, so a restarted controller still knows what was there
                self._spawn(self._store_metadata_again())
        else:
            log.warning("object store identity verified again")
            self._emit("StoreRecovered", "object store identity verified again", {})

    async def _store_metadata_again(self) -> None:
        try:
            version = await self.journal.write_snapshot(again=True)
            log.warning(
                "metadata snapshot at version %d stored again (the store was wiped)", version
            )
        except Exception as exc:
            log.warning("could not store the metadata snapshot again: %s", exc)
