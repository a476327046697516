"""The planner job: traffic history -> per-partition load profiles (Spark) -> a balanced plan.

Run by `tidalmq plan` (Spark in local mode) or by spark-submit on Kubernetes (the operator, see
tidalmq_operator.planning): `spark-submit ... local:///.../tidalmq_planner/job.py ARGS`, with the
same arguments as `tidalmq plan` (see `options`).

Stages:
  1. the current assignment and live brokers (bootstrap server, file, controller, or Prometheus)
  2. history rows: from a saved Parquet file, or fetched from Prometheus as range-query chunks
     (one Spark task per chunk) joined per partition; optionally saved for offline runs
  3. load profiles per partition (Spark, numpy in the Python workers): mean, p95, peak, hourly
  4. on the driver: balance_load (tidalmq_core) over the chosen statistic of bytes in and out,
     per-broker projections, outputs and report
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tidalmq_core.balance import LoadPlan, balance_load
from tidalmq_core.model import TopicPartition

from tidalmq_planner import assignment as sources
from tidalmq_planner.history import (
    SPARK_SCHEMA,
    Grid,
    format_duration,
    parse_duration,
    row_groups,
)
from tidalmq_planner.options import STATISTICS, PlanRequest, options, request_from_args
from tidalmq_planner.profiles import PROFILE_SPARK_SCHEMA, profile_batches, profile_row_groups
from tidalmq_planner.publish import publish_configmap
from tidalmq_planner.report import (
    BrokerProjection,
    PlanResult,
    Report,
    format_table,
    imbalance_of,
    report_links,
    write_outputs,
)

log = logging.getLogger("tidalmq_planner")


# ------------------------------------------------------------------------------- spark
def spark_session(master: str | None, driver_memory: str = "2g") -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName("tidalmq-planner")
    if master:
        cores = master[len("local[") : -1] if master.startswith("local[") else ""
        builder = (
            builder.master(master)
            .config("spark.driver.memory", driver_memory)
            .config(
                "spark.sql.shuffle.partitions",
                str(max(2, 2 * int(cores)) if cores.isdigit() else 8),
            )
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    builder = (
        builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # a history row holds a whole window (10,080 points per metric for 7d at 1m)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "128")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def traffic_per_topic(req: PlanRequest, grid: Grid, view: sources.ClusterView) -> bool:
    """Whether the history comes from the per-topic series (--traffic, or auto: the brokers
    export no per-partition traffic series at the window's end)."""
    from tidalmq_planner import prometheus

    assert req.prometheus
    if req.traffic == "auto":
        per_topic = not prometheus.has_partition_traffic(
            prometheus.connect(req.prometheus), grid.end
        )
    else:
        per_topic = req.traffic == "topic"
    if per_topic and not view.assignment:
        raise SystemExit(
            "per-topic traffic is spread over the partitions of the current assignment, and "
            "there is none: give --bootstrap-server, --controller-url or --assignment"
        )
    return per_topic


def history_frame(
    spark: Any,
    req: PlanRequest,
    grid: Grid | None,
    view: sources.ClusterView,
    notes: list[str] | None = None,
) -> Any:
    """Stage 2: a DataFrame of history rows (SPARK_SCHEMA), fetched from Prometheus."""
    from tidalmq_planner import prometheus

    assert req.prometheus and grid is not None
    per_topic = traffic_per_topic(req, grid, view)
    if per_topic:
        log.warning("no per-partition traffic series: spreading each topic's traffic evenly")
        if notes is not None:
            notes.append(
                "traffic read per topic (the brokers export no per-partition traffic series): "
                "each topic's bytes are spread evenly over its partitions, so skew between one "
                "topic's partitions is not seen"
            )
    partitions = max(len(view.assignment), 1)
    shards = req.shards or (1 if partitions <= 1000 else 10 if partitions <= 20_000 else 100)
    rate_window = parse_duration(req.rate_window) if req.rate_window else max(2 * grid.step, 60)
    tasks = prometheus.plan_tasks(
        req.prometheus,
        grid,
        rate_window_s=rate_window,
        topics=req.topics,
        shards=shards,
        points_per_chunk=req.chunk_points,
        per_topic=per_topic,
    )
    log.warning("fetching %d range-query chunks from %s as Spark tasks", len(tasks), req.prometheus)
    task_df = spark.createDataFrame(prometheus.tasks_frame(tasks)).repartition(len(tasks))
    chunks = task_df.mapInPandas(prometheus.fetch_batches, prometheus.CHUNK_SPARK_SCHEMA)
    if per_topic:
        chunks = chunks.mapInPandas(
            prometheus.spread_topics(prometheus.partition_counts(view.assignment)),
            prometheus.CHUNK_SPARK_SCHEMA,
        )
    history = chunks.groupBy("topic", "partition").applyInPandas(
        prometheus.assemble(grid, view.assignment), SPARK_SCHEMA
    )
    if req.save_history:
        history.write.mode("overwrite").parquet(req.save_history)
        log.warning("history saved to %s", req.save_history)
        return spark.read.parquet(req.save_history)
    return history


def load_profiles(
    spark: Any,
    req: PlanRequest,
    grid: Grid | None,
    view: sources.ClusterView,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """Stages 2 and 3: one profile row per partition, collected on the driver. A history file
    is read by the tasks themselves, one Parquet row group each (its large arrays never pass
    through the JVM)."""
    if req.history:
        groups = row_groups(req.history)
        tasks = spark.createDataFrame(pd.DataFrame(groups, columns=["file", "row_group"]))
        tasks = tasks.repartition(min(len(groups), 4 * spark.sparkContext.defaultParallelism))
        profiles = tasks.mapInPandas(profile_row_groups, PROFILE_SPARK_SCHEMA)
    else:
        history = history_frame(spark, req, grid, view, notes)
        profiles = history.mapInPandas(profile_batches, PROFILE_SPARK_SCHEMA)
    frame: pd.DataFrame = profiles.toPandas()  # pyspark's DataFrame methods return Any
    return frame


# ------------------------------------------------------------------------------- driver side
def cluster_view(req: PlanRequest, grid: Grid | None) -> sources.ClusterView:
    """Stage 1. Without an explicit source: Prometheus, or (offline) the history's column."""
    if req.bootstrap_server:
        return sources.from_bootstrap(req.bootstrap_server, command_config=req.command_config)
    if req.controller_url:
        return sources.from_controller(req.controller_url)
    if req.assignment_file:
        return sources.from_file(req.assignment_file)
    if req.prometheus and grid is not None:
        from tidalmq_planner import prometheus

        client = prometheus.connect(req.prometheus)
        assignment = prometheus.current_assignment(client, grid.end)
        brokers = sorted(set(prometheus.live_brokers(client, grid.end)) | set(assignment.values()))
        return sources.ClusterView(assignment, brokers, f"prometheus {req.prometheus}")
    return sources.ClusterView({}, [], "history file")


def balance(
    req: PlanRequest, profiles: pd.DataFrame, view: sources.ClusterView
) -> tuple[LoadPlan[TopicPartition], dict[TopicPartition, int], list[int], list[str]]:
    notes: list[str] = []
    stat = req.statistic
    load: dict[TopicPartition, tuple[float, float]] = {}
    assignment: dict[TopicPartition, int | None] = {}
    known = dict(view.assignment)
    authoritative = bool(known)
    row: Any  # a profile row: its fields are what the frame holds
    for row in profiles.itertuples(index=False):
        tp = TopicPartition(str(row.topic), int(row.partition))
        load[tp] = (
            float(getattr(row, f"bytes_in_{stat}")),
            float(getattr(row, f"bytes_out_{stat}")),
        )
        if not authoritative and not pd.isna(row.broker):
            known[(tp.topic, tp.partition)] = int(row.broker)
    for (topic, partition), broker in known.items():
        assignment[TopicPartition(topic, partition)] = broker
    dropped = [tp for tp in load if tp not in assignment]
    if dropped:
        notes.append(
            f"{len(dropped)} partitions with history are not in the current assignment "
            f"(deleted topics?) and were left out, e.g. {dropped[0]}"
        )
        for tp in dropped:
            load.pop(tp)
    brokers = sorted(set(req.brokers) if req.brokers else set(view.brokers) | set(known.values()))
    if not brokers:
        raise SystemExit("no brokers: give --brokers or a source of the current assignment")
    gone = sorted({b for b in known.values() if b not in brokers})
    if gone:
        notes.append(f"partitions on brokers {gone} (not live) are placed on live brokers")
    idle = sum(1 for tp in assignment if tp not in load)
    if idle:
        notes.append(f"{idle} partitions have no traffic history (counted with zero load)")
    movable = None
    if req.topics:
        wanted = set(req.topics)
        movable = [tp for tp in assignment if tp.topic in wanted]
    plan = balance_load(
        assignment,
        load,
        brokers,
        threshold=req.threshold,
        floor=req.floor,
        max_moves=req.max_moves,
        movable=movable,
    )
    if plan.cap[0] > req.threshold + 1e-9 or plan.cap[1] > req.threshold + 1e-9:
        notes.append(
            f"one partition alone is above the threshold: the best reachable max/mean is "
            f"{plan.cap[0]:.2f} (bytes in), {plan.cap[1]:.2f} (bytes out)"
        )
    return plan, {tp: b for tp, b in assignment.items() if b is not None}, brokers, notes


def project(
    profiles: pd.DataFrame,
    plan: LoadPlan[TopicPartition],
    current: dict[TopicPartition, int],
    stat: str,
) -> list[BrokerProjection]:
    """Per-broker load before and after: the balanced statistic (sum over partitions) and the
    busiest hour of the summed hourly profiles (the daily seasonality)."""
    index = {
        (str(t), int(p)): i
        for i, (t, p) in enumerate(zip(profiles["topic"], profiles["partition"], strict=True))
    }
    hourly = {
        m: np.stack(list(profiles[f"{m}_hourly"])) if len(profiles) else np.zeros((0, 24))
        for m in ("bytes_in", "bytes_out")
    }
    stat_cols = {
        m: profiles[f"{m}_{stat}"].to_numpy(dtype=float) for m in ("bytes_in", "bytes_out")
    }
    out = []
    for b in plan.brokers:
        rows = {}
        for label, assignment in (("before", current), ("after", plan.assignment)):
            idx = [
                index[(tp.topic, tp.partition)]
                for tp, x in assignment.items()
                if x == b and (tp.topic, tp.partition) in index
            ]
            vals = {}
            for m in ("bytes_in", "bytes_out"):
                vals[m] = float(stat_cols[m][idx].sum()) if idx else 0.0
                vals[f"{m}_peak_hour"] = float(hourly[m][idx].sum(axis=0).max()) if idx else 0.0
            rows[label] = vals
        out.append(
            BrokerProjection(
                b,
                sum(1 for x in current.values() if x == b),
                sum(1 for x in plan.assignment.values() if x == b),
                rows["before"],
                rows["after"],
            )
        )
    return out


def run(req: PlanRequest, spark: Any | None = None) -> PlanResult:
    if not req.prometheus and not req.history:
        raise SystemExit("give --prometheus URL or --history FILE")
    if req.statistic not in STATISTICS:
        raise SystemExit(f"--statistic must be one of {', '.join(STATISTICS)}")
    timings: dict[str, float] = {}
    started = time.perf_counter()
    grid = None
    if req.prometheus and not req.history:
        grid = Grid.ending(
            req.end or time.time(), parse_duration(req.window), parse_duration(req.step)
        )
    view = cluster_view(req, grid)
    timings["assignment"] = time.perf_counter() - started
    log.warning(
        "current assignment: %d partitions on brokers %s (from %s)",
        len(view.assignment),
        view.brokers,
        view.source,
    )

    t = time.perf_counter()
    own = spark is None
    spark = spark or spark_session(req.master, req.driver_memory)
    timings["spark_start"] = time.perf_counter() - t
    history_notes: list[str] = []
    try:
        t = time.perf_counter()
        profiles = load_profiles(spark, req, grid, view, history_notes)
        timings["profiles"] = time.perf_counter() - t
    finally:
        if own:
            spark.stop()
    log.warning("load profiles of %d partitions", len(profiles))

    t = time.perf_counter()
    plan, current, _brokers, notes = balance(req, profiles, view)
    notes = history_notes + notes
    timings["balance"] = time.perf_counter() - t
    projections = project(profiles, plan, current, req.statistic)
    dims = ("bytes_in", "bytes_out")
    window, step = req.window, req.step
    if req.history and len(profiles):
        step_s = int(profiles["step"].max())
        window = format_duration(step_s * int(profiles["points"].max()))
        step = format_duration(step_s)
    report = Report(
        statistic=req.statistic,
        threshold=req.threshold,
        floor=plan.floor[0] if plan.floor else 0.0,
        window=window,
        step=step,
        source=req.history or req.prometheus or "",
        assignment_source=view.source,
        partitions=len(plan.assignment),
        brokers=projections,
        moves=len(plan.moves),
        lower_bound=plan.lower_bound,
        max_moves=req.max_moves,
        balanced=plan.balanced,
        within_threshold=plan.within_threshold,
        stopped=plan.stopped,
        imbalance_before={d: imbalance_of([p.before[d] for p in projections]) for d in dims},
        imbalance_after={d: imbalance_of([p.after[d] for p in projections]) for d in dims},
        cap=dict(zip(dims, plan.cap, strict=True)),
        timings_s=timings,
        notes=notes,
        links=report_links(
            req.prometheus if not req.history else None,
            window,
            req.rate_window or format_duration(max(2 * parse_duration(step), 60)),
        ),
    )
    timings["total"] = time.perf_counter() - started
    name = req.name or f"planned-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    written = write_outputs(
        report,
        plan,
        out=Path(req.out) if req.out else None,
        report_dir=Path(req.report_dir) if req.report_dir else None,
        yaml_path=Path(req.yaml) if req.yaml else None,
        name=name,
        namespace=req.namespace,
    )
    result = PlanResult(plan, report, profiles, written)
    if req.configmap:
        publish_configmap(req.configmap, req.namespace, result)
        written["configmap"] = f"{req.namespace or ''}/{req.configmap}"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point (the master comes from spark-submit)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(
        prog="tidalmq_planner.job",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options(parser)
    result = run(request_from_args(parser.parse_args(argv)))
    print(format_table(result.report), flush=True)
    print("TIDALMQ_PLAN_RESULT " + json.dumps(result.summary(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
