"""[M1] Garbage collection pauses of the controller while topics are created, with and without
the GC policy (tidalmq_controller/gc_policy.py: gc.freeze() after big batches).

    .venv/bin/python bench/controller_gc_pauses.py                     # 3 runs each, alternating
    .venv/bin/python bench/controller_gc_pauses.py --runs 1 --policy on  # one run, one mode

One run is one child process (a clean heap): a real Controller on an ObjectStoreMetadataLog in a
temporary directory, with the runtime settings of a process hosting a controller
(tidalmq_broker.tuning: GC thresholds, switch interval), 4 simulated brokers
(bench/controller_scale.py's SimBroker: they open what they are pushed and report it) that
heartbeat every 50 ms over HTTP to the controller's liveness thread (ControllerServer), as real
brokers do. It creates `--partitions` (50,000) partitions: topics of `--per-topic` (4,000) and,
last, one topic of `--big` (10,000), each CreateTopics awaited until every partition is open.

Measured per phase (the small topics, the big one): every collection's pause (gc.callbacks, wall
time, by generation), the event loop's longest stall (a task asking to wake every 5 ms: how late
it woke), the heartbeats' answer times as the simulated brokers see them; then the policy's
freezes and frozen objects, and "frozen garbage": after a full collection, what a second one
finds once everything is unfrozen (the cycles the freezes kept; 0 without the policy).
Each figure is printed with the machine's load: wall times on a loaded machine are mostly the
machine's, so compare the two modes run alternately, in proportions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore  # noqa: E402
from tidalmq_broker.tuning import tune_runtime  # noqa: E402
from tidalmq_controller import (  # noqa: E402
    Controller,
    ControllerSettings,
    NewTopic,
    ObjectStoreMetadataLog,
    gc_policy,
)
from tidalmq_controller._control_auth import ControlAuth  # noqa: E402
from tidalmq_controller._rpc_client import HttpControllerClient  # noqa: E402
from tidalmq_controller._rpc_server import ControllerServer  # noqa: E402

from bench import procstat  # noqa: E402
from bench.controller_scale import HTTP_TOKEN, SimCluster  # noqa: E402

TICK_S = 0.005
MIB = 1 << 20


class GcPauses:
    """Every collection's wall time, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses: list[list[float]] = [[], [], []]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._started)

    def take(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g, pauses in enumerate(self.pauses):
            out[f"gen{g}"] = {
                "count": len(pauses),
                "total_ms": round(sum(pauses) * 1000, 1),
                "max_ms": round(max(pauses, default=0.0) * 1000, 1),
            }
        self.pauses = [[], [], []]
        return out


class LoopLag:
    """How late a task that asks to wake every TICK_S wakes: the loop's longest stall."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.worst = max(self.worst, time.perf_counter() - asked - TICK_S)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return round(worst * 1000, 1)

    def stop(self) -> None:
        self._task.cancel()


async def until(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("not settled")
        await asyncio.sleep(0.05)


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    policy = gc_policy.install() if args.policy == "on" else None
    store = LocalDirObjectStore(workdir / "store")
    settings = ControllerSettings(heartbeat_interval_s=1.0, auto_rebalance=True)
    c = Controller(ObjectStoreMetadataLog(store), settings)
    await c.start()
    sims = SimCluster(c, args.beat_interval)
    server = ControllerServer(c, ControlAuth([HTTP_TOKEN]))
    await server.start("127.0.0.1", 0)
    sims.http = HttpControllerClient(f"http://127.0.0.1:{server.port}", token=HTTP_TOKEN)
    sims.start()
    for b in range(args.brokers):
        await sims.add(b)
    await until(lambda: not c.moves.active(), 60)  # the offsets topic settles
    await asyncio.sleep(0.5)
    pauses, lag = GcPauses(), LoopLag()
    sims.beat_times.take()
    small = args.partitions - args.big
    layout = [(f"t{i:03d}", args.per_topic) for i in range(small // args.per_topic)]
    if small % args.per_topic:
        layout.append((f"t{len(layout):03d}", small % args.per_topic))
    result: dict[str, Any] = {
        "policy": args.policy,
        "rss_mib_start": round(procstat.rss_bytes() / MIB, 1),
        "gc_thresholds": list(gc.get_threshold()),
        "phases": {},
    }
    for phase, topics in (("small topics", layout), ("big topic", [("big", args.big)])):
        load_before = procstat.load_triple()
        cpu, wall = time.process_time(), time.perf_counter()
        for name, count in topics:
            done = await c.create_topics([NewTopic(name, count)], wait_s=30.0)
            if done[0].error is not None:
                raise RuntimeError(f"creating {name}: {done[0].error}")
        await asyncio.sleep(0.3)  # what the creation leaves behind (reports, pushes)
        result["phases"][phase] = {
            "partitions": sum(n for _, n in topics),
            "seconds": round(time.perf_counter() - wall, 2),
            "cpu_s": round(time.process_time() - cpu, 2),
            "gc": pauses.take(),
            "loop_stall_ms": lag.take(),
            "beats": sims.beat_times.take(),
            "load": f"{load_before} -> {procstat.load_triple()}",
        }
    result["freezes"] = policy.freezes if policy is not None else 0
    result["frozen_objects"] = gc.get_freeze_count()
    result["rss_mib_created"] = round(procstat.rss_bytes() / MIB, 1)
    gc.collect()  # what is not frozen
    gc.unfreeze()
    started = time.perf_counter()
    result["frozen_garbage"] = gc.collect()  # what the freezes kept that a collection frees
    result["full_collect_ms"] = round((time.perf_counter() - started) * 1000, 1)
    if policy is not None:
        gc.freeze()  # as it was
    pauses.take(), lag.take(), sims.beat_times.take()  # not the collections just above
    load_before = procstat.load_triple()
    cpu, wall = time.process_time(), time.perf_counter()
    names = [name for name, _ in layout] + ["big"]
    per_call = args.delete_per_call or len(names)
    for i in range(0, len(names), per_call):
        await c.delete_topics(names[i : i + per_call])  # committed (gone from the image) on return
    await asyncio.sleep(0.3)
    result["phases"]["delete"] = {
        "partitions": args.partitions,
        "seconds": round(time.perf_counter() - wall, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "gc": pauses.take(),
        "loop_stall_ms": lag.take(),
        "beats": sims.beat_times.take(),
        "load": f"{load_before} -> {procstat.load_triple()}",
    }
    lag.stop()
    sims.stop()
    await server.stop()
    await c.stop()
    gc.collect()
    result["rss_mib_deleted"] = round(procstat.rss_bytes() / MIB, 1)
    gc.unfreeze()
    result["deleted_garbage"] = gc.collect()  # cycles among frozen objects that died
    return result


def run_child(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gc-pauses-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(out),
            "--policy",
            policy,
            "--partitions",
            str(args.partitions),
            "--per-topic",
            str(args.per_topic),
            "--big",
            str(args.big),
            "--brokers",
            str(args.brokers),
            "--beat-interval",
            str(args.beat_interval),
            "--delete-per-call",
            str(args.delete_per_call),
        ]
        if args.gc_thresholds:
            cmd += ["--gc-thresholds", args.gc_thresholds]
        subprocess.run(cmd, check=True, timeout=300)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def line(r: dict[str, Any], phase: str) -> str:
    p = r["phases"][phase]
    g, b = p["gc"], p["beats"]
    gens = ", ".join(
        f"gen{i} {g[f'gen{i}']['count']} x (max {g[f'gen{i}']['max_ms']:.0f} ms, "
        f"total {g[f'gen{i}']['total_ms']:.0f} ms)"
        for i in range(3)
    )
    return (
        f"  {phase}: {p['partitions']:,} partitions in {p['seconds']:.2f} s (CPU {p['cpu_s']:.2f} "
        f"s); GC {gens}; loop stall max {p['loop_stall_ms']:.0f} ms; heartbeats "
        f"{b.get('heartbeats', 0)}, p99 {b.get('p99_ms', 0):.0f} ms, max {b.get('max_ms', 0):.0f}"
        f" ms, {b.get('over_100ms', 0)} over 100 ms; load {p['load']}"
    )


def summary(results: list[dict[str, Any]]) -> str:
    """Per mode, over the creation phases (the deletion is a phase of its own: it frees by
    reference counting, and its stall is its own slice, not a collection)."""
    out = []
    creating = ("small topics", "big topic")
    for policy in ("off", "on"):
        runs = [r for r in results if r["policy"] == policy]
        if not runs:
            continue

        def per_run(figure: Any, runs: list[dict[str, Any]] = runs) -> list[Any]:
            return [figure([r["phases"][p] for p in creating]) for r in runs]

        longest = per_run(
            lambda ps: max(p["gc"][f"gen{g}"]["max_ms"] for p in ps for g in range(3))
        )
        total = per_run(
            lambda ps: round(sum(p["gc"][f"gen{g}"]["total_ms"] for p in ps for g in range(3)))
        )
        stalls = per_run(lambda ps: max(p["loop_stall_ms"] for p in ps))
        over = per_run(lambda ps: sum(p["beats"].get("over_100ms", 0) for p in ps))
        beats = per_run(lambda ps: sum(p["beats"].get("heartbeats", 0) for p in ps))
        out.append(
            f"policy {policy}, creating: longest GC pause per run {longest} ms (median "
            f"{statistics.median(longest):.0f}), GC total {total} ms; longest loop stall "
            f"{stalls} ms; heartbeats over 100 ms {over} of {beats}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", type=int, default=50_000)
    ap.add_argument("--per-topic", type=int, default=4000)
    ap.add_argument("--big", type=int, default=10_000, help="the last topic's partitions")
    ap.add_argument("--brokers", type=int, default=4)
    ap.add_argument(
        "--delete-per-call",
        type=int,
        default=5,
        help="topics per DeleteTopics call at the end (0: every topic in one call)",
    )
    ap.add_argument("--beat-interval", type=float, default=0.05)
    ap.add_argument(
        "--gc-thresholds",
        help="gc.set_threshold after the runtime tuning, e.g. 700,10,10 (CPython's defaults)",
    )
    ap.add_argument("--policy", choices=("on", "off", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3, help="runs of each mode (alternating)")
    ap.add_argument("--json", type=Path, help="write every run's figures there")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        tune_runtime()  # as in a process hosting a controller
        if args.gc_thresholds:
            gc.set_threshold(*(int(x) for x in args.gc_thresholds.split(",")))
        workdir = Path(tempfile.mkdtemp(prefix="gc-pauses-store-"))
        try:
            result = asyncio.run(measure(args, workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        args.child.write_text(json.dumps(result))
        return 0
    modes = ("off", "on") if args.policy == "both" else (args.policy,)
    results = []
    for run in range(args.runs):
        for policy in modes:
            r = run_child(args, policy)
            results.append(r)
            print(
                f"run {run + 1}, policy {policy} (GC thresholds {r['gc_thresholds']}): "
                f"{r['freezes']} freezes, "
                f"{r['frozen_objects']:,} objects frozen, frozen garbage "
                f"{r['frozen_garbage']:,} objects (a full collection of everything then took "
                f"{r['full_collect_ms']:.0f} ms); after deleting every topic, garbage among "
                f"frozen objects {r['deleted_garbage']:,}; RSS {r['rss_mib_start']} -> "
                f"{r['rss_mib_created']} (created) -> {r['rss_mib_deleted']} MiB (deleted)",
                flush=True,
            )
            for phase in r["phases"]:
                print(line(r, phase), flush=True)
    print(summary(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
