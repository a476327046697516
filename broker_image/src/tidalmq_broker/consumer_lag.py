"""Consumer group lag, computed by the group coordinator at each scrape (docs/metrics.md).

For every group this broker coordinates (the loaded shards of `__consumer_offsets`), each
committed offset is set against its partition's end: the live high watermark when this broker
leads the partition, else the acknowledged end the controller last committed to the metadata
(`end_offset_floor`, raised from the leaders' heartbeats at most every
`floor_commit_interval_s`, 10 s): a partition led elsewhere can read up to that much too low,
never too high. A static topic's logic queue ends where its leader physical queue ends, in logic
offsets (the translation Fetch and ListOffsets use, `static_mapping.logic_high_watermark`; the
physical end found the same way). The work per scrape is O(committed partitions of the groups
coordinated here).

Lag in seconds is the age of the oldest record the group has not committed: the time the
partition's end first passed the committed offset, interpolated between the ends seen at
earlier scrapes (`EndHistory`, at most `HISTORY_POINTS` points per partition, older points
thinned out). Its resolution is the scrape interval (plus the floor's delay for partitions led
elsewhere); a record appended before the coordinator first looked counts from that look.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from tidalmq_broker.server.ratelog import RateLimitedLog, describe

log = logging.getLogger(__name__)
_FAILURES = RateLimitedLog()

HISTORY_POINTS = 32  # per partition: (time, end) pairs kept for the lag-in-seconds estimate

Committed = Mapping[str, Mapping[tuple[str, int], int]]
"""group -> (topic, partition) -> committed offset"""
EndsOf = Callable[[set[tuple[str, int]]], Mapping[tuple[str, int], int]]
"""The ends (high watermarks) of the partitions asked for that are known (absent: unknown)."""


class EndHistory:
    """A partition's ends as seen at successive scrapes: (time, end), ends not decreasing (an
    end seen again moves its second point: when it was last seen unchanged). Bounded: when full, every other point of the older half goes (recent points stay fine
    grained, old ones coarse)."""

    __slots__ = ("points",)

    def __init__(self) -> None:
        self.points: list[tuple[float, int]] = []

    def see(self, now: float, end: int) -> None:
        points = self.points
        if points and end <= points[-1][1]:
            if end < points[-1][1]:  # the log was truncated or re-created: start over
                points.clear()
                points.append((now, end))
            elif len(points) >= 2 and points[-2][1] == end:
                points[-1] = (now, end)  # still there: the next records came after `now`
            else:
                points.append((now, end))
            return
        points.append((now, end))
        if len(points) > HISTORY_POINTS:
            half = len(points) // 2
            del points[1:half:2]

    def appended_at(self, offset: int) -> float | None:
        """When the record at `offset` was (about) appended: None if it is not yet."""
        previous: tuple[float, int] | None = None
        for t, end in self.points:
            if end > offset:
                if previous is None:
                    return t  # before the first look: counted from it
                t0, end0 = previous
                # the records end0..end-1 were appended in (t0, t]: spread them evenly
                return t0 + (t - t0) * (offset - end0 + 1) / (end - end0)
            previous = (t, end)
        return None


@dataclass(slots=True)
class GroupTopicLag:
    records: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class LagReport:
    """One scrape's lag: per (group, topic) sums and ages, and per partition when asked."""

    topics: dict[tuple[str, str], GroupTopicLag] = field(default_factory=dict)
    partitions: list[tuple[str, str, int, int]] = field(default_factory=list)
    dropped: int = 0  # partition series left out by the cap


class ConsumerLag:
    """The lag of the groups one broker coordinates, and the end histories it needs."""

    def __init__(
        self,
        committed: Callable[[], Committed],
        ends_of: EndsOf,
        *,
        per_partition: bool = False,
        max_partition_series: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._committed = committed
        self._ends_of = ends_of
        self.per_partition = per_partition
        self.max_partition_series = max_partition_series
        self._clock = clock
        self._history: dict[tuple[str, int], EndHistory] = {}
        self.dropped_total = 0

    def report(self) -> LagReport:
        committed = self._committed()
        wanted = {tp for table in committed.values() for tp in table}
        ends = self._ends_of(wanted)
        now = self._clock()
        history = self._history
        for tp in [tp for tp in history if tp not in ends]:  # no group commits it any more
            del history[tp]
        for tp, end in ends.items():
            h = history.get(tp)
            if h is None:
                h = history[tp] = EndHistory()
            h.see(now, end)
        out = LagReport()
        room = self.max_partition_series if self.per_partition else 0
        for group, table in committed.items():
            for (topic, partition), offset in table.items():
                known = ends.get((topic, partition))
                if known is None:
                    continue  # a partition of an unknown (deleted) topic
                lag = max(0, known - offset)
                agg = out.topics.get((group, topic))
                if agg is None:
                    agg = out.topics[(group, topic)] = GroupTopicLag()
                agg.records += lag
                if lag:
                    appended = history[(topic, partition)].appended_at(offset)
                    if appended is not None:
                        agg.seconds = max(agg.seconds, now - appended)
                if self.per_partition:
                    if room > 0:
                        out.partitions.append((group, topic, partition, lag))
                        room -= 1
                    else:
                        out.dropped += 1
        self.dropped_total += out.dropped
        return out


def _families() -> tuple[
    GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily
]:
    return (
        GaugeMetricFamily(
            "tidalmq_consumer_group_lag_records",
            "Records between a group's committed offset and the partition's end (high "
            "watermark), per partition (only with --consumer-lag-partition-metrics)",
            labels=["group", "topic", "partition"],
        ),
        GaugeMetricFamily(
            "tidalmq_consumer_group_lag_sum_records",
            "A group's lag in records summed over the partitions of a topic it committed",
            labels=["group", "topic"],
        ),
        GaugeMetricFamily(
            "tidalmq_consumer_group_lag_seconds",
            "Age of the oldest record of the topic the group has not committed (estimated from "
            "the partitions' ends at earlier scrapes)",
            labels=["group", "topic"],
        ),
        CounterMetricFamily(
            "tidalmq_consumer_group_lag_partition_series_dropped",
            "Per-partition lag series left out by the cap "
            "(--consumer-lag-partition-series-max), summed over scrapes",
            labels=[],
        ),
    )


class _LagCollector(Collector):
    """The process's lag families, from every broker's ConsumerLag (tests and the embedded
    cluster run several brokers in one process: each group has one coordinator)."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[ConsumerLag] = weakref.WeakSet()

    def describe(self) -> Iterable[Metric]:
        return list(_families())

    def collect(self) -> Iterator[Metric]:
        records, total, seconds, dropped = _families()
        dropped_total = 0
        for source in list(self.sources):
            try:
                report = source.report()
            except Exception as exc:  # never the whole scrape: this broker's lag is left out
                _FAILURES.error(log, "computing consumer lag failed: %s", describe(exc))
                continue
            for (group, topic), agg in sorted(report.topics.items()):
                total.add_metric([group, topic], agg.records)
                seconds.add_metric([group, topic], agg.seconds)
            for group, topic, partition, lag in report.partitions:
                records.add_metric([group, topic, str(partition)], lag)
            dropped_total += source.dropped_total
        dropped.add_metric([], dropped_total)
        yield from (records, total, seconds, dropped)


COLLECTOR = _LagCollector()
REGISTRY.register(COLLECTOR)


def watch(lag: ConsumerLag) -> None:
    """Export `lag` at every scrape of this process's /metrics (until it is garbage)."""
    COLLECTOR.sources.add(lag)


def unwatch(lag: ConsumerLag) -> None:
    COLLECTOR.sources.discard(lag)
