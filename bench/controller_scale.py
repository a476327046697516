"""[M1] The controller alone at scale: a real Controller, 100 simulated brokers, one process.

    .venv/bin/python bench/metadata_scale.py --only controller               # 10k, 100k, 1M
    .venv/bin/python bench/metadata_scale.py --only controller --controller-sizes 10000
    .venv/bin/python bench/controller_scale.py --partitions 100000           # one size, printed
    .venv/bin/python bench/controller_scale.py --partitions 100000 --profile # + cProfile of moves
    # [M1]'s heartbeat item: 4 brokers, a 5th joins, then broker 0 is removed; the event loop's
    # longest slices (CPU per callback) and heartbeat answers over HTTP, every 50 ms a broker
    .venv/bin/python bench/controller_scale.py --partitions 50000 --brokers 4 \
        --max-moves-per-broker 4000 --remove --no-restart --runtime-tuning \
        --http-heartbeats --beat-interval 0.05

One size runs in a process of its own (`run_size`: memory and the controller's Prometheus
counters start from nothing), on one event loop: a real `Controller` with auto_rebalance on, on
an `ObjectStoreMetadataLog` over a `LocalDirObjectStore` in a temporary directory (bytes written
are real: the journal's counters, and the directory checked against them), and 100 simulated
brokers that are as cheap as possible. A simulated broker keeps only which partitions it leads
and at which epoch (never an image): it registers, answers each metadata push with the version
it holds, scans the pushed records (a topic record: it opens its partitions; a "p" record whose
leader becomes none while the partition was its own: it reports it closed at its epoch; one
whose leader becomes itself: it reports it opened at the new epoch), reports through
`Controller.partitions_reported` as a broker's report request does, and heartbeats what opened
and closed since its last heartbeat (`Controller.beat`, from a thread of its own: the liveness
thread of a real controller).

Phases, at each size N:

create    N partitions in topics of at most 10,000 partitions, one CreateTopics call per topic,
          awaited (with wait_s, as the Kafka API calls it: until every partition of the topic is
          reported open). Batches' bytes and controller CPU per topic and per partition.
memory    The controller's structures after creation (its image, the indexes of leadership, the
          membership table with every broker's open partitions, the journal's batches and
          snapshot), measured by walking the objects reachable from the controller (sizes from
          sys.getsizeof, each object once; never entering the event loop, tasks, threads,
          modules, classes, functions or the simulated brokers), per partition. The process's
          RSS growth minus the simulated brokers' own structures is given beside it.
snapshot  The first snapshot of the image (written by the journal in its worker thread): size
          per partition, wall time, CPU of the roll.
move      A 101st broker registers; the controller moves its fair share (about N/101 moves) by
          itself; timed until no move is in flight and every one is Done. Batches' bytes and
          controller CPU per move; snapshot bytes and CPU amortized per move (below).
restart   The controller stops; a new one loads the log (the snapshot and the batches after it)
          and claims it: wall time and CPU of `Controller.start`.
rolled    That new controller writes the next snapshot (the previous one decoded, the batches
          since applied, encoded again): the steady-state snapshot cost, in wall time and CPU.

Controller CPU is time.process_time() over a phase (every thread of the process: the event loop,
the liveness thread's calls into the controller, the journal's snapshot thread, the object
store's threads) minus the simulated brokers' own CPU: each broker's push handler measures its
scan with time.thread_time() (the calls it makes into the controller are outside that), and the
heartbeat thread counts its whole round minus the time inside `Controller.beat`. What the event
loop spends scheduling the controller's pushers is the controller's; the benchmark's own polling
(every 50 ms) is not subtracted and is negligible. Garbage collection is counted where it runs,
and its total time per phase is reported.

Snapshot amortization: the journal writes a snapshot when the bytes of batches since the last
one reach max(snapshot_min_bytes (8 MiB), the last snapshot's size). So each byte of records
costs snapshot_size / max(8 MiB, snapshot_size) bytes of snapshot (at most one) and
rolled_cpu / max(8 MiB, snapshot_size) of snapshot CPU; the move phase is too short to trigger
one at any size here, so that share is computed from the measured snapshot size and roll CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import logging
import math
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from prometheus_client import REGISTRY  # noqa: E402
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore  # noqa: E402
from tidalmq_controller import (  # noqa: E402
    Batch,
    Controller,
    ControllerSettings,
    Heartbeat,
    NewTopic,
    ObjectStoreMetadataLog,
    report_doc,
)
from tidalmq_controller._control_auth import ControlAuth  # noqa: E402
from tidalmq_controller._rpc_client import HttpControllerClient  # noqa: E402
from tidalmq_controller._rpc_server import ControllerServer  # noqa: E402
from tidalmq_core import snapshots  # noqa: E402
from tidalmq_core.metadata import BrokerInfo  # noqa: E402
from tidalmq_core.model import TopicPartition  # noqa: E402

from bench import procstat  # noqa: E402

SIZES = (10_000, 100_000, 1_000_000)
PER_TOPIC = 10_000  # TidalMQ caps a topic at 10,000 partitions
BROKERS = 100
KIB = 1024
MIB = 1 << 20
HTTP_TOKEN = "controller-scale-bench"  # --http-heartbeats: the simulated brokers' control token
DEFAULT_MAX_MOVES = ControllerSettings().max_moves_per_broker  # the controller's default wave


@dataclass(frozen=True)
class ScaleConfig:
    partitions: int
    brokers: int = BROKERS
    per_topic: int = PER_TOPIC
    # large: every move of the join starts at once (waves are not the limit); the controller's
    # default is 1,000 (then the 1M join runs in waves, see --max-moves-per-broker)
    max_moves_per_broker: int = 1_000_000
    heartbeat_interval_s: float = 1.0
    create_wait_s: float = 10.0  # like CreateTopics: until every new partition is open
    phase_timeout_s: float = 1200.0
    profile: bool = False  # cProfile the event loop while creating and moving
    idle_s: float = 3.0  # measure the idle controller's CPU this long before creating
    restart: bool = True  # then a new controller on the log, in a process of its own
    # an experiment, not the controller's behaviour: gc.freeze() once the partitions exist,
    # so full collections no longer walk the image (see the GC pauses the page reports)
    gc_freeze: bool = False
    # then broker 0 is drained and removed (remove-broker), timed like the move
    remove: bool = False
    # the runtime settings of a process hosting a controller (tidalmq_broker.tuning)
    runtime_tuning: bool = False
    # and its garbage collection policy (tidalmq_controller/gc_policy.py: gc.freeze() after
    # big batches), as `tidalmq local up` and the operator install it
    gc_policy: bool = False
    # heartbeats over HTTP to the controller's liveness thread (ControllerServer), as a real
    # broker sends them, instead of calling Controller.beat from the heartbeat thread
    http_heartbeats: bool = False
    # how often each simulated broker heartbeats (None: the controller's interval); shorter
    # gives more samples of the answer time in a phase of a second or two
    beat_interval_s: float | None = None


def responsiveness(phase: dict[str, Any]) -> str:
    """The longest event-loop slice and the heartbeat answers of a phase, with the load."""
    loop, beats = phase["loop"], phase["beats"]
    top = loop["longest"][0] if loop["longest"] else {"cpu_s": 0.0, "wall_s": 0.0, "what": "-"}
    return (
        f"  longest loop slice {top['cpu_s'] * 1000:.0f} ms CPU ({top['wall_s'] * 1000:.0f} ms "
        f"wall) of {loop['callbacks']:,} callbacks: {top['what']}; heartbeats "
        f"{beats['heartbeats']}, answer p99 {beats.get('p99_ms', 0):.1f} ms, max "
        f"{beats.get('max_ms', 0):.1f} ms, {beats.get('over_100ms', 0)} over 100 ms; load "
        f"{phase['load_before']} -> {phase['load_after']}"
    )


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def counter(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def topic_layout(partitions: int, per_topic: int) -> dict[str, int]:
    """`partitions` split evenly over the fewest topics of at most `per_topic` partitions."""
    topics = max(1, math.ceil(partitions / per_topic))
    base, extra = divmod(partitions, topics)
    return {f"scale-{i:03d}": base + (1 if i < extra else 0) for i in range(topics)}


# --------------------------------------------------------------------------------------------
# CPU bookkeeping


class SimClock:
    """CPU the simulated brokers spend, apart from the controller's. Each field is written by
    one thread only (the event loop, the heartbeat thread)."""

    def __init__(self) -> None:
        self.loop_s = 0.0
        self.beats_s = 0.0

    @property
    def total(self) -> float:
        return self.loop_s + self.beats_s


class GcClock:
    """Garbage collection (gc.callbacks): its total CPU (the collecting thread's), and each
    full (generation 2) collection's pause in wall time. A collection holds the GIL, so it
    stalls the event loop and the liveness thread alike, whichever thread's allocation
    triggered it; on a loaded machine the pause is longer than its CPU."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.full_pauses: list[tuple[float, float]] = []  # (wall s, CPU s)
        self._started = (0.0, 0.0)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = (time.perf_counter(), time.thread_time())
        else:
            wall = time.perf_counter() - self._started[0]
            cpu = time.thread_time() - self._started[1]
            self.cpu += cpu
            if info.get("generation") == 2:
                self.full_pauses.append((wall, cpu))

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)


