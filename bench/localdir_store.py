"""Micro-benchmark of the local-directory object store under concurrency: puts and GET+PUT pairs.

    .venv/bin/python bench/localdir_store.py                      # this tree vs the version before
    .venv/bin/python bench/localdir_store.py --impl new --concurrency 1,3000
    .venv/bin/python bench/localdir_store.py --before <git rev>   # compare with another version

Scenarios, each at 1, 8, 100 and 3,000 concurrent callers (closed loop: every caller issues its
next operation when the previous one returned; 600 operations a run at least):
  put      create-only puts (if_none_match) of 300-byte objects, each caller under its own
           directory (as partitions are)
  get+put  a partition move's checkpoint pattern: get_with_etag of a 300-byte object, then a put
           of a new version with if_match (every caller owns its key: no conflicts); one op is
           one pair
  lone     1 and 2 concurrent puts, batches synced with fsync (file, then directory) or with
           syncfs: which is cheaper for one or two puts (the store: fsync for a lone put)
  wal      the latency of one 4 MiB put issued alone, and in the middle of 3,000 concurrent
           300-byte puts (a big WAL object must not queue behind every small write)
"old" is localdir.py as of --before (the last version with a thread job and an fsync per put),
loaded from git into a temporary module; "new" is this tree's. Each figure is the median of
--repeat runs, old and new interleaved so that both see the same load, with the range of the
runs and the 1-minute load average at the end of the median run: on a shared machine that is
the first thing to read next to a throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tidalmq_broker.storage.objectstore import localdir as new_localdir  # noqa: E402
from tidalmq_broker.storage.objectstore.base import ObjectStore  # noqa: E402

from bench.cache import cache_dir  # noqa: E402

LOCALDIR = "broker_image/src/tidalmq_broker/storage/objectstore/localdir.py"
# the last version with a thread job (temp file, fsync, lock, rename, fsync of the directory) per put
BEFORE_GROUP_COMMIT = "0e45afcafd8ff2060aa39bafa9a72696018057d8"
SMALL = 300
WAL = 4 * 1024 * 1024


def load_old(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:{LOCALDIR}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="localdir-old-")) / "localdir_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("localdir_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Row:
    impl: str
    scenario: str
    concurrency: int
    ops: int
    seconds: float
    cpu_s: float
    p50_ms: float
    p99_ms: float
    load1: float

    @property
    def ops_s(self) -> float:
        return self.ops / self.seconds

    def line(self) -> str:
        return (
            f"| {self.impl} | {self.scenario} | {self.concurrency} | {self.ops} | "
            f"{self.ops_s:,.0f} | {self.p50_ms:.1f} | {self.p99_ms:.1f} | "
            f"{self.cpu_s / self.seconds:.2f} | {self.load1:.1f} |"
        )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1e3


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def closed_loop(
    concurrency: int, total: int, op: Callable[[int, int], Awaitable[Any]]
) -> tuple[float, float, list[float]]:
    """`concurrency` callers share `total` operations; op(caller, n) is the caller's n-th."""
    per_caller = max(1, total // concurrency)
    latencies: list[float] = []

    async def caller(c: int) -> None:
        for n in range(per_caller):
            t0 = time.perf_counter()
            await op(c, n)
            latencies.append(time.perf_counter() - t0)

    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(concurrency)))
    return time.perf_counter() - t0, cpu() - c0, latencies


async def run_put(
    store: ObjectStore, concurrency: int, total: int
) -> tuple[float, float, list[float]]:
    payload = os.urandom(SMALL)

    async def op(c: int, n: int) -> None:
        await store.put(f"put/t{c % 100}/p{c}/{n:06d}", payload, if_none_match=True)

    return await closed_loop(concurrency, total, op)


async def run_get_put(
    store: ObjectStore, concurrency: int, total: int
) -> tuple[float, float, list[float]]:
    payload = os.urandom(SMALL)
    setup = [store.put(f"cp/t{c % 100}/p{c}/checkpoint", payload) for c in range(concurrency)]
    for i in range(0, len(setup), 500):
        await asyncio.gather(*setup[i : i + 500])

    async def op(c: int, n: int) -> None:
        key = f"cp/t{c % 100}/p{c}/checkpoint"
        _data, etag = await store.get_with_etag(key)
        await store.put(key, payload, if_match=etag)

    return await closed_loop(concurrency, total, op)


async def run_wal(store: ObjectStore) -> list[tuple[str, float]]:
    big = os.urandom(WAL)
    small = os.urandom(SMALL)
    out = []
    for i in range(3):
        t0 = time.perf_counter()
        await store.put(f"wal/alone-{i}", big, if_none_match=True)
        out.append(("alone", time.perf_counter() - t0))
    for i in range(3):
        storm = [
            asyncio.ensure_future(store.put(f"wal/s{i}/t{c % 100}/{c}", small)) for c in range(1500)
        ]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await store.put(f"wal/storm-{i}", big, if_none_match=True)
        out.append(("amid 3,000 small puts", time.perf_counter() - t0))
        storm += [
            asyncio.ensure_future(store.put(f"wal/s{i}/u{c % 100}/{c}", small)) for c in range(1500)
        ]
        await asyncio.gather(*storm)
    return out


Factory = Callable[[Path], ObjectStore]


def factories(args: argparse.Namespace) -> dict[str, Factory]:
    out: dict[str, Factory] = {}
    if args.impl in ("old", "both"):
        old = load_old(args.before)
        out["old"] = lambda root: old.LocalDirObjectStore(root)  # type: ignore[no-any-return]
    if args.impl in ("new", "both"):
        out["new"] = lambda root: new_localdir.LocalDirObjectStore(root)
    return out


