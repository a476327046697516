"""`tidalmq local top`: a live view of the local cluster from its metrics (docs/metrics.md).

Every interval it reads the cluster's status (brokers, moves) from the controller and every
broker's /metrics, and shows per broker the bytes and records in and out per second (rates of
`tidalmq_topic_*_total` between two scrapes), connections and partitions led, then the
consumer groups' lag (`tidalmq_consumer_group_lag_sum_records` and `_lag_seconds`, from each
group's coordinator) and the moves in flight and done.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, TextIO

TRAFFIC = {
    "tidalmq_topic_bytes_in_total": "bytes_in",
    "tidalmq_topic_bytes_out_total": "bytes_out",
    "tidalmq_topic_records_in_total": "records_in",
    "tidalmq_topic_records_out_total": "records_out",
}
MAX_LAG_ROWS = 20  # the most lagging (group, topic) pairs shown


@dataclass(slots=True)
class Sample:
    """What one broker's /metrics said at `at` (monotonic seconds)."""

    at: float
    totals: dict[str, float] = field(default_factory=dict)  # TRAFFIC's keys, summed over topics
    connections: float = 0.0
    lag: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


def parse(text: str, at: float) -> Sample:
    """A broker's exposition text, reduced to what the view shows."""
    from prometheus_client.parser import text_string_to_metric_families

    sample = Sample(at, dict.fromkeys(TRAFFIC.values(), 0.0))
    seconds: dict[tuple[str, str], float] = {}
    records: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.labels.get("group", ""), s.labels.get("topic", ""))
            if s.name in TRAFFIC:
                sample.totals[TRAFFIC[s.name]] += s.value
            elif s.name == "tidalmq_connections":
                sample.connections += s.value
            elif s.name == "tidalmq_consumer_group_lag_sum_records":
                records[key] = s.value
            elif s.name == "tidalmq_consumer_group_lag_seconds":
                seconds[key] = s.value
    sample.lag = {k: (v, seconds.get(k, 0.0)) for k, v in records.items()}
    return sample


def rates(before: Sample | None, after: Sample) -> dict[str, float]:
    """Per second between two samples of one broker (a counter that went down: the broker
    restarted, counted from zero)."""
    if before is None or after.at <= before.at:
        return dict.fromkeys(TRAFFIC.values(), 0.0)
    span = after.at - before.at
    out = {}
    for key, now in after.totals.items():
        then = before.totals.get(key, 0.0)
        out[key] = (now - then if now >= then else now) / span
    return out


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render(status: dict[str, Any], samples: dict[int, Sample], previous: dict[int, Sample]) -> str:
    lines = [
        f"bootstrap {status.get('bootstrap', '?')}   moves in flight "
        f"{status.get('moves_in_flight', 0)}   moves done {status.get('moves_done', 0)}",
        "",
        f"{'BROKER':>6} {'STATE':<8} {'PARTS':>5} {'CONNS':>5} {'IN/s':>11} {'OUT/s':>11} "
        f"{'REC IN/s':>9} {'REC OUT/s':>9} {'MOVES IN':>8} {'MOVES OUT':>9}",
    ]
    lag: dict[tuple[str, str], tuple[float, float]] = {}
    for row in status.get("brokers", []):
        broker = int(row["broker"])
        sample = samples.get(broker)
        r = rates(previous.get(broker), sample) if sample else dict.fromkeys(TRAFFIC.values(), 0)
        conns = f"{sample.connections:.0f}" if sample else "-"
        lines.append(
            f"{broker:>6} {row.get('state', '?'):<8} {row.get('partitions', 0):>5} {conns:>5} "
            f"{_size(r['bytes_in']):>11} {_size(r['bytes_out']):>11} "
            f"{r['records_in']:>9.0f} {r['records_out']:>9.0f} "
            f"{row.get('moves_in', 0):>8} {row.get('moves_out', 0):>9}"
        )
        if sample:
            lag.update(sample.lag)
    lines += ["", f"{'GROUP':<30} {'TOPIC':<30} {'LAG':>10} {'LAG AGE':>9}"]
    ranked = sorted(lag.items(), key=lambda kv: (-kv[1][0], kv[0]))
    for (group, topic), (records, seconds) in ranked[:MAX_LAG_ROWS]:
        lines.append(f"{group:<30} {topic:<30} {records:>10.0f} {seconds:>8.0f}s")
    if not lag:
        lines.append("(no committed offsets)")
    elif len(ranked) > MAX_LAG_ROWS:
        lines.append(f"... {len(ranked) - MAX_LAG_ROWS} more (group, topic) pairs")
    return "\n".join(lines)


def scrape(status: dict[str, Any], timeout_s: float = 5.0) -> dict[int, Sample]:
    """Every running broker's metrics now (a broker that does not answer is left out)."""
    out = {}
    for row in status.get("brokers", []):
        port = row.get("http_port")
        if not port:
            continue
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        out[int(row["broker"])] = parse(text, time.monotonic())
    return out


def run(client: Any, interval_s: float, once: bool, stream: TextIO = sys.stdout) -> int:
    """Refresh every `interval_s` until Ctrl-C (`once`: two scrapes `interval_s` apart, one
    frame, for scripts)."""
    previous = scrape(client.status())
    try:
        while True:
            time.sleep(interval_s)
            status = client.status()
            samples = scrape(status)
            frame = render(status, samples, previous)
            if once:
                print(frame, file=stream)
                return 0
            print("\x1b[H\x1b[2J" + frame, file=stream, flush=True)
            previous = samples
    except KeyboardInterrupt:
        return 0
