"""The results page and chart of ``bench/metadata_scale.py`` ([M1], control plane at scale),
written from its JSON results (every part and size kept under "<part>@<partitions>")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

KAFKA_COLOR = "#4d4d4d"
TIDAL_COLOR = "#1f77b4"
CHART_SIZE = 20_000  # the picture: moves completed over time at 20,000 partitions
TARGET_RATIO = 5.0
SCENARIO_SIZE = 50_000

PAGE_HEAD = """# Control plane at scale ([M1]): `bench/metadata_scale.py`

Apache Kafka {kafka} and TidalMQ on the same machine, in the same benchmark: creating many
partitions, moving a share of them onto a new broker, and the issue's acceptance scenario on a
TidalMQ local cluster. Every figure carries the machine's load average (1/5/15 min) before and
after its part: this 2-core machine is shared, and figures taken under load are noisy.

```sh
.venv/bin/python bench/metadata_scale.py --only kafka --sizes 6000,20000,50000
.venv/bin/python bench/metadata_scale.py --only tidalmq --sizes 6000,20000,50000
.venv/bin/python bench/metadata_scale.py --only scenario         # 50,000 partitions, 4 -> 5 -> 4
.venv/bin/python bench/metadata_scale.py --quick                 # small smoke run of all three
.venv/bin/python bench/metadata_scale.py --render                # this page from the JSON
```
"""

METHOD = [
    "**Create**: the partitions go in the fewest topics of at most 9,000 partitions (Kafka "
    "refuses a request making more than 10,000 metadata records: a 10,000-partition topic fails "
    "with 'Unable to perform excessively large batch operation', 9,990 pass; TidalMQ caps a "
    "topic at 10,000; fewer topics favour Kafka: 6,000 partitions in two topics sent together "
    "showed every leader 22 s after the requests here, in one topic 1.8 s), one CreateTopics "
    "request per topic (confluent-kafka AdminClient), all "
    "sent at once, replication factor 1. Timed from sending the requests to the first Metadata "
    "showing every partition with a leader (asked per topic, for the topics not yet complete, "
    "by a second client, so that no poll waits on the creating connection behind a CreateTopics "
    "answer (a connection answers in order), in rounds back to back with at most half the time "
    "spent polling; before 2026-11-28 20:30 UTC on the creating client, in rounds 50 ms apart, "
    "which added 0.05-0.1 s to every creation and the CreateTopics answer's wait to TidalMQ's).",
    "**Move**: Kafka: 3 brokers, then a 4th is started and a quarter of the partitions (every "
    "4th partition of each topic, so each old broker gives up the same number) is moved onto it "
    "with `kafka-reassign-partitions --execute`, in requests of at most 2,500 partitions "
    "submitted back to back (the later ones with `--additional`), then `--verify` until it says "
    "complete. TidalMQ: `tidalmq local up` with 3 brokers, then `add-broker`; the controller "
    "moves the new broker's fair share by itself. Both are timed to the moment every moved "
    "partition is led by the new broker in Metadata **and** a write to each of a sample of them "
    "(at least 500, or all when fewer moved) was acknowledged by it. Kafka's clock starts at "
    "the first `--execute` (its broker's JVM start is reported apart); TidalMQ's at the "
    "`add-broker` request, so it includes the new broker's process start and registration: "
    "the ratio is conservative for TidalMQ.",
    "**Serving**: the Metadata of every topic is polled back to back (at most half the time "
    "spent polling); when a sampled partition first shows its new leader, one record (key "
    "`probe`) is produced to it with acks=all; it counts as serving at its acknowledgement "
    "(produce time plus the client's produce->ack latency). With one replica, only the "
    "partition's leader appends, and the old one has closed it before Metadata names the new "
    "one, so the acknowledgement is the new leader's.",
    "**TidalMQ's control plane**: `tidalmq_controller_brokers_declared_dead_total` from the "
    "controller's HTTP port (found in `<data-dir>/cluster.json`) and each broker's "
    "`tidalmq_broker_heartbeat_seconds` histogram from its HTTP `/metrics`, polled every second; "
    "per phase, the heartbeat p99 is the upper bound of the bucket holding the 99th percentile "
    "of the bucket deltas over all brokers. A heartbeat with no answer within the broker's 2 s "
    "timeout never reaches the histogram: the broker logs 'heartbeat failed', and those lines "
    "are counted as slower than every bucket.",
    "**Partitions are empty** apart from the probe records (and the scenario producer's): the "
    "benchmark measures the control plane. Kafka copies a partition's data on a move, TidalMQ "
    "hands over a partition whose data is already in the shared object store (here a local "
    "directory); with empty partitions Kafka's copy is trivial.",
]


def fmt_s(v: Any) -> str:
    if v is None:
        return "n/a"
    v = float(v)
    return f"{v:.0f} s" if v >= 100 else f"{v:.1f} s" if v >= 10 else f"{v:.2f} s"


def load_text(entry: dict[str, Any]) -> str:
    def one(load: Any) -> str:
        return "/".join(f"{x:.1f}" for x in load) if load else "?"

    text = f"{one(entry.get('load_before'))} -> {one(entry.get('load_after'))}"
    settle = entry.get("load_settle") or {}
    if settle.get("waited_s"):  # the part waited for the previous one's load to settle
        text = f"{text} (after {settle['waited_s']:.0f} s from {one(settle.get('from'))})"
    return text


def phase(entry: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    if entry is None:
        return None
    result: dict[str, Any] | None = entry.get("phases", {}).get(name)
    return result


def cell(entry: dict[str, Any] | None, name: str, count: str = "") -> str:
    """A phase's time, or why there is none."""
    if entry is None:
        return "not run"
    if entry.get("error"):
        return f"error: {entry['error'][:80]}"
    p = phase(entry, name)
    if p is None:
        return "not reached"
    if p.get("ok"):
        extra = f" ({p[count]:,})" if count and p.get(count) is not None else ""
        return f"{fmt_s(p['seconds'])}{extra}"
    if p.get("skipped"):
        return f"not run: {p['skipped']}"
    reached = ""
    if name == "create":
        reached = f"; {p.get('led', 0):,} of {p.get('partitions', 0):,} led"
    elif "fair_share" in p:
        reached = (
            f"; the new broker led {p.get('new_leads', 0):,} of its fair share "
            f"{p['fair_share']:,}, {p.get('moves_in_flight')} moves in flight"
        )
    elif p.get("to_move") is not None:
        reached = f"; {p.get('moved', 0):,} of {p.get('to_move', 0):,} moved"
    return f"**{p.get('failure', 'failed')}**{reached}"