class RollClock:
    """Times `tidalmq_core.snapshots.roll` (the journal calls it in a worker thread): wall and
    the worker thread's CPU, per call. Instrumentation only: the call is unchanged."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int]] = []  # (wall s, thread CPU s, bytes)
        self._original = snapshots.roll
        snapshots.roll = self._roll  # type: ignore[assignment]

    def _roll(self, *args: Any, **kwargs: Any) -> bytes:
        wall, cpu = time.perf_counter(), time.thread_time()
        data = self._original(*args, **kwargs)
        self.calls.append((time.perf_counter() - wall, time.thread_time() - cpu, len(data)))
        return data

    def close(self) -> None:
        snapshots.roll = self._original  # type: ignore[assignment]


class LoopSlices:
    """Every callback the event loop runs (asyncio's `Handle._run`: a task's step, a call_soon,
    a timer), timed in the loop thread's CPU (time.thread_time: what it computed, not the time
    other processes of a loaded machine took the core) and in wall time. While one runs, nothing
    else on the loop does. Only the longest are kept, with what ran. Instrumentation only."""

    KEEP = 5

    def __init__(self) -> None:
        self.longest: list[tuple[float, float, str]] = []  # (CPU s, wall s, what), longest first
        self.count = 0
        self._original = asyncio.events.Handle._run
        slices = self

        def _run(handle: asyncio.events.Handle) -> None:
            cpu, wall = time.thread_time(), time.perf_counter()
            slices._original(handle)
            took = time.thread_time() - cpu
            slices.count += 1
            if len(slices.longest) < slices.KEEP or took > slices.longest[-1][0]:
                slices._keep(took, time.perf_counter() - wall, handle)

        asyncio.events.Handle._run = _run  # type: ignore[method-assign]

    def _keep(self, cpu: float, wall: float, handle: asyncio.events.Handle) -> None:
        what = repr(handle)[:160]
        task = getattr(getattr(handle, "_callback", None), "__self__", None)
        if isinstance(task, asyncio.Task):  # a task's step: which task, and where it began
            what = f"task {task.get_name()!r} ({task.get_coro().__qualname__})"
        self.longest = sorted([*self.longest, (cpu, wall, what)], reverse=True)[: self.KEEP]

    def reset(self) -> None:
        self.longest = []
        self.count = 0

    def figures(self) -> dict[str, Any]:
        return {
            "callbacks": self.count,
            "longest_cpu_s": round(self.longest[0][0], 4) if self.longest else 0.0,
            "longest": [
                {"cpu_s": round(c, 4), "wall_s": round(w, 4), "what": what}
                for c, w, what in self.longest
            ],
        }

    def close(self) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]


class BeatTimes:
    """Each heartbeat's answer time as the simulated brokers' thread sees it (wall time of
    `Controller.beat`: the GIL and the membership lock it waits for included)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self.lock:
            self.times.append(seconds)

    def take(self) -> dict[str, Any]:
        with self.lock:
            times, self.times = sorted(self.times), []
        if not times:
            return {"heartbeats": 0}
        return {
            "heartbeats": len(times),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 2),
            "max_ms": round(times[-1] * 1000, 2),
            "over_100ms": sum(t > 0.1 for t in times),
        }


