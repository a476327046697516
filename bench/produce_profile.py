"""Where a produce request's CPU goes: one broker on the local store under Kafka's Java producer.

Runs one TidalMQ broker (a local-directory store in a scratch directory), creates a topic, runs
kafka-producer-perf-test against it (1 KiB records, acks=all, idempotent, the producer's default
16 KiB batches: the load of [L1]; --partitions 1 for one partition per request) and prints, for
the produce requests of that run (with --runs N, of each of N runs against the same broker and
their median, then the rest for the last run):
- `tidalmq_request_cpu_seconds` (the broker's own per-request CPU by API) per request;
- the metric for every API during the run (and, with --consume, while kafka-consumer-perf-test
  reads the records back: Fetch);
- the broker process's whole CPU (user + system, every thread) per produce request, which also
  holds what the metric leaves out (reading frames, writing answers, the WAL writer's flushes,
  the event loop itself);
- with --cprofile, the broker's event-loop thread under cProfile timed by the thread's CPU
  clock: the top functions by own CPU time in microseconds per produce request (cProfile
  slows Python calls down, so its totals are higher than the unprofiled figures: compare its
  rows with each other, and the unprofiled figures before and after a change).

    .venv/bin/python bench/produce_profile.py --records 200000
    .venv/bin/python bench/produce_profile.py --records 100000 --cprofile --top 30
    git worktree add --detach /tmp/before <commit>
    .venv/bin/python bench/produce_profile.py --records 200000 --source /tmp/before
    .venv/bin/python bench/produce_profile.py --records 60000 --runs 5 --partitions 1

The machine's load average is printed with the figures: on a shared machine compare runs made
under the same conditions only.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from bench import procstat
from bench.kafka.harness import consumer_perf_test, producer_perf_test
from bench.side_by_side_systems import create_topic
from tests.support.broker_process import BrokerProcess


def produce_counters(http_url: str) -> tuple[float, float, float, float]:
    """(produce requests, their CPU seconds by the metric, requests counted by the metric, WAL
    flushes)."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    requests = cpu_sum = cpu_count = flushes = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tidalmq_storage_wal_flushes_total":
                flushes += s.value
            if s.labels.get("api") != "Produce":
                continue
            if s.name == "tidalmq_requests_total":
                requests = s.value
            elif s.name == "tidalmq_request_cpu_seconds_sum":
                cpu_sum = s.value
            elif s.name == "tidalmq_request_cpu_seconds_count":
                cpu_count = s.value
    return requests, cpu_sum, cpu_count, flushes


def cpu_by_api(http_url: str) -> dict[str, tuple[float, float]]:
    """tidalmq_request_cpu_seconds by API: (count, sum)."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "tidalmq_request_cpu_seconds":
            continue
        for s in family.samples:
            count, total = out.get(s.labels["api"], (0.0, 0.0))
            if s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
            out[s.labels["api"]] = (count, total)
    return out


def print_cpu_by_api(
    phase: str, before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> None:
    """The metric's requests and mean CPU per request by API between two scrapes."""
    print(f"tidalmq_request_cpu_seconds during {phase}:")
    for api, (count, total) in sorted(after.items()):
        count0, total0 = before.get(api, (0.0, 0.0))
        if count > count0:
            n = count - count0
            print(f"  {api:<20} {n:8.0f} requests {(total - total0) / n * 1e6:8.0f} us/request")


# the broker's main under cProfile timed by the thread's CPU clock, not the wall clock: on a
# shared machine a wall-clock profile charges the time the process waited for a core to
# whatever it was running then (a system call, a coroutine that awaited)
_PROFILED_BROKER = """
import cProfile, runpy, sys, time
out = sys.argv[1]
sys.argv = ["tidalmq_broker.cli", *sys.argv[2:]]
profile = cProfile.Profile(time.thread_time)
try:
    profile.runcall(runpy.run_module, "tidalmq_broker.cli", run_name="__main__")
except SystemExit:
    pass
finally:
    profile.dump_stats(out)
"""


