"""The controller's half of static topics: create, remap, repair, clean up.

A static topic `T` lives in the cluster metadata as three things, always changed together in one
commit: the mapping copies (`ClusterMetadata.static_topics[T]`, the source of truth), the hidden
topic `__sq.T` whose partitions are the physical queues (each created on one broker and never
moved; a sealed one has no leader and is read from object storage), and the Kafka view `T`
(partition q led by the broker of logic queue q's writable physical queue), derived from the
first two by `sync_view`.

A remap of some logic queues of a topic is one *operation* (the seed's RemappingStaticTopic):
it moves every copy from epoch e to e + 1 in three writes, with the I/O of closing the old
physical queues between them:

    C1  strict: the old physical queues lose their leader (their brokers close them: no more
        writes) and the Kafka view shows no leader; available: also the new physical queues
        are created and become the writable leaders at once ("switch new", logic offset
        undecided, producers answered at old end + jump)
    --  wait until each old physical queue is closed (its broker reports it), or, if that broker
        is dead or does not close in time (then it is fenced and its lease runs out), seal it
        from object storage by replaying its WAL; either way read its exact end offset
    C2  "block old": record each old item's end in its broker's copy
    C3  strict: the new physical queues continue at exactly the old ends; available: the new
        items' logic offsets are fixed (bounded jump, never backwards); every copy is rewritten
        at e + 1 (leader completeness, second-leader copy, cleanup of older generations)

A controller that dies between two commits leaves copies at different epochs: the check refuses
every further update, and `repair` (automatic when the controller restarts, or `tidalmq
static-topic repair`) finishes the interrupted operation from what the copies say.

The controller never balances, drains or fails over physical queues like other partitions; this
manager moves logic queues instead: off brokers that die (strict, sealed from object storage so
every acknowledged record stays), drain or leave the topic's broker set, onto brokers that join
(minimal moves), and to explicit targets (`remap`, StaticTopic `spec.remap`).

This module owns: creating and updating static topics, the remap operation (C1-C3 above),
repair, the automatic moves, pins and cleanup started from the controller's tick, and what the
CLI and the operator read (`describe`, `remaps`). Beside it: _static_sealing.py (making a
physical queue unwritable and sealing it), _static_view.py (the Kafka view and placement, pure
functions), _static_topics_http.py (the routes). Must not touch: other topics' partitions and
moves (leadership's), brokers' leases (it asks the controller to fence one), or the metadata
outside one `update` of the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from prometheus_client import Counter, Gauge, Histogram
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.topic_data import delete_partition_data
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.placement import place_partitions
from tidalmq_core.static_description import describe
from tidalmq_core.static_mapping import (
    MODES,
    MappingConflict,
    MappingError,
    MappingView,
    StaticTopicState,
    TotalQueuesFixed,
    block_old,
    complete,
    drop_items,
    expired_items,
    finish,
    initial_mapping,
    pending_work,
    physical_topic_name,
    placement_of,
    plan_placement,
    require_consistent,
    switch_new,
)
from tidalmq_core.topics import (
    InvalidTopic,
    config_number,
    validate_configs,
    validate_partition_count,
    validate_topic_name,
)

from tidalmq_controller._errors import NoBrokers, StaticTopicError, TopicAlreadyExists, UnknownTopic
from tidalmq_controller._membership import BrokerLiveness, Membership
from tidalmq_controller._settings import ControllerSettings
from tidalmq_controller._static_sealing import QueueSealer
from tidalmq_controller._static_view import (
    copy_brokers,
    new_physical_queue,
    placeable_brokers,
    sync_view,
    view_drifted,
)
from tidalmq_controller._topics import TopicResult

log = logging.getLogger(__name__)

REMAPS = Counter(
    "tidalmq_static_remaps_total",
    "Logic queues remapped, by order and outcome",
    ["topic", "mode", "outcome"],
)
REMAP_SECONDS = Histogram(
    "tidalmq_static_remap_seconds",
    "Remap request until the new physical queue is served (the logic queue's unavailability)",
    ["mode"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
JUMP = Counter(
    "tidalmq_static_logic_offsets_skipped_total",
    "Logic offsets skipped by availability-order remaps (the bounded jump)",
    ["topic"],
)
EPOCH = Gauge("tidalmq_static_topic_epoch", "Epoch of a static topic's mapping", ["topic"])
INCONSISTENT = Gauge(
    "tidalmq_static_topic_inconsistent",
    "1 while a static topic's mapping copies disagree (updates refused until repair)",
    ["topic"],
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class StaticTopicsHost(Protocol):
    """What the static-topic manager reads and calls of the controller that hosts it (the
    controller is one; naming this instead of the Controller class keeps _controller.py ->
    _static_topics.py one-way)."""

    settings: ControllerSettings
    membership: Membership

    @property
    def metadata(self) -> ClusterMetadata: ...

    async def update(self, mutate: Callable[[ClusterMetadata], object]) -> int: ...

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult: ...

    def known_high_watermarks(self) -> dict[TopicPartition, int]: ...

    def broker_liveness(self) -> dict[int, BrokerLiveness]: ...

    def deferred(self, tp: TopicPartition) -> bool: ...

    def wake(self) -> None: ...

    def fence_broker(self, broker_id: int, reason: str) -> None: ...

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None: ...


@dataclass(slots=True)
class RemapRecord:
    """One logic queue's remap, for status, the CLI and the benchmark."""

    topic: str
    queue: int
    source: int
    target: int
    mode: str
    reason: str
    started: float  # wall clock
    old_physical: int = -1
    new_physical: int = -1
    sealed_ms: float | None = None  # old physical queue closed or sealed, since start
    switched_ms: float | None = None  # the new one is the leader in the metadata, since start
    opened_ms: float | None = None  # its broker serves it, since start: the remap time
    recovered: bool = False  # the old one was sealed from object storage (dead broker)
    jump: int = 0  # logic offsets skipped (availability order)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Op:
    name: str
    moves: dict[int, tuple[int, str]]
    reason: str
    records: dict[int, RemapRecord] = field(default_factory=dict)