@dataclass
class Mark:
    wall: float
    cpu: float
    sim: float
    gc: float
    gc_full: int  # full collections so far
    rolls: int
    batches: float
    records: float
    bytes: float
    snapshot_bytes: float
    load: list[float]


# --------------------------------------------------------------------------------------------
# The simulated brokers


class SimBroker:
    """A broker reduced to what the controller sees of it (see the module docstring)."""

    def __init__(self, cluster: SimCluster, broker_id: int) -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.incarnation = f"sim-{broker_id}"
        self.version = -1
        self.led: dict[str, dict[int, int]] = {}  # topic -> {partition: epoch} it has open
        self.topic_ids: dict[str, str] = {}
        self.lock = threading.Lock()
        self.changes: dict[TopicPartition, int | None] = {}  # since the last heartbeat
        self.resync = False
        self.fenced = False
        self.pushes = 0
        self.snapshots = 0

    # the BrokerChannel the controller pushes to
    async def push_update(self, base: int, snapshot: bytes | None, batches: list[Batch]) -> int:
        started = time.thread_time()
        self.pushes += 1
        reports: list[dict[str, Any]] = []
        if snapshot is not None:
            self.snapshots += 1
            if self.version < 0 and not self.led:
                self.version = base  # new: it leads nothing the snapshot holds
            else:
                self._load(snapshot)
        elif base != self.version:
            self.cluster.clock.loop_s += time.thread_time() - started
            return self.version  # refused: the controller sends from our version
        for batch in batches:
            if batch.version != self.version + 1:
                continue
            self._apply(batch.records, reports)
            self.version = batch.version
        self.cluster.clock.loop_s += time.thread_time() - started
        if reports:
            self.cluster.controller.partitions_reported(self.broker_id, reports)
        return self.version

    def _apply(self, records: list[dict[str, Any]], reports: list[dict[str, Any]]) -> None:
        me = self.broker_id
        for rec in records:
            kind = rec["t"]
            if kind == "p":
                leader = rec.get("l")
                if leader is None:
                    continue  # not a leadership change (queued, created, floors)
                name, index = rec["n"], rec["p"]
                mine = self.led.get(name)
                if leader == me:
                    epoch = rec.get("e")
                    if epoch is None:
                        epoch = mine.get(index, 0) if mine is not None else 0
                    if mine is None:
                        mine = self.led[name] = {}
                    if mine.get(index) != epoch:
                        mine[index] = epoch
                        self._opened(name, index, epoch, reports)
                elif mine is not None and index in mine:
                    self._closed(name, index, mine.pop(index), reports)
            elif kind == "topic":
                name = rec["name"]
                self.topic_ids[name] = rec["id"]
                for index in self.led.pop(name, {}):  # replaced whole: closed first
                    self._closed(name, index, -1, reports)
                if "r" in rec:
                    mine = {i: 0 for i, b in enumerate(rec["r"]) if b == me}
                else:
                    mine = {
                        i: int(p["leader_epoch"])
                        for i, p in enumerate(rec["parts"])
                        if p["leader"] == me
                    }
                if mine:
                    self.led[name] = mine
                    for index, epoch in mine.items():
                        self._opened(name, index, epoch, reports)
            elif kind == "grow":
                name = rec["name"]
                mine = self.led.setdefault(name, {})
                for i, b in enumerate(rec["r"], start=rec.get("at") or 0):
                    if b == me:
                        mine[i] = 0
                        self._opened(name, i, 0, reports)
            elif kind == "tgone":
                for index in self.led.pop(rec["name"], {}):
                    self._closed(rec["name"], index, -1, reports)

    def _opened(self, name: str, index: int, epoch: int, reports: list[dict[str, Any]]) -> None:
        tp = TopicPartition(name, index)
        with self.lock:
            self.changes[tp] = epoch
        # a new partition (epoch 0) opens without a store round trip: its checkpoint comes
        # with its first data (none here); a moved one is opened from its checkpoint
        reports.append(
            report_doc(
                "opened",
                tp,
                epoch,
                topic_id=self.topic_ids.get(name),
                high_watermark=0,
                stored=epoch > 0,
            )
        )

    def _closed(self, name: str, index: int, epoch: int, reports: list[dict[str, Any]]) -> None:
        tp = TopicPartition(name, index)
        with self.lock:
            self.changes[tp] = None
        if epoch >= 0:
            reports.append(
                report_doc("closed", tp, epoch, topic_id=self.topic_ids.get(name), high_watermark=0)
            )

    def _load(self, snapshot: bytes) -> None:
        """A snapshot to a broker that had state (it fell behind): rebuild what it leads."""
        image = snapshots.decode(snapshot)
        self.version = image.version
        self.led = {}
        for name, topic in image.topics.items():
            self.topic_ids[name] = topic.topic_id
            mine = {
                i: p.leader_epoch
                for i, p in enumerate(topic.partitions)
                if p.leader == self.broker_id
            }
            if mine:
                self.led[name] = mine
        self.resync = True

    def heartbeat(self) -> Heartbeat:
        """This round's heartbeat (the heartbeat thread)."""
        with self.lock:
            full = self.resync
            if full:
                changes: dict[TopicPartition, int | None] = {
                    TopicPartition(name, i): e
                    for name, mine in list(self.led.items())
                    for i, e in list(mine.items())
                }
            else:
                changes = self.changes
            self.changes = {}
            self.resync = False
        return Heartbeat(self.broker_id, self.incarnation, self.version, changes, full=full)

    def info(self) -> BrokerInfo:
        return BrokerInfo(
            self.broker_id, "127.0.0.1", 10_000 + self.broker_id, incarnation=self.incarnation
        )