# the broker's main under yappi, every thread (the event loop's, the local store's executor, the
# liveness thread...) timed by its own CPU clock, C functions (socket calls, CRC, struct) apart;
# what it wrote: one JSON row per function and thread, and each thread's total
_WHOLE_PROCESS_BROKER = """
import json, os, runpy, signal, sys, yappi
out = sys.argv[1]
sys.argv = ["tidalmq_broker.cli", *sys.argv[2:]]

def measure(signum, frame):  # SIGUSR2: the measured window starts (the start-up forgotten)
    yappi.clear_stats()

def dump(signum, frame):  # SIGRTMIN: it ends; the figures written, then the broker goes on
    yappi.stop()
    threads = [
        {"id": t.id, "name": t.name, "cpu_s": t.ttot, "switches": t.sched_count}
        for t in yappi.get_thread_stats()
    ]
    rows = []
    for t in threads:
        for f in yappi.get_func_stats(filter={"ctx_id": t["id"]}):
            builtins = [[c.name, c.tsub, c.ncall] for c in f.children if c.builtin]
            children = [
                [c.module, c.lineno, c.name, c.ttot, c.ncall] for c in f.children if not c.builtin
            ]
            rows.append(
                {"thread": t["id"], "module": f.module, "line": f.lineno, "name": f.name,
                 "calls": f.ncall, "own_s": f.tsub, "cum_s": f.ttot, "builtin": f.builtin,
                 "builtin_children": builtins, "children": children}
            )
    with open(out + ".part", "w") as fh:
        json.dump({"threads": threads, "functions": rows}, fh)
    os.replace(out + ".part", out)

signal.signal(signal.SIGUSR2, measure)
signal.signal(signal.SIGRTMIN, dump)
yappi.set_clock_type("cpu")
yappi.start(builtins=True, profile_threads=True)
runpy.run_module("tidalmq_broker.cli", run_name="__main__")
"""


