"""Reading traffic history and the current assignment from Prometheus (prometheus-api-client).

The brokers export, per partition they lead, `tidalmq_partition_bytes_in_total` and
`tidalmq_partition_bytes_out_total` (labels broker, topic, partition) and
`tidalmq_partition_leader_epoch`. A window is fetched as range queries of the per-second rate
summed over brokers (a partition that moved has one series per broker it lived on), cut into
chunks of time and of partitions (by the last digits of the partition number) so that each
chunk is one Spark task of bounded size.

A cluster whose brokers run with the per-partition traffic series off
(`partition_traffic_metrics=false`, for large clusters) has only the per-topic families
(`tidalmq_topic_bytes_in_total`, `_bytes_out_total`): the history is then fetched per topic and
each topic's rate spread evenly over its partitions in the current assignment (`spread_topics`).
Skew between the topics is kept; skew between one topic's partitions is not seen.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import pandas as pd

from tidalmq_planner.history import Grid, format_duration

log = logging.getLogger(__name__)

SERIES = {
    "bytes_in": "tidalmq_partition_bytes_in_total",
    "bytes_out": "tidalmq_partition_bytes_out_total",
}
TOPIC_SERIES = {
    "bytes_in": "tidalmq_topic_bytes_in_total",
    "bytes_out": "tidalmq_topic_bytes_out_total",
}
TOPIC_ROW = -1  # the partition of a chunk row that holds a whole topic's rate
TRAFFIC_SOURCES = ("auto", "partition", "topic")
EPOCH_SERIES = "tidalmq_partition_leader_epoch"
BROKERS_SERIES = "tidalmq_partitions_led"

CHUNK_SPARK_SCHEMA = "topic string, partition int, metric string, first int, values array<float>"


@dataclass(frozen=True, slots=True)
class ChunkTask:
    """One range query: a metric, a piece of the grid, a shard of the partitions."""

    url: str
    metric: str
    query: str
    first: int  # index of the first grid point
    points: int
    start: int  # epoch seconds of the first point
    step: int
    timeout_s: float


def connect(url: str, timeout_s: float = 60.0) -> Any:
    from prometheus_api_client import PrometheusConnect

    return PrometheusConnect(url=url.rstrip("/"), disable_ssl=True, timeout=timeout_s)


def _regex_escape(text: str) -> str:
    return re.escape(text).replace("\\", "\\\\").replace('"', '\\"')


def selector(topics: Sequence[str] | None, shard: str | None) -> str:
    matchers = []
    if topics:
        matchers.append(f'topic=~"{"|".join(_regex_escape(t) for t in topics)}"')
    if shard is not None:
        matchers.append(f'partition=~"{shard}"')
    return "{" + ",".join(matchers) + "}"


def shard_patterns(shards: int) -> list[str | None]:
    """Partition-number regexes that split the partitions into 1, 10 or 100 shards."""
    if shards <= 1:
        return [None]
    digits = 1 if shards <= 10 else 2
    patterns: list[str | None] = [
        f".*{i:0{digits}d}" if digits == 2 else f".*{i}" for i in range(10**digits)
    ]
    if digits == 2:
        patterns.append("[0-9]")  # one-digit partitions under two-digit shards
    return patterns


def plan_tasks(
    url: str,
    grid: Grid,
    *,
    rate_window_s: float,
    topics: Sequence[str] | None = None,
    shards: int = 1,
    points_per_chunk: int = 1440,
    timeout_s: float = 120.0,
    per_topic: bool = False,
) -> list[ChunkTask]:
    """The range queries of a window. per_topic: of the per-topic families, one row per topic
    (partition TOPIC_ROW) for spread_topics to share out; no partition shards (a topic's row is
    one series whatever its partition count)."""
    window = format_duration(rate_window_s)
    tasks = []
    for metric in SERIES:
        for shard in [None] if per_topic else shard_patterns(shards):
            if per_topic:
                series = TOPIC_SERIES[metric]
                query = f"sum by (topic) (rate({series}{selector(topics, None)}[{window}]))"
            else:
                series = SERIES[metric]
                sel = selector(topics, shard)
                query = f"sum by (topic, partition) (rate({series}{sel}[{window}]))"
            for first, points in grid.chunks(points_per_chunk):
                tasks.append(
                    ChunkTask(
                        url, metric, query, first, points, grid.time(first), grid.step, timeout_s
                    )
                )
    return tasks


def fetch_chunk(task: ChunkTask, client: Any | None = None) -> pd.DataFrame:
    """Run one range query; one row per partition with the chunk's points (NaN: no sample)."""
    client = client or connect(task.url, task.timeout_s)
    end = task.start + (task.points - 1) * task.step
    result = client.custom_query_range(
        task.query,
        start_time=datetime.fromtimestamp(task.start, UTC),
        end_time=datetime.fromtimestamp(end, UTC),
        step=f"{task.step}s",
    )
    rows: dict[str, list[Any]] = {
        "topic": [],
        "partition": [],
        "metric": [],
        "first": [],
        "values": [],
    }
    for series in result:
        labels = series.get("metric", {})
        try:
            topic, partition = labels["topic"], int(labels.get("partition", TOPIC_ROW))
        except (KeyError, ValueError):
            continue
        values = np.full(task.points, np.nan, dtype=np.float32)
        for ts, value in series.get("values", []):
            i = round((float(ts) - task.start) / task.step)
            if 0 <= i < task.points:
                v = float(value)
                values[i] = v if math.isfinite(v) else np.nan
        rows["topic"].append(topic)
        rows["partition"].append(partition)
        rows["metric"].append(task.metric)
        rows["first"].append(task.first)
        rows["values"].append(values)
    return pd.DataFrame(rows)


