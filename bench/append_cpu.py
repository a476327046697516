"""CPU of a Produce request's per-partition work, in one process, on a loaded machine.

What a produce request does for each partition before it waits for the WAL: Produce's record
checks (`apis.produce.record_refusal`, with a CreateTime topic's default timestamp bounds, as
every topic has) and the partition's append start (`Partition.start_append`: headers, CRC,
idempotent producer checks, offsets, the WAL queue), on a real partition of a local-directory
engine, for Java-producer-shaped data: one batch of 15 records of 1 KiB per append, from an
idempotent producer. Where a checkout's handler parses the headers once and hands them to the
append (`start_append(headers=...)`), this does the same; otherwise each step parses its own.

Timed with the thread's CPU clock (time.thread_time) around the synchronous part only; the WAL
flushes run between rounds and are not counted. Rounds of the checkouts given alternate, each in
a fresh process, so that a loaded machine weighs on all of them alike; each round's figure and
the median per checkout are printed with the load average.

    .venv/bin/python bench/append_cpu.py --source /tmp/before --source .
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
BOUNDS = (9223372036854775807, 3_600_000)  # Kafka's defaults: no lower bound, one hour ahead


async def _round(appends: int, partitions: int) -> float:
    """Microseconds of thread CPU per partition append (checks and start)."""
    from tidalmq_broker.apis.produce import record_refusal
    from tidalmq_broker.protocol import records
    from tidalmq_broker.storage.api import PartitionConfig, StorageConfig
    from tidalmq_broker.storage.engine import ObjectStreamEngine
    from tidalmq_broker.storage.objectstore import LocalDirObjectStore
    from tidalmq_core.model import TopicPartition

    with tempfile.TemporaryDirectory(prefix="append-cpu-") as tmp:
        engine = ObjectStreamEngine(
            LocalDirObjectStore(Path(tmp)), 1, StorageConfig(checkpoint_interval_s=3600)
        )
        await engine.start()
        try:
            logs = [
                await engine.open_partition(TopicPartition("t", i), "id", 1, PartitionConfig())
                for i in range(partitions)
            ]
            start = logs[0].start_append  # type: ignore[attr-defined]
            once = "headers" in inspect.signature(start).parameters
            value = os.urandom(1024)
            now_ms = int(time.time() * 1000)
            spent = 0.0
            for n in range(appends):
                # a fresh buffer per append, as each request has its own frame
                data = memoryview(
                    bytearray(
                        records.build_batch(
                            [(None, value)] * 15,
                            timestamp_ms=now_ms,
                            producer_id=1000,
                            producer_epoch=0,
                            base_sequence=(n // partitions) * 15,
                        )
                    )
                )
                plog = logs[n % partitions]
                t0 = time.thread_time()
                if once:
                    headers = records.read_headers(data)
                    record_refusal("t", 0, data, False, BOUNDS, headers=headers)  # type: ignore[call-arg]
                    plog.start_append(data, acks=-1, owned=True, headers=headers)  # type: ignore[attr-defined]
                else:
                    record_refusal("t", 0, data, False, BOUNDS)
                    plog.start_append(data, acks=-1, owned=True)  # type: ignore[attr-defined]
                spent += time.thread_time() - t0
                if n % 64 == 63:
                    await engine.writer.wait_idle()
            await engine.writer.wait_idle()
        finally:
            await engine.stop()
    return spent / appends * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, action="append", help="a checkout (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(asyncio.run(_round(args.appends, args.partitions)))
        return 0
    sources = args.source or [HERE]
    figures: dict[Path, list[float]] = {s: [] for s in sources}
    for r in range(args.rounds):
        for source in sources:
            env = {**os.environ, "PYTHONPATH": str(source.resolve() / "broker_image" / "src")}
            load = os.getloadavg()[0]
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--appends",
                    str(args.appends),
                    "--partitions",
                    str(args.partitions),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            us = float(out.stdout.strip().splitlines()[-1])
            figures[source].append(us)
            print(f"round {r + 1} {source}: {us:.1f} us per append (load {load:.2f})", flush=True)
    for source, values in figures.items():
        print(
            f"{source}: median {statistics.median(values):.1f} us per append "
            f"(rounds {min(values):.1f}-{max(values):.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