class ProfiledBroker(BrokerProcess):
    """The broker process, optionally under cProfile (its stats written when it stops) or yappi
    (`whole`: every thread)."""

    def __init__(
        self,
        storage_url: str,
        log_dir: Path,
        profile_to: Path | None,
        source: Path | None,
        *,
        whole: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        env = {"TIDALMQ_LOG_LEVEL": "WARNING", **(settings or {})}
        if source is not None:  # another checkout's broker (its broker_image/src first)
            env["PYTHONPATH"] = str(source.resolve() / "broker_image" / "src")
        super().__init__(storage_url, log_dir, env=env)
        self.profile_to = profile_to
        self.whole = whole

    def spawn(self) -> None:
        if self.profile_to is None:
            super().spawn()
            return
        env = {**os.environ, **self.env}
        cmd = [
            sys.executable,
            "-c",
            _WHOLE_PROCESS_BROKER if self.whole else _PROFILED_BROKER,
            str(self.profile_to),
            "broker",
            "--broker-id",
            str(self.broker_id),
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--storage-url",
            self.storage_url,
        ]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


# Kafka's Java producer is idempotent by default since 3.0 with acks=all; said here so that a
# different client default cannot change what is measured (sequence checks on every batch)
_IDEMPOTENT = {"enable.idempotence": "true", "max.in.flight.requests.per.connection": "5"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records to produce (1 KiB)")
    ap.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="of the topic: a Java producer's request holds one batch for each (1 = one "
        "partition per request)",
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="measured producer runs against the same broker (each its own topic), each "
        "printed, then their median: the spread shows what the machine's load does",
    )
    ap.add_argument("--cprofile", action="store_true", help="run the broker under cProfile")
    ap.add_argument(
        "--whole-process",
        action="store_true",
        help="run the broker under yappi: every thread by its CPU clock, C functions apart; "
        "prints the process's CPU per produce request by subsystem, and the top functions",
    )
    ap.add_argument(
        "--syscalls",
        action="store_true",
        help="count the broker's system calls during the first run (strace -c -f attached to "
        "every thread; the counts per produce request do not depend on the machine's load, "
        "strace's times do and are inflated). Alone: with --whole-process, yappi's clock reads "
        "become traced system calls (thousands per request)",
    )
    ap.add_argument(
        "--perf",
        action="store_true",
        help="sample the broker with `perf record` during the first run (every thread, user "
        "and kernel): where the CPU goes below Python's frames (the interpreter, the cyclic "
        "garbage collector, malloc, the kernel), as shares of the process's samples",
    )
    ap.add_argument(
        "--top", type=int, default=25, help="functions to list (--cprofile, --whole-process)"
    )
    ap.add_argument(
        "--sort",
        choices=("own", "cumulative"),
        default="own",
        help="rank the functions by own time, or by cumulative time (callees included: where "
        "a request's time goes, top down) (--cprofile)",
    )
    ap.add_argument(
        "--keep", type=Path, help="write the cProfile stats (or --whole-process's JSON) here too"
    )
    ap.add_argument(
        "--consume",
        action="store_true",
        help="then read the records back with kafka-consumer-perf-test (Fetch requests' CPU); "
        "the profile covers both",
    )
    ap.add_argument(
        "--source",
        type=Path,
        help="run the broker of this checkout (e.g. a `git worktree add --detach` of the commit "
        "before a change), for before/after runs under the same conditions",
    )
    ap.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a broker setting as its environment variable (TIDALMQ_FLUSH_INTERVAL_MS=10), "
        "repeatable",
    )
    args = ap.parse_args(argv)
    settings = dict(kv.split("=", 1) for kv in args.setting)

    with tempfile.TemporaryDirectory(prefix="produce-profile-") as tmp:
        root = Path(tmp)
        (root / "objects").mkdir()
        prof = root / "broker.prof" if args.cprofile else None
        if args.whole_process:
            prof = root / "broker.json"
        broker = ProfiledBroker(
            f"file://{root / 'objects'}",
            root / "logs",
            prof,
            args.source,
            whole=args.whole_process,
            settings=settings,
        )
        broker.start(timeout_s=120)
        try:
            b = broker.bootstrap
            create_topic(b, "warmup", args.partitions)
            producer_perf_test(b, "warmup", num_records=20_000, record_size=1024)
            assert broker.proc is not None
            pid = broker.proc.pid
            # requests, metric, process, load, WAL flushes per request, MiB/s
            runs: list[tuple[float, float, float, float, float, float]] = []
            for run in range(args.runs):
                topic = "profiled" if run == 0 else f"profiled-{run}"
                create_topic(b, topic, args.partitions)
                before = produce_counters(broker.http_url)
                if run == 0:
                    by_api_before = cpu_by_api(broker.http_url)
                if args.whole_process and run == 0:
                    os.kill(pid, signal.SIGUSR2)  # yappi forgets the start and the warm-up
                if args.syscalls and run == 0:
                    strace_out = root / "strace.txt"
                    strace = subprocess.Popen(
                        ["strace", "-c", "-f", "-p", str(pid), "-o", str(strace_out)],
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)  # attached to every thread
                if args.perf and run == 0:
                    perf_data = root / "perf.data"
                    perf = subprocess.Popen(
                        ["perf", "record", "-F", "999", "-p", str(pid), "-o", str(perf_data)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)
                cpu_before, load_before = procstat.cpu_s(pid), procstat.loadavg()[0]
                stat_before = procstat.stat(pid)
                threads_before = procstat.threads_cpu_s(pid)
                tstat_before = procstat.threads_stat(pid)
                result, _ = producer_perf_test(
                    b,
                    topic,
                    num_records=args.records,
                    record_size=1024,
                    acks="all",
                    properties=_IDEMPOTENT,
                )
                cpu_after, load_after = procstat.cpu_s(pid), procstat.loadavg()[0]
                stat_after = procstat.stat(pid)
                if args.perf and run == 0:
                    perf.send_signal(signal.SIGINT)
                    perf.wait(timeout=120)
                if args.syscalls and run == 0:
                    strace.send_signal(signal.SIGINT)  # detaches and writes its summary
                    strace.wait(timeout=60)
                if args.whole_process and run == 0:
                    os.kill(pid, signal.SIGRTMIN)  # yappi's figures of this run written
                threads_after = procstat.threads_cpu_s(pid)
                tstat_after = procstat.threads_stat(pid)
                after = produce_counters(broker.http_url)
                if run == 0:
                    by_api = [cpu_by_api(broker.http_url)]
                n = max(after[0] - before[0], 1)
                runs.append(
                    (
                        after[0] - before[0],
                        (after[1] - before[1]) / max(after[2] - before[2], 1) * 1e6,
                        (cpu_after - cpu_before) / n * 1e6,
                        (load_before + load_after) / 2,
                        (after[3] - before[3]) / n,
                        result.mb_per_sec,
                    )
                )
                if args.runs > 1:
                    print(
                        f"run {run + 1}: {result.mb_per_sec:.1f} MiB/s, {runs[-1][0]:.0f} "
                        f"requests, metric {runs[-1][1]:.0f} us/request, process "
                        f"{runs[-1][2]:.0f} us/request, {runs[-1][4]:.2f} WAL flushes/request, "
                        f"p50 {result.p50_ms:.0f} ms, load {load_before:.2f}/{load_after:.2f}",
                        flush=True,
                    )
            if args.whole_process:
                assert prof is not None
                deadline = time.monotonic() + 300
                while not prof.exists() and time.monotonic() < deadline:
                    time.sleep(0.5)
            if args.consume:
                consumed, _ = consumer_perf_test(b, "profiled", num_records=args.records)
                cpu_consumed = procstat.cpu_s(pid)
                by_api.append(cpu_by_api(broker.http_url))
        finally:
            broker.stop(timeout_s=60)
        if args.runs > 1:
            print(
                f"median of {args.runs} runs: metric "
                f"{statistics.median(r[1] for r in runs):.0f} us/request, process "
                f"{statistics.median(r[2] for r in runs):.0f} us/request, "
                f"{statistics.median(r[4] for r in runs):.2f} WAL flushes/request, "
                f"{statistics.median(r[5] for r in runs):.1f} MiB/s (load "
                f"{min(r[3] for r in runs):.2f}-{max(r[3] for r in runs):.2f})"
            )
        requests = after[0] - before[0]
        metric_s = after[1] - before[1]
        metered = after[2] - before[2]
        process_s = cpu_after - cpu_before
        print(
            f"kafka-producer-perf-test: {args.records} records of 1 KiB, acks=all, "
            f"{args.partitions} partitions: {result.mb_per_sec:.1f} MiB/s, "
            f"p50 {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms"
        )
        print(f"load average (1 min) before/after: {load_before:.2f} / {load_after:.2f}")
        print(
            f"produce requests: {requests:.0f} ({args.records / max(requests, 1):.1f} records "
            f"each), WAL flushes {after[3] - before[3]:.0f} ({runs[-1][4]:.2f} per request)"
        )
        print(
            f"tidalmq_request_cpu_seconds{{api=Produce}}: "
            f"{metric_s / max(metered, 1) * 1e6:.0f} us per request"
        )
        print(
            f"broker process CPU (all threads, user+system): {process_s:.2f} s, "
            f"{process_s / max(requests, 1) * 1e6:.0f} us per produce request"
        )
        main_s = threads_after.get(pid, 0.0) - threads_before.get(pid, 0.0)
        others_s = (
            sum(t - threads_before.get(tid, 0.0) for tid, t in threads_after.items()) - main_s
        )
        print(
            f"  of which the event loop's thread {main_s / max(requests, 1) * 1e6:.0f} us, the "
            f"{len(threads_after) - 1} other threads {others_s / max(requests, 1) * 1e6:.0f} us "
            "per produce request (schedstat)"
        )
        ticks = 1e6 / procstat.CLOCK_TICKS / max(requests, 1)
        print(
            f"  of which user {(stat_after.utime_ticks - stat_before.utime_ticks) * ticks:.0f} us, "
            f"system (the kernel: sockets, files) "
            f"{(stat_after.stime_ticks - stat_before.stime_ticks) * ticks:.0f} us per produce request"
        )
        print_threads_split(pid, tstat_before, tstat_after, requests)
        print_cpu_by_api("the produce run", by_api_before, by_api[0])
        if args.consume:
            fetches = by_api[1].get("Fetch", (0.0, 0.0))[0] - by_api[0].get("Fetch", (0.0, 0.0))[0]
            print(
                f"kafka-consumer-perf-test: {consumed.records} records, "
                f"{consumed.mb_per_sec:.1f} MiB/s; broker process CPU "
                f"{(cpu_consumed - cpu_after) / max(fetches, 1) * 1e6:.0f} us per fetch request"
            )
            print_cpu_by_api("the consume run", by_api[0], by_api[1])
        if args.perf:
            print_perf(root / "perf.data", runs[0][2], args.top)
        if args.syscalls:
            print_syscalls((root / "strace.txt").read_text(), runs[0][0])
        if prof is not None and args.whole_process:
            whole = json.loads(prof.read_text())
            if args.keep is not None:
                args.keep.write_text(json.dumps(whole))
            print_whole_process(whole, runs[0][0], args.top)
        elif prof is not None:
            stats = pstats.Stats(str(prof))
            if args.keep is not None:
                stats.dump_stats(str(args.keep))
            print_top(stats, requests, args.top, cumulative=args.sort == "cumulative")
    return 0


def print_top(stats: pstats.Stats, requests: float, top: int, *, cumulative: bool = False) -> None:
    """The functions with the most own time (or cumulative time: callees included), in
    microseconds per produce request (the whole broker run, warm-up included: its requests are
    few next to the profiled run's)."""
    rows = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).name}:{line}({func})" if line else func
        rows.append((tottime, cumtime, calls, where))
    per = 1e6 / max(requests, 1)
    total = sum(r[0] for r in rows)
    rows.sort(key=(lambda r: r[1]) if cumulative else (lambda r: r[0]), reverse=True)
    ranked = "cumulative" if cumulative else "own"
    print(
        f"cProfile: {total * per:.0f} us of own time per produce request in all; "
        f"top {top} by {ranked} time:"
    )
    print(f"{'own us/req':>10} {'cum us/req':>10} {'calls/req':>9}  function")
    for tottime, cumtime, calls, where in rows[:top]:
        print(
            f"{tottime * per:10.1f} {cumtime * per:10.1f} {calls / max(requests, 1):9.2f}  {where}"
        )


