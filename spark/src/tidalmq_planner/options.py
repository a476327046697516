"""The planner's arguments (shared by `tidalmq plan` and the spark-submit entry point) and the
request they make. Light on purpose: `tidalmq` registers its sub-commands at every start."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tidalmq_core.cli_values import bootstrap_servers, http_url, id_list

STATISTICS = ("mean", "p95", "peak")


@dataclass(slots=True)
class PlanRequest:
    prometheus: str | None = None
    history: str | None = None
    save_history: str | None = None
    window: str = "7d"
    step: str = "1m"
    end: float | None = None  # epoch seconds; default now
    rate_window: str | None = None  # default max(2 x step, 1m)
    traffic: str = "auto"  # auto | partition | topic: which series the history is read from
    threshold: float = 1.10
    floor: float | None = None  # default 2 - threshold; 0 turns it off
    max_moves: int | None = None
    statistic: str = "mean"
    topics: list[str] | None = None
    bootstrap_server: str | None = None
    command_config: str | None = None  # Kafka client properties for a TLS/SASL listener
    controller_url: str | None = None
    assignment_file: str | None = None
    brokers: list[int] | None = None
    out: str | None = None
    report_dir: str | None = None
    yaml: str | None = None
    name: str = ""
    namespace: str | None = None
    configmap: str | None = None
    master: str | None = None
    shards: int = 0  # 0: by partition count
    chunk_points: int = 1440
    driver_memory: str = "2g"


def options(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("traffic history")
    src.add_argument("--prometheus", metavar="URL", type=http_url, help="Prometheus base URL")
    src.add_argument("--history", metavar="FILE", help="a saved history (Parquet) instead")
    src.add_argument("--save-history", metavar="FILE", help="save the fetched history (Parquet)")
    src.add_argument("--window", default="7d", help="how far back (default 7d)")
    src.add_argument("--step", default="1m", help="resolution (default 1m)")
    src.add_argument("--end", type=float, help="end of the window, epoch seconds (default now)")
    src.add_argument("--rate-window", help="rate() range (default max(2 x step, 1m))")
    src.add_argument("--topics", help="comma-separated: fetch and move only these topics")
    src.add_argument(
        "--traffic",
        choices=("auto", "partition", "topic"),
        default="auto",
        help="per-partition traffic series, or per-topic ones spread evenly over each topic's "
        "partitions (for brokers run with partition_traffic_metrics=false); auto (default): "
        "per partition when the brokers export them",
    )
    cur = p.add_argument_group("current assignment (default: from Prometheus or the history)")
    cur.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        type=bootstrap_servers,
        help="read it from the cluster",
    )
    cur.add_argument(
        "--command-config",
        metavar="FILE",
        help="with --bootstrap-server: Kafka client properties (security.protocol, "
        "SASL, PEM stores) for a TLS or SASL listener",
    )
    cur.add_argument(
        "--controller-url", metavar="URL", type=http_url, help="read it from the controller"
    )
    cur.add_argument("--assignment", metavar="FILE", help="a Kafka-format assignment JSON")
    cur.add_argument(
        "--brokers", type=id_list, metavar="IDS", help="comma-separated broker ids to balance onto"
    )
    goal = p.add_argument_group("goal")
    goal.add_argument(
        "--threshold",
        type=float,
        default=1.10,
        help="max broker load / mean to reach (default 1.1)",
    )
    goal.add_argument(
        "--floor",
        type=float,
        help="min broker load / mean to reach (default 2 - threshold; 0: none)",
    )
    goal.add_argument("--max-moves", type=int, help="move budget")
    goal.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="mean",
        help="which load to balance (default mean)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--out", metavar="FILE", help="the plan, Kafka's reassignment JSON")
    out.add_argument("--report-dir", metavar="DIR", help="report, chart, plan, rollback, YAML")
    out.add_argument("--yaml", metavar="FILE", help="the plan as a PartitionReassignment")
    out.add_argument("--name", default="", help="the PartitionReassignment's name")
    out.add_argument("--namespace", help="its namespace (and the ConfigMap's)")
    out.add_argument(
        "--configmap", metavar="NAME", help="(in a pod) write the result into this ConfigMap"
    )
    run_ = p.add_argument_group("spark")
    run_.add_argument("--master", help="Spark master (tidalmq plan: local[*])")
    run_.add_argument("--shards", type=int, default=0, help="partition shards per query (1/10/100)")
    run_.add_argument("--chunk-points", type=int, default=1440, help="points per range query")
    run_.add_argument("--driver-memory", default="2g", help="local mode: driver JVM memory")


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    def ints(given: str | list[int] | None) -> list[int] | None:  # a list: parsed by id_list
        if isinstance(given, list):
            return given
        return [int(x) for x in given.split(",") if x.strip()] if given else None

    return PlanRequest(
        prometheus=args.prometheus,
        history=args.history,
        save_history=args.save_history,
        window=args.window,
        step=args.step,
        end=args.end,
        rate_window=args.rate_window,
        traffic=args.traffic,
        threshold=args.threshold,
        floor=args.floor,
        max_moves=args.max_moves,
        statistic=args.statistic,
        topics=[t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None,
        bootstrap_server=args.bootstrap_server,
        command_config=args.command_config,
        controller_url=args.controller_url,
        assignment_file=args.assignment,
        brokers=ints(args.brokers),
        out=args.out,
        report_dir=args.report_dir,
        yaml=args.yaml,
        name=args.name,
        namespace=args.namespace,
        configmap=args.configmap,
        master=args.master,
        shards=args.shards,
        chunk_points=args.chunk_points,
        driver_memory=args.driver_memory,
    )
