"""Synthetic traffic history with realistic skew and daily seasonality, for the benchmark and
tests (written in the history file format, see history.py).

- topics of 6 to 96 partitions; a topic's heat is lognormal (a few topics carry most bytes);
  within a topic partitions differ (lognormal), and some topics have a hot key (one partition
  several times its siblings)
- a daily cycle per topic (amplitude 20-80 %, peak hour spread as over time zones), quieter
  weekends for some, multiplicative noise, short bursts, and scrape gaps (NaN)
- bytes out = bytes in x the number of consumer groups (0 to 3) of the topic
- the assignment of Kafka's default placement (partition i on broker i mod n) over the brokers
  that were there, and `joined` brokers that just joined and hold nothing
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidalmq_planner.history import SCHEMA


@dataclass(frozen=True, slots=True)
class Spec:
    partitions: int = 10_000
    brokers: int = 20
    joined: int = 1  # brokers that just joined (hold nothing yet)
    days: float = 7.0
    step_s: int = 60
    seed: int = 42
    end: int = 1_767_225_600  # 2026-01-01T00:00:00Z, so runs are reproducible

    @property
    def points(self) -> int:
        return int(self.days * 86400 // self.step_s)

    def key(self) -> str:
        text = repr(self) + "v1"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def topics(spec: Spec, rng: np.random.Generator) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    total = 0
    while total < spec.partitions:
        n = int(rng.choice([6, 12, 12, 24, 24, 48, 96]))
        n = min(n, spec.partitions - total)
        out.append((f"topic-{len(out):04d}", n))
        total += n
    return out


def generate(spec: Spec, path: Path, batch: int = 256) -> Path:
    """Write the history to `path` (Parquet); returns it."""
    rng = np.random.default_rng(spec.seed)
    old = spec.brokers - spec.joined
    start = spec.end - (spec.points - 1) * spec.step_s
    t = start + spec.step_s * np.arange(spec.points, dtype=np.int64)
    day_phase = 2 * np.pi * (t % 86400) / 86400
    weekday = ((t // 86400) + 3) % 7  # 1970-01-01 was a Thursday
    weekend = (weekday >= 5).astype(np.float64)
    rows = []  # (topic, partition, broker, base, amp, phase, weekend_dip, fanout)
    for name, n in topics(spec, rng):
        heat = rng.lognormal(mean=np.log(20_000), sigma=1.2)  # bytes/s of a typical partition
        weights = rng.lognormal(0.0, 0.4, size=n)
        if rng.random() < 0.15:
            weights[rng.integers(n)] *= rng.uniform(3, 8)  # a hot key
        amp = rng.uniform(0.2, 0.8)
        phase = rng.uniform(0, 2 * np.pi)
        dip = rng.choice([0.0, 0.3])
        fanout = float(rng.choice([0, 1, 1, 2, 3]))
        for i in range(n):
            rows.append((name, i, i % old, heat * weights[i], amp, phase, dip, fanout))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, SCHEMA, compression="snappy") as writer:
        for lo in range(0, len(rows), batch):
            part = rows[lo : lo + batch]
            k = len(part)
            bases = np.array([r[3] for r in part])[:, None]
            amps = np.array([r[4] for r in part])[:, None]
            phases = np.array([r[5] for r in part])[:, None]
            dips = np.array([r[6] for r in part])[:, None]
            fanouts = np.array([r[7] for r in part])[:, None]
            season = 1 + amps * np.sin(day_phase[None, :] - phases)
            season *= 1 - dips * weekend[None, :]
            noise = rng.lognormal(0.0, 0.15, size=(k, spec.points))
            bursts = np.where(
                rng.random((k, spec.points)) < 0.002, rng.uniform(2, 5, (k, spec.points)), 1.0
            )
            bytes_in = (bases * season * noise * bursts).astype(np.float32)
            lag = rng.lognormal(0.0, 0.1, size=(k, spec.points))
            bytes_out = (bytes_in * fanouts * lag).astype(np.float32)
            gaps = rng.random((k, spec.points)) < 0.005
            bytes_in[gaps] = np.nan
            bytes_out[gaps] = np.nan
            offsets = pa.array(np.arange(k + 1, dtype=np.int32) * spec.points)
            table = pa.table(
                {
                    "topic": pa.array([r[0] for r in part], pa.string()),
                    "partition": pa.array([r[1] for r in part], pa.int32()),
                    "broker": pa.array([r[2] for r in part], pa.int32()),
                    "start": pa.array([start] * k, pa.int64()),
                    "step": pa.array([spec.step_s] * k, pa.int32()),
                    "bytes_in": pa.ListArray.from_arrays(offsets, pa.array(bytes_in.ravel())),
                    "bytes_out": pa.ListArray.from_arrays(offsets, pa.array(bytes_out.ravel())),
                },
                schema=SCHEMA,
            )
            writer.write_table(table)
    tmp.replace(path)
    return path


def cached(spec: Spec, cache_dir: Path) -> Path:
    """The history for `spec` under `cache_dir`, generated once."""
    path = (
        cache_dir
        / f"history-{spec.partitions}p-{spec.brokers}b-{spec.days:g}d-{spec.key()}.parquet"
    )
    return path if path.exists() else generate(spec, path)