# the interpreter's cyclic garbage collector (Modules/gcmodule.c)
_GC_SYMBOLS = (
    "gc_collect",
    "visit_reachable",
    "visit_decref",
    "move_unreachable",
    "subtract_refs",
    "update_refs",
    "deduce_unreachable",
    "move_legacy_finalizers",
    "dict_traverse",
    "list_traverse",
    "tupletraverse",
    "subtype_traverse",
    "func_traverse",
    "frame_traverse",
    "cell_traverse",
    "gc_",
)


def print_perf(data: Path, process_us: float, top: int) -> None:
    """`perf report`'s symbols as shares of the broker's samples and, from the run's process
    CPU per request, microseconds per produce request; grouped: the garbage collector, the
    kernel, the interpreter and its allocator."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows: list[tuple[float, str, str]] = []
    for line in report.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].endswith("%") and fields[2].startswith("["):
            try:
                share = float(fields[0].rstrip("%"))
            except ValueError:
                continue
            rows.append((share, fields[1], " ".join(fields[3:])))
    groups: dict[str, float] = {}
    for share, dso, sym in rows:
        if dso.startswith("[kernel"):
            g = "kernel"
        elif any(sym.startswith(prefix) for prefix in _GC_SYMBOLS):
            g = "cyclic garbage collector"
        elif "libpython" in dso or dso.startswith("python"):
            g = "interpreter (libpython)"
        elif dso.startswith("libc"):
            g = "libc (malloc, free, memcpy)"
        else:
            g = "other: " + dso
        groups[g] = groups.get(g, 0.0) + share
    print(f"perf record (every thread, {len(rows)} symbols), share of samples and us per request:")
    for g, share in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{share:6.1f}% {share / 100 * process_us:7.0f} us  {g}")
    print(f"top {top} symbols:")
    for share, dso, sym in sorted(rows, reverse=True)[:top]:
        print(f"{share:6.2f}% {share / 100 * process_us:7.0f} us  {dso} {sym}")


def print_threads_split(
    pid: int,
    before: dict[int, procstat.Stat],
    after: dict[int, procstat.Stat],
    requests: float,
) -> None:
    """User and system time of the event loop's thread and of the others, per request."""
    per = 1e6 / procstat.CLOCK_TICKS / max(requests, 1)
    sums = {"the event loop's thread": [0, 0], "the other threads": [0, 0]}
    for tid, st in after.items():
        b = before.get(tid)
        row = sums["the event loop's thread" if tid == pid else "the other threads"]
        row[0] += st.utime_ticks - (b.utime_ticks if b else 0)
        row[1] += st.stime_ticks - (b.stime_ticks if b else 0)
    print(
        "  "
        + "; ".join(
            f"{who}: user {u * per:.0f} us, system {s * per:.0f} us" for who, (u, s) in sums.items()
        )
    )