class SimCluster:
    """The simulated brokers and their heartbeat thread."""

    def __init__(self, controller: Controller, interval_s: float) -> None:
        self.controller = controller
        self.interval_s = interval_s
        self.clock = SimClock()
        self.brokers: dict[int, SimBroker] = {}
        self.fenced_replies = 0  # heartbeats answered 'fenced' (or 'not registered')
        self.beat_times = BeatTimes()
        # with --http-heartbeats: the controller's own HTTP server (its liveness thread) answers
        self.http: HttpControllerClient | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, name="sim heartbeats", daemon=True)

    async def add(self, broker_id: int) -> SimBroker:
        broker = SimBroker(self, broker_id)
        self.brokers[broker_id] = broker
        await self.controller.register_broker(broker.info(), broker)
        return broker

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _beat_loop(self) -> None:
        while not self._stop.is_set():
            round_started = time.monotonic()
            cpu = time.thread_time()
            inside = 0.0
            for broker in list(self.brokers.values()):
                beat = broker.heartbeat()
                entered = time.thread_time()
                asked = time.perf_counter()
                try:
                    if self.http is not None:  # the real path: HTTP to the liveness thread
                        reply = self.http.beat_blocking(beat)
                    else:
                        reply = self.controller.beat(beat)
                except Exception:
                    reply = None
                self.beat_times.add(time.perf_counter() - asked)
                inside += time.thread_time() - entered
                if reply is None:
                    continue
                if reply.fenced:
                    self.fenced_replies += 1
                    broker.fenced = True
                if reply.resync:
                    broker.resync = True
            self.clock.beats_s += time.thread_time() - cpu - inside
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - round_started)))

    def structures(self) -> list[object]:
        return [(b.led, b.topic_ids, b.changes) for b in self.brokers.values()]


# --------------------------------------------------------------------------------------------
# Memory: the controller's structures


STOP_TYPES: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    asyncio.AbstractEventLoop,
    asyncio.Future,
    threading.Thread,
    Executor,
    logging.Logger,
    SimBroker,
    SimCluster,
)


def deep_size(roots: Iterable[object], seen: set[int]) -> tuple[int, int]:
    """(bytes, objects) reachable from `roots` (sys.getsizeof, each object once: `seen` is
    shared between calls so a later root counts only what the earlier ones did not reach),
    never entering STOP_TYPES."""
    total = objects = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        if isinstance(obj, STOP_TYPES):
            continue
        total += sys.getsizeof(obj)
        objects += 1
        stack.extend(gc.get_referents(obj))
    return total, objects


def controller_memory(c: Controller, sims: SimCluster, partitions: int) -> dict[str, Any]:
    """The controller's structures by part (each counts what the parts before it did not
    reach), per partition."""
    seen: set[int] = {id(sims), *(id(b) for b in sims.brokers.values())}
    lead = c.leadership
    parts: dict[str, list[object]] = {
        "image": [c.journal.image],
        "leadership indexes": [
            lead._owner,
            lead.by_broker,
            lead.moving,
            lead.leaderless,
            lead.lost,
            lead._queued,
            lead._deferred,
            lead._floor_reports,
            lead._created_reports,
        ],
        "moves": [lead.moves],
        "membership (open partitions)": [c.membership._live],
        "journal (batches kept, snapshot)": [c.journal._ring, c.journal.snapshot_bytes],
        "the rest of the controller": [c],
    }
    started = time.perf_counter()
    out: dict[str, Any] = {"by_part": {}}
    total = objects = 0
    for name, roots in parts.items():
        size, count = deep_size(roots, seen)
        out["by_part"][name] = {"bytes": size, "per_partition": round(size / partitions, 1)}
        total += size
        objects += count
    sim_bytes, _ = deep_size(sims.structures(), seen)
    out |= {
        "bytes": total,
        "objects": objects,
        "per_partition": round(total / partitions, 1),
        "walk_s": round(time.perf_counter() - started, 1),
        "sim_bytes": sim_bytes,
    }
    return out


# --------------------------------------------------------------------------------------------
# The run


