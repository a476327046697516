"""What brokers spend on their sides of N moves, in process (no network, no controller): the
source closes N partitions it led (the move's first step: the metadata names no leader), the
target opens them at the next epoch (a clean handover), each through a PartitionManager and a
storage engine over one local directory, with the broker's report hook (its partition metrics
and the report document) and its runtime tuning. Prints CPU (time.process_time) per partition
for each round: CPU, not wall time, so it compares commits and settings on a busy machine.

    .venv/bin/python bench/broker_moves.py                          # 2,000 partitions, 3 rounds
    PYTHONMALLOC=pymalloc .venv/bin/python bench/broker_moves.py    # Python's allocator
    PYTHONMALLOC=malloc .venv/bin/python bench/broker_moves.py      # glibc's (what brokers run)

The interpreter's allocator is chosen when it starts: a broker runs on glibc's malloc
(tuning.py), this process on whatever PYTHONMALLOC says (Python's own allocator by default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tidalmq_broker.metrics import BrokerMetrics
from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.tuning import tune_runtime
from tidalmq_controller import report_doc
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition

HOUR = 3600.0
CONFIG = StorageConfig(
    checkpoint_interval_s=HOUR,
    compaction_interval_s=HOUR,
    retention_check_interval_s=HOUR,
    garbage_sweep_interval_s=HOUR,
)


def metadata(partitions: int, version: int, leader: int, epoch: int) -> ClusterMetadata:
    parts = [
        PartitionState(leader=leader, leader_epoch=epoch, replicas=[max(leader, 0)])
        for _ in range(partitions)
    ]
    topic = TopicInfo(name="moves", topic_id="moves-id", partitions=parts)
    return ClusterMetadata(cluster_id="c", version=version, topics={"moves": topic})


def broker(engine: ObjectStreamEngine, broker_id: int) -> PartitionManager:
    """A PartitionManager reporting as Broker._report_partition does (metrics, report doc)."""
    manager = PartitionManager(engine, broker_id)
    m = BrokerMetrics(broker_id, {})
    docs: list[dict[str, Any]] = []

    async def report(kind: str, tp: TopicPartition, epoch: int, **detail: Any) -> None:
        if kind == "closed":
            m.partition_released(tp.topic, tp.partition)
        else:
            m.partition_not_lost(tp.topic, tp.partition)
            m.partition_led(tp.topic, tp.partition, epoch)
        wanted = {k: detail[k] for k in ("topic_id", "high_watermark", "stored") if k in detail}
        docs.append(report_doc(kind, tp, epoch, **wanted))

    manager.add_report(report)
    return manager


async def one_round(partitions: int) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="broker-moves-"))
    source = ObjectStreamEngine(LocalDirObjectStore(workdir), 0, CONFIG)
    target = ObjectStreamEngine(LocalDirObjectStore(workdir), 1, CONFIG)
    await source.start()
    await target.start()
    leaving, coming = broker(source, 0), broker(target, 1)
    try:
        leaving.apply(metadata(partitions, 1, 0, 0))
        assert await leaving.wait_settled(300)
        started = time.process_time()
        leaving.apply(metadata(partitions, 2, -1, 0))  # a move's first step: no leader
        assert await leaving.wait_settled(300)
        closed = time.process_time() - started
        started = time.process_time()
        coming.apply(metadata(partitions, 3, 1, 1))  # the target elected at the next epoch
        assert await coming.wait_settled(300)
        opened = time.process_time() - started
    finally:
        for manager in (leaving, coming):
            await manager.stop()
        for engine in (source, target):
            await engine.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return closed, opened


async def run(partitions: int, rounds: int) -> None:
    tune_runtime()
    results = [await one_round(partitions) for _ in range(rounds)]
    ms = [(1000 * c / partitions, 1000 * o / partitions) for c, o in results]
    print(
        f"{partitions} moves, PYTHONMALLOC={os.environ.get('PYTHONMALLOC', '(default)')}: "
        f"CPU per partition, close {' '.join(f'{c:.3f}' for c, _ in ms)} ms, "
        f"open {' '.join(f'{o:.3f}' for _, o in ms)} ms; best close + open "
        f"{min(c for c, _ in ms) + min(o for _, o in ms):.3f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(run(args.partitions, args.rounds))


if __name__ == "__main__":
    main()
