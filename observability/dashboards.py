"""The five dashboards: brokers; topics and consumer lag; moves and rebalances; the operator,
controller and planner; storage. Every query reads metrics the brokers, the controller and the
operator export (docs/dashboards-and-alerts.md lists them), but the broker HPA's panel:
kube-state-metrics' series."""

from __future__ import annotations

from grafanalib import core as g

from observability.alerts import HPA_SELECTOR
from observability.panels import RATE, Panel, Query, Row, Variable, dashboard


def _selector(metric: str, match: str) -> str:
    return f"{metric}{{{match}}}" if match else metric


def _rate(metric: str, by: str, match: str = "") -> str:
    return f"sum by ({by}) (rate({_selector(metric, match)}[{RATE}]))"


def _hpa(series: str) -> str:
    """A kube-state-metrics series of the chart's broker HPA, per release."""
    return (
        f"max by (namespace, horizontalpodautoscaler) "
        f"(kube_horizontalpodautoscaler_{series}{{{HPA_SELECTOR}}})"
    )


def _quantile(q: float, metric: str, by: str, match: str = "") -> str:
    bucket = _selector(f"{metric}_bucket", match)
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}[{RATE}])))"


B = 'broker=~"$broker"'
T = 'topic=~"$topic"'
GT = 'group=~"$group", topic=~"$topic"'


# Panels that stand on two dashboards, each defined once: the brokers dashboard shows them for
# the brokers chosen ($broker), the others for the whole fleet.
def _partitions_led_per_broker(description: str, match: str = "") -> Panel:
    return Panel(
        "Partitions led per broker",
        description,
        [
            Query(
                f"sum by (broker) ({_selector('tidalmq_partitions_led', match)})",
                "broker {{broker}}",
            )
        ],
    )


def _moves_in_flight(description: str) -> Panel:
    return Panel(
        "Moves in flight by phase",
        description,
        [Query("sum by (phase) (tidalmq_controller_moves_in_flight)", "{{phase}}")],
    )


