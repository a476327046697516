"""Benchmark: the planner on 10,000 partitions x 20 brokers x 7 days of 1-minute history.

    .venv/bin/python bench/planner.py                     # the issue's scale
    .venv/bin/python bench/planner.py --partitions 2000 --days 1 --no-results

The history is synthetic (tidalmq_planner.synthetic: lognormal topic heat, hot keys, a daily
cycle per topic with spread peak hours, quieter weekends, noise, bursts, scrape gaps; bytes out
= bytes in x 0-3 consumer groups), with Kafka's default placement over 19 brokers and a 20th
that just joined; it is generated once into ${TIDALMQ_CACHE_DIR:-.cache}/planner-bench/
(Parquet, ~760 MB; point TIDALMQ_CACHE_DIR at a roomier disk, e.g. /dev/shm, if need be).

What is timed is `tidalmq plan --history FILE` end to end, as a user runs it: a new process,
Spark in local mode (JVM start included), reading the file, profiles in the Python workers,
balancing, report and chart. Figures: wall time (target <= 120 s), and per stage; plan quality:
max/mean broker load after the plan (target <= 1.10) and moves against the lower bound (target
<= 1.2x). The machine's load average is printed with them (other work shares the 2 cores).
Writes bench/RESULTS-planner.md (the chart is bench/out/planner/report/load.png).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "spark" / "src"))
sys.path.insert(0, str(ROOT / "broker_image" / "src"))

from tidalmq_planner.synthetic import Spec, cached  # noqa: E402

from bench.cache import cache_dir  # noqa: E402


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--brokers", type=int, default=20)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=int, default=60, help="seconds")
    ap.add_argument("--threshold", type=float, default=1.10)
    ap.add_argument("--statistic", default="mean", choices=("mean", "p95", "peak"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "planner")
    ap.add_argument("--no-results", action="store_true", help="do not write RESULTS-planner.md")
    args = ap.parse_args()

    spec = Spec(partitions=args.partitions, brokers=args.brokers, days=args.days, step_s=args.step)
    t0 = time.perf_counter()
    cache = cache_dir() / "planner-bench"
    history = cached(spec, cache)
    gen_s = time.perf_counter() - t0
    size_mb = history.stat().st_size / 1e6
    print(
        f"history: {history} ({size_mb:.0f} MB, {spec.points} points x {spec.partitions} "
        f"partitions x 2 metrics; ready in {gen_s:.1f} s)",
        flush=True,
    )

    report_dir = args.out / "report"
    load_before = loadavg()
    cmd = [
        sys.executable,
        "-m",
        "tidalmq_broker.cli",
        "plan",
        "--history",
        str(history),
        "--brokers",
        ",".join(str(b) for b in range(spec.brokers)),
        "--threshold",
        str(args.threshold),
        "--statistic",
        args.statistic,
        "--out",
        str(args.out / "plan.json"),
        "--report-dir",
        str(report_dir),
        "--master",
        f"local[{os.cpu_count() or 1}]",
        "--driver-memory",
        "3g",
        "--json",
    ]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    load_after = loadavg()
    if done.returncode not in (0, 3):
        print(done.stdout[-3000:], done.stderr[-6000:], file=sys.stderr)
        return 1
    summary = json.loads(done.stdout)
    report = json.loads((report_dir / "report.json").read_text())
    moves, bound = summary["moves"], summary["lowerBound"]
    ratio = moves / bound if bound else float("inf") if moves else 1.0
    after = summary["imbalanceAfter"]
    before = summary["imbalanceBefore"]
    timings = summary["timings"]
    ok_time, ok_bal, ok_moves = (
        wall <= 120,
        max(after.values()) <= args.threshold + 1e-9,
        ratio <= 1.2,
    )

    lines = [
        f"plan time (wall, `tidalmq plan` process): {wall:.1f} s  [target <= 120 s: "
        f"{'met' if ok_time else 'MISSED'}]",
        "  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()),
        f"imbalance max/mean, {args.statistic}: bytes in {before['bytes_in']:.3f} -> "
        f"{after['bytes_in']:.3f}, bytes out {before['bytes_out']:.3f} -> {after['bytes_out']:.3f}"
        f"  [target <= {args.threshold:.2f}: {'met' if ok_bal else 'MISSED'}]",
        f"moves: {moves}, lower bound {bound}, ratio {ratio:.3f}  [target <= 1.2: "
        f"{'met' if ok_moves else 'MISSED'}]",
        f"load average (1/5/15 min) before: {load_before}, after: {load_after}",
        f"chart: {report_dir / 'load.png'}"
        + ("" if args.no_results else " (copied to bench/RESULTS-planner-load.png)"),
    ]
    for line in lines:
        print(line, flush=True)
    if args.no_results:
        return 0
    peak = [
        (b["broker"], b["before"]["bytes_in_peak_hour"], b["after"]["bytes_in_peak_hour"])
        for b in report["brokers"]
    ]
    mean_peak_after = sum(p[2] for p in peak) / len(peak)
    mean_peak_before = sum(p[1] for p in peak) / len(peak)
    results = ROOT / "bench" / "RESULTS-planner.md"
    chart = ROOT / "bench" / "RESULTS-planner-load.png"
    shutil.copyfile(report_dir / "load.png", chart)
    results.write_text(
        "# Planner benchmark\n\n"
        f"`.venv/bin/python bench/planner.py` on {platform.node()} ({os.cpu_count()} cores, "
        f"Python {platform.python_version()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n"
        f"History: {spec.partitions} partitions x {spec.brokers} brokers x {spec.days:g} days at "
        f"{spec.step_s} s ({spec.points} points per metric), synthetic "
        f"(`tidalmq_planner.synthetic`), {size_mb:.0f} MB of Parquet; broker {spec.brokers - 1} "
        "just joined (holds nothing), the others hold Kafka's default placement.\n\n"
        + "| figure | value | target |\n|---|---|---|\n"
        f"| plan time, whole `tidalmq plan` process (Spark local[{os.cpu_count()}]) | {wall:.1f} s | <= 120 s |\n"
        + "".join(f"| stage: {k} | {v:.1f} s | |\n" for k, v in timings.items())
        + f"| max/mean bytes in ({args.statistic}), before -> after | {before['bytes_in']:.3f} -> {after['bytes_in']:.3f} | <= {args.threshold:.2f} |\n"
        f"| max/mean bytes out ({args.statistic}), before -> after | {before['bytes_out']:.3f} -> {after['bytes_out']:.3f} | <= {args.threshold:.2f} |\n"
        f"| busiest broker-hour / mean broker-hour, bytes in, before -> after | "
        f"{max(p[1] for p in peak) / mean_peak_before:.3f} -> {max(p[2] for p in peak) / mean_peak_after:.3f} | (reported) |\n"
        f"| moves | {moves} | |\n| lower bound on moves | {bound} | |\n"
        f"| moves / lower bound | {ratio:.3f} | <= 1.2 |\n"
        f"| load average (1/5/15 min) | before {load_before}; after {load_after} | |\n\n"
        f"Chart (per-broker load before/after): `bench/{chart.name}` (a copy of this run's "
        f"`{report_dir.relative_to(ROOT)}/load.png`).\n\n![per-broker load]({chart.name})\n\n"
        "Per-broker table:\n\n```\n" + (report_dir / "report.txt").read_text() + "```\n"
    )
    print(f"results: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