def print_syscalls(summary: str, requests: float) -> None:
    """strace -c's table as calls per produce request (the first run's; strace's own times
    left out: tracing slows every call down)."""
    print(f"system calls per produce request (strace -c -f, {requests:.0f} requests):")
    rows = []
    for line in summary.splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(fields) >= 5 and fields[3].isdigit() and fields[-1] != "total":
            errors = int(fields[4]) if len(fields) == 6 else 0
            rows.append((int(fields[3]), errors, fields[-1]))
    rows.sort(reverse=True)
    print(f"{'calls/req':>9} {'errors/req':>10}  syscall")
    for calls, errors, name in rows:
        if calls / max(requests, 1) >= 0.01:
            print(f"{calls / max(requests, 1):9.2f} {errors / max(requests, 1):10.2f}  {name}")
    total = sum(r[0] for r in rows)
    print(f"{total / max(requests, 1):9.2f} {'':>10}  in all")


# module path parts -> subsystem, first match wins (protocol/codec and fastpath by function:
# encode* answers, the rest decodes requests)
_SUBSYSTEMS = (
    ("prometheus_client/", "metrics (prometheus_client, metrics.py)"),
    ("tidalmq_broker/metrics.py", "metrics (prometheus_client, metrics.py)"),
    ("tidalmq_broker/storage/metrics.py", "metrics (prometheus_client, metrics.py)"),
    ("tidalmq_broker/protocol/records.py", "append: batch headers, CRC (records.py)"),
    ("tidalmq_broker/protocol/", "decode requests (protocol/)"),
    ("tidalmq_broker/apis/", "Produce handler (apis/)"),
    ("tidalmq_broker/storage/partition/appends.py", "append: partition (appends, producer state)"),
    ("tidalmq_broker/storage/producer_state.py", "append: partition (appends, producer state)"),
    ("tidalmq_broker/partitions.py", "append: partition (appends, producer state)"),
    ("tidalmq_broker/static_topics/", "append: partition (appends, producer state)"),
    ("tidalmq_broker/storage/wal", "WAL writer: encode, flush (wal_writer, wal)"),
    ("tidalmq_broker/storage/objectstore/", "object store, event loop side (put, metered)"),
    ("tidalmq_broker/storage/", "flush completion (flushes, cache, index, engine)"),
    ("tidalmq_broker/server/", "network: frames, tasks, answers (server/)"),
    ("tidalmq_controller/", "controller ticks (in-process controller)"),
    ("asyncio/", "event loop (asyncio)"),
)