def brokers() -> g.Dashboard:
    return dashboard(
        "tidalmq-brokers",
        "TidalMQ / Brokers",
        "Each broker's traffic, requests, latency, connections and memory budgets.",
        variables=[Variable("broker", "broker", "tidalmq_partitions_led")],
        rows=[
            Row(
                "Fleet",
                [
                    Panel(
                        "Brokers serving",
                        "Brokers that export metrics and lead partitions.",
                        [Query("count(tidalmq_partitions_led)")],
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Partitions led",
                        "Partitions led by all brokers together.",
                        [Query("sum(tidalmq_partitions_led)")],
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Bytes in",
                        "Record batch bytes appended per second, all brokers.",
                        [Query(f"sum(rate(tidalmq_topic_bytes_in_total[{RATE}]))")],
                        unit="Bps",
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Bytes out",
                        "Record batch bytes fetched per second, all brokers.",
                        [Query(f"sum(rate(tidalmq_topic_bytes_out_total[{RATE}]))")],
                        unit="Bps",
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
            Row(
                "Traffic",
                [
                    Panel(
                        "Bytes in per broker",
                        "Record batch bytes appended per second (the "
                        "HPA's bytes-in metric and the planner's input).",
                        [
                            Query(
                                _rate("tidalmq_topic_bytes_in_total", "broker", B),
                                "broker {{broker}}",
                            )
                        ],
                        unit="Bps",
                    ),
                    Panel(
                        "Bytes out per broker",
                        "Record batch bytes fetched per second.",
                        [
                            Query(
                                _rate("tidalmq_topic_bytes_out_total", "broker", B),
                                "broker {{broker}}",
                            )
                        ],
                        unit="Bps",
                    ),
                    _partitions_led_per_broker("Partitions each broker leads now.", B),
                    Panel(
                        "Requests per API",
                        "Kafka requests handled per second, by API.",
                        [Query(_rate("tidalmq_requests_total", "api", B), "{{api}}")],
                        unit="reqps",
                    ),
                ],
            ),
            Row(
                "Latency and errors",
                [
                    Panel(
                        "Request latency p99 per API",
                        "99th percentile of the time to handle a request, by API.",
                        [Query(_quantile(0.99, "tidalmq_request_seconds", "api", B), "{{api}}")],
                        unit="s",
                    ),
                    Panel(
                        "Request latency p50 per API",
                        "Median time to handle a request.",
                        [Query(_quantile(0.5, "tidalmq_request_seconds", "api", B), "{{api}}")],
                        unit="s",
                    ),
                    Panel(
                        "Failed requests per API",
                        "Requests whose handler failed, per second.",
                        [Query(_rate("tidalmq_request_failures_total", "api", B), "{{api}}")],
                        unit="reqps",
                    ),
                    Panel(
                        "Heartbeat round trip p99",
                        "Broker to controller heartbeat latency as "
                        "the brokers see it; heartbeats sent without news because the event "
                        "loop was busy.",
                        [
                            Query(
                                _quantile(0.99, "tidalmq_broker_heartbeat_seconds", "job"),
                                "p99 {{job}}",
                            ),
                            Query(
                                f"sum(rate(tidalmq_broker_heartbeats_without_loop_total[{RATE}]))",
                                "without loop /s",
                            ),
                        ],
                        unit="s",
                    ),
                ],
            ),
            Row(
                "Request CPU",
                [
                    Panel(
                        "CPU per request by API",
                        "Mean event-loop thread CPU time per request: its decoding, handler and "
                        "encoding, not its waiting, nor the WAL flushes and object-store writes "
                        "shared by many requests (docs/performance.md).",
                        [
                            Query(
                                f"{_rate('tidalmq_request_cpu_seconds_sum', 'broker, api', B)}"
                                f" / {_rate('tidalmq_request_cpu_seconds_count', 'broker, api', B)}",
                                "{{api}} {{broker}}",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Event-loop CPU in requests by API",
                        "Share of one core each broker's event loop spends in requests, by API "
                        "(1: the loop is busy with requests all the time; one broker process "
                        "uses one core).",
                        [
                            Query(
                                _rate("tidalmq_request_cpu_seconds_sum", "broker, api", B),
                                "{{api}} {{broker}}",
                            )
                        ],
                        unit="percentunit",
                    ),
                ],
            ),
            Row(
                "Connections and memory",
                [
                    Panel(
                        "Connections",
                        "Open client connections; muted ones (clients not reading "
                        "responses) and ones waiting for the request budget.",
                        [
                            Query(
                                f"sum by (broker) (tidalmq_connections{{{B}}})", "open {{broker}}"
                            ),
                            Query(
                                f"sum by (broker) (tidalmq_connections_muted{{{B}}})",
                                "muted {{broker}}",
                            ),
                            Query(
                                f"sum by (broker) (tidalmq_connections_waiting_for_memory{{{B}}})",
                                "waiting {{broker}}",
                            ),
                        ],
                    ),
                    Panel(
                        "Connections refused and closed",
                        "Connections refused at a cap or "
                        "closed by a bound (idle), per second; authentication failures.",
                        [
                            Query(
                                _rate("tidalmq_connections_refused_total", "broker, reason", B),
                                "refused {{broker}} {{reason}}",
                            ),
                            Query(
                                _rate("tidalmq_connections_closed_total", "broker, reason", B),
                                "closed {{broker}} {{reason}}",
                            ),
                            Query(
                                _rate("tidalmq_authentication_failures_total", "listener, kind"),
                                "auth failed {{listener}} {{kind}}",
                            ),
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Buffered bytes against the budgets",
                        "Request and response bytes the "
                        "connections hold, and the broker-wide budgets (0: none).",
                        [
                            Query(
                                f"sum by (broker, kind) (tidalmq_buffered_bytes{{{B}}})",
                                "{{kind}} {{broker}}",
                            ),
                            Query(
                                f"max by (kind) (tidalmq_buffer_budget_bytes{{{B}}})",
                                "budget {{kind}}",
                            ),
                        ],
                        unit="bytes",
                        width=24,
                    ),
                ],
            ),
        ],
    )


def topics() -> g.Dashboard:
    return dashboard(
        "tidalmq-topics",
        "TidalMQ / Topics and consumer lag",
        "Per-topic traffic and errors, consumer group lag in records and seconds, static topics.",
        variables=[
            Variable("topic", "topic", "tidalmq_partition_leader_epoch"),
            Variable("group", "group", "tidalmq_consumer_group_lag_sum_records"),
        ],
        rows=[
            Row(
                "Traffic",
                [
                    Panel(
                        "Bytes in per topic",
                        "Record batch bytes appended per second.",
                        [Query(_rate("tidalmq_topic_bytes_in_total", "topic", T), "{{topic}}")],
                        unit="Bps",
                        width=8,
                    ),
                    Panel(
                        "Records in per topic",
                        "Records appended per second.",
                        [Query(_rate("tidalmq_topic_records_in_total", "topic", T), "{{topic}}")],
                        unit="rps",
                        width=8,
                    ),
                    Panel(
                        "Bytes out per topic",
                        "Record batch bytes fetched per second.",
                        [Query(_rate("tidalmq_topic_bytes_out_total", "topic", T), "{{topic}}")],
                        unit="Bps",
                        width=8,
                    ),
                    Panel(
                        "Partitions per topic",
                        "Partitions served now (one leader epoch series each).",
                        [
                            Query(
                                f"count by (topic) (tidalmq_partition_leader_epoch{{{T}}})",
                                "{{topic}}",
                            )
                        ],
                    ),
                    Panel(
                        "Produce errors per topic",
                        "Partition errors answered to producers, per second, by error code.",
                        [
                            Query(
                                _rate("tidalmq_produce_errors_total", "topic, error", T),
                                "{{topic}} {{error}}",
                            )
                        ],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                "Consumer lag",
                [
                    Panel(
                        "Lag per group and topic (records)",
                        "Committed offsets behind the high "
                        "watermark, summed over the topic's partitions.",
                        [
                            Query(
                                f"max by (group, topic) "
                                f"(tidalmq_consumer_group_lag_sum_records{{{GT}}})",
                                "{{group}} {{topic}}",
                            )
                        ],
                    ),
                    Panel(
                        "Lag per group and topic (seconds)",
                        "How far behind the newest record "
                        "the group's committed position is, estimated in time.",
                        [
                            Query(
                                f"max by (group, topic) (tidalmq_consumer_group_lag_seconds{{{GT}}})",
                                "{{group}} {{topic}}",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Partitions with the most lag",
                        "The 20 partitions furthest behind.",
                        [
                            Query(
                                f"topk(20, max by (group, topic, partition) "
                                f"(tidalmq_consumer_group_lag_records{{{GT}}}))",
                                "{{group}} {{topic}}/{{partition}}",
                            )
                        ],
                        width=24,
                    ),
                ],
            ),
            Row(
                "Static topics",
                [
                    Panel(
                        "Remaps by outcome",
                        "Logic queues remapped per second, by order and outcome.",
                        [
                            Query(
                                _rate("tidalmq_static_remaps_total", "topic, mode, outcome", T),
                                "{{topic}} {{mode}} {{outcome}}",
                            )
                        ],
                        unit="ops",
                        width=8,
                    ),
                    Panel(
                        "Remap unavailability p99",
                        "Remap request until the new physical queue is served.",
                        [
                            Query(
                                _quantile(0.99, "tidalmq_static_remap_seconds", "mode"), "{{mode}}"
                            )
                        ],
                        unit="s",
                        width=8,
                    ),
                    Panel(
                        "Mapping epoch and inconsistency",
                        "Each static topic's mapping epoch; "
                        "1 while its mapping copies disagree; logic offsets skipped.",
                        [
                            Query(
                                f"max by (topic) (tidalmq_static_topic_epoch{{{T}}})",
                                "epoch {{topic}}",
                            ),
                            Query(
                                f"max by (topic) (tidalmq_static_topic_inconsistent{{{T}}})",
                                "inconsistent {{topic}}",
                            ),
                            Query(
                                f"sum by (topic) "
                                f"(increase(tidalmq_static_logic_offsets_skipped_total{{{T}}}"
                                f"[{RATE}]))",
                                "skipped {{topic}}",
                            ),
                        ],
                        width=8,
                    ),
                ],
            ),
        ],
    )


def moves() -> g.Dashboard:
    return dashboard(
        "tidalmq-moves",
        "TidalMQ / Moves and rebalances",
        "Partition moves in flight and done, their unavailability, failovers and the balance "
        "of the fleet.",
        rows=[
            Row(
                "Moves",
                [
                    _moves_in_flight("Moves started and not finished."),
                    Panel(
                        "Moves finished by outcome",
                        "Moves that finished in each interval: done, cancelled, failed.",
                        [
                            Query(
                                f"sum by (outcome) "
                                f"(increase(tidalmq_controller_reassignments_total[{RATE}]))",
                                "{{outcome}}",
                            )
                        ],
                    ),
                    Panel(
                        "Move unavailability",
                        "Time from recording a move to the target "
                        "serving: what a client of the partition waits.",
                        [
                            Query(
                                _quantile(0.5, "tidalmq_controller_reassignment_seconds", "job"),
                                "p50",
                            ),
                            Query(
                                _quantile(0.99, "tidalmq_controller_reassignment_seconds", "job"),
                                "p99",
                            ),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Brokers declared dead",
                        "Brokers the controller fenced and failed over "
                        "(session timed out, or killed).",
                        [
                            Query(
                                f"sum(increase(tidalmq_controller_brokers_declared_dead_total"
                                f"[{RATE}]))",
                                "declared dead",
                            )
                        ],
                    ),
                ],
            ),
            Row(
                "Balance",
                [
                    _partitions_led_per_broker("How the partitions spread over brokers."),
                    Panel(
                        "Bytes-in imbalance",
                        "Busiest broker's bytes in over the fleet's "
                        "average: what the planner's rebalance brings under its threshold.",
                        [
                            Query(
                                f"max({_rate('tidalmq_topic_bytes_in_total', 'broker')}) / "
                                f"avg({_rate('tidalmq_topic_bytes_in_total', 'broker')})",
                                "max / avg",
                            )
                        ],
                    ),
                    Panel(
                        "Partition opens by kind",
                        "Partitions opened per second: new, clean "
                        "(after a move) or unclean (recovered after a failure).",
                        [Query(_rate("tidalmq_storage_partition_opens_total", "kind"), "{{kind}}")],
                        unit="ops",
                        width=24,
                    ),
                ],
            ),
            Row(
                "Autoscaling",
                [
                    Panel(
                        "Broker autoscaler replicas",
                        "The broker HPA's current and desired brokers against its maximum "
                        "(TidalMQBrokersAtMaxReplicas fires when desired stays at the maximum). "
                        "kube-state-metrics' series: empty without it.",
                        [
                            Query(_hpa("status_current_replicas"), "{{namespace}} current"),
                            Query(_hpa("status_desired_replicas"), "{{namespace}} desired"),
                            Query(_hpa("spec_max_replicas"), "{{namespace}} max"),
                        ],
                        width=24,
                    ),
                ],
            ),
        ],
    )


def control_plane() -> g.Dashboard:
    return dashboard(
        "tidalmq-control-plane",
        "TidalMQ / Operator, controller and planner",
        "The controller's metadata log and pushes, the operator's view of Topics and "
        "StaticTopics, losses, control-plane refusals, and the planner's input.",
        rows=[
            Row(
                "Health",
                [
                    Panel(
                        "Degraded resources",
                        "Topics and StaticTopics whose condition Degraded "
                        "is true, by reason (StoreLost, DataLost, BrokerNotAlive, Leaderless).",
                        [
                            Query(
                                "sum by (kind, reason) (tidalmq_operator_degraded)",
                                "{{kind}} {{reason}}",
                            )
                        ],
                        width=8,
                    ),
                    Panel(
                        "Lost partitions",
                        "Partitions whose acknowledged data a broker found "
                        "missing, until the loss is accepted.",
                        [
                            Query("max(tidalmq_controller_lost_partitions)", "controller"),
                            Query(
                                "sum by (kind, resource) (tidalmq_operator_lost_partitions)",
                                "{{kind}} {{resource}}",
                            ),
                        ],
                        width=8,
                    ),
                    Panel(
                        "Store and metadata lost",
                        "1 while the object store's identity marker "
                        "is missing (controller) or the metadata log is missing (operator).",
                        [
                            Query("max(tidalmq_controller_store_lost)", "store lost"),
                            Query("max(tidalmq_operator_metadata_lost)", "metadata lost"),
                        ],
                        width=8,
                    ),
                ],
            ),
            Row(
                "Controller",
                [
                    Panel(
                        "Metadata commit latency",
                        "Time to append one metadata batch to its store.",
                        [
                            Query(
                                _quantile(0.5, "tidalmq_controller_metadata_commit_seconds", "job"),
                                "p50",
                            ),
                            Query(
                                _quantile(
                                    0.99, "tidalmq_controller_metadata_commit_seconds", "job"
                                ),
                                "p99",
                            ),
                        ],
                        unit="s",
                        width=8,
                    ),
                    Panel(
                        "Metadata committed",
                        "Batches and records committed per second.",
                        [
                            Query(
                                f"sum(rate(tidalmq_controller_metadata_batches_total[{RATE}]))",
                                "batches",
                            ),
                            Query(
                                f"sum(rate(tidalmq_controller_metadata_records_total[{RATE}]))",
                                "records",
                            ),
                        ],
                        unit="ops",
                        width=8,
                    ),
                    Panel(
                        "Metadata pushes by kind",
                        "Metadata updates sent to brokers per second.",
                        [
                            Query(
                                _rate("tidalmq_controller_metadata_pushes_total", "kind"),
                                "{{kind}}",
                            )
                        ],
                        unit="ops",
                        width=8,
                    ),
                    Panel(
                        "Control calls refused",
                        "Control calls refused by the controller and "
                        "the brokers (no or a wrong token or certificate).",
                        [
                            Query(
                                _rate("tidalmq_controller_control_refusals_total", "reason"),
                                "controller {{reason}}",
                            ),
                            Query(
                                _rate("tidalmq_broker_control_refusals_total", "reason"),
                                "broker {{reason}}",
                            ),
                        ],
                        unit="ops",
                        width=24,
                    ),
                ],
            ),
            Row(
                "Planner",
                [
                    Panel(
                        "Broker bytes in and out (the planner's input)",
                        "The per-broker bytes the planner balances (it reads the per-partition "
                        "rates, or these per-topic ones when the brokers export no per-partition "
                        "series); the plan's report links to the same queries.",
                        [
                            Query(
                                _rate("tidalmq_topic_bytes_in_total", "broker"),
                                "in, broker {{broker}}",
                            ),
                            Query(
                                _rate("tidalmq_topic_bytes_out_total", "broker"),
                                "out, broker {{broker}}",
                            ),
                        ],
                        unit="Bps",
                    ),
                    _moves_in_flight("Moves of the current reassignment, by phase."),
                ],
            ),
        ],
    )


def storage() -> g.Dashboard:
    return dashboard(
        "tidalmq-storage",
        "TidalMQ / Storage",
        "The object store (requests, latency, errors), the WAL, the tail cache, checkpoints, "
        "compaction, retention and lost data.",
        variables=[Variable("broker", "broker", "tidalmq_storage_open_partitions")],
        rows=[
            Row(
                "Store health",
                [
                    Panel(
                        "Store unwritable",
                        "1 while the object store does not take a broker's "
                        "writes (appends are refused).",
                        [
                            Query(
                                f"max by (broker) (tidalmq_storage_store_unwritable{{{B}}})",
                                "broker {{broker}}",
                            )
                        ],
                        width=8,
                    ),
                    Panel(
                        "Store lost",
                        "1 while the store's identity marker is missing or names "
                        "another cluster (nothing is served).",
                        [
                            Query(
                                f"max by (broker) (tidalmq_store_lost{{{B}}})", "broker {{broker}}"
                            )
                        ],
                        width=8,
                    ),
                    Panel(
                        "Partitions with lost data",
                        "Partitions whose data is lost and the acknowledged offsets missing.",
                        [
                            Query(
                                f"sum by (broker) (tidalmq_partitions_lost{{{B}}})",
                                "lost {{broker}}",
                            ),
                            Query(
                                f"sum by (topic) (tidalmq_partition_missing_offsets{{{B}}})",
                                "missing offsets {{topic}}",
                            ),
                        ],
                        width=8,
                    ),
                ],
            ),
            Row(
                "Object store",
                [
                    Panel(
                        "Requests by operation and outcome",
                        "Object-store requests per second.",
                        [
                            Query(
                                _rate("tidalmq_storage_object_requests_total", "op, outcome", B),
                                "{{op}} {{outcome}}",
                            )
                        ],
                        unit="reqps",
                        width=8,
                    ),
                    Panel(
                        "Request latency p99",
                        "Object-store request latency by operation.",
                        [
                            Query(
                                _quantile(0.99, "tidalmq_storage_object_request_seconds", "op", B),
                                "{{op}}",
                            )
                        ],
                        unit="s",
                        width=8,
                    ),
                    Panel(
                        "Bytes moved",
                        "Bytes put to and got from the object store per second.",
                        [Query(_rate("tidalmq_storage_object_bytes_total", "op", B), "{{op}}")],
                        unit="Bps",
                        width=8,
                    ),
                ],
            ),
            Row(
                "WAL and appends",
                [
                    Panel(
                        "WAL flushes by outcome",
                        "WAL objects written per second.",
                        [
                            Query(
                                _rate("tidalmq_storage_wal_flushes_total", "broker, outcome", B),
                                "{{broker}} {{outcome}}",
                            )
                        ],
                        unit="ops",
                        width=8,
                    ),
                    Panel(
                        "WAL flush latency p99",
                        "Time from the flush decision until the WAL object is durable.",
                        [
                            Query(
                                _quantile(0.99, "tidalmq_storage_wal_flush_seconds", "broker", B),
                                "p99 seconds {{broker}}",
                            )
                        ],
                        unit="s",
                        width=8,
                    ),
                    Panel(
                        "WAL object size p50",
                        "Median size of WAL objects.",
                        [
                            Query(
                                _quantile(0.5, "tidalmq_storage_wal_flush_bytes", "broker", B),
                                "{{broker}}",
                            )
                        ],
                        unit="bytes",
                        width=8,
                    ),
                    Panel(
                        "Append failures by reason",
                        "Appends that failed per second; duplicate "
                        "batches of idempotent producers answered without a write.",
                        [
                            Query(
                                _rate("tidalmq_storage_append_failures_total", "reason", B),
                                "{{reason}}",
                            ),
                            Query(
                                _rate("tidalmq_produce_duplicate_batches_total", "broker", B),
                                "duplicates {{broker}}",
                            ),
                        ],
                        unit="ops",
                        width=12,
                    ),
                    Panel(
                        "Appended bytes",
                        "Record batch bytes appended per second.",
                        [
                            Query(
                                _rate("tidalmq_storage_append_bytes_total", "broker", B),
                                "broker {{broker}}",
                            )
                        ],
                        unit="Bps",
                        width=12,
                    ),
                ],
            ),
            Row(
                "Cache and housekeeping",
                [
                    Panel(
                        "Tail cache hit ratio",
                        "Share of bytes read served by the tail cache.",
                        [
                            Query(
                                f"sum by (broker) (rate(tidalmq_storage_cache_hit_bytes_total"
                                f"{{{B}}}[{RATE}])) / (sum by (broker) (rate("
                                f"tidalmq_storage_cache_hit_bytes_total{{{B}}}[{RATE}])) + sum by "
                                f"(broker) (rate(tidalmq_storage_cache_miss_bytes_total{{{B}}}"
                                f"[{RATE}])))",
                                "broker {{broker}}",
                            )
                        ],
                        unit="percentunit",
                        width=8,
                    ),
                    Panel(
                        "Tail cache size",
                        "Bytes held by the tail cache.",
                        [
                            Query(
                                f"sum by (broker) (tidalmq_storage_cache_bytes{{{B}}})",
                                "broker {{broker}}",
                            )
                        ],
                        unit="bytes",
                        width=8,
                    ),
                    Panel(
                        "Open partitions",
                        "Partitions open on each broker.",
                        [
                            Query(
                                f"sum by (broker) (tidalmq_storage_open_partitions{{{B}}})",
                                "broker {{broker}}",
                            )
                        ],
                        width=8,
                    ),
                    Panel(
                        "Checkpoints and compactions",
                        "Checkpoints and compaction runs per second, by outcome; bytes compacted.",
                        [
                            Query(
                                _rate("tidalmq_storage_checkpoints_total", "outcome", B),
                                "checkpoint {{outcome}}",
                            ),
                            Query(
                                _rate("tidalmq_storage_compactions_total", "outcome", B),
                                "compaction {{outcome}}",
                            ),
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Retention and garbage",
                        "Segments deleted by retention and unreferenced "
                        "objects deleted, per second.",
                        [
                            Query(
                                _rate(
                                    "tidalmq_storage_retention_deleted_segments_total", "broker", B
                                ),
                                "retention {{broker}}",
                            ),
                            Query(
                                _rate(
                                    "tidalmq_storage_garbage_deleted_objects_total", "kind, path", B
                                ),
                                "garbage {{kind}} {{path}}",
                            ),
                        ],
                        unit="ops",
                    ),
                ],
            ),
        ],
    )


ALL = {
    "brokers": brokers,
    "topics": topics,
    "moves": moves,
    "control-plane": control_plane,
    "storage": storage,
}
"""Every dashboard by the name of its file (charts/tidalmq/monitoring/dashboards/NAME.json)."""