class StaticTopicManager:
    def __init__(self, controller: StaticTopicsHost, store: ObjectStore | None) -> None:
        self._c = controller
        self._store = store
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._sealer = QueueSealer(controller, store)
        self._awaiting_open: dict[TopicPartition, RemapRecord] = {}
        self._opened = asyncio.Condition()
        self._pins: dict[str, dict[int, tuple[int, str]]] = {}
        self._placed_on: dict[str, tuple[int, ...]] = {}
        self._repair_after: dict[str, float] = {}
        self._leaderless_since: dict[TopicPartition, float] = {}
        self._last_cleanup = time.monotonic()
        self.history: deque[RemapRecord] = deque(maxlen=4096)
        self.auto_repair = True
        self.default_mode = "strict"
        self.cleanup_interval_s = 30.0
        self.empty_item_grace_ms = 60_000
        self.last_error: dict[str, str] = {}

    # ------------------------------------------------------------------ helpers
    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _state(self, meta: ClusterMetadata, name: str) -> StaticTopicState:
        st = meta.static_topics.get(name)
        if st is None:
            raise UnknownTopic(f"static topic {name!r} does not exist")
        return st

    # ------------------------------------------------------------------ the Kafka view
    sync_view = staticmethod(sync_view)  # the operator's status tests derive views with it

    # ------------------------------------------------------------------ create / update
    async def create(
        self,
        name: str,
        total_queues: int,
        *,
        brokers: list[int] | None = None,
        configs: dict[str, str | None] | None = None,
        jump: int | None = None,
    ) -> dict[str, Any]:
        self._sealer.require_store()
        validate_topic_name(name)
        validate_partition_count(total_queues)
        checked = validate_configs(dict(configs or {}), static=True)
        meta = self._c.metadata
        phys_name = physical_topic_name(name)
        if name.startswith("__"):
            raise InvalidTopic(f"topic {name!r}: names starting with '__' are internal")
        if name in meta.topics or name in meta.static_topics or phys_name in meta.topics:
            raise TopicAlreadyExists(f"topic {name!r} already exists")
        alive = [b for b, info in meta.brokers.items() if info.state == "alive"]
        if brokers is not None:
            brokers = sorted(set(brokers))
            unknown = [b for b in brokers if b not in meta.brokers]
            if unknown or not brokers:
                raise StaticTopicError(
                    f"spec.brokers names brokers that are not registered: {unknown}"
                    if unknown
                    else "spec.brokers is empty"
                )
        placeable = [b for b in (brokers if brokers is not None else alive) if b in alive]
        if not placeable:
            raise NoBrokers("no live broker to place the logic queues on")
        placement = place_partitions(placeable, total_queues)
        now = _now_ms()

        def mutate(m: ClusterMetadata) -> None:
            if name in m.topics or phys_name in m.topics:
                raise TopicAlreadyExists(f"topic {name!r} already exists")
            st = initial_mapping(
                name,
                total_queues,
                placement,
                brokers=brokers,
                now_ms=now,
                copy_brokers=brokers if brokers is not None else alive,
            )
            if jump is not None:
                st.jump = max(int(jump), 0)
            m.static_topics[name] = st
            m.topics[phys_name] = TopicInfo(
                phys_name,
                str(uuid.uuid4()),
                [PartitionState(b, 0, [b]) for b in placement],
                dict(checked),
                internal=True,
                kind="physical",
            )
            m.topics[name] = TopicInfo(
                name,
                str(uuid.uuid4()),
                [PartitionState(b, 0, [b]) for b in placement],
                dict(checked),
                internal=False,
                kind="static",
            )

        await self._c.update(mutate)
        log.info(
            "static topic %s created: %d logic queues on brokers %s",
            name,
            total_queues,
            sorted(set(placement)),
        )
        self._c.emit(
            "StaticTopicCreated",
            f"static topic {name}: {total_queues} logic queues",
            {"topic": name},
        )
        return self.describe(name)

    async def update(
        self,
        name: str,
        *,
        total_queues: int | None = None,
        brokers: list[int] | Literal["keep"] | None = "keep",
        configs: dict[str, str | None] | None = None,
        pins: dict[int, tuple[int, str]] | None = None,
    ) -> dict[str, Any]:
        """Apply a changed spec: the broker set (queues move at the next tick), configs, pins
        (explicit remaps, kept until changed). `totalQueues` can never change."""
        meta = self._c.metadata
        st = self._state(meta, name)
        if total_queues is not None and total_queues != st.total_queues:
            raise TotalQueuesFixed(
                f"static topic {name!r} has {st.total_queues} logic queues; totalQueues can "
                f"never change (asked for {total_queues}): keyed data keeps its queue only "
                "because the count is fixed. Create a new static topic for another count."
            )
        if pins is not None:
            for q, (b, mode) in pins.items():
                self._check_move(meta, st, q, b, mode)
            self._pins[name] = dict(pins)
        if brokers != "keep":
            new = None if brokers is None else sorted(set(brokers))
            if new is not None:
                unknown = [b for b in new if b not in meta.brokers]
                if unknown:
                    raise StaticTopicError(f"brokers {unknown} are not registered")
            if new != st.brokers:

                def mutate(m: ClusterMetadata) -> None:
                    m.static_topics[name].brokers = new

                await self._c.update(mutate)
        topic = self._c.metadata.topics.get(name)
        if (
            configs is not None
            and topic is not None
            and validate_configs(configs, static=True) != topic.configs
        ):
            result = await self._c.alter_topic_configs(
                name, dict(configs), incremental=False, validate_only=False
            )
            if result.error is not None:
                raise result.error
        self._c.wake()
        return self.describe(name)

    def forget(self, name: str) -> None:
        """The static topic was deleted."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self._pins.pop(name, None)
        self._placed_on.pop(name, None)

    # ------------------------------------------------------------------ remap
    def _check_move(
        self, meta: ClusterMetadata, st: StaticTopicState, q: int, broker: int, mode: str
    ) -> None:
        if not 0 <= q < st.total_queues:
            raise StaticTopicError(f"logic queue {q} does not exist (0..{st.total_queues - 1})")
        if mode not in MODES:
            raise StaticTopicError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        info = meta.brokers.get(broker)
        if info is None or info.state != "alive":
            raise StaticTopicError(f"broker {broker} is not a live broker")
        if st.brokers is not None and broker not in st.brokers:
            raise StaticTopicError(f"broker {broker} is not in the topic's brokers {st.brokers}")

    async def remap(
        self,
        name: str,
        moves: dict[int, tuple[int, str]],
        *,
        reason: str = "requested",
        wait_open_s: float = 30.0,
    ) -> list[RemapRecord]:
        """Move logic queues to other brokers (one operation); returns once every new physical
        queue is served (or `wait_open_s` passed)."""
        self._sealer.require_store()
        meta = self._c.metadata
        st = self._state(meta, name)
        for q, (b, mode) in moves.items():
            self._check_move(meta, st, q, b, mode)
        async with self._lock(name):
            op = _Op(name, dict(moves), reason)
            try:
                await self._operate(op)
            except MappingConflict as exc:
                raise StaticTopicError(str(exc)) from exc
        await self._wait_opened(list(op.records.values()), wait_open_s)
        return list(op.records.values())

    async def _operate(self, op: _Op) -> None:
        name = op.name
        meta = self._c.metadata
        st = self._state(meta, name)
        view = require_consistent(st)  # the Global Epoch Check: refused if the copies disagree
        target_epoch = view.epoch + 1
        moves = {}
        for q, (b, mode) in op.moves.items():
            leader = view.leader(q)
            if leader is not None and leader.broker != b:
                moves[q] = (b, mode)
        if not moves:
            return
        olds = {q: view.leader(q) for q in moves}
        phys_name = physical_topic_name(name)
        started = time.time()
        for q, (b, mode) in moves.items():
            old = olds[q]
            assert old is not None
            op.records[q] = RemapRecord(
                name, q, old.broker, b, mode, op.reason, started, old_physical=old.queue
            )
        hwms = self._c.known_high_watermarks()
        now = _now_ms()
        for old in olds.values():
            assert old is not None
            self._sealer.forget_closed(TopicPartition(phys_name, old.queue))

        def c1(m: ClusterMetadata) -> None:  # strict: block; available: switch new, block
            st = m.static_topics[name]
            phys = m.topics[phys_name]
            for q, (b, mode) in moves.items():
                old = olds[q]
                assert old is not None
                phys.partitions[old.queue].leader = NO_LEADER
                if mode == "available":
                    pid = new_physical_queue(phys, b)
                    known = hwms.get(TopicPartition(phys_name, old.queue), old.start_offset)
                    switch_new(
                        st, q, b, pid, known_end=known, now_ms=now, target_epoch=target_epoch
                    )
                    self._expect_open(op.records[q], phys_name, pid)
            sync_view(m, name)

        version = await self._c.update(c1)
        self._switched(op, "available")
        log.info(
            "static topic %s: remapping %s (%s)",
            name,
            {q: f"{olds[q].broker}->{b} {mode}" for q, (b, mode) in moves.items()},  # type: ignore[union-attr]
            op.reason,
        )
        sealed = await self._sealer.seal_all(name, [old.queue for old in olds.values()], version)  # type: ignore[union-attr]
        for q in moves:
            old = olds[q]
            assert old is not None
            rec = op.records[q]
            rec.sealed_ms = (time.time() - rec.started) * 1000
            rec.recovered = sealed[old.queue].recovered
        now = _now_ms()

        def c2(m: ClusterMetadata) -> None:  # block old: each old broker's copy records the end
            st = m.static_topics[name]
            phys = m.topics[phys_name]
            for q in moves:
                old = olds[q]
                assert old is not None
                result = sealed[old.queue]
                block_old(
                    st,
                    q,
                    old.gen,
                    end_offset=result.end_offset,
                    time_of_end=result.time_of_end,
                    now_ms=now,
                    target_epoch=target_epoch,
                )
                part = phys.partitions[old.queue]
                part.leader = NO_LEADER
                part.leader_epoch = max(part.leader_epoch, result.checkpoint.leader_epoch)

        await self._c.update(c2)
        strict = {q: b for q, (b, mode) in moves.items() if mode == "strict"}
        holes: dict[int, int] = {}

        def c3(m: ClusterMetadata) -> None:  # switch new: new leaders, every copy at e + 1
            st = m.static_topics[name]
            phys = m.topics[phys_name]

            def allocate(q: int, broker: int) -> int:
                pid = new_physical_queue(phys, broker)
                self._expect_open(op.records[q], phys_name, pid)
                return pid

            before = st.view()
            complete(
                st,
                ends={},
                targets=strict,
                allocate=allocate,
                now_ms=now,
                target_epoch=target_epoch,
                copy_brokers=copy_brokers(m, st),
            )
            after = st.view()
            for q in moves:
                items = after.items(q)
                prev = before.items(q)
                if len(items) >= 2 and prev and not prev[-1].decided:
                    holes[q] = items[-1].logic_offset - items[-2].logic_end()
            sync_view(m, name)

        await self._c.update(c3)
        for q, hole in holes.items():
            op.records[q].jump = hole
            JUMP.labels(name).inc(hole)
        self._switched(op, "strict")
        for rec in op.records.values():
            self.history.append(rec)
            REMAPS.labels(name, rec.mode, "ok").inc()
            self._c.emit(
                "StaticQueueRemapped",
                f"{name} queue {rec.queue}: broker {rec.source} -> {rec.target} ({rec.mode})",
                {"topic": name, "queue": rec.queue, "target": rec.target},
            )
        for old in olds.values():
            assert old is not None
            self._spawn(
                self._sealer.compact(name, old.queue), f"compact sealed {phys_name}-{old.queue}"
            )
        self.last_error.pop(name, None)

    def _expect_open(self, rec: RemapRecord, phys_name: str, pid: int) -> None:
        """Register before the commit, so an early report of the open is not missed."""
        rec.new_physical = pid
        self._awaiting_open[TopicPartition(phys_name, pid)] = rec

    @staticmethod
    def _switched(op: _Op, mode: str) -> None:
        for rec in op.records.values():
            if rec.mode == mode:
                rec.switched_ms = (time.time() - rec.started) * 1000

    async def _wait_opened(self, records: list[RemapRecord], timeout_s: float) -> None:
        """Until every new physical queue is served (its broker's report, or its heartbeat if
        the report was lost), or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while any(r.opened_ms is None and r.error is None for r in records):
            if time.monotonic() > deadline:
                return
            for r in records:
                live = self._c.broker_liveness().get(r.target)
                tp = TopicPartition(physical_topic_name(r.topic), r.new_physical)
                if r.opened_ms is None and live is not None and tp in live.open_partitions:
                    self.partition_opened(r.target, tp)
            async with self._opened:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):  # not wait_for: see Controller._run
                        await self._opened.wait()

    def partition_opened(self, broker_id: int, tp: TopicPartition) -> None:
        rec = self._awaiting_open.get(tp)
        if rec is None or rec.target != broker_id:
            return
        del self._awaiting_open[tp]
        rec.opened_ms = (time.time() - rec.started) * 1000
        REMAP_SECONDS.labels(rec.mode).observe(rec.opened_ms / 1000)

        async def notify() -> None:
            async with self._opened:
                self._opened.notify_all()

        self._spawn(notify(), "static remap opened")

    def partition_closed(self, broker_id: int, tp: TopicPartition) -> None:
        self._sealer.closed(tp)

    # ------------------------------------------------------------------ repair
    async def repair(self, name: str) -> dict[str, Any]:
        """Finish an interrupted update from what the copies say: seal the physical queues an
        availability switch left open, give a successor to a sealed leader, fix undecided
        logic offsets, and rewrite every copy at one epoch above all of them. Misplaced copies
        are dropped."""
        self._sealer.require_store()
        async with self._lock(name):
            await self._repair_locked(name)
        return self.describe(name)

    async def _repair_locked(self, name: str) -> None:
        meta = self._c.metadata
        st = self._state(meta, name)
        view = st.view()
        if view.consistent and not view.ignored:
            return
        target_epoch = max(c.epoch for c in st.copies.values()) + 1
        phys_name = physical_topic_name(name)
        work = pending_work(view)
        to_seal = [item.queue for _, item in work["seal"]]
        if to_seal:

            def block(m: ClusterMetadata) -> None:
                for pid in to_seal:
                    m.topics[phys_name].partitions[pid].leader = NO_LEADER
                sync_view(m, name)

            version = await self._c.update(block)
            sealed = await self._sealer.seal_all(name, to_seal, version)
        else:
            sealed = {}
        ends = {pid: (r.end_offset, r.time_of_end) for pid, r in sealed.items()}
        now = _now_ms()
        placeable: list[int] = []

        def finish_it(m: ClusterMetadata) -> None:
            st = m.static_topics[name]
            phys = m.topics[phys_name]
            for key in [k for k, c in st.copies.items() if c.bname != k]:
                del st.copies[key]  # misplaced copies: dropped, the others rewritten
            placeable[:] = placeable_brokers(m, st)
            targets = {}
            for q, last in pending_work(st.view())["reopen"]:
                if last.broker not in placeable and placeable:
                    targets[q] = min(placeable)
            for pid, result in sealed.items():
                phys.partitions[pid].leader_epoch = max(
                    phys.partitions[pid].leader_epoch, result.checkpoint.leader_epoch
                )
            complete(
                st,
                ends=ends,
                targets=targets,
                allocate=lambda q, b: new_physical_queue(phys, b),
                now_ms=now,
                target_epoch=target_epoch,
                copy_brokers=copy_brokers(m, st),
            )
            sync_view(m, name)

        await self._c.update(finish_it)
        log.warning("static topic %s repaired: every copy at epoch %d", name, target_epoch)
        self._c.emit(
            "StaticTopicRepaired",
            f"{name}: copies rewritten at epoch {target_epoch}",
            {"topic": name},
        )

    # ------------------------------------------------------------------ the loop
    def tick(self) -> None:
        """Called by the controller loop: start whatever each static topic needs (never waits:
        operations run as tasks, one at a time per topic)."""
        if self._store is None:
            return
        meta = self._c.metadata
        now = time.monotonic()
        for name, st in meta.static_topics.items():
            view = st.view()
            EPOCH.labels(name).set(view.epoch)
            INCONSISTENT.labels(name).set(0 if view.consistent else 1)
            running = self._tasks.get(name)
            if running is not None and not running.done():
                continue
            if self._lock(name).locked():
                continue
            if not view.consistent or view.ignored:
                if self.auto_repair and now >= self._repair_after.get(name, 0.0):
                    self._repair_after[name] = now + 5.0
                    self._start(name, self._repair_locked(name), "repair")
                continue
            if self._reopen_leaderless(meta, name, view, now):
                continue
            if view_drifted(meta, name):
                self._start(name, self._c.update(functools.partial(sync_view, name=name)), "view")
                continue
            moves, reason = self._wanted_moves(meta, name, st, view)
            if moves:
                placeable = tuple(placeable_brokers(meta, st))
                self._start(name, self._auto_op(name, moves, reason, placeable), reason)
                continue
            if now - self._last_cleanup > self.cleanup_interval_s:
                self._start(name, self._cleanup_locked(name), "cleanup")
        if now - self._last_cleanup > self.cleanup_interval_s:
            self._last_cleanup = now

    def _start(self, name: str, coro: Any, what: str) -> None:
        async def run() -> None:
            async with self._lock(name):
                try:
                    await coro
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.last_error[name] = f"{what}: {exc}"
                    REMAPS.labels(name, what, "failed").inc()
                    log.warning("static topic %s: %s failed: %s", name, what, exc)

        self._tasks[name] = asyncio.create_task(run(), name=f"static {name} {what}")

    def _wanted_moves(
        self, meta: ClusterMetadata, name: str, st: StaticTopicState, view: MappingView
    ) -> tuple[dict[int, tuple[int, str]], str]:
        placeable = placeable_brokers(meta, st)
        if not placeable:
            return {}, ""
        leaders = placement_of(view)
        pins = {q: pin for q, pin in self._pins.get(name, {}).items() if pin[0] in placeable}
        dead = {b for b, info in meta.brokers.items() if info.state == "dead"}
        orphans = {q for q, b in leaders.items() if b not in placeable}
        changed = tuple(placeable) != self._placed_on.get(name)
        if not (changed or orphans):
            pinned = {q: pin for q, pin in pins.items() if leaders.get(q) != pin[0]}
            return pinned, "spec.remap"
        plan = plan_placement(leaders, placeable, {q: b for q, (b, _) in pins.items()})
        moves: dict[int, tuple[int, str]] = {}
        for q, b in plan.items():
            source = leaders.get(q)
            gone = source is None or source in dead or source not in meta.brokers
            mode = "strict" if gone else pins.get(q, (b, self.default_mode))[1]
            moves[q] = (b, mode)
        if not moves:
            self._placed_on[name] = tuple(placeable)
        reason = "brokers changed" if changed else "queues on brokers that left"
        return moves, reason

    async def _auto_op(
        self, name: str, moves: dict[int, tuple[int, str]], reason: str, placeable: tuple[int, ...]
    ) -> None:
        await self._operate(_Op(name, moves, reason))
        self._placed_on[name] = placeable

    def _reopen_leaderless(
        self, meta: ClusterMetadata, name: str, view: MappingView, now: float
    ) -> bool:
        """A writable item whose physical queue has had no leader for longer than a session
        (a controller that died between C1 and C2 of a strict remap): give it back to its
        broker with a higher epoch (any earlier incarnation's lease has run out by then)."""
        phys_name = physical_topic_name(name)
        phys = meta.topics.get(phys_name)
        if phys is None:
            return False
        s = self._c.settings
        due: list[int] = []
        for q in range(view.total_queues):
            last = view.leader(q)
            if last is None or last.sealed or last.queue >= len(phys.partitions):
                continue
            tp = TopicPartition(phys_name, last.queue)
            part = phys.partitions[last.queue]
            info = meta.brokers.get(last.broker)
            if part.leader != NO_LEADER or info is None or info.state != "alive":
                self._leaderless_since.pop(tp, None)
                continue
            since = self._leaderless_since.setdefault(tp, now)
            if now - since > s.session_timeout_s and not self._c.deferred(tp):
                due.append(last.queue)
        if not due:
            return False

        def mutate(m: ClusterMetadata) -> None:
            for pid in due:
                part = m.topics[phys_name].partitions[pid]
                part.leader = part.replicas[0]
                part.leader_epoch += 1
            sync_view(m, name)

        for pid in due:
            self._leaderless_since.pop(TopicPartition(phys_name, pid), None)
        log.warning(
            "static topic %s: reopening physical queues %s left without a leader", name, due
        )
        self._start(name, self._c.update(mutate), "reopen")
        return True

    async def _cleanup_locked(self, name: str) -> None:
        """The seed's cleanup of expired mapping items: delete the physical queues whose data
        is older than retention.ms (and empty ones), then drop their items from every copy."""
        store = self._store
        meta = self._c.metadata
        st = meta.static_topics.get(name)
        topic = meta.topics.get(name)
        phys = meta.topics.get(physical_topic_name(name))
        if store is None or st is None or topic is None or phys is None:
            return
        view = st.view()
        if not view.consistent:
            return
        retention = int(config_number("retention.ms", topic.config("retention.ms") or "-1"))
        doomed = expired_items(
            view, now_ms=_now_ms(), retention_ms=retention, empty_grace_ms=self.empty_item_grace_ms
        )
        if not doomed:
            return

        def drop(m: ClusterMetadata) -> None:
            st = m.static_topics[name]
            drop_items(st, doomed)
            finish(st, copy_brokers=copy_brokers(m, st), target_epoch=view.epoch + 1)
            sync_view(m, name)

        await self._c.update(drop)  # unmapped first: no read can land on a deleted queue
        for _, item in doomed:
            tp = TopicPartition(phys.name, item.queue)
            with contextlib.suppress(Exception):
                await delete_partition_data(store, tp, phys.topic_id)
        log.info("static topic %s: cleaned up %d expired items", name, len(doomed))

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        for task in [*self._tasks.values(), *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks.values(), *self._background, return_exceptions=True)

    # ------------------------------------------------------------------ describe
    def describe(self, name: str) -> dict[str, Any]:
        meta = self._c.metadata
        self._state(meta, name)
        running = self._tasks.get(name)
        return {
            **describe(meta, name),
            "busy": running is not None and not running.done(),
            "lastError": self.last_error.get(name),
            "pins": {
                str(q): {"broker": b, "mode": m} for q, (b, m) in self._pins.get(name, {}).items()
            },
        }

    def names(self) -> list[str]:
        return sorted(self._c.metadata.static_topics)

    def remaps(self, name: str | None = None) -> list[RemapRecord]:
        return [r for r in self.history if name is None or r.topic == name]


def moves_from_json(
    items: Iterable[dict[str, Any]], default_mode: str
) -> dict[int, tuple[int, str]]:
    out: dict[int, tuple[int, str]] = {}
    for item in items:
        q = int(item["queue"])
        if q in out:
            raise StaticTopicError(f"logic queue {q} appears twice")
        out[q] = (int(item["broker"]), str(item.get("mode") or default_mode))
    return out


__all__ = [
    "MappingConflict",
    "MappingError",
    "RemapRecord",
    "StaticTopicError",
    "StaticTopicManager",
    "TotalQueuesFixed",
    "moves_from_json",
]