def median_row(rows: list[Row]) -> tuple[Row, str]:
    rows = sorted(rows, key=lambda r: r.ops_s)
    spread = f"{rows[0].ops_s:,.0f}-{rows[-1].ops_s:,.0f}" if len(rows) > 1 else ""
    return rows[len(rows) // 2], spread


async def one_run(
    factory: Factory, root: Path, scenario: str, concurrency: int, total: int
) -> tuple[float, float, list[float]]:
    store = factory(root)
    try:
        if scenario in ("put", "lone put"):
            return await run_put(store, concurrency, total)
        if scenario == "get+put":
            return await run_get_put(store, concurrency, total)
        raise SystemExit(f"unknown scenario {scenario}")
    finally:
        await store.close()
        empty(root)


def empty(root: Path) -> None:
    """Remove the objects, keep the store's own directories: every run, old or new, creates its
    temporary files in the same directory. (On this machine's ext4 the cost of creating a file
    depends on the directory, from ~20 us to ~0.7 ms of kernel time, and changes over time: a
    fresh directory per run made the figures a lottery.)"""
    for entry in root.iterdir():
        if entry.name.startswith(".tidalmq"):
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def create_cost_us(directory: Path, n: int = 200) -> float:
    """Microseconds to create (and write 300 bytes to) a file in `directory`: the kernel's part
    of a put that no store can avoid, for reading the figures."""
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(directory / f"probe-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * SMALL)
        os.close(fd)
    elapsed = time.perf_counter() - t0
    for i in range(n):
        os.unlink(directory / f"probe-{i}")
    return elapsed / n * 1e6


async def bench(args: argparse.Namespace, base: Path) -> None:
    impls = factories(args)
    plan = [
        (impls, scenario, int(c))
        for scenario in args.scenarios.split(",")
        for c in args.concurrency.split(",")
    ]
    if args.lone:
        # is fsync cheaper than syncfs for one or two puts? (the store's default: fsync for one)
        lone: dict[str, Factory] = {
            "new, fsync": lambda root: new_localdir.LocalDirObjectStore(root, syncfs_min_batch=3),
            "new, syncfs": lambda root: new_localdir.LocalDirObjectStore(root, syncfs_min_batch=1),
        }
        plan += [(lone, "lone put", 1), (lone, "lone put", 2)]
    for variants, scenario, concurrency in plan:
        runs: dict[str, list[Row]] = {name: [] for name in variants}
        for _ in range(args.repeat):
            for name, factory in variants.items():  # interleaved: the same load for each
                total = max(args.min_ops, concurrency)
                root = base / "store"
                secs, cpu_s, lat = await one_run(factory, root, scenario, concurrency, total)
                runs[name].append(
                    Row(
                        name,
                        scenario,
                        concurrency,
                        len(lat),
                        secs,
                        cpu_s,
                        pct(lat, 50),
                        pct(lat, 99),
                        os.getloadavg()[0],
                    )
                )
        for rows in runs.values():
            if rows:
                row, spread = median_row(rows)
                print(f"{row.line()} {spread} |", flush=True)
    if args.wal:
        for name, factory in impls.items():
            root = base / "store"
            store = factory(root)
            figures = await run_wal(store)
            await store.close()
            empty(root)
            for label in ("alone", "amid 3,000 small puts"):
                ms = [s * 1e3 for what, s in figures if what == label]
                print(
                    f"| {name} | 4 MiB put {label} | median {statistics.median(ms):.1f} ms | "
                    f"max {max(ms):.1f} ms | load {os.getloadavg()[0]:.1f} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=["old", "new", "both"], default="both")
    parser.add_argument("--before", default=BEFORE_GROUP_COMMIT, help="git rev of the old store")
    parser.add_argument("--concurrency", default="1,8,100,3000")
    parser.add_argument("--scenarios", default="put,get+put")
    parser.add_argument("--min-ops", type=int, default=600, help="operations per run at least")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the median shown)")
    parser.add_argument("--no-wal", dest="wal", action="store_false")
    parser.add_argument("--no-lone", dest="lone", action="store_false")
    cache = str(cache_dir())
    parser.add_argument(
        "--dir",
        default=os.path.join(cache, "bench-localdir"),
        help="where the stores go (emptied after); not /tmp on the dev machine: file creation "
        "there costs ~0.4 ms of kernel time, ~20 us elsewhere on the same ext4",
    )
    args = parser.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    fs = subprocess.run(
        ["df", "--output=fstype,source", str(base)], capture_output=True, text=True
    ).stdout.split()[-2:]
    print(
        f"load average before: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{os.cpu_count()} cores; python {sys.version.split()[0]}; {base} on {' '.join(fs)}; "
        f"syncfs: {'yes' if new_localdir._libc_syncfs is not None else 'no (fsync fallback)'}"
    )
    print(
        "| impl | scenario | concurrency | ops | ops/s | p50 ms | p99 ms | cpu/wall | load1 "
        "| ops/s min-max |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    probe = base / "store" / ".tidalmq-tmp"
    before = create_cost_us(probe)
    try:
        asyncio.run(bench(args, base))
        after = create_cost_us(probe)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"load average after: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}; creating a file "
        f"in the stores' temporary directory: {before:.0f} us before, {after:.0f} us after"
    )


if __name__ == "__main__":
    main()
