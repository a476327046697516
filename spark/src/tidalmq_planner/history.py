"""Traffic history: what the planner reads, whichever the source.

One row per partition: its broker at the end of the window (when known) and, on a regular time
grid (`start`, `step`), the per-second rate of bytes in and bytes out, NaN where there was no
sample (the partition did not exist yet, or nobody scraped it). A saved history file is this
table as Parquet, so an offline run reads exactly what a Prometheus run would have fetched:

    topic: string, partition: int32, broker: int32 (null: unknown), start: int64 (epoch s of
    the first point), step: int32 (s), bytes_in: list<float32>, bytes_out: list<float32>
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

METRICS = ("bytes_in", "bytes_out")

SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("broker", pa.int32()),
        pa.field("start", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("bytes_in", pa.list_(pa.float32()), nullable=False),
        pa.field("bytes_out", pa.list_(pa.float32()), nullable=False),
    ]
)

SPARK_SCHEMA = (
    "topic string, partition int, broker int, start long, step int, "
    "bytes_in array<float>, bytes_out array<float>"
)

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|y)\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in a Prometheus-style duration ("7d", "1m", "30s", "1.5h") or a number."""
    if isinstance(text, int | float):
        return float(text)
    m = _DURATION.match(text)
    if m is None:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"not a duration: {text!r} (expected e.g. 7d, 12h, 1m, 15s)") from None
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest exact Prometheus duration for a whole number of seconds (ms otherwise)."""
    if seconds != int(seconds):
        return f"{round(seconds * 1000)}ms"
    s = int(seconds)
    for unit in ("w", "d", "h", "m"):
        if s and s % int(_UNITS[unit]) == 0:
            return f"{s // int(_UNITS[unit])}{unit}"
    return f"{s}s"


@dataclass(frozen=True, slots=True)
class Grid:
    """The time grid of a window: `points` samples, `step` seconds apart, the last at `end`."""

    end: int
    step: int
    points: int

    @classmethod
    def ending(cls, end: float, window: float, step: float) -> Grid:
        step_s = max(1, round(step))
        if window < step_s:
            raise ValueError(f"the window ({window:g}s) is shorter than the step ({step_s}s)")
        aligned = int(end) - int(end) % step_s
        return cls(aligned, step_s, int(window // step_s))

    @property
    def start(self) -> int:
        return self.end - (self.points - 1) * self.step

    def chunks(self, points_per_chunk: int) -> list[tuple[int, int]]:
        """(first index, number of points) of consecutive pieces of the grid."""
        size = max(1, points_per_chunk)
        return [(i, min(size, self.points - i)) for i in range(0, self.points, size)]

    def time(self, index: int) -> int:
        return self.start + index * self.step


def row_groups(path: str | Path) -> list[tuple[str, int]]:
    """(file, row group) of every row group of a history file or directory of Parquet files:
    the units of work of an offline run (each Spark task reads its own with pyarrow)."""
    import pyarrow.parquet as pq

    root = Path(path)
    files = (
        sorted(p for p in root.rglob("*.parquet") if not p.name.startswith((".", "_")))
        if root.is_dir()
        else [root]
    )
    if not files:
        raise FileNotFoundError(f"no Parquet files in {path}")
    return [(str(f), i) for f in files for i in range(pq.ParquetFile(f).num_row_groups)]


def read_row_group(file: str, index: int) -> pd.DataFrame:
    """One row group as history rows, the rate lists as zero-copy numpy views when every row
    has the same number of points (the usual case)."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.ParquetFile(file).read_row_group(index)
    frame = pd.DataFrame(
        {
            "topic": table.column("topic").to_pylist(),
            "partition": table.column("partition").to_numpy(),
            "broker": pd.array(table.column("broker").to_pylist(), dtype="Int32"),
            "start": table.column("start").to_numpy(),
            "step": table.column("step").to_numpy(),
        }
    )
    for metric in METRICS:
        col = table.column(metric).combine_chunks()
        offsets = col.offsets.to_numpy()
        values = col.values.to_numpy(zero_copy_only=False)
        lengths = np.diff(offsets)
        if len(lengths) and (lengths == lengths[0]).all() and offsets[0] == 0:
            rows = list(values[: offsets[-1]].reshape(len(lengths), int(lengths[0])))
        else:
            rows = [values[a:b] for a, b in itertools.pairwise(offsets)]
        frame[metric] = rows
    return frame