class Run:
    def __init__(self, cfg: ScaleConfig, workdir: Path, out: Path | None) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.out = out
        self.result: dict[str, Any] = {
            "partitions": cfg.partitions,
            "config": asdict(cfg),
            "phases": {},
        }
        self.gc = GcClock()
        self.rolls = RollClock()
        self.slices = LoopSlices()
        self.sims: SimCluster | None = None
        self.controller: Controller | None = None
        self.server: ControllerServer | None = None
        self.events: list[str] = []

    def settings(self) -> ControllerSettings:
        return ControllerSettings(
            heartbeat_interval_s=self.cfg.heartbeat_interval_s,
            auto_rebalance=True,
            max_moves_per_broker=self.cfg.max_moves_per_broker,
        )

    def new_controller(self) -> Controller:
        store = LocalDirObjectStore(self.workdir / "store")
        return Controller(ObjectStoreMetadataLog(store), self.settings())

    def save(self) -> None:
        if self.out is not None:
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.result, indent=1, sort_keys=True))
            tmp.replace(self.out)

    def mark(self) -> Mark:
        sim = self.sims.clock.total if self.sims is not None else 0.0
        return Mark(
            time.perf_counter(),
            time.process_time(),
            sim,
            self.gc.cpu,
            len(self.gc.full_pauses),
            len(self.rolls.calls),
            counter("tidalmq_controller_metadata_batches_total"),
            counter("tidalmq_controller_metadata_records_total"),
            counter("tidalmq_controller_metadata_bytes_total"),
            counter("tidalmq_controller_metadata_snapshot_bytes_total"),
            procstat.loadavg(),
        )

    def since(self, m: Mark) -> dict[str, Any]:
        now = self.mark()
        cpu = now.cpu - m.cpu
        sim = now.sim - m.sim
        longest = max(self.gc.full_pauses[m.gc_full :], default=(0.0, 0.0))
        return {
            "seconds": round(now.wall - m.wall, 3),
            "process_cpu_s": round(cpu, 3),
            "sim_cpu_s": round(sim, 3),
            "controller_cpu_s": round(cpu - sim, 3),
            "gc_s": round(now.gc - m.gc, 3),  # CPU
            "gc_full": now.gc_full - m.gc_full,
            # the longest full collection: its wall time (the stall), and its CPU
            "gc_longest_pause_s": round(longest[0], 3),
            "gc_longest_pause_cpu_s": round(longest[1], 3),
            "snapshot_rolls": [
                {"wall_s": round(w, 3), "cpu_s": round(c, 3), "bytes": b}
                for w, c, b in self.rolls.calls[m.rolls :]
            ],
            "batches": int(now.batches - m.batches),
            "records": int(now.records - m.records),
            "batch_bytes": int(now.bytes - m.bytes),
            "snapshot_bytes": int(now.snapshot_bytes - m.snapshot_bytes),
            "load_before": m.load,
            "load_after": now.load,
        }

    async def wait(
        self, done: Callable[[], bool], what: Callable[[], str], timeout_s: float
    ) -> bool:
        deadline = time.monotonic() + timeout_s
        next_report = time.monotonic() + 10
        while not done():
            if time.monotonic() > deadline:
                return False
            if time.monotonic() > next_report:
                log(f"  ... {what()} ({procstat.load1()})")
                next_report = time.monotonic() + 10
            await asyncio.sleep(0.05)
        return True

    async def idle_rate(self, seconds: float) -> float | None:
        """Controller CPU per second while nothing happens but heartbeats."""
        if seconds <= 0:
            return None
        m = self.mark()
        await asyncio.sleep(seconds)
        s = self.since(m)
        return round(s["controller_cpu_s"] / s["seconds"], 4)

    # ---------------------------------------------------------------- phases
    async def run(self) -> dict[str, Any]:
        try:
            await self.phases()
        finally:
            await self.stop()
        if self.cfg.restart and "move" in self.result["phases"]:
            self.result["phases"] |= await asyncio.to_thread(
                restart_in_child, self.cfg, self.workdir
            )
            self.save()
        return self.result

    async def phases(self) -> None:
        cfg = self.cfg
        phases = self.result["phases"]
        self.result["rss_start"] = procstat.rss_bytes()
        c = self.controller = self.new_controller()
        c.add_event_sink(lambda reason, msg, _: self.events.append(f"{reason}: {msg}"))
        await c.start()
        sims = self.sims = SimCluster(c, cfg.beat_interval_s or cfg.heartbeat_interval_s)
        if cfg.http_heartbeats:
            self.server = ControllerServer(c, ControlAuth([HTTP_TOKEN]))
            await self.server.start("127.0.0.1", 0)
            sims.http = HttpControllerClient(
                f"http://127.0.0.1:{self.server.port}", token=HTTP_TOKEN
            )
        sims.start()
        m = self.mark()
        for b in range(cfg.brokers):
            await sims.add(b)
        await self.wait(lambda: not c.moves.active(), lambda: "the offsets topic settling", 120)
        phases["register"] = self.since(m) | {"brokers": cfg.brokers}
        idle = self.result["idle_cpu_per_s"] = await self.idle_rate(cfg.idle_s)
        log(
            f"{cfg.brokers} brokers registered in {phases['register']['seconds']:.1f} s; idle "
            f"controller CPU {(idle or 0) * 100:.1f}% ({procstat.load1()})"
        )
        self.save()
        if not await self.create():
            return
        self.save()
        gc.collect()
        phases["memory"] = controller_memory(c, sims, self.total_partitions())
        phases["memory"]["rss_growth"] = procstat.rss_bytes() - self.result["rss_before_create"]
        mem = phases["memory"]
        log(
            f"controller memory {mem['per_partition']:.0f} B per partition "
            f"({mem['bytes'] / MIB:.0f} MiB, walked in {mem['walk_s']} s); process RSS grew "
            f"{mem['rss_growth'] / MIB:.0f} MiB, the simulated brokers hold "
            f"{mem['sim_bytes'] / MIB:.0f} MiB"
        )
        self.save()
        if cfg.gc_freeze:
            gc.freeze()
        m = self.mark()
        version = await c.journal.write_snapshot()
        snap = self.since(m)
        size = len(c.journal.snapshot_bytes or b"")
        phases["snapshot"] = snap | {
            "version": version,
            "size": size,
            "per_partition": round(size / self.total_partitions(), 2),
        }
        log(
            f"snapshot: {size / MIB:.1f} MiB ({phases['snapshot']['per_partition']} B per "
            f"partition) in {snap['seconds']:.2f} s (roll CPU "
            f"{sum(r['cpu_s'] for r in snap['snapshot_rolls']):.2f} s)"
        )
        self.save()
        if await self.move() and cfg.remove:
            self.save()
            await self.remove()
        self.save()

    def total_partitions(self) -> int:
        assert self.controller is not None
        return sum(len(t.partitions) for t in self.controller.image.topics.values())

    async def create(self) -> bool:
        c, cfg = self.controller, self.cfg
        assert c is not None
        layout = topic_layout(cfg.partitions, cfg.per_topic)
        self.result["rss_before_create"] = procstat.rss_bytes()
        profile = cProfile.Profile() if cfg.profile else None
        m = self.mark()
        if profile is not None:
            profile.enable()
        slowest = 0.0
        deadline = time.monotonic() + cfg.phase_timeout_s
        created = 0
        for name, count in layout.items():
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            result = await c.create_topics([NewTopic(name, count)], wait_s=cfg.create_wait_s)
            if result[0].error is not None:
                raise RuntimeError(f"creating {name}: {result[0].error}")
            slowest = max(slowest, time.perf_counter() - started)
            created += 1
            if created % 10 == 0:
                log(f"  ... {created} of {len(layout)} topics ({procstat.load1()})")
        ok = created == len(layout)
        all_open = await self.wait(
            lambda: self.unopened() == 0 and self.settled(),
            lambda: f"{self.unopened():,} partitions not open yet",
            60,
        )
        if profile is not None:
            profile.disable()
        phase = self.since(m) | {
            "ok": ok and all_open,
            "topics": created,
            "per_topic": max(layout.values()),
            "partitions_created": sum(list(layout.values())[:created]),
            "slowest_topic_s": round(slowest, 3),
            "not_open": self.unopened(),
        }
        if not ok:
            phase["failure"] = f"did not finish within {cfg.phase_timeout_s:.0f} s"
        if profile is not None:
            phase["profile"] = profile_lines(profile, f"{created} topics")
        self.result["phases"]["create"] = phase
        log(
            f"create: {phase['partitions_created']:,} partitions in {created} topics in "
            f"{phase['seconds']:.1f} s; {phase['batch_bytes'] / KIB:.0f} KiB of batches; "
            f"controller CPU {phase['controller_cpu_s']:.2f} s (the simulated brokers "
            f"{phase['sim_cpu_s']:.2f} s); GC {phase['gc_s']:.2f} s ({procstat.load1()})"
        )
        return bool(phase["ok"])

    def unopened(self) -> int:
        c = self.controller
        assert c is not None
        opened = sum(len(live.open_partitions) for _, live in c.membership.items())
        return self.total_partitions() - opened

    def settled(self) -> bool:
        """No move in flight, nothing decided and not committed, and every broker holds the
        committed version (the records a phase causes are all counted in it)."""
        c, sims = self.controller, self.sims
        assert c is not None and sims is not None
        j = c.journal
        return (
            not c.moves.active()
            and not c.leadership._created_reports
            and j._open is None
            and j._in_flight is None
            and all(b.version >= j.committed_version for b in sims.brokers.values())
        )

    async def move(self) -> bool:
        c, sims, cfg = self.controller, self.sims, self.cfg
        assert c is not None and sims is not None
        new_id = cfg.brokers
        total = self.total_partitions()
        done_before = counter("tidalmq_controller_reassignments_total", {"outcome": "done"})
        profile = cProfile.Profile() if cfg.profile else None
        self.slices.reset()
        sims.beat_times.take()
        m = self.mark()
        if profile is not None:
            profile.enable()
        await sims.add(new_id)  # the join's rebalance is planned and queued before it returns
        plan = self.since(m)
        # queued in slices, the first ones may be done already
        queued = len(c.moves.active()) + int(
            counter("tidalmq_controller_reassignments_total", {"outcome": "done"}) - done_before
        )
        log(
            f"  broker {new_id} registered in {plan['seconds']:.2f} s (the rebalance planned "
            f"and queued: CPU {plan['controller_cpu_s']:.2f} s); {queued:,} moves queued"
        )
        finished = await self.wait(
            self.settled,
            lambda: f"{len(c.moves.active()):,} moves in flight",
            cfg.phase_timeout_s,
        )
        if profile is not None:
            profile.disable()
        phase = self.since(m)
        done = int(
            counter("tidalmq_controller_reassignments_total", {"outcome": "done"}) - done_before
        )
        phase |= {
            "ok": finished and done == queued,
            "plan": plan,
            "moves": queued,
            "done": done,
            "new_broker_leads": len(c.leadership.by_broker.get(new_id, ())),
            "fair_share": total // (cfg.brokers + 1),
            "fenced": sum("BrokerFenced" in e for e in self.events),
            "dead": sum("BrokerDead" in e for e in self.events),
            "heartbeats_refused": sims.fenced_replies,
            "loop": self.slices.figures(),
            "beats": sims.beat_times.take(),
        }
        if not finished:
            phase["failure"] = (
                f"did not finish within {cfg.phase_timeout_s:.0f} s: "
                f"{len(c.moves.active()):,} moves in flight"
            )
        if profile is not None:
            phase["profile"] = profile_lines(profile, f"{done} moves")
        self.result["phases"]["move"] = phase
        log(
            f"move: {done:,} moves done of {queued:,} in {phase['seconds']:.1f} s; "
            f"{phase['batch_bytes'] / KIB:.0f} KiB of batches in {phase['batches']} batches; "
            f"controller CPU {phase['controller_cpu_s']:.2f} s (the simulated brokers "
            f"{phase['sim_cpu_s']:.2f} s); GC {phase['gc_s']:.2f} s (longest pause "
            f"{phase['gc_longest_pause_s']:.2f} s); fenced {phase['fenced']}, dead "
            f"{phase['dead']} ({procstat.load1()})"
        )
        log(responsiveness(phase))
        return bool(phase["ok"])

    async def remove(self) -> bool:
        """remove-broker: broker 0 drained (every partition it leads moved elsewhere), then
        removed, timed like the move."""
        c, sims, cfg = self.controller, self.sims, self.cfg
        assert c is not None and sims is not None
        leads = len(c.leadership.by_broker.get(0, ()))
        self.slices.reset()
        sims.beat_times.take()
        m = self.mark()
        drained = await c.drain_broker(0, timeout_s=cfg.phase_timeout_s)
        await c.remove_broker(0)
        sims.brokers.pop(0, None)
        finished = drained and await self.wait(
            self.settled, lambda: f"{len(c.moves.active()):,} moves in flight", 60
        )
        phase = self.since(m) | {
            "ok": finished,
            "moved": leads,
            "loop": self.slices.figures(),
            "beats": sims.beat_times.take(),
        }
        self.result["phases"]["remove"] = phase
        log(
            f"remove: broker 0's {leads:,} partitions moved in {phase['seconds']:.1f} s; "
            f"controller CPU {phase['controller_cpu_s']:.2f} s ({procstat.load1()})"
        )
        log(responsiveness(phase))
        return finished

    async def stop(self) -> None:
        c, sims = self.controller, self.sims
        if sims is not None:
            sims.stop()
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if c is not None:
            await c.stop()
        self.controller = None
        self.sims = None

    def close(self) -> None:
        self.gc.close()
        self.rolls.close()
        self.slices.close()
        if self.cfg.gc_freeze:
            gc.unfreeze()