def ratio(kafka: dict[str, Any] | None, tidal: dict[str, Any] | None) -> float | None:
    if not kafka or not tidal or not kafka.get("ok") or not tidal.get("ok"):
        return None
    if not tidal.get("seconds"):
        return None
    return float(kafka["seconds"]) / float(tidal["seconds"])


def ratio_text(r: float | None, kafka: dict[str, Any] | None, tidal: dict[str, Any] | None) -> str:
    if r is not None:
        return f"{r:.1f}x"
    if kafka and kafka.get("ok") and tidal is not None and not tidal.get("ok"):
        return "n/a (TidalMQ did not finish)"
    return "n/a"


def side_by_side(runs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the table, the per-run details)."""
    sizes = sorted(
        {int(e["partitions"]) for e in runs.values() if e["part"] in ("kafka", "tidalmq")}
    )
    table = [
        "| partitions | Kafka: create | TidalMQ: create | TidalMQ faster | Kafka: move a "
        "quarter (moved) | TidalMQ: add-broker, fair share (moved) | TidalMQ faster | "
        f"target >= {TARGET_RATIO:g}x | load (1/5/15) Kafka; TidalMQ |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    details: list[str] = []
    for n in sizes:
        k, t = runs.get(f"kafka@{n}"), runs.get(f"tidalmq@{n}")
        rc = ratio(phase(k, "create"), phase(t, "create"))
        rm = ratio(phase(k, "move"), phase(t, "move"))
        tm = phase(t, "move")
        if rc is not None and rm is not None:
            verdict = "met" if min(rc, rm) >= TARGET_RATIO else "**not met**"
        elif (t is not None and t.get("error")) or (tm is not None and not tm.get("ok")):
            verdict = "**not met**" if k is not None else "**not met** (TidalMQ did not finish)"
        else:
            verdict = "n/a (one system not run at this size)"
        loads = f"{load_text(k) if k else '-'}; {load_text(t) if t else '-'}"
        table.append(
            f"| {n:,} | {cell(k, 'create')} | {cell(t, 'create')} | "
            f"{ratio_text(rc, phase(k, 'create'), phase(t, 'create'))} | {cell(k, 'move', 'moved')} | "
            f"{cell(t, 'move', 'moved')} | {ratio_text(rm, phase(k, 'move'), tm)} | {verdict} | "
            f"{loads} |"
        )
        for key, entry in ((f"kafka@{n}", k), (f"tidalmq@{n}", t)):
            if entry is not None:
                details += run_details(key, entry)
    return table, details


def run_details(key: str, e: dict[str, Any]) -> list[str]:
    system = "Apache Kafka" if e["part"] == "kafka" else "TidalMQ"
    label = f", {e['label']}" if e.get("label") else ""
    out = [
        "",
        f"**{system}, {int(e['partitions']):,} partitions** ({e.get('brokers', '?')} brokers; "
        f"{e['mode']} run{label}; {e['started']}, commit {commit(e)}, {e.get('duration_s', '?')} s; "
        f"load {load_text(e)}):",
        "",
    ]
    if e.get("error"):
        out.append(f"- the run failed: {e['error']}")
    c = phase(e, "create")
    if c is not None:
        out.append(f"- create: {create_text(c)}")
    m = phase(e, "move")
    if m is not None and e["part"] == "kafka":
        out.append(f"- move: {kafka_move_text(m)}")
    elif m is not None:
        out.append(f"- add-broker: {tidal_move_text(m)}")
    return out


def commit(e: dict[str, Any]) -> str:
    tidalmq = str(e.get("env", {}).get("tidalmq", ""))
    inside = tidalmq[tidalmq.find("(") + 1 : tidalmq.find(";")] if "(" in tidalmq else "?"
    return f"`{inside}`"


def metrics_text(m: dict[str, Any] | None) -> str:
    if not m:
        return ""
    if m.get("heartbeat_p99_beyond_buckets"):
        p99 = "beyond the 5 s bucket or unanswered"
    elif m.get("heartbeat_p99_le_s") is None:
        p99 = "n/a"
    else:
        p99 = f"<= {m['heartbeat_p99_le_s'] * 1000:g} ms"
    return (
        f"brokers declared dead: {m.get('declared_dead')}; heartbeat answer p99 {p99} "
        f"({m.get('heartbeats')} heartbeats, {m.get('heartbeats_over_100ms')} over 100 ms, "
        f"{m.get('heartbeats_failed')} unanswered)"
    )


def create_text(c: dict[str, Any]) -> str:
    head = (
        f"{fmt_s(c['seconds'])} to every partition led"
        if c.get("ok")
        else f"**{c.get('failure')}**: {c.get('led', 0):,} of {c['partitions']:,} led"
    )
    text = (
        f"{head} ({c['topics']} topic{'s' if c['topics'] != 1 else ''} of up to {c['per_topic']:,}; the CreateTopics "
        f"answers came after {fmt_s(c.get('responses_s'))}, {c.get('responses')} of "
        f"{c['topics']})"
    )
    if c.get("errors"):
        text += f"; errors: {'; '.join(c['errors'])}"
    if c.get("metrics"):
        text += f"; {metrics_text(c['metrics'])}"
    return text


def served_text(m: dict[str, Any]) -> str:
    retried, left = m.get("probe_failures"), m.get("left_again")
    return (
        f"the moved partitions reached their new leader in Metadata by "
        f"{fmt_s(m.get('metadata_s'))}; {m.get('served', 0)} of {m.get('sample', 0)} sampled "
        f"ones served a write by {fmt_s(m.get('served_s'))}"
        + (f" ({retried} probe records sent again)" if retried else "")
        + (f"; {left} times a partition left its new leader again (failover)" if left else "")
    )


def kafka_move_text(m: dict[str, Any]) -> str:
    reqs = m.get("requests", [])
    tools = ", ".join(fmt_s(r["tool_s"]) for r in reqs)
    head = (
        f"{m['moved']:,} partitions in {fmt_s(m['seconds'])} from the first `--execute` "
        f"({fmt_s(m.get('from_broker_start_s'))} from the 4th broker's start)"
        if m.get("ok")
        else f"**{m.get('failure')}**: {m.get('moved', 0):,} of {m.get('to_move', 0):,} moved"
    )
    return (
        f"{head}; broker {m.get('new_broker')} started and in Metadata after "
        f"{fmt_s(m.get('broker_start_s'))}; "
        f"{len(reqs)} requests (tool runs {tools}); {served_text(m)}; `--verify` said complete "
        f"after {fmt_s(m.get('verify_complete_s'))}"
    )


def tidal_move_text(m: dict[str, Any]) -> str:
    if m.get("skipped"):
        return f"not run: {m['skipped']}"
    target = (
        f"broker {m['new_broker']} leads {m.get('new_leads', 0):,} (fair share "
        f"{m.get('fair_share', 0):,} of every partition)"
        if "new_broker" in m
        else f"broker {m.get('removed_broker')}'s {m.get('broker_share', 0):,} partitions"
    )
    head = (
        f"{m['moved']:,} partitions of the benchmark's topics serving in {fmt_s(m['seconds'])} "
        "from the request"
        if m.get("ok")
        else f"**{m.get('failure')}**: {m.get('moved', 0):,} of {m.get('to_move', 0):,} moved"
        if "fair_share" not in m
        else f"**{m.get('failure')}**"
    )
    call = (
        f"the request failed: {m['call_error']}"
        if m.get("call_error")
        else f"the call returned after {fmt_s(m.get('call_s'))}"
    )
    moved_p = (
        f"; {m['producer_partitions_moved']} of the producer's partitions moved"
        if "producer_partitions_moved" in m
        else ""
    )
    return (
        f"{head}; {target}; {call}; {served_text(m)}; moves in flight at the end "
        f"{m.get('moves_in_flight')}; {metrics_text(m.get('metrics'))}{moved_p}"
    )


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def scenario(runs: dict[str, Any]) -> list[str]:
    entries = sorted(
        (e for e in runs.values() if e["part"] == "scenario"), key=lambda e: int(e["partitions"])
    )
    if not entries:
        return ["Not run yet (`--only scenario`)."]
    out: list[str] = []
    for e in entries:
        n = int(e["partitions"])
        label = f", {e['label']}" if e.get("label") else ""
        out += [
            f"### {n:,} partitions, 4 -> 5 -> 4 brokers ({e['mode']} run{label})",
            "",
            f"{e['started']}, commit {commit(e)}, {e.get('duration_s', '?')} s; load "
            f"{load_text(e)}."
            + (
                ""
                if n == SCENARIO_SIZE
                else f" **Not the issue's size** ({SCENARIO_SIZE:,}): the verdicts below only "
                "check the benchmark; the targets are for 50,000 partitions."
            ),
            "",
        ]
        if e.get("error"):
            out += [f"The run failed: {e['error']}", ""]
        create, add, remove = phase(e, "create"), phase(e, "add"), phase(e, "remove")
        prod = phase(e, "producer")
        rows = [("create", create), ("add", add), ("remove", remove)]
        metrics = [(name, p.get("metrics")) for name, p in rows if p and p.get("metrics")]
        dead = [m.get("declared_dead") for _, m in metrics]
        # a phase too short for any heartbeat has no p99: it neither meets nor misses the target
        p99s = [m.get("heartbeat_p99_le_s") for _, m in metrics if m.get("heartbeats", 1)]
        beyond = any(m.get("heartbeat_p99_beyond_buckets") for _, m in metrics)

        def timed(p: dict[str, Any] | None, limit: float, sample: bool) -> bool | None:
            if p is None:
                return None
            ok = bool(p.get("ok")) and float(p.get("seconds") or math.inf) <= limit
            if sample and ok:
                ok = p.get("sample", 0) >= min(500, p.get("to_move", 0))
            return ok

        share = f"{add['to_move']:,}" if add and "to_move" in add else "?"
        rshare = f"{remove['broker_share']:,}" if remove and "broker_share" in remove else "?"
        table = [
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| {n:,} partitions over 4 brokers created in <= 10 s | {cell(e, 'create')} | "
            f"{verdict(timed(create, 10, False))} |",
            f"| `add-broker`: the 5th broker's fair share ({share} of the benchmark's "
            f"partitions) serving in <= 30 s, on a sample of >= 500 | {cell(e, 'add')}"
            f"{sample_text(add)} | {verdict(timed(add, 30, True))} |",
            f"| `remove-broker {remove.get('removed_broker', '?') if remove else '?'}`: its "
            f"{rshare} partitions serving elsewhere in <= 30 s, on a sample of >= 500 | "
            f"{cell(e, 'remove')}{sample_text(remove)} | {verdict(timed(remove, 30, True))} |",
            f"| no broker declared dead (create / add / remove) | "
            f"{' / '.join(str(d) for d in dead) or 'n/a'} | "
            f"{verdict(None if not dead or None in dead else all(d == 0 for d in dead))} |",
            f"| heartbeat answer p99 <= 100 ms (create / add / remove) | "
            f"{' / '.join(p99_text(m) for _, m in metrics) or 'n/a'} | "
            f"{verdict(None if not p99s and not beyond else not beyond and all(p is not None and p <= 0.1 for p in p99s))} |",
            f"| idempotent producer on {prod.get('partitions', '?') if prod else '?'} partitions "
            f"throughout: every acknowledged record read back exactly once, in order | "
            f"{producer_text(prod)} | "
            f"{verdict(None if prod is None else bool(prod.get('readback_ok')) and not prod.get('errors'))} |",
            "",
        ]
        out += table
        for name, p in rows:
            if p is None:
                continue
            text = create_text(p) if name == "create" else tidal_move_text(p)
            out.append(f"- {name}: {text}")
        out.append("")
    return out


def sample_text(p: dict[str, Any] | None) -> str:
    if not p or p.get("sample") is None:
        return ""
    return f"; sample {p.get('served', 0)} of {p['sample']} served"


def p99_text(m: dict[str, Any]) -> str:
    if m.get("heartbeat_p99_beyond_buckets"):
        return "> 5 s or unanswered"
    v = m.get("heartbeat_p99_le_s")
    return "n/a" if v is None else f"<= {v * 1000:g} ms"


def producer_text(p: dict[str, Any] | None) -> str:
    if p is None:
        return "not run"
    text = (
        f"{p.get('acknowledged', 0):,} acknowledged of {p.get('sent', 0):,} sent, "
        f"{p.get('errors', 0)} failed, longest wait {fmt_s(p.get('worst_wait_s'))}; read-back "
    )
    text += (
        f"OK ({p.get('read', 0):,} records)"
        if p.get("readback_ok")
        else f"**failed**: {p.get('readback_failure', '?')[:200]}"
    )
    if p.get("stop_failure"):
        text += f"; {p['stop_failure'][:100]}"
    return text


CONTROLLER_METHOD = [
    "**What runs**: `bench/controller_scale.py`, each size in a process of its own, one event "
    "loop: a real `Controller` (default settings: 1 s heartbeats, auto_rebalance on; "
    "max_moves_per_broker 1,000,000 so every move of the join starts at once, see the waves "
    "run below for the default 1,000), in a process set up as one hosting a controller is "
    "(`tidalmq local up`, the operator: the runtime tuning of tidalmq_broker.tuning and the "
    "garbage collection policy of tidalmq_controller/gc_policy.py; runs before 2026-11-28 16:30 "
    "UTC had neither: CPython's default collector), on an `ObjectStoreMetadataLog` over a "
    "`LocalDirObjectStore` in a temporary directory on the local disk (fsync'd writes), and "
    "100 simulated brokers. A simulated broker keeps only which partitions it leads and at "
    "which epoch (no image): it answers each push with the version it holds, scans the pushed "
    "records (a topic record: it opens its partitions; a partition record whose leader becomes "
    "none while it was its own: it reports it closed at its epoch; one whose leader becomes "
    "itself: opened at the new epoch) through `Controller.partitions_reported`, and heartbeats "
    "what opened and closed since its last heartbeat from a thread of its own (as a real "
    "controller answers heartbeats on its liveness thread).",
    "**Phases**: N partitions created in topics of at most 10,000 (one CreateTopics call per "
    "topic, awaited until every partition of the topic is reported open, as the Kafka API "
    "calls it); a 101st broker joins and the controller moves its fair share (about N/101 "
    "moves), timed until no move is in flight, every one is Done, and everything the moves "
    "caused is committed and held by every broker.",
    "**Bytes written**: the journal's counters (`tidalmq_controller_metadata_bytes_total`, "
    "`..._snapshot_bytes_total`). A snapshot is written once the batches since the last one "
    "reach max(8 MiB, its size), so a record byte costs snapshot size / max(8 MiB, snapshot "
    "size) bytes of snapshot and that share of a snapshot's CPU; the phases here are too short "
    "to trigger one, so that share is computed from the measured snapshot and the measured CPU "
    "of rolling one (the previous snapshot decoded, the batches since applied, encoded, stored).",
    "**Controller CPU**: `time.process_time()` over the phase (every thread: the event loop, "
    "the heartbeat thread's calls into the controller, the journal's snapshot thread, the "
    "store's threads, the rebalance's worker thread) minus the simulated brokers' own CPU: "
    "each push handler measures its scan with `time.thread_time()` (its calls into the "
    "controller are outside), the heartbeat thread counts its rounds minus the time inside "
    "`Controller.beat`. Garbage collection counts where it runs; its CPU is given apart, and "
    "the longest full collection in wall time: it holds the GIL, so the event loop and the "
    "liveness thread stall that long (on a loaded machine longer than its CPU). A move's "
    "CPU is split into planning (the join's rebalance: the assignment copied on the loop, "
    "`balance_counts` in a worker thread, the moves queued: O(partitions) once per join) "
    "and running the moves.",
    "**Memory**: after creation, the objects reachable from the controller (its image, the "
    "indexes of leadership, the membership table with every broker's open partitions, the "
    "journal's kept batches and snapshot, the rest), each once, sized with `sys.getsizeof`, "
    "never entering the event loop, tasks, threads, modules, classes, functions or the "
    "simulated brokers; divided by the partition count. The process's RSS growth over "
    "creation (which includes the simulated brokers' structures) is given beside it.",
    "**A new controller**: in a fresh process, `Controller.start` on the log the run left "
    "(the snapshot written after creation and the move batches after it): load, decode, "
    "index, claim the log with its epoch record.",
]


def _kib(v: float) -> str:
    return f"{v / 1024:.1f} KiB" if v >= 1024 else f"{v:.0f} B"


def _mib(v: float) -> str:
    return f"{v / (1 << 20):.1f} MiB"


def _controller_row(e: dict[str, Any]) -> str:
    n = int(e["partitions"])
    f = e.get("figures", {})
    ph = e.get("phases", {})
    topics = ph.get("create", {}).get("topics")
    head = f"| {n:,} ({topics} topic{'s' if topics != 1 else ''})" if topics else f"| {n:,}"
    c, mv, mem = f.get("create"), f.get("move"), ph.get("memory")
    if e.get("error"):
        return f"{head} | error: {e['error'][:80]} | | | | | {load_text(e)} |"
    create = (
        f"{_kib(c['bytes_per_topic'])} + {_kib(c.get('snapshot_bytes_per_topic', 0))} | "
        f"{c['cpu_ms_per_topic']:.0f} ms + {c.get('snapshot_cpu_ms_per_topic', 0):.1f} ms "
        f"({c['cpu_us_per_partition']:.1f} us per partition)"
        if c
        else "n/a | n/a"
    )
    move = (
        f"{mv['bytes']:.0f} B + {mv.get('snapshot_bytes', 0):.0f} B ({mv['records']:.1f} "
        f"records) | {mv['cpu_ms']:.2f} ms ({mv['plan_cpu_ms']:.2f} planning + "
        f"{mv['run_cpu_ms']:.2f} running) + {mv.get('snapshot_cpu_ms', 0):.3f} ms"
        if mv
        else f"{_controller_failure(e, 'move')} | n/a"
    )
    memory = f"{mem['per_partition']:.0f} B" if mem else "n/a"
    return f"{head} | {create} | {move} | {memory} | {load_text(e)} |"


def _controller_failure(e: dict[str, Any], name: str) -> str:
    p = e.get("phases", {}).get(name)
    if p is not None and p.get("failure"):
        return f"**{p['failure']}**"
    if e.get("failure"):
        return f"**{e['failure']}**"
    return "not reached"


def _once_row(e: dict[str, Any]) -> str:
    n = int(e["partitions"])
    ph = e.get("phases", {})
    snap, rolled, restart, move = (
        ph.get("snapshot"),
        ph.get("rolled"),
        ph.get("restart"),
        ph.get("move"),
    )
    snapshot = f"{_mib(snap['size'])} ({snap['per_partition']:.1f} B)" if snap else "n/a"
    writes = "n/a"
    if snap:
        writes = f"{fmt_s(snap['seconds'])}"
        if rolled and rolled.get("seconds") is not None:
            writes += f" / {fmt_s(rolled['seconds'])} (CPU {fmt_s(rolled['controller_cpu_s'])})"
    start = "n/a"
    if restart and restart.get("seconds") is not None:
        stored = restart.get("stored", {})
        start = (
            f"{fmt_s(restart['seconds'])} (CPU {fmt_s(restart['process_cpu_s'])}; "
            f"{_mib(stored.get('snapshot_bytes', 0))} + {stored.get('batches', 0)} batches)"
        )
    elif restart and restart.get("failure"):
        start = f"**{restart['failure']}**"
    plan = "n/a"
    if move and move.get("plan"):
        p = move["plan"]
        plan = f"{fmt_s(p['seconds'])} (CPU {fmt_s(p['controller_cpu_s'])})"
    pauses = [
        (p.get("gc_longest_pause_s") or 0.0, p.get("gc_longest_pause_cpu_s"), name)
        for name, p in ph.items()
        if isinstance(p, dict) and "gc_longest_pause_s" in p
    ]
    pause = max(pauses, key=lambda t: t[0], default=None)
    gc_text = "none"
    if pause and pause[0]:
        cpu = f", CPU {pause[1] * 1000:.0f} ms" if pause[1] is not None else ""
        gc_text = f"{pause[0] * 1000:.0f} ms ({pause[2]}{cpu})"
    rss = _mib(e["peak_rss"]) if e.get("peak_rss") else "n/a"
    return f"| {n:,} | {snapshot} | {writes} | {start} | {plan} | {gc_text} | {rss} |"


def _growth(entries: list[dict[str, Any]]) -> list[str]:
    """How the per-operation figures changed from the smallest to the largest size."""
    done = [e for e in entries if e.get("figures", {}).get("move")]
    if len(done) < 2:
        return []
    a, b = done[0], done[-1]
    fa, fb = a["figures"], b["figures"]

    def x(key: str, sub: str) -> str:
        va, vb = fa[key].get(sub), fb[key].get(sub)
        return f"x{vb / va:.2f}" if va and vb is not None else "n/a"

    return [
        f"From {int(a['partitions']):,} to {int(b['partitions']):,} partitions "
        f"(x{int(b['partitions']) / int(a['partitions']):.0f}): bytes per topic created "
        f"{x('create', 'bytes_per_topic')}, controller CPU per topic created "
        f"{x('create', 'cpu_ms_per_topic')}; bytes per move {x('move', 'bytes')}, controller "
        f"CPU per move {x('move', 'cpu_ms')} (planning {x('move', 'plan_cpu_ms')}, running "
        f"{x('move', 'run_cpu_ms')}); memory per partition "
        + (
            f"x{b['phases']['memory']['per_partition'] / a['phases']['memory']['per_partition']:.2f}"
            if a.get("phases", {}).get("memory") and b.get("phases", {}).get("memory")
            else "n/a"
        )
        + ".",
        "",
    ]


def _controller_details(e: dict[str, Any]) -> list[str]:
    n = int(e["partitions"])
    ph = e.get("phases", {})
    label = f", {e['label']}" if e.get("label") else ""
    out = [
        f"**{n:,} partitions** ({e.get('brokers', '?')}; {e.get('mode', '?')} run{label}; "
        f"{e.get('started', '?')}, commit {commit(e)}, {e.get('duration_s', '?')} s; load "
        f"{load_text(e)}; idle controller CPU "
        f"{e.get('idle_cpu_per_s', 0) * 100:.1f}% of a core):",
        "",
    ]
    for key in ("error", "failure"):
        if e.get(key):
            out.append(f"- the run stopped: {e[key]}")
    c = ph.get("create")
    if c:
        out.append(
            f"- create: {c['partitions_created']:,} partitions in {c['topics']} "
            f"topic{'s' if c['topics'] != 1 else ''} in "
            f"{fmt_s(c['seconds'])} (slowest topic {fmt_s(c['slowest_topic_s'])}); "
            f"{c['batches']} batches, {_kib(c['batch_bytes'])}; controller CPU "
            f"{fmt_s(c['controller_cpu_s'])} (GC {fmt_s(c['gc_s'])}, {c['gc_full']} full "
            f"collections, the longest {c['gc_longest_pause_s'] * 1000:.0f} ms), the simulated "
            f"brokers {fmt_s(c['sim_cpu_s'])}; load {'/'.join(f'{x:.1f}' for x in c['load_before'])}"
            + (f"; **{c['failure']}**" if c.get("failure") else "")
        )
    mem = ph.get("memory")
    if mem:
        parts = ", ".join(
            f"{name} {v['per_partition']:.0f} B" for name, v in mem["by_part"].items()
        )
        out.append(
            f"- controller memory: {mem['per_partition']:.0f} B per partition "
            f"({_mib(mem['bytes'])}: {parts}); the process's RSS grew "
            f"{_mib(mem['rss_growth'])} over creation, of which the simulated brokers' "
            f"structures are {_mib(mem['sim_bytes'])}"
        )
    snap = ph.get("snapshot")
    if snap:
        out.append(
            f"- first snapshot: {_mib(snap['size'])} ({snap['per_partition']:.1f} B per "
            f"partition) in {fmt_s(snap['seconds'])}"
        )
    m = ph.get("move")
    if m:
        plan = m.get("plan", {})
        out.append(
            f"- move: {m['done']:,} of {m['moves']:,} moves done in {fmt_s(m['seconds'])} "
            f"(the join's rebalance planned and queued in {fmt_s(plan.get('seconds'))}); the "
            f"new broker leads {m['new_broker_leads']:,} (fair share {m['fair_share']:,}); "
            f"{m['batches']} batches, {m['records']:,} records, {_kib(m['batch_bytes'])}; "
            f"controller CPU {fmt_s(m['controller_cpu_s'])} (GC {fmt_s(m['gc_s'])}, the longest "
            f"full collection {m['gc_longest_pause_s'] * 1000:.0f} ms), the "
            f"simulated brokers {fmt_s(m['sim_cpu_s'])}; brokers fenced {m['fenced']}, "
            f"declared dead {m['dead']}" + (f"; **{m['failure']}**" if m.get("failure") else "")
        )
    w = e.get("waves")
    if w:
        wm, wf = w.get("move") or {}, w.get("figures", {}).get("move")
        if wf:
            out.append(
                f"- the same moves in waves (max_moves_per_broker {w['max_moves_per_broker']:,}, "
                f"the default): done in {fmt_s(wm.get('seconds'))} in {wm.get('batches')} "
                f"batches; per move {wf['bytes']:.0f} B ({wf['records']:.1f} records), "
                f"controller CPU {wf['cpu_ms']:.2f} ms ({wf['plan_cpu_ms']:.2f} planning + "
                f"{wf['run_cpu_ms']:.2f} running)"
            )
        else:
            why = w.get("failure") or w.get("error") or (wm or {}).get("failure") or "no figures"
            out.append(f"- the same moves in waves: **{why}**")
    r = ph.get("restart")
    if r and r.get("seconds") is not None:
        out.append(
            f"- a new controller (fresh process) started on the log in {fmt_s(r['seconds'])} "
            f"(CPU {fmt_s(r['process_cpu_s'])}, GC {fmt_s(r['gc_s'])}); then rolled the next "
            f"snapshot in {fmt_s(ph.get('rolled', {}).get('seconds'))} (longest GC pause "
            f"{ph.get('rolled', {}).get('gc_longest_pause_s', 0) * 1000:.0f} ms)"
        )
    out.append("")
    return out


def controller_alone(runs: dict[str, Any]) -> list[str]:
    """Section 3: the controller alone with 100 simulated brokers (bench/controller_scale.py,
    entries "controller@<partitions>")."""
    entries = sorted(
        (e for e in runs.values() if e["part"] == "controller"), key=lambda e: int(e["partitions"])
    )
    if not entries:
        return [
            "Not run yet (`bench/metadata_scale.py --only controller`, sizes "
            "`--controller-sizes`, 10,000, 100,000 and 1,000,000 by default)."
        ]
    out = [
        "```sh",
        ".venv/bin/python bench/metadata_scale.py --only controller   # 10k, 100k, 1M partitions",
        ".venv/bin/python bench/controller_scale.py --partitions 100000 --profile  # one size",
        "```",
        "",
        "Per operation: these should not grow with the partition count. Bytes written are "
        "batches + the snapshot share amortized; controller CPU is planning the join's rebalance "
        "+ running the moves, then + the snapshot share.",
        "",
        "| partitions | per topic created: bytes written | per topic created: controller CPU "
        "| per move: bytes written | per move: controller CPU | controller memory per partition "
        "| load (1/5/15) |",
        "|---:|---:|---:|---:|---:|---:|---|",
        *[_controller_row(e) for e in entries],
        "",
        *_growth(entries),
        "What a cluster of that size costs as a whole (these grow with it):",
        "",
        "| partitions | snapshot (per partition) | writing the first snapshot / a rolled one "
        "| a new controller starts on the log | planning the join's rebalance | longest GC "
        "pause (phase) | process peak RSS |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *[_once_row(e) for e in entries],
        "",
    ]
    for e in entries:
        out += _controller_details(e)
    out += ["How it is measured:", "", *[f"- {m}" for m in CONTROLLER_METHOD]]
    return out


def chart(runs: dict[str, Any], n: int, path: Path) -> bool:
    """Moves completed over time at `n` partitions, both systems; False if nothing to draw or
    matplotlib is missing."""
    series = []
    for part, label, color in (
        ("kafka", "Apache Kafka", KAFKA_COLOR),
        ("tidalmq", "TidalMQ", TIDAL_COLOR),
    ):
        m = phase(runs.get(f"{part}@{n}"), "move")
        if m and m.get("series"):
            series.append((label, color, m))
    if not series:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for label, color, m in series:
        t = [p[0] for p in m["series"]]
        moved = [p[1] for p in m["series"]]
        state = (
            f"all serving at {fmt_s(m['seconds'])} (dotted)" if m.get("ok") else "did not finish"
        )
        ax.step(t, moved, where="post", color=color, label=f"{label}: {state}")
        if m.get("ok"):
            ax.axvline(float(m["seconds"]), color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since the move request (Kafka: first --execute; TidalMQ: add-broker)")
    ax.set_ylabel("partitions led by the new broker (Metadata)")
    ax.set_title(f"Moves completed over time, {n:,} partitions, 3 -> 4 brokers")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def render(data: dict[str, Any], md_path: Path, charts_dir: Path) -> list[str]:
    """Writes the page (and charts); returns its summary lines (printed by the benchmark)."""
    runs: dict[str, Any] = data.get("runs", {})
    kafka_version = next(
        (e["env"].get("kafka") for e in runs.values() if e["part"] == "kafka"), "4.3.1"
    )
    table, details = side_by_side(runs)
    sizes = sorted({int(e["partitions"]) for e in runs.values() if e["part"] != "scenario"})
    drawn = [n for n in sizes if chart(runs, n, charts_dir / f"metadata-moves-{n}.png")]
    rel = (
        charts_dir.relative_to(md_path.parent)
        if charts_dir.is_relative_to(md_path.parent)
        else charts_dir
    )
    if CHART_SIZE in drawn:
        picture = [
            f"![moves over time at {CHART_SIZE:,} partitions]({rel}/metadata-moves-{CHART_SIZE}.png)"
        ]
    else:
        picture = [
            f"*No run at {CHART_SIZE:,} partitions yet*: the picture of moves completed over "
            f"time at {CHART_SIZE:,} partitions, both systems, appears here once both parts "
            "ran at that size."
        ]
        picture += [
            f"Meanwhile, at {n:,} partitions: ![moves over time at {n:,}]({rel}/metadata-moves-{n}.png)"
            for n in drawn
        ]
    latest = max(runs.values(), key=lambda e: str(e.get("started")), default=None)
    machine = []
    if latest is not None:
        env = latest.get("env", {})
        kafka_runs = [e for e in runs.values() if e["part"] == "kafka"]
        if kafka_runs:  # runs of TidalMQ alone do not look Java up
            env = {**env, "java": max(kafka_runs, key=lambda e: str(e["started"]))["env"]["java"]}
        machine = [
            f"Machine (latest run): {env.get('cores')} cores ({env.get('cpu')}), "
            f"{env.get('ram_gib')} GiB, Linux {env.get('kernel')}; Python {env.get('python')}, "
            f"{env.get('java')}, confluent-kafka {env.get('confluent_kafka')}; TidalMQ's object "
            "store: a local directory. Each run below names its commit and load.",
            "",
        ]
    summary = [
        "## 1. Side by side with Apache Kafka (3 brokers, then a 4th)",
        "",
        *table,
    ]
    scen = scenario(runs)
    lines = [
        PAGE_HEAD.format(kafka=kafka_version),
        *machine,
        *summary,
        *details,
        "",
        "### Moves completed over time",
        "",
        *picture,
        "",
        "## 2. Acceptance scenario: TidalMQ local cluster, 4 -> 5 -> 4 brokers",
        "",
        *scen,
        *(
            ["### Notes from the runs", "", *[f"- {n}" for n in data["notes"]], ""]
            if data.get("notes")
            else []
        ),
        "## 3. The controller alone with simulated brokers (10k, 100k and 1M partitions)",
        "",
        *controller_alone(runs),
        "",
        "## How it is measured",
        "",
        *[f"- {m}" for m in METHOD],
        "",
    ]
    md_path.write_text("\n".join(lines))
    return [*summary, "", "## 2. Acceptance scenario", "", *scen]
