"""The results page and charts of ``bench/side_by_side.py``, written from its JSON results."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

ORDER = ("produce", "consume", "move", "rebalance")
TITLES = {
    "produce": "1. Produce: 1 KiB records, acks=all, one broker",
    "consume": "2. Consume: from the tail and cold",
    "move": "3. Moving one partition to another broker",
    "rebalance": "4. Adding a broker to a 300-partition cluster",
}
KAFKA_COLOR = "#4d4d4d"
TIDAL_COLOR = "#1f77b4"

UNEQUAL = [
    "**Implementation language and process model.** Kafka is a JVM broker with many I/O and "
    "request-handler threads; a TidalMQ broker is one Python (asyncio) process. On this 2-core "
    "machine both share the cores with the client processes (the perf tools are JVMs too), so "
    "every figure includes client overhead.",
    "**Durability of an acknowledgement.** With replication factor 1 Kafka acknowledges acks=all "
    "once the leader has appended the batch to its page cache (it does not fsync per request). "
    "TidalMQ acknowledges after the batch's WAL object is durable in the object store: with "
    "local-directory storage the file is fsynced and renamed (and the directory fsynced) before "
    "the ack. TidalMQ does strictly more work per acknowledged produce here.",
    "**Replication.** Kafka runs with replication factor 1 so a move must copy data; in "
    "production Kafka would run with 3 replicas and pay inter-broker replication on every "
    "produce, which these produce figures do not include. TidalMQ has one replica by design and "
    "leaves durability to the object store.",
    "**The object store is local.** By default TidalMQ's object store is a directory on the "
    "same disk (`file://`): no network round trip, no request pricing. Real S3 adds tens of "
    "milliseconds per PUT/GET; `--storage minio` runs MinIO on loopback, which adds the HTTP "
    "path but not the network.",
    "**Page cache.** Kafka reads through the page cache; after producing, its log is usually "
    "all there. The cold reads evict the benchmark's own data files (Kafka's segments, "
    "TidalMQ's objects) with posix_fadvise(DONTNEED) after a broker restart, for both systems; "
    "the 'restart (cache kept)' row shows what a plain restart gives. The page shows how much "
    "was resident.",
    "**Moves.** A Kafka reassignment with replication factor 1 copies the whole partition; the "
    "throttle used is a typical production setting, not a limit of the machine. A TidalMQ move "
    "hands over a partition whose data is already in the shared object store. Both are timed "
    "with the same tool and the same metadata polling.",
    "**Rebalancing.** Kafka has no automatic rebalancing: the operator generates and executes a "
    "plan (here with kafka-reassign-partitions --generate, which does not minimise moves). "
    "TidalMQ's controller moves a minimal set of partitions by itself.",
    "**A loaded machine.** The load average before and after each run is recorded: figures "
    "taken while other work ran on the machine are noisy, and Kafka and TidalMQ did not run at "
    "the same moment (each system runs alone, Kafka first).",
]


def fmt(v: Any, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, (int, float)):
        av = abs(v)
        text = (
            f"{v:.0f}"
            if av >= 100
            else f"{v:.1f}"
            if av >= 10
            else f"{v:.2f}"
            if av >= 0.1
            else f"{v:.3f}"
        )
        return f"{text} {unit}".strip()
    return str(v)


def advantage_text(c: dict[str, Any]) -> str:
    a = c.get("advantage")
    if a is None:
        return "n/a"
    if c["kind"] == "throughput":
        return f"{a:.2f}x Kafka's"
    if "unavailab" in c["metric"]:
        word_good, word_bad = "shorter", "longer"
    elif c["kind"] == "time":
        word_good, word_bad = "faster", "slower"
    else:
        word_good, word_bad = "lower", "higher"
    if a >= 1:
        return f"{a:.1f}x {word_good}" if a < 100 else f"{a:.0f}x {word_good}"
    return f"{1 / a:.1f}x {word_bad}"


def target_text(c: dict[str, Any]) -> str:
    t = c.get("target")
    if not t:
        return ""
    a = c.get("advantage")
    met = a is not None and a >= t
    verdict = "✅ met" if met else "❌ not met"
    if c["kind"] == "latency":  # its ratio is Kafka's / ours: say it the way a reader reads it
        bound = "no higher than Kafka's" if t == 1 else f"at most {1 / t:g}x Kafka's"
        return f"{bound} {verdict}"
    return f"≥{t:g}x {verdict}"


def _load(x: list[float] | None) -> str:
    return "/".join(f"{v:.1f}" for v in x) if x else "?"


def _figures(m: dict[str, Any]) -> str:
    skip = {"system", "run", "load_before", "load_after", "wall_s", "page_cache"}
    parts = []
    for k, v in m.items():
        if k in skip or isinstance(v, (dict, list)) or v is None:
            continue
        parts.append(f"{k}={fmt(v) if isinstance(v, float) else v}")
    if isinstance(m.get("page_cache"), dict):
        pc = m["page_cache"]
        text = f"page cache: {pc['resident_before_mib']} of {pc['data_mib']} MiB resident"
        if pc.get("evicted", True):
            text += f", {pc['resident_after_evict_mib']} MiB after eviction"
        parts.append(text)
    return ", ".join(parts)


def chart(key: str, sec: dict[str, Any], charts_dir: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    groups: dict[str, list[dict[str, Any]]] = {}
    for c in sec["comparisons"]:
        if c.get("kafka") is None and c.get("tidalmq") is None:
            continue
        groups.setdefault(c["chart"], []).append(c)
    if not groups:
        return None
    width_in = max(7.5, 5.2 * len(groups))
    fig, axes = plt.subplots(1, len(groups), figsize=(width_in, 4.6), squeeze=False)
    for ax, (title, rows) in zip(axes[0], groups.items(), strict=True):
        xs = range(len(rows))
        width = 0.38
        kv = [r["kafka"] or 0 for r in rows]
        tv = [r["tidalmq"] or 0 for r in rows]
        ax.bar([x - width / 2 for x in xs], kv, width, label="Apache Kafka", color=KAFKA_COLOR)
        ax.bar([x + width / 2 for x in xs], tv, width, label="TidalMQ", color=TIDAL_COLOR)
        positive = [v for v in kv + tv if v > 0]
        if rows[0]["kind"] == "time" and positive and max(positive) / min(positive) > 30:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["short"] for r in rows], rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        for x, r in zip(xs, rows, strict=True):
            if r.get("advantage") is not None:
                top = max(r["kafka"] or 0, r["tidalmq"] or 0)
                ax.annotate(
                    advantage_text(r).replace(" Kafka's", ""),
                    (x, top),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    axes[0][0].legend(fontsize=8)
    env = sec.get("env", {})
    fig.suptitle(
        f"{TITLES.get(sec['section'], key)}\n{sec['mode']} run {sec['started']}, "
        f"{env.get('cores', '?')} cores, load {_load(sec.get('load_before'))}",
        fontsize=9,
    )
    fig.tight_layout()
    charts_dir.mkdir(parents=True, exist_ok=True)
    path = charts_dir / f"side-by-side-{key.replace('@', '-')}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(data: dict[str, Any], out: Path, charts_dir: Path) -> None:
    sections: dict[str, Any] = data.get("sections", {})
    keys = sorted(sections, key=lambda k: (ORDER.index(sections[k]["section"]), k))
    lines = [
        "# Apache Kafka and TidalMQ, side by side",
        "",
        "Generated by `bench/side_by_side.py` (issue X1) from `bench/RESULTS-side-by-side.json`; "
        f"page written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Every section runs "
        "the real Apache Kafka and TidalMQ in the same invocation, one after the other, with the "
        "same clients.",
        "",
        "```sh",
        "./.ci/setup && export TIDALMQ_CACHE_DIR=/work/cache    # or any cache directory",
        ".venv/bin/python bench/side_by_side.py                 # full run, all sections",
        ".venv/bin/python bench/side_by_side.py --resume        # the same, after an interruption",
        ".venv/bin/python bench/side_by_side.py --quick         # small sizes, for validation",
        ".venv/bin/python bench/side_by_side.py --only move     # one section (others kept)",
        ".venv/bin/python bench/side_by_side.py --storage minio --only produce,consume",
        "```",
        "",
    ]
    if not keys:
        lines.append("No results yet.")
    envs = [sections[k]["env"] for k in keys]
    if envs:
        e = envs[-1]
        lines += [
            "| machine and versions | |",
            "|---|---|",
            f"| machine | {e['cores']} cores ({e['cpu']}), {e['ram_gib']} GiB RAM, Linux {e['kernel']} |",
            f"| Apache Kafka | {e['kafka']} (KRaft, assembled from Maven Central), {e['java']} |",
            f"| TidalMQ | {e['tidalmq']}, Python {e['python']} |",
            f"| clients | Kafka {e['kafka']} perf tools and kafka-reassign-partitions; confluent-kafka {e['confluent_kafka']} |",
        ]
        if any("minio" in x for x in envs):
            lines.append(f"| MinIO | {next(x['minio'] for x in envs if 'minio' in x)} |")
        lines.append("")
        lines += [
            "## Summary",
            "",
            "| section | run | load before → after (1/5/15 min) | measurement | Apache Kafka | TidalMQ | TidalMQ vs Kafka | target |",
            "|---|---|---|---|---:|---:|---|---|",
        ]
        for k in keys:
            s = sections[k]
            for i, c in enumerate(s["comparisons"]):
                head = (
                    f"{k} | {s['mode']}, {s['started']} | {_load(s['load_before'])} → {_load(s['load_after'])}"
                    if i == 0
                    else " | | "
                )
                lines.append(
                    f"| {head} | {c['metric']} | {fmt(c['kafka'], c['unit'])} | "
                    f"{fmt(c['tidalmq'], c['unit'])} | {advantage_text(c)} | {target_text(c)} |"
                )
        lines.append("")
        losses = [
            (k, c)
            for k in keys
            for c in sections[k]["comparisons"]
            if c.get("advantage") is not None and c["advantage"] < 1
        ]
        missed = [
            (k, c)
            for k in keys
            for c in sections[k]["comparisons"]
            if c.get("target") and (c.get("advantage") or 0) < c["target"]
        ]
        lines += ["## Where TidalMQ loses", ""]
        if not losses:
            lines.append("Nowhere in the sections run.")
        for k, c in losses:
            lines.append(
                f"- {k}: {c['metric']}: {advantage_text(c)} "
                f"({fmt(c['tidalmq'], c['unit'])} vs {fmt(c['kafka'], c['unit'])})."
            )
        if missed:
            lines += [
                "",
                "Targets not met: " + "; ".join(f"{k}: {c['metric']}" for k, c in missed) + ".",
            ]
        lines += [
            "",
            "Why, in short: a TidalMQ broker is a single Python process doing per-request work "
            "that Kafka spreads over JVM threads, and it acknowledges a produce only once the "
            "batch is durable in the object store, where Kafka (replication factor 1) "
            "acknowledges from the page cache; see below for everything that is not equal.",
            "",
        ]
    for k in keys:
        s = sections[k]
        suffix = "" if s["storage"] == "local" else f" (TidalMQ on {s['storage']})"
        lines += [f"## {TITLES.get(s['section'], k)}{suffix}", ""]
        lines += [
            f"{s['mode'].capitalize()} run, {s['started']}, {s['duration_s']} s; load average "
            f"{_load(s['load_before'])} before, {_load(s['load_after'])} after; TidalMQ storage: "
            f"{s['storage']}. Command: `{s['command'].strip()}`.",
            "",
            "| measurement | Apache Kafka | TidalMQ | TidalMQ vs Kafka | target |",
            "|---|---:|---:|---|---|",
        ]
        for c in s["comparisons"]:
            lines.append(
                f"| {c['metric']} | {fmt(c['kafka'], c['unit'])} | "
                f"{fmt(c['tidalmq'], c['unit'])} | {advantage_text(c)} | {target_text(c)} |"
            )
        png = chart(k, s, charts_dir)
        if png is not None:
            rel = png.relative_to(out.parent) if png.is_relative_to(out.parent) else png
            lines += ["", f"![{k}]({rel.as_posix()})"]
        lines += [
            "",
            "Runs (each system alone, Kafka first):",
            "",
            "| system | run | load before → after | figures |",
            "|---|---|---|---|",
        ]
        for m in s["measurements"]:
            lines.append(
                f"| {m['system']} | {m['run']} | {_load(m['load_before'])} → "
                f"{_load(m['load_after'])} | {_figures(m)} |"
            )
        if s.get("notes"):
            lines += [""] + [f"- {n}" for n in s["notes"]]
        lines.append("")
    lines += ["## What is not equal in this comparison", ""]
    lines += [f"- {u}" for u in UNEQUAL]
    lines.append("")
    out.write_text("\n".join(lines))