def fetch_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The mapInPandas function of the fetch stage: task rows in, chunk rows out."""
    for batch in batches:
        records = cast("list[dict[str, Any]]", batch.to_dict("records"))  # columns: by name
        for record in records:
            task = ChunkTask(**record)
            frame = fetch_chunk(task)
            log.info(
                "fetched %s points %d+%d: %d series",
                task.metric,
                task.first,
                task.points,
                len(frame),
            )
            yield frame


def spread_topics(
    partitions: dict[str, int],
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """The mapInPandas function that turns each per-topic chunk row into one row per partition
    of the topic (`partitions`: topic -> partition count in the current assignment), each with
    an even share of the rate. Rows of topics not in the assignment (deleted) are dropped;
    per-partition rows pass unchanged."""

    def spread(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in batches:
            whole = frame[frame["partition"] == TOPIC_ROW]
            out = [frame[frame["partition"] != TOPIC_ROW]]
            for row in whole.itertuples(index=False):
                count = partitions.get(str(row.topic), 0)
                if count <= 0:
                    continue
                share = np.asarray(row.values, dtype=np.float32) / np.float32(count)
                out.append(
                    pd.DataFrame(
                        {
                            "topic": [row.topic] * count,
                            "partition": list(range(count)),
                            "metric": [row.metric] * count,
                            "first": [row.first] * count,
                            "values": [share] * count,
                        }
                    )
                )
            yield pd.concat(out, ignore_index=True)

    return spread


def partition_counts(assignment: dict[tuple[str, int], int]) -> dict[str, int]:
    """topic -> partition count (the highest partition number + 1) of an assignment."""
    counts: dict[str, int] = {}
    for topic, partition in assignment:
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    return counts


def has_partition_traffic(client: Any, at: float | None = None) -> bool:
    """Whether any broker exports the per-partition traffic series (at `at`, default now)."""
    params = {"time": str(at)} if at is not None else None
    result = client.custom_query(f"count({SERIES['bytes_in']})", params)
    return bool(result) and float(result[0]["value"][1]) > 0


def tasks_frame(tasks: Sequence[ChunkTask]) -> pd.DataFrame:
    return pd.DataFrame([asdict(t) for t in tasks])


def assemble(grid: Grid, assignment: dict[tuple[str, int], int]) -> Any:
    """The applyInPandas function that joins a partition's chunks into one history row."""

    def build(frame: pd.DataFrame) -> pd.DataFrame:
        topic, partition = str(frame["topic"].iloc[0]), int(frame["partition"].iloc[0])
        arrays = {m: np.full(grid.points, np.nan, dtype=np.float32) for m in SERIES}
        for metric, first, values in zip(
            frame["metric"], frame["first"], frame["values"], strict=True
        ):
            v = np.asarray(values, dtype=np.float32)
            arrays[metric][int(first) : int(first) + v.size] = v
        return pd.DataFrame(
            {
                "topic": [topic],
                "partition": [partition],
                "broker": pd.array([assignment.get((topic, partition))], dtype="Int32"),
                "start": [grid.start],
                "step": [grid.step],
                "bytes_in": [arrays["bytes_in"]],
                "bytes_out": [arrays["bytes_out"]],
            }
        )

    return build


# ------------------------------------------------------------------------------- the present
def current_assignment(client: Any, at: float | None = None) -> dict[tuple[str, int], int]:
    """Which broker leads each partition (at `at`, default now): the broker exporting the
    highest leader epoch for it. Brokers without the epoch gauge: the broker whose bytes-in
    series is present (ties: the lowest id)."""
    params = {"time": str(at)} if at is not None else None
    out: dict[tuple[str, int], tuple[float, int]] = {}
    result = client.custom_query(f"max by (topic, partition, broker) ({EPOCH_SERIES})", params)
    if not result:
        result = client.custom_query(
            f"count by (topic, partition, broker) ({SERIES['bytes_in']})", params
        )
        for r in result:
            r["value"] = [0, "0"]
    for r in result:
        labels = r.get("metric", {})
        try:
            key = (labels["topic"], int(labels["partition"]))
            broker = int(labels["broker"])
            epoch = float(r["value"][1])
        except (KeyError, ValueError, IndexError):
            continue
        if key not in out or (epoch, -broker) > (out[key][0], -out[key][1]):
            out[key] = (epoch, broker)
    return {k: b for k, (_, b) in out.items()}


def live_brokers(client: Any, at: float | None = None) -> list[int]:
    """Brokers that export `tidalmq_partitions_led` (every broker does, from its start: a broker
    that just joined and leads nothing is live too)."""
    params = {"time": str(at)} if at is not None else None
    result = client.custom_query(f"max by (broker) ({BROKERS_SERIES})", params)
    brokers = set()
    for r in result:
        try:
            brokers.add(int(r["metric"]["broker"]))
        except (KeyError, ValueError):
            continue
    return sorted(brokers)
