"""What one broker spends on its share of a topic creation, in process (no network, no other
broker): the topic record applied to its metadata, the wishes derived (PartitionManager.apply_delta)
and the partitions it leads opened and reported (the PartitionManager's workers, the storage
engine over a local directory), on one event loop with the broker's runtime tuning.

    .venv/bin/python bench/broker_opens.py                       # 6,000 partitions, 3 brokers
    .venv/bin/python bench/broker_opens.py --partitions 50000 --brokers 4 --profile

This is the brokers' part of the create row of bench/metadata_scale.py (where three such
brokers share two cores with the controller); it prints wall time and CPU per round and the
machine's load, and with --profile the cProfile of the last round. No target of its own: it
tells where a creation's time goes on the broker side.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.tuning import tune_runtime
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta, apply_batch, topic_record


async def run(partitions: int, brokers: int, rounds: int, profile: bool) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="broker-opens-"))
    engine = ObjectStreamEngine(
        LocalDirObjectStore(workdir / "objects"), 0, StorageConfig(), owns_store=True
    )
    await engine.start()
    manager = PartitionManager(engine, 0)
    opened: set[TopicPartition] = set()
    want = 0
    done = asyncio.Event()

    async def report(kind: str, tp: TopicPartition, epoch: int, **_: Any) -> None:
        if kind == "opened":
            opened.add(tp)
            if len(opened) == want:
                done.set()

    manager.add_report(report)
    meta = ClusterMetadata("bench", version=1)
    manager.apply(meta)
    prof = cProfile.Profile() if profile else None
    print(
        f"{partitions:,} partitions over {brokers} brokers: this broker leads "
        f"{len(range(0, partitions, brokers)):,}; load {os.getloadavg()[0]:.1f}"
    )
    for n in range(rounds):
        opened.clear()
        done.clear()
        topic = TopicInfo(
            f"t{n}",
            str(uuid.uuid4()),
            [PartitionState(i % brokers, 0, [i % brokers]) for i in range(partitions)],
        )
        record = topic_record(topic)
        want = len(range(0, partitions, brokers))
        last = n == rounds - 1
        if prof is not None and last:
            prof.enable()
        wall, cpu = time.perf_counter(), time.process_time()
        delta = MetadataDelta()
        apply_batch(meta, [record], meta.version + 1, delta)
        applied = time.perf_counter()
        manager.apply_delta(meta, delta)
        wished = time.perf_counter()
        await done.wait()
        end = time.perf_counter()
        if prof is not None and last:
            prof.disable()
        print(
            f"  round {n + 1}: record applied {1000 * (applied - wall):.1f} ms, wishes "
            f"{1000 * (wished - applied):.1f} ms, opened and reported "
            f"{1000 * (end - wished):.1f} ms; total {1000 * (end - wall):.1f} ms, CPU "
            f"{1000 * (time.process_time() - cpu):.1f} ms "
            f"({1e6 * (time.process_time() - cpu) / want:.1f} us per partition led); "
            f"load {os.getloadavg()[0]:.1f}"
        )
        await asyncio.sleep(0.3)
    await manager.stop()
    await engine.stop()
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=6000)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    tune_runtime()
    asyncio.run(run(args.partitions, args.brokers, args.rounds, args.profile))


if __name__ == "__main__":
    main()