def print_whole_process(whole: dict[str, Any], requests: float, top: int) -> None:
    """yappi's figures for the produce runs, in microseconds per produce request: each
    thread's CPU; own time by subsystem, a C function's (socket calls, CRC, struct, dict
    methods) counted with the Python function that called it, so that the rows add up to the
    threads' total; the top functions by own time, then the top C functions by caller."""
    per = 1e6 / max(requests, 1)
    main = next((t["id"] for t in whole["threads"] if t["name"] == "_MainThread"), None)
    print(f"yappi (CPU clock, every thread), us per produce request ({requests:.0f} requests):")
    threads_s = 0.0
    for t in sorted(whole["threads"], key=lambda t: -t["cpu_s"]):
        threads_s += t["cpu_s"]
        if t["cpu_s"] * per >= 1:
            print(f"  thread {t['name']:<22} {t['cpu_s'] * per:8.0f} us")
    groups: dict[str, list[float]] = {}
    merged: dict[str, list[float]] = {}
    c_calls: dict[tuple[str, str], list[float]] = {}
    for f in whole["functions"]:
        if f["builtin"]:
            continue  # counted with its callers (builtin_children)
        g = subsystem(f, f["thread"] == main)
        where = f"{Path(f['module']).name}:{f['line']}({f['name']})"
        c_own = sum(c[1] for c in f["builtin_children"])
        c_n = sum(c[2] for c in f["builtin_children"])
        acc = groups.setdefault(g, [0.0, 0.0, 0.0])
        acc[0] += f["own_s"] + c_own
        acc[1] += f["calls"]
        acc[2] += c_n
        m = merged.setdefault(where, [0.0, 0.0, 0.0, 0.0])
        m[0] += f["own_s"]
        m[1] += c_own
        m[2] += f["cum_s"]
        m[3] += f["calls"]
        for name, own, n in f["builtin_children"]:
            c = c_calls.setdefault((name, g), [0.0, 0.0])
            c[0] += own
            c[1] += n
    total = sum(v[0] for v in groups.values())
    print(
        f"own time by subsystem, C calls with their callers ({total * per:.0f} us per request; "
        f"the threads' clocks say {threads_s * per:.0f}):"
    )
    print(f"{'us/req':>8} {'share':>6} {'py calls/req':>12} {'C calls/req':>11}  subsystem")
    for g, (own, calls, cn) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if own * per >= 0.5:
            print(
                f"{own * per:8.0f} {own / max(total, 1e-9):6.1%} {calls / max(requests, 1):12.1f} "
                f"{cn / max(requests, 1):11.1f}  {g}"
            )
    print(f"top {top} Python functions by own time (+ the C functions they call), every thread:")
    print(f"{'own us/req':>10} {'+C us/req':>9} {'cum us/req':>10} {'calls/req':>9}  function")
    for where, (own, c_own, cum, calls) in sorted(
        merged.items(), key=lambda kv: -(kv[1][0] + kv[1][1])
    )[:top]:
        print(
            f"{own * per:10.1f} {c_own * per:9.1f} {cum * per:10.1f} "
            f"{calls / max(requests, 1):9.2f}  {where}"
        )
    print(f"top {top} C functions by own time, by the subsystem that called them:")
    for (name, g), (own, n) in sorted(c_calls.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{own * per:10.1f} {n / max(requests, 1):9.2f}  {name}  [{g}]")


def subsystem(f: dict[str, Any], on_event_loop: bool) -> str:
    """Which part of the broker a function's own time belongs to (the whole-process table);
    other threads' (the local store's executor: WAL files and fsyncs; the liveness thread)
    apart."""
    if not on_event_loop:
        return "other threads (local store's writes, liveness)"
    module = f["module"].replace("\\", "/")
    if "tidalmq_broker/protocol/" in module and "encode" in f["name"]:
        return "encode answers (protocol/)"
    for part, group in _SUBSYSTEMS:
        if part in module:
            return group
    return "other: " + Path(module).name


if __name__ == "__main__":
    sys.exit(main())
