"""Where a produce request's CPU goes: one broker on the local store under Kafka's Java producer.

Runs one TidalMQ broker (a local-directory store in a scratch directory), creates a topic, runs
kafka-producer-perf-test against it (1 KiB records, acks=all, the producer's default 16 KiB
batches: the load of [L1]) and prints, for the produce requests of that run:
- `tidalmq_request_cpu_seconds` (the broker's own per-request CPU by API) per request;
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

The machine's load average is printed with the figures: on a shared machine compare runs made
under the same conditions only.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from bench.kafka.harness import producer_perf_test
from bench.side_by_side_systems import create_topic
from tests.support.broker_process import BrokerProcess

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def produce_counters(http_url: str) -> tuple[float, float, float]:
    """(produce requests, their CPU seconds by the metric, requests counted by the metric)."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    requests = cpu_sum = cpu_count = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("api") != "Produce":
                continue
            if s.name == "tidalmq_requests_total":
                requests = s.value
            elif s.name == "tidalmq_request_cpu_seconds_sum":
                cpu_sum = s.value
            elif s.name == "tidalmq_request_cpu_seconds_count":
                cpu_count = s.value
    return requests, cpu_sum, cpu_count


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


class ProfiledBroker(BrokerProcess):
    """The broker process, optionally under cProfile (its stats written when it stops)."""

    def __init__(
        self, storage_url: str, log_dir: Path, profile_to: Path | None, source: Path | None
    ) -> None:
        env = {"TIDALMQ_LOG_LEVEL": "WARNING"}
        if source is not None:  # another checkout's broker (its broker_image/src first)
            env["PYTHONPATH"] = str(source.resolve() / "broker_image" / "src")
        super().__init__(storage_url, log_dir, env=env)
        self.profile_to = profile_to

    def spawn(self) -> None:
        if self.profile_to is None:
            super().spawn()
            return
        env = {**os.environ, **self.env}
        cmd = [
            sys.executable, "-c", _PROFILED_BROKER, str(self.profile_to), "broker",
            "--broker-id", str(self.broker_id), "--port", str(self.port),
            "--http-port", str(self.http_port), "--storage-url", self.storage_url,
        ]  # fmt: skip
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records to produce (1 KiB)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--cprofile", action="store_true", help="run the broker under cProfile")
    ap.add_argument("--top", type=int, default=25, help="functions to list (--cprofile)")
    ap.add_argument("--keep", type=Path, help="write the cProfile stats here too")
    ap.add_argument(
        "--source",
        type=Path,
        help="run the broker of this checkout (e.g. a `git worktree add --detach` of the commit "
        "before a change), for before/after runs under the same conditions",
    )
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="produce-profile-") as tmp:
        root = Path(tmp)
        (root / "objects").mkdir()
        prof = root / "broker.prof" if args.cprofile else None
        broker = ProfiledBroker(f"file://{root / 'objects'}", root / "logs", prof, args.source)
        broker.start(timeout_s=120)
        try:
            b = broker.bootstrap
            create_topic(b, "warmup", args.partitions)
            producer_perf_test(b, "warmup", num_records=20_000, record_size=1024)
            create_topic(b, "profiled", args.partitions)
            assert broker.proc is not None
            pid = broker.proc.pid
            before = produce_counters(broker.http_url)
            cpu_before, load_before = process_cpu_s(pid), os.getloadavg()[0]
            result, _ = producer_perf_test(
                b, "profiled", num_records=args.records, record_size=1024, acks="all"
            )
            cpu_after, load_after = process_cpu_s(pid), os.getloadavg()[0]
            after = produce_counters(broker.http_url)
        finally:
            broker.stop(timeout_s=60)
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
            f"produce requests: {requests:.0f} ({args.records / max(requests, 1):.1f} records each)"
        )
        print(
            f"tidalmq_request_cpu_seconds{{api=Produce}}: "
            f"{metric_s / max(metered, 1) * 1e6:.0f} us per request"
        )
        print(
            f"broker process CPU (all threads, user+system): {process_s:.2f} s, "
            f"{process_s / max(requests, 1) * 1e6:.0f} us per produce request"
        )
        if prof is not None:
            stats = pstats.Stats(str(prof))
            if args.keep is not None:
                stats.dump_stats(str(args.keep))
            print_top(stats, requests, args.top)
    return 0


def print_top(stats: pstats.Stats, requests: float, top: int) -> None:
    """The functions with the most own time, in microseconds per produce request (the whole
    broker run, warm-up included: its requests are few next to the profiled run's)."""
    rows = []
    for (path, line, func), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).name}:{line}({func})" if line else func
        rows.append((tottime, cumtime, calls, where))
    rows.sort(reverse=True)
    per = 1e6 / max(requests, 1)
    total = sum(r[0] for r in rows)
    print(f"cProfile: {total * per:.0f} us of own time per produce request in all; top {top}:")
    print(f"{'own us/req':>10} {'cum us/req':>10} {'calls/req':>9}  function")
    for tottime, cumtime, calls, where in rows[:top]:
        print(
            f"{tottime * per:10.1f} {cumtime * per:10.1f} {calls / max(requests, 1):9.2f}  {where}"
        )


if __name__ == "__main__":
    sys.exit(main())
