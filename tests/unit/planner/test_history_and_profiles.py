"""The planner's pieces that need no Spark: durations and grids, load profiles (numpy),
Prometheus query construction and chunk decoding, outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from tidalmq_core.balance import balance_load
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import parse_plan
from tidalmq_planner import assignment as sources
from tidalmq_planner import prometheus as prom
from tidalmq_planner.history import Grid, format_duration, parse_duration
from tidalmq_planner.profiles import hour_of_day, profile_frame, summarize
from tidalmq_planner.report import reassignment_resource, rollback_plan, to_yaml


def test_durations() -> None:
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("1m") == 60 and parse_duration("90s") == 90
    assert parse_duration("1.5h") == 5400 and parse_duration("250ms") == 0.25
    assert parse_duration(30) == 30.0 and parse_duration("45") == 45.0
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("a week")
    assert [format_duration(s) for s in (60, 3600, 86400, 7 * 86400, 90, 20, 0.5)] == [
        "1m",
        "1h",
        "1d",
        "1w",
        "90s",
        "20s",
        "500ms",
    ]


def test_grid_is_aligned_and_chunked() -> None:
    g = Grid.ending(end=1000.7, window=300, step=60)
    assert (g.end, g.step, g.points) == (960, 60, 5)
    assert g.start == 720 and g.time(4) == 960
    assert g.chunks(2) == [(0, 2), (2, 2), (4, 1)]
    with pytest.raises(ValueError, match="shorter than the step"):
        Grid.ending(1000, 30, 60)


def test_summarize_against_a_direct_computation() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(0, 1, size=(7, 500))
    values[0, ::7] = np.nan  # scrape gaps
    values[1, :] = np.nan  # a partition that did not exist in the window
    hours = hour_of_day(start=1_767_225_600 - 3600 * 5, step=300, points=500)
    got = summarize(values, hours)
    for i in (0, 2, 6):
        row = values[i][~np.isnan(values[i])]
        assert got["mean"][i] == pytest.approx(row.mean())
        assert got["peak"][i] == pytest.approx(row.max())
        # nearest-rank 95th percentile
        assert got["p95"][i] == pytest.approx(np.sort(row)[int(np.ceil(0.95 * row.size)) - 1])
        for h in (0, 13, 23):
            sel = (hours == h) & ~np.isnan(values[i])
            assert got["hourly"][i][h] == pytest.approx(values[i][sel].mean() if sel.any() else 0)
    assert got["mean"][1] == got["p95"][1] == got["peak"][1] == 0.0 and got["samples"][1] == 0


def test_profile_frame_finds_the_daily_cycle() -> None:
    step, points = 600, 6 * 24 * 3  # three days at 10 minutes
    start = 1_767_225_600
    t = start + step * np.arange(points)
    cycle = 100 + 80 * np.sin(2 * np.pi * ((t % 86400) / 86400 - 0.25))  # peaks at 12:00 UTC
    batch = pd.DataFrame(
        {
            "topic": ["a", "b"],
            "partition": [0, 1],
            "broker": pd.array([2, None], dtype="Int32"),
            "start": [start, start],
            "step": [step, step],
            "bytes_in": [cycle.astype(np.float32), np.full(points, 5, np.float32)],
            "bytes_out": [np.zeros(points, np.float32), np.full(points, 10, np.float32)],
        }
    )
    out = profile_frame(batch)
    assert list(out["topic"]) == ["a", "b"] and out["broker"].isna().tolist() == [False, True]
    assert int(np.argmax(out["bytes_in_hourly"][0])) == 12
    assert out["bytes_in_mean"][0] == pytest.approx(100, rel=1e-3)
    assert out["bytes_in_peak"][0] == pytest.approx(180, rel=1e-3)
    assert out["bytes_out_mean"][1] == 10 and out["bytes_in_p95"][1] == 5
    assert out["points"][0] == points and out["step"][0] == step


def test_shards_cover_every_partition_exactly_once() -> None:
    for shards in (1, 10, 100):
        patterns = prom.shard_patterns(shards)
        for partition in range(0, 1200):
            hits = [p for p in patterns if p is None or re.fullmatch(p, str(partition))]
            assert len(hits) == 1, (shards, partition, hits)


def test_queries_select_topics_and_shards() -> None:
    grid = Grid.ending(86400 * 3, 86400 * 2, 60)
    tasks = prom.plan_tasks("http://p", grid, rate_window_s=120, topics=["a.b", 'q"x'], shards=10)
    assert len(tasks) == 2 * 10 * 2  # metrics x shards x day-long chunks
    q = tasks[0].query
    assert q.startswith("sum by (topic, partition) (rate(tidalmq_partition_bytes_in_total{")
    assert 'topic=~"a\\\\.b|q\\"x"' in q and 'partition=~".*0"' in q and q.endswith("[2m]))")
    assert {t.points for t in tasks} == {1440} and tasks[1].start == grid.time(1440)


class FakePrometheus:
    """prometheus-api-client's two calls, answering from canned results."""

    def __init__(self, range_result: list[dict[str, Any]], instant: dict[str, list]) -> None:
        self.range_result = range_result
        self.instant = instant
        self.calls: list[tuple[str, Any]] = []

    def custom_query_range(self, query: str, start_time: Any, end_time: Any, step: str) -> Any:
        self.calls.append((query, (start_time.timestamp(), end_time.timestamp(), step)))
        return self.range_result

    def custom_query(self, query: str, params: Any = None) -> Any:
        self.calls.append((query, params))
        for key, result in self.instant.items():
            if key in query:
                return result
        return []


