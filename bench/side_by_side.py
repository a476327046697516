"""Side by side: the real Apache Kafka and TidalMQ on this machine, in one invocation, measured
with the same clients (Kafka's own perf tools and kafka-reassign-partitions, confluent-kafka).

    .venv/bin/python bench/side_by_side.py --quick                   # validation: small sizes
    .venv/bin/python bench/side_by_side.py                           # the full run
    .venv/bin/python bench/side_by_side.py --resume                  # ... after an interruption
    .venv/bin/python bench/side_by_side.py --only move,rebalance     # some sections only
    .venv/bin/python bench/side_by_side.py --storage minio --only produce,consume
    .venv/bin/python bench/side_by_side.py --render                  # page + charts from the JSON

Sections (each runs Kafka, then TidalMQ, never both at once, and prints both and the ratio):

produce    1 KiB records, acks=all, one broker each: kafka-producer-perf-test flat out and at a
           fixed rate (latency not dominated by queueing), and a confluent-kafka driver.
consume    from the tail (a topic produced just before) and cold (after a broker restart with the
           data files evicted from the page cache; also after a restart that keeps the page
           cache), with kafka-consumer-perf-test and a confluent-kafka consumer.
move       one partition of 100 MiB and 1 GiB moved to another broker with
           kafka-reassign-partitions (Kafka: 2 brokers, replication factor 1, with and without a
           throttle) and with `tidalmq reassign` (TidalMQ: 2 brokers; its throttled run with
           Kafka's tool): time to completion from the command's launch and from the submission,
           and the longest produce->ack wait of a producer writing to the partition throughout.
rebalance  a broker added to a cluster holding a 300-partition topic: Kafka generates and
           executes a plan with kafka-reassign-partitions; TidalMQ's controller rebalances by
           itself. Time until the metadata shows the new broker leading its share.

Each section's figures are kept in bench/RESULTS-side-by-side.json as soon as it finishes, so a
run can be resumed (the same command with --resume skips the sections already done) or repeated
one section at a time (--only); bench/RESULTS-side-by-side.md and
bench/charts/side-by-side-*.png are written from that file after every section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.kafka.harness import (  # noqa: E402
    consumer_perf_test,
    producer_perf_test,
    reassign_generate,
    reassign_verify,
)
from bench.partition_moves import TrickleProducer  # noqa: E402
from bench.side_by_side_report import render  # noqa: E402
from bench.side_by_side_systems import (  # noqa: E402
    KAFKA,
    MIB,
    TIDALMQ,
    MetadataWatch,
    System,
    TidalCluster,
    ck_consume,
    ck_produce,
    cluster,
    create_topic,
    delete_topic,
    environment,
    fill_topic,
    loadavg,
    log,
    partition_states,
    run_reassign_execute,
    single_broker,
    wait_for,
)

RESULTS_JSON = REPO / "bench" / "RESULTS-side-by-side.json"
RESULTS_MD = REPO / "bench" / "RESULTS-side-by-side.md"
CHARTS = REPO / "bench" / "charts"
SECTIONS = ("produce", "consume", "move", "rebalance")
RECORD = 1024


@dataclasses.dataclass(frozen=True)
class Params:
    produce_records: int  # per kafka-producer-perf-test run (1 KiB each)
    ck_records: int  # per confluent-kafka run (librdkafka is much faster: it needs more to time)
    latency_rate: int  # records/s of the fixed-rate latency run
    latency_seconds: int
    partitions: int  # of the produce and consume topics
    cold_mib: int
    tail_mib: int
    move_sizes_mib: tuple[int, ...]
    move_repeats: int  # TidalMQ moves per size (a Kafka move copies the data: one per variant)
    throttle_mib_s: int
    rebalance_partitions: int
    rebalance_brokers: int  # before the new one joins
    rebalance_kib_per_partition: int


FULL = Params(
    produce_records=1_000_000,
    ck_records=1_000_000,
    latency_rate=2000,
    latency_seconds=30,
    partitions=4,
    cold_mib=1024,
    tail_mib=200,
    move_sizes_mib=(100, 1024),
    move_repeats=3,
    throttle_mib_s=20,
    rebalance_partitions=300,
    rebalance_brokers=3,
    rebalance_kib_per_partition=1024,
)
QUICK = Params(
    produce_records=50_000,
    ck_records=200_000,
    latency_rate=1000,
    latency_seconds=10,
    partitions=4,
    cold_mib=128,
    tail_mib=64,
    move_sizes_mib=(16, 64),
    move_repeats=2,
    throttle_mib_s=20,
    rebalance_partitions=300,
    rebalance_brokers=2,
    rebalance_kib_per_partition=64,
)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Recorder:
    """Collects one section's measurements (each with the load average around it)."""

    def __init__(self, section: str) -> None:
        self.section = section
        self.measurements: list[dict[str, Any]] = []
        self.comparisons: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def measure(self, system: str, run: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        before = loadavg()
        log(f"{self.section}: {system}: {run} ...")
        started = time.time()
        values = fn()
        row = {
            "system": system,
            "run": run,
            **values,
            "load_before": before,
            "load_after": loadavg(),
            "wall_s": round(time.time() - started, 1),
        }
        self.measurements.append(row)
        shown = {k: v for k, v in values.items() if not isinstance(v, (dict, list))}
        log(
            f"{self.section}: {system}: {run}: {shown} (load {before[0]} -> {row['load_after'][0]})"
        )
        return row

    def compare(
        self,
        metric: str,
        unit: str,
        kind: str,
        kafka: float | None,
        tidalmq: float | None,
        *,
        target: float | None = None,
        chart: str = "",
        short: str = "",
    ) -> None:
        """kind: "throughput" (higher is better) or "latency"/"time" (lower is better).
        advantage = how many times better TidalMQ is (>1: TidalMQ better)."""
        advantage = None
        if kafka and tidalmq and kafka > 0 and tidalmq > 0:
            advantage = tidalmq / kafka if kind == "throughput" else kafka / tidalmq
        row = {
            "metric": metric,
            "unit": unit,
            "kind": kind,
            "kafka": kafka,
            "tidalmq": tidalmq,
            "advantage": advantage,
            "target": target,
            "chart": chart or unit,
            "short": short or metric,
        }
        self.comparisons.append(row)
        adv = f"{advantage:.2f}x" if advantage is not None else "n/a"
        tgt = (
            f" (target >= {target}x: {'met' if advantage and advantage >= target else 'NOT met'})"
            if target
            else ""
        )
        log(
            f"  {metric}: {KAFKA} {_fmt(kafka)} {unit} | {TIDALMQ} {_fmt(tidalmq)} {unit} | "
            f"TidalMQ advantage {adv}{tgt}"
        )


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


KINDS = (("kafka", KAFKA), ("tidalmq", TIDALMQ))


def by(rec: Recorder, system: str, run: str) -> dict[str, Any] | None:
    for m in rec.measurements:
        if m["system"] == system and m["run"] == run:
            return m
    return None


def val(rec: Recorder, system: str, run: str, key: str) -> float | None:
    m = by(rec, system, run)
    return None if m is None or m.get(key) is None else float(m[key])


# --------------------------------------------------------------------------------------------
# 1. produce


def section_produce(p: Params, workdir: Path, storage: str) -> Recorder:
    rec = Recorder("produce")
    perf_run = f"kafka-producer-perf-test, {p.produce_records} records flat out"
    rate_run = f"kafka-producer-perf-test at {p.latency_rate} records/s for {p.latency_seconds} s"
    ck_run = f"confluent-kafka, {p.ck_records} records flat out"
    for kind, label in KINDS:
        with single_broker(kind, workdir, storage) as system:
            b = system.bootstrap
            warm = name("warmup")
            create_topic(b, warm, p.partitions)
            producer_perf_test(b, warm, num_records=20_000, record_size=RECORD)  # JIT, caches
            delete_topic(b, warm)

            def perf(topic: str, records: int, rate: int = -1, b: str = b) -> dict[str, Any]:
                create_topic(b, topic, p.partitions)
                r, _ = producer_perf_test(
                    b, topic, num_records=records, record_size=RECORD, throughput=rate, acks="all"
                )
                delete_topic(b, topic)
                return {
                    "mib_per_sec": r.mb_per_sec,
                    "records_per_sec": r.records_per_sec,
                    "p50_ms": r.p50_ms,
                    "p99_ms": r.p99_ms,
                    "p999_ms": r.p999_ms,
                    "avg_ms": r.avg_latency_ms,
                    "max_ms": r.max_latency_ms,
                }

            rec.measure(label, perf_run, lambda: perf(name("perf"), p.produce_records))
            rec.measure(
                label,
                rate_run,
                lambda: perf(name("rate"), p.latency_rate * p.latency_seconds, p.latency_rate),
            )

            def ck(b: str = b) -> dict[str, Any]:
                topic = name("ck")
                create_topic(b, topic, p.partitions)
                out = ck_produce(b, topic, count=p.ck_records, record_size=RECORD)
                delete_topic(b, topic)
                return out

            rec.measure(label, ck_run, ck)
    # [L1]'s acceptance: the Java producer at least 1.0x Kafka's on the local store and 0.8x on
    # S3, confluent-kafka 1.0x on both; at the fixed rate p50 and p99 no higher than Kafka's on
    # the local store, p99 at most 2x Kafka's on S3 (a latency row's ratio is Kafka's / ours)
    local = storage == "local"
    throughput_target = {"perf-test": 1.0 if local else 0.8, "confluent-kafka": 1.0}
    latency_target = {"p50": 1.0 if local else None, "p99": 1.0 if local else 0.5}
    for run, tag in ((perf_run, "perf-test"), (ck_run, "confluent-kafka")):
        rec.compare(
            f"produce throughput, {tag}",
            "MiB/s",
            "throughput",
            val(rec, KAFKA, run, "mib_per_sec"),
            val(rec, TIDALMQ, run, "mib_per_sec"),
            target=throughput_target[tag],
            chart="throughput MiB/s",
            short=tag,
        )
        for q in ("p50", "p99"):
            rec.compare(
                f"produce latency {q} flat out, {tag}",
                "ms",
                "latency",
                val(rec, KAFKA, run, f"{q}_ms"),
                val(rec, TIDALMQ, run, f"{q}_ms"),
                chart="latency flat out (ms)",
                short=f"{q} {tag}",
            )
    for q in ("p50", "p99"):
        rec.compare(
            f"produce latency {q} at {p.latency_rate} records/s, perf-test",
            "ms",
            "latency",
            val(rec, KAFKA, rate_run, f"{q}_ms"),
            val(rec, TIDALMQ, rate_run, f"{q}_ms"),
            target=latency_target[q],
            chart=f"latency at {p.latency_rate}/s (ms)",
            short=f"{q} perf-test",
        )
    k_perf = val(rec, KAFKA, perf_run, "mib_per_sec")
    k_ck = val(rec, KAFKA, ck_run, "mib_per_sec")
    if k_perf and k_ck and k_perf < 0.5 * k_ck:
        rec.note(
            f"kafka-producer-perf-test reached {k_perf:.1f} MiB/s against Kafka where the "
            f"confluent-kafka driver reached {k_ck:.1f} MiB/s against the same broker: the tool "
            "itself is the bottleneck here (it fills every record with fresh random letters, "
            "1024 random draws per 1 KiB record, in one JVM thread, on cores shared with the "
            "broker), so its rows compare the two brokers through a client-bound load. Its "
            "latencies flat out are then the time records wait in its 32 MiB buffer."
        )
    rec.note(
        f"Topics of {p.partitions} partitions, replication factor 1 (TidalMQ has one replica by "
        "design; its data's durability is the object store's). Clients on their default settings "
        "apart from acks=all; a 20 000-record warm-up run per broker first. Latency flat out is "
        "mostly queueing in the client at saturation; the fixed-rate run shows the service "
        "latency."
    )
    return rec


# --------------------------------------------------------------------------------------------
# 2. consume


def section_consume(p: Params, workdir: Path, storage: str) -> Recorder:
    rec = Recorder("consume")
    cold_n = p.cold_mib * MIB // RECORD
    tail_n = p.tail_mib * MIB // RECORD
    runs = {
        "tail_perf": f"tail {p.tail_mib} MiB, kafka-consumer-perf-test",
        "tail_ck": f"tail {p.tail_mib} MiB, confluent-kafka",
        "warm_perf": f"{p.cold_mib} MiB after a restart (page cache kept), kafka-consumer-perf-test",
        "cold_perf": f"{p.cold_mib} MiB cold (restart + page cache evicted), kafka-consumer-perf-test",
        "cold_ck": f"{p.cold_mib} MiB cold (restart + page cache evicted), confluent-kafka",
    }
    for kind, label in KINDS:
        with single_broker(kind, workdir, storage) as system:
            b = system.bootstrap
            cold, tail = name("cold"), name("tail")
            create_topic(b, cold, p.partitions)
            create_topic(b, tail, p.partitions)
            rec.measure(
                label,
                f"fill {p.cold_mib} MiB",
                lambda b=b, cold=cold: fill_topic(b, cold, p.cold_mib),
            )
            rec.measure(
                label,
                f"fill {p.tail_mib} MiB (tail)",
                lambda b=b, tail=tail: fill_topic(b, tail, p.tail_mib),
            )

            def perf(topic: str, n: int, b: str = b) -> dict[str, Any]:
                r, _ = consumer_perf_test(b, topic, num_records=n, timeout_ms=60_000)
                if r.records < n:
                    raise RuntimeError(f"kafka-consumer-perf-test read {r.records} of {n}")
                return {
                    "mib_per_sec": r.fetch_mb_per_sec,
                    "mib": r.data_mb,
                    "fetch_s": r.fetch_ms / 1000,
                    "rebalance_s": r.rebalance_ms / 1000,
                    "mib_per_sec_incl_join": r.mb_per_sec,
                }

            def restarted(
                fn: Callable[[], dict[str, Any]], evict: bool, system: System = system
            ) -> Callable[[], dict[str, Any]]:
                def go() -> dict[str, Any]:
                    residency = system.restart(evict=evict)
                    return {**fn(), "page_cache": residency}

                return go

            rec.measure(label, runs["tail_perf"], lambda tail=tail: perf(tail, tail_n))
            rec.measure(
                label, runs["tail_ck"], lambda b=b, tail=tail: ck_consume(b, tail, count=tail_n)
            )
            rec.measure(
                label, runs["warm_perf"], restarted(lambda cold=cold: perf(cold, cold_n), False)
            )
            rec.measure(
                label, runs["cold_perf"], restarted(lambda cold=cold: perf(cold, cold_n), True)
            )
            rec.measure(
                label,
                runs["cold_ck"],
                restarted(lambda b=b, cold=cold: ck_consume(b, cold, count=cold_n), True),
            )
    labels = {
        "tail_perf": "tail, perf-test",
        "tail_ck": "tail, confluent-kafka",
        "warm_perf": "restart (cache kept), perf-test",
        "cold_perf": "cold, perf-test",
        "cold_ck": "cold, confluent-kafka",
    }
    for key, run in runs.items():
        rec.compare(
            f"consume throughput {labels[key]}",
            "MiB/s",
            "throughput",
            val(rec, KAFKA, run, "mib_per_sec"),
            val(rec, TIDALMQ, run, "mib_per_sec"),
            target=0.5 if key.startswith("tail") else None,
            chart="consume MiB/s",
            short=labels[key],
        )
    for label in (KAFKA, TIDALMQ):
        m = by(rec, label, runs["cold_perf"])
        w = by(rec, label, runs["warm_perf"])
        if m and w:
            pc, wc = m["page_cache"], w["page_cache"]
            rec.note(
                f"{label}: {pc['data_mib']} MiB of data files; after a plain restart "
                f"{wc['resident_before_mib']} MiB of them were in the page cache; for the cold "
                f"reads {pc['resident_before_mib']} MiB were resident before eviction and "
                f"{pc['resident_after_evict_mib']} MiB after."
            )
    rec.note(
        "Throughput is over the fetch, from the partitions' assignment to the last record, without "
        "joining the group (kafka-consumer-perf-test's fetch.MB.sec; the confluent-kafka driver "
        "measures the same way). Tail: a topic produced just before (TidalMQ serves it from its 256 MiB tail cache, "
        "Kafka from the page cache). Cold: the broker restarted and its data files (Kafka's log "
        "segments, TidalMQ's object store) evicted from the page cache with "
        "posix_fadvise(DONTNEED), so both read from disk; with TidalMQ on local-directory storage "
        "the 'object store' is the same disk, not a network service."
    )
    return rec


# --------------------------------------------------------------------------------------------
# 3. move one partition


def timed_move(
    system: System,
    topic: str,
    target: int,
    trickle: TrickleProducer,
    *,
    throttle_bytes: int | None = None,
    tidalmq_cli: bool = False,
) -> dict[str, Any]:
    """Move partition 0 of ``topic`` onto broker ``target`` with kafka-reassign-partitions (or
    ``tidalmq reassign``, the real command, when ``tidalmq_cli``); time it from the command's
    launch and from its 'Successfully started' line to the first metadata that shows the
    partition on ``target`` alone (polled every 20 ms, back to back for the first second after
    the submission)."""
    b = system.bootstrap
    moves = {(topic, 0): [target]}
    watch = MetadataWatch(b, topic).start()
    done_state = {0: (target, (target,))}
    try:
        run = run_reassign_execute(
            b,
            moves,
            throttle_bytes=throttle_bytes,
            tidalmq_cli=tidalmq_cli,
            on_submitted=lambda: watch.hurry(1.0),
        )
        result: dict[str, Any] = {"tool": run.tool}
        if run.returncode != 0:
            return {**result, "tool_error": run.error, "error": run.error}
        wait_for(
            lambda: watch.first_time(lambda s: s == done_state) is not None,
            7200,
            f"{topic} on broker {target}",
            interval=0.05,
        )
        time.sleep(1.5)  # every record produced before completion gets its acknowledgement
        done = watch.first_time(lambda s: s == done_state)
        assert done is not None
    finally:
        watch.stop()
    worst = trickle.worst_wait(run.launched, done)
    return {
        **result,
        "from_launch_s": round(done - run.launched, 3),
        "from_submit_s": round(max(0.0, done - run.submitted), 3) if run.submitted else None,
        "tool_s": round(run.exited - run.launched, 3),
        "unavailable_s": round(worst, 3) if worst is not None else None,
        "states_seen": len(watch.history),
    }


def one_move(
    rec: Recorder,
    system: System,
    label: str,
    run: str,
    topic: str,
    trickle: TrickleProducer,
    *,
    size: int,
    variant: str,
    throttle: int | None,
    quiet: float | None,
) -> None:
    source = partition_states(system.bootstrap, topic)[0][0]
    target = next(x for x in system.broker_ids() if x != source)
    is_kafka = label == KAFKA

    def go() -> dict[str, Any]:
        return {
            "size_mib": size,
            "variant": variant,
            "source": source,
            "target": target,
            "quiet_worst_wait_s": quiet,
            **timed_move(
                system,
                topic,
                target,
                trickle,
                throttle_bytes=throttle,
                # TidalMQ's own moves are made with its own command, so 'from the command's
                # launch' includes the start a user waits for ([L1] item 5); its throttled run
                # is Kafka's tool against TidalMQ (the tool's --throttle and JSON work there)
                tidalmq_cli=not is_kafka and throttle is None,
            ),
        }

    rec.measure(label, run, go)
    if throttle is not None and is_kafka:
        # as Kafka's documentation says: --verify after completion removes the throttle
        plan = {
            "version": 1,
            "partitions": [{"topic": topic, "partition": 0, "replicas": [target]}],
        }
        reassign_verify(system.bootstrap, plan)


def section_move(p: Params, workdir: Path, storage: str) -> Recorder:
    rec = Recorder("move")
    throttle = p.throttle_mib_s * MIB
    for kind, label in KINDS:
        with cluster(kind, workdir, storage, brokers=2) as system:
            b = system.bootstrap
            ids = system.broker_ids()
            for size in p.move_sizes_mib:
                topic = name(f"move-{size}m")
                if kind == "kafka":
                    create_topic(b, topic, 1, assignment=[[ids[0]]])
                else:
                    create_topic(b, topic, 1)
                rec.measure(
                    label,
                    f"fill {size} MiB",
                    lambda b=b, topic=topic, size=size: fill_topic(b, topic, size),
                )
                trickle = TrickleProducer(b, topic).start()
                try:
                    time.sleep(2.0)
                    quiet_from = time.time()
                    time.sleep(2.0)
                    quiet = trickle.worst_wait(quiet_from, time.time() - 0.5)
                    variants: list[tuple[str, int | None]] = (
                        [("no throttle", None), (f"throttle {p.throttle_mib_s} MiB/s", throttle)]
                        if kind == "kafka"
                        else [("no throttle", None)] * p.move_repeats
                        + [(f"throttle {p.throttle_mib_s} MiB/s", throttle)]
                    )
                    for i, (variant, thr) in enumerate(variants):
                        numbered = kind == "tidalmq" and thr is None
                        run = f"{size} MiB, {variant}" + (f" #{i + 1}" if numbered else "")
                        one_move(
                            rec,
                            system,
                            label,
                            run,
                            topic,
                            trickle,
                            size=size,
                            variant=variant,
                            throttle=thr,
                            quiet=quiet,
                        )
                        time.sleep(2.0)
                finally:
                    trickle.stop()
                if trickle.errors:
                    rec.note(
                        f"{label}, {size} MiB: {trickle.errors} records of the "
                        "writing producer failed"
                    )
                delete_topic(b, topic)

    def tidal(size: int, key: str, agg: Callable[[list[float]], float]) -> float | None:
        vals = [
            float(m[key])
            for m in rec.measurements
            if m["system"] == TIDALMQ
            and m.get("size_mib") == size
            and m.get("variant") == "no throttle"
            and m.get(key) is not None
        ]
        return agg(vals) if vals else None

    thr_variant = f"throttle {p.throttle_mib_s} MiB/s"
    for size in p.move_sizes_mib:
        k_plain = by(rec, KAFKA, f"{size} MiB, no throttle") or {}
        k_thr = by(rec, KAFKA, f"{size} MiB, {thr_variant}") or {}
        # TidalMQ's own run with --throttle where the tool took it, else its unthrottled figures
        t_thr = by(rec, TIDALMQ, f"{size} MiB, {thr_variant}") or {}
        if t_thr.get("error"):
            t_thr = {}
        target = 100.0 if size >= 1024 else None
        for key, what, tag in (
            ("from_submit_s", "from submission", "from submission"),
            ("from_launch_s", "from the command's launch", "from command launch"),
        ):
            rec.compare(
                f"{size} MiB move, time to completion {what} (Kafka without throttle)",
                "s",
                "time",
                k_plain.get(key),
                tidal(size, key, statistics.median),
                target=target,
                chart="move time (s)",
                short=f"{size} MiB, {tag}",
            )
        rec.compare(
            f"{size} MiB move, time to completion from submission (Kafka throttled {p.throttle_mib_s} MiB/s)",
            "s",
            "time",
            k_thr.get("from_submit_s"),
            t_thr.get("from_submit_s", tidal(size, "from_submit_s", statistics.median)),
            chart="move time (s)",
            short=f"{size} MiB, throttled",
        )
        rec.compare(
            f"{size} MiB move, client-visible unavailability (Kafka without throttle)",
            "s",
            "time",
            k_plain.get("unavailable_s"),
            tidal(size, "unavailable_s", max),
            chart="unavailability (s)",
            short=f"{size} MiB",
        )
        rec.compare(
            f"{size} MiB move, client-visible unavailability (Kafka throttled)",
            "s",
            "time",
            k_thr.get("unavailable_s"),
            t_thr.get("unavailable_s", tidal(size, "unavailable_s", max)),
            chart="unavailability (s)",
            short=f"{size} MiB, throttled",
        )
    for m in rec.measurements:
        if m.get("tool_error"):
            rec.note(
                f"{m['system']}: {m['tool']} failed ({m['tool_error']}); "
                f"no figure for '{m['variant']}'."
            )
    rec.note(
        "Kafka: 2 brokers and a controller, the topic created with replication factor 1 on one "
        "broker, so the move copies the whole log to the other one. TidalMQ: 2 brokers (local "
        f"cluster); its figure is the median of {p.move_repeats} moves back and forth (time) and "
        "the worst of them (unavailability); Kafka moves once per variant. Completion: the first "
        "metadata response naming the target as sole replica and leader, polled with "
        "confluent-kafka every 20 ms and back to back (~1 ms apart) for the first second after "
        "the submission (until 2026-11-28 every 20 ms throughout, which added ~10 ms on average "
        "to TidalMQ's figures; Kafka's moves take longer than that second, so its figures are "
        "timed to 20 ms as before). 'From submission' starts when the tool prints 'Successfully started "
        "partition reassignment' (after the AlterPartitionReassignments call returned); 'from the "
        "command's launch' includes the command's start: for Kafka kafka-reassign-partitions "
        "(a JVM, about 1-3 s here), for TidalMQ `tidalmq reassign --execute`, the console script "
        "a user runs (a Python process). Unavailability: the "
        "longest produce->ack wait of the records a confluent-kafka producer (acks=all, "
        "idempotent, one 100-byte record every 2 ms) produced between the command's launch and "
        "completion. The throttle (--throttle) limits Kafka's replication copy; TidalMQ copies "
        "nothing: its throttled rows are its own run of kafka-reassign-partitions with --throttle "
        "(one move), or its unthrottled figures where the tool's --throttle failed against it."
    )
    return rec


# --------------------------------------------------------------------------------------------
# 4. rebalance onto a new broker


def section_rebalance(p: Params, workdir: Path, storage: str) -> Recorder:
    rec = Recorder("rebalance")
    n = p.rebalance_partitions
    run = f"{n} partitions, {p.rebalance_brokers} -> {p.rebalance_brokers + 1} brokers"
    for kind, label in KINDS:
        with cluster(kind, workdir, storage, brokers=p.rebalance_brokers) as system:
            b = system.bootstrap
            topic = name("wide")
            create_topic(b, topic, n)
            rec.measure(
                label,
                f"fill {n} x {p.rebalance_kib_per_partition} KiB",
                lambda b=b, topic=topic: fill_topic(
                    b, topic, n * p.rebalance_kib_per_partition / 1024
                ),
            )
            if kind == "tidalmq":
                assert isinstance(system, TidalCluster)
                system.cluster.wait_settled(300)
            rec.measure(
                label,
                run,
                lambda system=system, topic=topic, kind=kind: (
                    rebalance_kafka(system, topic, n)
                    if kind == "kafka"
                    else rebalance_tidalmq(system, topic, n)
                ),
            )
    for key, what in (("total_s", "from the broker's start"), ("after_join_s", "after it joined")):
        rec.compare(
            f"new broker serving its share, {what}",
            "s",
            "time",
            val(rec, KAFKA, run, key),
            val(rec, TIDALMQ, run, key),
            chart="rebalance time (s)",
            short=what,
        )
    k = by(rec, KAFKA, run) or {}
    t = by(rec, TIDALMQ, run) or {}
    rec.note(
        f"Kafka: the new broker started (JVM), then kafka-reassign-partitions --generate over all "
        f"{p.rebalance_brokers + 1} brokers and --execute of that plan; --generate proposes a "
        f"fresh round-robin assignment, so it moved {k.get('moved', '?')} partitions, "
        f"{k.get('moved_to_new', '?')} of them onto the new broker (the minimum would be about "
        f"{n // (p.rebalance_brokers + 1)}). TidalMQ: `add-broker` of the local cluster (a "
        f"process start and registration); the controller then moved "
        f"{t.get('moved_to_new', '?')} partitions of the topic onto it. Done: the first metadata "
        "(polled every 50 ms) in which the new broker leads its final share. 'After it joined' "
        "starts for Kafka when the broker logged 'Kafka Server started', for TidalMQ when "
        "add-broker returned (the broker registered; the controller may already be moving "
        "partitions by then), so 'from the broker's start' is the like-for-like figure."
    )
    return rec


def _leads(state: dict[int, tuple[int, tuple[int, ...]]], broker: int) -> int:
    return sum(1 for leader, _ in state.values() if leader == broker)


def rebalance_kafka(system: System, topic: str, n: int) -> dict[str, Any]:
    watch = MetadataWatch(system.bootstrap, topic, interval=0.05).start()
    try:
        started = time.time()
        new = system.add_broker()
        joined = time.time()
        current, proposed = reassign_generate(system.bootstrap, [topic], system.broker_ids())
        generated = time.time()
        run = run_reassign_execute(system.bootstrap, {}, plan=proposed)
        if run.returncode != 0:
            raise RuntimeError(f"kafka-reassign-partitions --execute: {run.error}")
        want = {
            e["partition"]: (e["replicas"][0], tuple(e["replicas"])) for e in proposed["partitions"]
        }
        before = {e["partition"]: tuple(e["replicas"]) for e in current["partitions"]}

        def done(state: dict[int, tuple[int, tuple[int, ...]]]) -> bool:
            return len(state) == n and all(state.get(p) == w for p, w in want.items())

        wait_for(lambda: watch.first_time(done) is not None, 7200, "the plan", interval=0.2)
        finished = watch.first_time(done)
        assert finished is not None
        reassign_verify(system.bootstrap, proposed)  # clears any throttle, as Kafka's docs say
    finally:
        watch.stop()
    return {
        "new_broker": new,
        "total_s": round(finished - started, 2),
        "join_s": round(joined - started, 2),
        "after_join_s": round(finished - joined, 2),
        "generate_s": round(generated - joined, 2),
        "execute_tool_s": round(run.exited - run.launched, 2),
        "moved": sum(1 for p, w in want.items() if before.get(p) != w[1]),
        "moved_to_new": sum(1 for p, w in want.items() if w[1] == (new,) and before.get(p) != w[1]),
        "new_leads": _leads(watch.latest(), new),
    }


def rebalance_tidalmq(system: System, topic: str, n: int) -> dict[str, Any]:
    assert isinstance(system, TidalCluster)
    watch = MetadataWatch(system.bootstrap, topic, interval=0.05).start()
    try:
        started = time.time()
        new = system.add_broker()
        joined = time.time()
        stable_since: list[float] = []

        def settled() -> bool:
            status = system.cluster.status()
            leads = _leads(watch.latest(), new)
            if status["moves_in_flight"] or leads == 0:
                stable_since.clear()
                return False
            if not stable_since or stable_since[0] != leads:
                stable_since[:] = [leads, time.monotonic()]
            return time.monotonic() - stable_since[1] >= 2.0

        wait_for(settled, 1800, "the rebalance", interval=0.1)
        final = _leads(watch.latest(), new)
        finished = watch.first_time(lambda s: _leads(s, new) == final)
        assert finished is not None
        moves = [
            m
            for m in system.cluster.moves()["recent"]
            if m["topic"] == topic and m["started"] >= started - 1
        ]
    finally:
        watch.stop()
    return {
        "new_broker": new,
        "total_s": round(finished - started, 2),
        "join_s": round(joined - started, 2),
        "after_join_s": round(finished - joined, 2),
        "moved": len(moves),
        "moved_to_new": sum(1 for m in moves if m["target"] == new),
        "new_leads": final,
    }


# --------------------------------------------------------------------------------------------
# Environment, results file, main


def load_results() -> dict[str, Any]:
    if RESULTS_JSON.exists():
        data: dict[str, Any] = json.loads(RESULTS_JSON.read_text())
        return data
    return {"sections": {}}


def save_results(data: dict[str, Any]) -> None:
    tmp = RESULTS_JSON.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(RESULTS_JSON)


RUNNERS: dict[str, Callable[[Params, Path, str], Recorder]] = {
    "produce": section_produce,
    "consume": section_consume,
    "move": section_move,
    "rebalance": section_rebalance,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, for validation")
    ap.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections of {', '.join(SECTIONS)}",
    )
    ap.add_argument(
        "--storage",
        choices=["local", "minio"],
        default="local",
        help="TidalMQ's object store: a local directory or MinIO on loopback",
    )
    ap.add_argument("--move-sizes", help="partition sizes to move, MiB (e.g. 100,1024)")
    ap.add_argument("--throttle-mib-s", type=int, help="Kafka's replication throttle")
    ap.add_argument("--cold-mib", type=int, help="size of the cold read")
    ap.add_argument("--tail-mib", type=int, help="size of the tail read")
    ap.add_argument("--produce-records", type=int, help="records per kafka-producer-perf-test run")
    ap.add_argument("--rebalance-brokers", type=int, help="brokers before one is added")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="skip the sections the JSON already holds from a run of the same kind "
        "(quick or full, same storage): rerun the same command after an interruption",
    )
    ap.add_argument("--workdir", help="where the clusters live (default: a temporary directory)")
    ap.add_argument(
        "--render", action="store_true", help="only write the page and charts from the JSON"
    )
    args = ap.parse_args(argv)

    if args.render:
        render(load_results(), RESULTS_MD, CHARTS)
        print(f"wrote {RESULTS_MD.relative_to(REPO)}")
        return 0
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    base = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.move_sizes:
        overrides["move_sizes_mib"] = tuple(int(x) for x in args.move_sizes.split(","))
    for field in ("throttle_mib_s", "cold_mib", "tail_mib", "produce_records", "rebalance_brokers"):
        if getattr(args, field) is not None:
            overrides[field] = getattr(args, field)
    params = dataclasses.replace(base, **overrides)

    # SIGTERM/SIGHUP end the run through the finally blocks that stop every broker.
    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)

    workroot = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="sbs-"))
    workroot.mkdir(parents=True, exist_ok=True)
    command = "bench/side_by_side.py " + " ".join(argv if argv is not None else sys.argv[1:])
    env = environment(args.storage)
    log(
        f"Apache Kafka {env['kafka']} vs TidalMQ {env['tidalmq']}, storage {args.storage}, "
        f"{'quick' if args.quick else 'full'}; sections {', '.join(sections)}; work dir {workroot}"
    )
    failed: list[str] = []
    try:
        for section in sections:
            key = section if args.storage == "local" else f"{section}@{args.storage}"
            mode = "quick" if args.quick else "full"
            if args.resume and load_results()["sections"].get(key, {}).get("mode") == mode:
                log(f"{section}: already in {RESULTS_JSON.name} from a {mode} run; skipped")
                continue
            started = time.time()
            load_before = loadavg()
            try:
                rec = RUNNERS[section](params, workroot, args.storage)
            except Exception as exc:  # keep the other sections' figures; report the failure
                traceback.print_exc()
                log(f"{section}: FAILED: {exc!r}")
                failed.append(section)
                continue
            data = load_results()
            data["sections"][key] = {
                "section": section,
                "storage": args.storage,
                "mode": "quick" if args.quick else "full",
                "command": command,
                "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
                "duration_s": round(time.time() - started),
                "load_before": load_before,
                "load_after": loadavg(),
                "params": dataclasses.asdict(params),
                "env": env,
                "measurements": rec.measurements,
                "comparisons": rec.comparisons,
                "notes": rec.notes,
            }
            save_results(data)
            render(data, RESULTS_MD, CHARTS)
            log(
                f"{section}: done in {time.time() - started:.0f} s; wrote "
                f"{RESULTS_MD.relative_to(REPO)}"
            )
    finally:
        if not args.workdir:
            shutil.rmtree(workroot, ignore_errors=True)
    if failed:
        log(f"failed sections: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
