"""Per-partition load profiles from history rows (numpy, run inside Spark's Python workers).

For each of bytes in and bytes out (bytes per second): the mean, the 95th percentile and the
peak over the window, and a simple daily seasonality: the mean at each hour of the day (UTC),
from which the report projects each broker's busiest hour. Missing points (NaN) are left out;
a partition with no point at all has zero load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import numpy as np
import pandas as pd

from tidalmq_planner.history import METRICS, read_row_group

STATS = ("mean", "p95", "peak")
HOURS = 24

PROFILE_SPARK_SCHEMA = ", ".join(
    ["topic string", "partition int", "broker int", "samples int", "points int", "step int"]
    + [f"{m}_{s} double" for m in METRICS for s in STATS]
    + [f"{m}_hourly array<double>" for m in METRICS]
)


def _matrix(values: pd.Series) -> np.ndarray:
    """Stack a column of equal-length arrays into a float32 matrix (NaN-padded if ragged)."""
    arrays = [np.asarray(v, dtype=np.float32) for v in values]
    width = max((a.size for a in arrays), default=0)
    if all(a.size == width for a in arrays):
        return np.stack(arrays) if arrays else np.zeros((0, 0), np.float32)
    out = np.full((len(arrays), width), np.nan, dtype=np.float32)
    for i, a in enumerate(arrays):
        out[i, : a.size] = a
    return out


def hour_of_day(start: int, step: int, points: int) -> np.ndarray:
    return ((start + step * np.arange(points, dtype=np.int64)) // 3600) % HOURS


def summarize(values: np.ndarray, hours: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, p95, peak and hourly means of each row of `values` (rows: partitions, columns:
    points; NaN = no sample). `hours` gives the hour of day of each column."""
    rows, width = values.shape
    present = ~np.isnan(values)
    counts = present.sum(axis=1)
    has = counts > 0
    filled = np.where(present, values, np.float32(0))
    mean = np.where(has, filled.sum(axis=1, dtype=np.float64) / np.maximum(counts, 1), 0.0)
    with np.errstate(invalid="ignore"):
        peak = np.where(has, np.fmax.reduce(values, axis=1) if width else 0.0, 0.0)
    # the 95th percentile without nanpercentile's per-row Python loop: sort (NaN last) and
    # take the nearest-rank element among each row's present values
    if width:
        ordered = np.sort(values, axis=1)
        rank = np.clip(np.ceil(0.95 * counts).astype(np.int64) - 1, 0, width - 1)
        p95 = np.where(has, ordered[np.arange(rows), rank].astype(np.float64), 0.0)
    else:
        p95 = np.zeros(rows)
    onehot = np.zeros((width, HOURS), dtype=np.float32)
    onehot[np.arange(width), hours] = 1.0
    hour_sum = (filled @ onehot).astype(np.float64)
    hour_count = present.astype(np.float32) @ onehot
    hourly = np.where(hour_count > 0, hour_sum / np.maximum(hour_count, 1), 0.0)
    return {
        "mean": mean,
        "p95": p95,
        "peak": peak.astype(np.float64),
        "hourly": hourly,
        "samples": counts,
    }


def profile_frame(batch: pd.DataFrame) -> pd.DataFrame:
    """History rows -> profile rows (one per partition)."""
    out = pd.DataFrame(
        {
            "topic": batch["topic"].astype(str).to_numpy(),
            "partition": batch["partition"].astype(np.int32).to_numpy(),
            "broker": batch["broker"].astype("Int32"),
        }
    )
    samples = np.zeros(len(batch), dtype=np.int64)
    points = np.zeros(len(batch), dtype=np.int64)
    # rows sharing a grid share one hour-of-day vector (the usual case: one grid per run)
    groups = batch.groupby(["start", "step"], sort=False).indices if len(batch) else {}
    columns: dict[str, np.ndarray] = {}
    for metric in METRICS:
        for stat in STATS:
            columns[f"{metric}_{stat}"] = np.zeros(len(batch))
        columns[f"{metric}_hourly"] = np.zeros((len(batch), HOURS))
    for grid, idx in groups.items():
        start, step = cast("tuple[int, int]", grid)
        for metric in METRICS:
            values = _matrix(batch[metric].iloc[idx])
            summary = summarize(values, hour_of_day(int(start), int(step), values.shape[1]))
            for stat in STATS:
                columns[f"{metric}_{stat}"][idx] = summary[stat]
            columns[f"{metric}_hourly"][idx] = summary["hourly"]
            samples[idx] = np.maximum(samples[idx], summary["samples"])
            points[idx] = np.maximum(points[idx], values.shape[1])
    out["samples"] = samples.astype(np.int32)
    out["points"] = points.astype(np.int32)
    out["step"] = batch["step"].astype(np.int32).to_numpy() if len(batch) else np.zeros(0, np.int32)
    for metric in METRICS:
        for stat in STATS:
            out[f"{metric}_{stat}"] = columns[f"{metric}_{stat}"]
        out[f"{metric}_hourly"] = list(columns[f"{metric}_hourly"])
    return out


def profile_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The mapInPandas function of the profile stage."""
    for batch in batches:
        yield profile_frame(batch)


def profile_row_groups(tasks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The mapInPandas function of an offline run: (file, row_group) rows in, profiles out; the
    worker reads the row group itself (pyarrow), so the history's large arrays never pass
    through the JVM."""
    for batch in tasks:
        for file, index in zip(batch["file"], batch["row_group"], strict=True):
            yield profile_frame(read_row_group(str(file), int(index)))