def test_fetch_chunk_places_samples_on_the_grid() -> None:
    task = prom.ChunkTask(
        "http://p", "bytes_in", "q", first=10, points=4, start=1000, step=60, timeout_s=5
    )
    client = FakePrometheus(
        [
            {
                "metric": {"topic": "t", "partition": "3"},
                "values": [[1000, "1.5"], [1120, "2"], [1180, "NaN"], [5000, "9"]],
            },
            {"metric": {"no": "labels"}, "values": [[1000, "1"]]},
        ],
        {},
    )
    frame = prom.fetch_chunk(task, client)
    assert client.calls[0][1] == (1000, 1180, "60s")
    assert list(frame["topic"]) == ["t"] and list(frame["first"]) == [10]
    np.testing.assert_array_equal(
        frame["values"][0], np.array([1.5, np.nan, 2, np.nan], np.float32)
    )


def test_per_topic_history_is_spread_evenly_over_each_topics_partitions() -> None:
    """Brokers with partition_traffic_metrics=false: one query per metric and time chunk of the
    per-topic families, each topic's rate shared evenly by its partitions."""
    grid = Grid.ending(86400 * 3, 86400 * 2, 60)
    tasks = prom.plan_tasks(
        "http://p", grid, rate_window_s=120, topics=["a"], shards=10, per_topic=True
    )
    assert len(tasks) == 2 * 2  # metrics x day-long chunks: no partition shards
    assert tasks[0].query == 'sum by (topic) (rate(tidalmq_topic_bytes_in_total{topic=~"a"}[2m]))'
    assert "tidalmq_topic_bytes_out_total" in tasks[-1].query

    task = prom.ChunkTask(
        "http://p", "bytes_in", "q", first=0, points=2, start=1000, step=60, timeout_s=5
    )
    client = FakePrometheus(
        [
            {"metric": {"topic": "a"}, "values": [[1000, "300"], [1060, "600"]]},
            {"metric": {"topic": "gone"}, "values": [[1000, "5"]]},
        ],
        {},
    )
    chunk = prom.fetch_chunk(task, client)
    assert list(chunk["partition"]) == [prom.TOPIC_ROW, prom.TOPIC_ROW]
    counts = prom.partition_counts({("a", 0): 1, ("a", 2): 0, ("a", 1): 2, ("b", 0): 1})
    assert counts == {"a": 3, "b": 1}
    passthrough = pd.DataFrame(
        {
            "topic": ["b"],
            "partition": [0],
            "metric": ["bytes_in"],
            "first": [0],
            "values": [np.array([7, 7], np.float32)],
        }
    )
    (spread,) = prom.spread_topics(counts)(iter([pd.concat([chunk, passthrough])]))
    a = spread[spread["topic"] == "a"].sort_values("partition")
    assert list(a["partition"]) == [0, 1, 2]  # "gone" (not in the assignment) is dropped
    for values in a["values"]:
        np.testing.assert_array_equal(values, np.array([100, 200], np.float32))
    assert list(spread[spread["topic"] == "b"]["partition"]) == [0]
    assert "gone" not in set(spread["topic"])