def stored_log(workdir: Path) -> dict[str, Any]:
    """What a new controller reads: the newest snapshot and the batches after it."""
    log_dir = workdir / "store" / "cluster"
    snaps = sorted((log_dir / "snapshots").glob("*"))
    newest = int(snaps[-1].name) if snaps else 0
    after = [p for p in (log_dir / "log").glob("*") if int(p.name) > newest]
    return {
        "snapshot_bytes": snaps[-1].stat().st_size if snaps else 0,
        "batches": len(after),
        "batch_bytes": sum(p.stat().st_size for p in after),
        # everything kept: the two newest snapshots and the batches since the older one
        "store_bytes": sum(p.stat().st_size for p in log_dir.rglob("*") if p.is_file()),
    }


async def restart(cfg: ScaleConfig, workdir: Path) -> dict[str, Any]:
    """In a fresh process: a new controller loads the log and claims it; then it writes the
    next snapshot (the previous one rolled forward by the batches since)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run = Run(cfg, workdir, None)
    try:
        stored = stored_log(workdir)
        m = run.mark()
        c = run.new_controller()
        await c.start()
        phase = run.since(m) | {"stored": stored, "rss": procstat.rss_bytes()}
        # the brokers of the log are not running: keep the new controller from declaring them
        # dead (and failing a million partitions over) while it writes its snapshot below
        c.expect_brokers(list(c.image.brokers), within_s=cfg.phase_timeout_s)
        log(
            f"restart: a new controller loaded the snapshot "
            f"({stored['snapshot_bytes'] / MIB:.1f} MiB) and {stored['batches']} batches "
            f"({stored['batch_bytes'] / KIB:.0f} KiB) in {phase['seconds']:.2f} s, CPU "
            f"{phase['process_cpu_s']:.2f} s (GC {phase['gc_s']:.2f} s)"
        )
        m = run.mark()
        await c.journal.write_snapshot()
        rolled = run.since(m) | {"size": len(c.journal.snapshot_bytes or b"")}
        log(
            f"rolled snapshot (previous + batches since): {rolled['size'] / MIB:.1f} MiB in "
            f"{rolled['seconds']:.2f} s, roll CPU "
            f"{sum(r['cpu_s'] for r in rolled['snapshot_rolls']):.2f} s (GC "
            f"{rolled['gc_s']:.2f} s, longest pause {rolled['gc_longest_pause_s']:.2f} s)"
        )
        await c.stop()
    finally:
        run.close()
    return {"restart": phase, "rolled": rolled}


def restart_in_child(cfg: ScaleConfig, workdir: Path) -> dict[str, Any]:
    """`restart` in a process of its own: a new controller starts with nothing else in its
    heap, as it would after a failover."""
    out = workdir / "restart.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--restart-from", str(workdir)]
    cmd += ["--json", str(out)]
    cmd += ["--runtime-tuning"] if cfg.runtime_tuning else []
    cmd += ["--gc-policy"] if cfg.gc_policy else []
    try:
        proc = subprocess.run(cmd, timeout=cfg.phase_timeout_s, check=False)
        why = f"exited with {proc.returncode}"
    except subprocess.TimeoutExpired:
        why = f"did not finish within {cfg.phase_timeout_s:.0f} s"
    if out.exists():
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    return {"restart": {"ok": False, "failure": why}}


def profile_lines(profile: cProfile.Profile, what: str, top: int = 25) -> list[str]:
    """The functions that took the most time (own time, then cumulative) on the event loop
    (cProfile sees only the thread it was enabled in; wall-clock, so idle waits show)."""
    out: list[str] = []
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        stats = pstats.Stats(profile, stream=buf)
        stats.sort_stats(key).print_stats(top)
        out.append(f"-- sorted by {key} ({what}; divide by it for per operation)")
        out += [ln for ln in buf.getvalue().splitlines() if ln.strip()][-top - 1 :]
    return out


async def measure(cfg: ScaleConfig, workdir: Path, out: Path | None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run = Run(cfg, workdir, out)
    started = time.perf_counter()
    try:
        result = await asyncio.wait_for(run.run(), cfg.phase_timeout_s * 3)
    except TimeoutError:
        run.result["failure"] = f"the run did not finish within {cfg.phase_timeout_s * 3:.0f} s"
        result = run.result
    finally:
        run.close()
    result["duration_s"] = round(time.perf_counter() - started, 1)
    result["peak_rss"] = peak_rss()
    run.save()
    return result


def peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


# --------------------------------------------------------------------------------------------
# Figures per operation (what the page shows)


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """Per topic creation, per partition created, per move; snapshot shares amortized."""
    phases = result.get("phases", {})
    out: dict[str, Any] = {}
    create, move = phases.get("create"), phases.get("move")
    snap, rolled = phases.get("snapshot"), phases.get("rolled")
    min_bytes = ControllerSettings().snapshot_min_bytes
    size = (snap or {}).get("size")
    # a steady-state snapshot: the previous one decoded, the batches since applied, encoded,
    # stored (the rolled phase runs in a process with nothing else to do)
    rolled_cpu = (rolled or {}).get("controller_cpu_s")
    trigger = max(min_bytes, size) if size else None
    if create and create.get("topics"):
        topics, parts = create["topics"], create["partitions_created"]
        out["create"] = {
            "bytes_per_topic": create["batch_bytes"] / topics,
            "bytes_per_partition": create["batch_bytes"] / parts,
            "cpu_ms_per_topic": create["controller_cpu_s"] * 1000 / topics,
            "cpu_us_per_partition": create["controller_cpu_s"] * 1e6 / parts,
        }
        if trigger:
            share = create["batch_bytes"] / trigger
            out["create"]["snapshot_bytes_per_topic"] = share * size / topics
            if rolled_cpu:
                out["create"]["snapshot_cpu_ms_per_topic"] = share * rolled_cpu * 1000 / topics
    if move and move.get("done"):
        done = move["done"]
        plan_cpu = move.get("plan", {}).get("controller_cpu_s", 0.0)
        out["move"] = {
            "bytes": move["batch_bytes"] / done,
            "records": move["records"] / done,
            "cpu_ms": move["controller_cpu_s"] * 1000 / done,
            # the join's rebalance planned (O(cluster) once) and queued, then the moves run
            "plan_cpu_ms": plan_cpu * 1000 / done,
            "run_cpu_ms": (move["controller_cpu_s"] - plan_cpu) * 1000 / done,
            "gc_ms": move["gc_s"] * 1000 / done,
            "seconds": move["seconds"],
        }
        if trigger:
            per = move["batch_bytes"] / done
            out["move"]["snapshot_bytes"] = per * size / trigger
            if rolled_cpu:
                out["move"]["snapshot_cpu_ms"] = per * rolled_cpu * 1000 / trigger
    return out


def summary(result: dict[str, Any]) -> str:
    f = figures(result)
    n = result["partitions"]
    lines = [f"{n:,} partitions x {result['config']['brokers']} brokers:"]
    if "create" in f:
        c = f["create"]
        lines.append(
            f"  per topic created: {c['bytes_per_topic'] / KIB:.1f} KiB of batches, controller "
            f"CPU {c['cpu_ms_per_topic']:.1f} ms ({c['cpu_us_per_partition']:.1f} us per "
            "partition)"
        )
    if "move" in f:
        mv = f["move"]
        lines.append(
            f"  per move: {mv['bytes']:.0f} B of batches ({mv['records']:.1f} records) + "
            f"{mv.get('snapshot_bytes', 0):.0f} B of snapshot amortized; controller CPU "
            f"{mv['cpu_ms']:.3f} ms (planning {mv['plan_cpu_ms']:.3f}, running "
            f"{mv['run_cpu_ms']:.3f}) + {mv.get('snapshot_cpu_ms', 0):.3f} ms of snapshot "
            "amortized"
        )
    mem = result.get("phases", {}).get("memory")
    if mem:
        lines.append(f"  controller memory: {mem['per_partition']:.0f} B per partition")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# One size in a process of its own (the page's runner)


def run_size(cfg: ScaleConfig, workdir: Path, *, timeout_s: float | None = None) -> dict[str, Any]:
    """Runs one size in a child process (a clean heap, fresh counters); returns what it
    measured, partial if it did not finish in time ("failure" says so) or failed ("error")."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"controller-{cfg.partitions}.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--partitions",
        str(cfg.partitions),
        "--brokers",
        str(cfg.brokers),
        "--max-moves-per-broker",
        str(cfg.max_moves_per_broker),
        "--phase-timeout",
        str(cfg.phase_timeout_s),
        "--workdir",
        str(workdir / f"controller-{cfg.partitions}"),
        "--json",
        str(out),
    ]
    if cfg.profile:
        cmd.append("--profile")
    if cfg.gc_freeze:
        cmd.append("--gc-freeze")
    if cfg.runtime_tuning:
        cmd.append("--runtime-tuning")
    if cfg.gc_policy:
        cmd.append("--gc-policy")
    limit = timeout_s or cfg.phase_timeout_s * 3 + 300
    returncode: int | None = None
    try:
        returncode = subprocess.run(cmd, timeout=limit, check=False).returncode
    except subprocess.TimeoutExpired:
        pass
    result: dict[str, Any] = (
        json.loads(out.read_text()) if out.exists() else {"partitions": cfg.partitions}
    )
    if returncode is None:
        result["failure"] = f"the run did not finish within {limit:.0f} s (killed)"
    elif returncode != 0 and not result.get("failure"):
        result["error"] = f"the run exited with {returncode}"
    result["figures"] = figures(result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", type=int, default=SIZES[0])
    ap.add_argument("--brokers", type=int, default=BROKERS)
    ap.add_argument("--max-moves-per-broker", type=int, default=ScaleConfig(0).max_moves_per_broker)
    ap.add_argument("--phase-timeout", type=float, default=ScaleConfig(0).phase_timeout_s)
    ap.add_argument("--profile", action="store_true", help="cProfile creating and moving")
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="experiment: gc.freeze() once the partitions exist (not what the controller does)",
    )
    ap.add_argument("--remove", action="store_true", help="then drain and remove broker 0")
    ap.add_argument("--no-restart", action="store_true", help="skip the new controller's phases")
    ap.add_argument(
        "--runtime-tuning",
        action="store_true",
        help="the GC thresholds and thread switch interval of a process hosting a controller",
    )
    ap.add_argument(
        "--gc-policy",
        action="store_true",
        help="the garbage collection policy of a process hosting a controller (gc_policy.py)",
    )
    ap.add_argument(
        "--http-heartbeats",
        action="store_true",
        help="heartbeats over HTTP to the controller's liveness thread, as real brokers send",
    )
    ap.add_argument(
        "--beat-interval", type=float, help="seconds between a simulated broker's heartbeats"
    )
    ap.add_argument("--workdir", type=Path, help="the log's directory (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="write the figures there (after every phase)")
    ap.add_argument("--restart-from", type=Path, help=argparse.SUPPRESS)  # restart_in_child
    args = ap.parse_args(argv)
    cfg = ScaleConfig(
        partitions=args.partitions,
        brokers=args.brokers,
        max_moves_per_broker=args.max_moves_per_broker,
        phase_timeout_s=args.phase_timeout,
        profile=args.profile,
        gc_freeze=args.gc_freeze,
        remove=args.remove,
        restart=not args.no_restart,
        runtime_tuning=args.runtime_tuning,
        gc_policy=args.gc_policy,
        http_heartbeats=args.http_heartbeats,
        beat_interval_s=args.beat_interval,
    )
    if cfg.runtime_tuning:
        from tidalmq_broker.tuning import tune_runtime

        tune_runtime()
    if cfg.gc_policy:
        from tidalmq_controller.hosting import install_gc_policy

        install_gc_policy()
    if args.restart_from is not None:
        phases = asyncio.run(restart(cfg, args.restart_from))
        if args.json is not None:
            args.json.write_text(json.dumps(phases, indent=1, sort_keys=True))
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="controller-scale-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    try:
        result = asyncio.run(measure(cfg, workdir, args.json))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["figures"] = figures(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(summary(result))
    for name in ("create", "move"):
        profile = result.get("phases", {}).get(name, {}).get("profile")
        if profile:
            print(f"== {name}", *profile, sep="\n")
    return 1 if result.get("error") or result.get("failure") else 0


if __name__ == "__main__":
    sys.exit(main())
