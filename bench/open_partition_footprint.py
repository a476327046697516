"""What the storage engine's opening of a creation's partitions leaves for the garbage collector,
in process (a real engine over a local directory, no broker, no network):

    .venv/bin/python bench/open_partition_footprint.py                  # 2,000 partitions
    PYTHONMALLOC=malloc .venv/bin/python bench/open_partition_footprint.py --tuned

Prints the tracked objects an opened, unused partition leaves (by type: gc.get_objects before
and after), then over `--rounds` rounds of `--partitions` opens each the CPU of the opens with
the collector off and on, and the CPU of one young collection (gc.collect(0)) of what the
opens left. `--tuned` applies the broker's runtime tuning (tuning.py: its GC thresholds and
malloc settings; run it with PYTHONMALLOC=malloc, as a broker runs). The gate on the object
count is tests/unit/storage/test_open_partition_footprint.py; these times are for the record
(docs/control-plane.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidalmq_broker.storage.api import PartitionConfig, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.tuning import tune_runtime
from tidalmq_core.model import TopicPartition

HOUR = 3600.0
# the engine's own loops stay asleep: only the opens run
CONFIG = StorageConfig(
    checkpoint_interval_s=HOUR,
    compaction_interval_s=HOUR,
    retention_check_interval_s=HOUR,
    garbage_sweep_interval_s=HOUR,
    identity_check_interval_ms=HOUR * 1000,
    store_probe_interval_ms=0,
)


async def open_all(engine: ObjectStreamEngine, tps: list[TopicPartition], topic_id: str) -> None:
    config = PartitionConfig()
    for tp in tps:
        await engine.open_partition(tp, topic_id, 0, config)


async def run(partitions: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="open-footprint-") as workdir:
        engine = ObjectStreamEngine(LocalDirObjectStore(Path(workdir)), 0, CONFIG)
        await engine.start()
        await open_all(engine, [TopicPartition("warm", i) for i in range(50)], "warm-id")

        tps = [TopicPartition("counted", i) for i in range(partitions)]
        gc.collect()
        gc.disable()
        before = gc.get_objects()  # held: no object made by the opens can reuse one's id
        known = {id(o) for o in before}
        await open_all(engine, tps, "counted-id")
        by_type = Counter(type(o).__name__ for o in gc.get_objects() if id(o) not in known)
        gc.enable()
        del before, known
        total = sum(by_type.values())
        kinds = ", ".join(f"{name} {n / partitions:g}" for name, n in by_type.most_common(10))
        print(f"tracked objects an opened partition leaves: {total / partitions:.3f} ({kinds})")

        cpu: dict[str, list[float]] = {"off": [], "on": []}
        young_ms: list[float] = []
        for r in range(rounds):
            for collector in ("off", "on"):
                tps = [TopicPartition(f"round-{r}-gc-{collector}", i) for i in range(partitions)]
                gc.collect()
                if collector == "off":
                    gc.disable()
                started = time.process_time()
                await open_all(engine, tps, f"round-{r}-gc-{collector}")
                cpu[collector].append(time.process_time() - started)
                if collector == "off":
                    started = time.process_time()
                    gc.collect(0)
                    young_ms.append((time.process_time() - started) * 1000)
                gc.enable()
        for collector, times in cpu.items():
            median = statistics.median(times)
            print(
                f"open {partitions:,} (GC {collector}): CPU median {median * 1000:.1f} ms, "
                f"min {min(times) * 1000:.1f} ms ({median / partitions * 1e6:.1f} us a partition)"
            )
        print(
            f"one young collection of what {partitions:,} opens left: CPU median "
            f"{statistics.median(young_ms):.2f} ms, min {min(young_ms):.2f} ms"
        )
        print(f"load {os.getloadavg()[0]:.1f}")
        await engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tuned", action="store_true", help="the broker's runtime tuning")
    args = ap.parse_args()
    if args.tuned:
        tune_runtime()
    asyncio.run(run(args.partitions, args.rounds))


if __name__ == "__main__":
    main()