def test_traffic_source_follows_what_the_brokers_export() -> None:
    with_series = FakePrometheus(
        [], {"count(tidalmq_partition_bytes_in_total)": [{"metric": {}, "value": [0, "12"]}]}
    )
    assert prom.has_partition_traffic(with_series)
    assert not prom.has_partition_traffic(FakePrometheus([], {}))


def test_per_topic_traffic_needs_an_assignment_to_spread_over() -> None:
    from tidalmq_planner import job
    from tidalmq_planner.options import PlanRequest

    grid = Grid.ending(86400, 3600, 60)
    req = PlanRequest(prometheus="http://p", traffic="topic")
    with pytest.raises(SystemExit, match="--bootstrap-server"):
        job.traffic_per_topic(req, grid, sources.ClusterView({}, [], "none"))
    view = sources.ClusterView({("a", 0): 1}, [1], "file")
    assert job.traffic_per_topic(req, grid, view)
    assert not job.traffic_per_topic(
        PlanRequest(prometheus="http://p", traffic="partition"), grid, view
    )


def test_current_assignment_follows_the_highest_epoch() -> None:
    def row(t: str, p: int, b: int, v: float) -> dict[str, Any]:
        return {"metric": {"topic": t, "partition": str(p), "broker": str(b)}, "value": [0, str(v)]}

    client = FakePrometheus(
        [],
        {
            prom.EPOCH_SERIES: [row("t", 0, 1, 3), row("t", 0, 2, 4), row("t", 1, 0, 1)],
            prom.BROKERS_SERIES: [{"metric": {"broker": b}, "value": [0, "1"]} for b in "201"],
        },
    )
    assert prom.current_assignment(client) == {("t", 0): 2, ("t", 1): 0}
    assert prom.live_brokers(client) == [0, 1, 2]


def test_assignment_from_a_kafka_json_file(tmp_path: Path) -> None:
    path = tmp_path / "current.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": "a", "partition": 0, "replicas": [1]},
                    {"topic": "a", "partition": 1, "replicas": [3]},
                ],
            }
        )
    )
    view = sources.from_file(path)
    assert view.assignment == {("a", 0): 1, ("a", 1): 3} and view.brokers == [1, 3]


def test_reassignment_resource_yaml_round_trips() -> None:
    tp = TopicPartition
    plan = balance_load(
        {tp("t", 0): 0, tp("t", 1): 0}, {tp("t", 0): (5.0,), tp("t", 1): (5.0,)}, [0, 1]
    )
    moves = {m.partition: m.target for m in plan.moves}
    doc = reassignment_resource("rebalance-1", "tidalmq", moves, {"moves": 1, "why": 'a "b": c'})
    text = to_yaml(doc)
    assert yaml.safe_load(text) == doc
    assert doc["spec"]["approved"] is False
    assert doc["spec"]["partitions"] == [{"topic": "t", "partition": 1, "replicas": [1]}] or doc[
        "spec"
    ]["partitions"] == [{"topic": "t", "partition": 0, "replicas": [1]}]
    entries = parse_plan({"version": 1, "partitions": doc["spec"]["partitions"]})
    assert len(entries) == 1
    assert rollback_plan(plan) == {m.partition: 0 for m in plan.moves}


def test_job_runs_as_a_script_like_spark_submit_runs_it() -> None:
    """spark-submit runs job.py as a file (its directory first on sys.path): no module of the
    package may shadow one the job needs."""
    import subprocess
    import sys

    import tidalmq_planner.job as job

    done = subprocess.run(
        [sys.executable, job.__file__, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--prometheus" in done.stdout and "--configmap" in done.stdout
