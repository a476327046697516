"""The Prometheus alerting rules: one group, each rule with the expression, how long it must
hold, a severity and what to do. The chart ships them as a PrometheusRule (its spec is this
file's `groups`) and as a plain rules file for a Prometheus without the Prometheus Operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HPA_SELECTOR = 'horizontalpodautoscaler=~".+-broker"'
"""kube-state-metrics' HPA series of the chart's broker HPA (named FULLNAME-broker)."""

BROKER_TARGET = "last_over_time(tidalmq_storage_store_unwritable[1h])"
"""A scrape target that is a broker: every broker exports tidalmq_storage_store_unwritable from its
start (one series, labelled with its id); a target that did in the last hour, or whose job's other
targets do now, is a broker's."""

MOVE_TROUBLE = "failed|target_lost|retargeted"
"""The move outcomes TidalMQMovesFailing fires on (tidalmq_controller._moves.TROUBLE): not done,
not a user's cancel, not a move superseded by a new reassignment."""


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook": f"docs/dashboards-and-alerts.md, alert {self.name}",
            },
        }


ALERTS = (
    Alert(
        "TidalMQPartitionsWithoutLeader",
        "max by (namespace, kind, resource, reason) "
        '(tidalmq_operator_degraded{reason=~"Leaderless|BrokerNotAlive"}) > 0',
        "2m",
        "critical",
        "Partitions of {{ $labels.kind }} {{ $labels.resource }} have no serving leader",
        "The operator reports {{ $labels.kind }} {{ $labels.resource }} Degraded "
        "({{ $labels.reason }}) for 2 minutes: some of its partitions have no leader or their "
        "broker is not alive. Producers and consumers of them wait. See the resource's status "
        "and the controller's log.",
    ),
    Alert(
        "TidalMQPartitionDataLost",
        "max by (namespace) (tidalmq_controller_lost_partitions) > 0",
        "1m",
        "critical",
        "{{ $value }} partitions lost acknowledged data",
        "A broker found less in the object store than the metadata knows was acknowledged. "
        "The partitions are not served until the loss is accepted (annotation "
        "tidalmq.io/accept-data-loss on the Topic); the Topic's status names them.",
    ),
    Alert(
        "TidalMQObjectStoreLost",
        "max by (namespace) (tidalmq_controller_store_lost) > 0 "
        "or max by (namespace) (tidalmq_store_lost) > 0",
        "1m",
        "critical",
        "The object store's identity marker is missing or names another cluster",
        "Nothing is served: the bucket or prefix was deleted, replaced or points at another "
        "cluster's data. Check the store's URL and the bucket.",
    ),
    Alert(
        "TidalMQMetadataLost",
        "max by (namespace) (tidalmq_operator_metadata_lost) > 0",
        "1m",
        "critical",
        "The metadata log the ClusterState points to is missing",
        "The controller does not start until the metadata log is back in its store.",
    ),
    Alert(
        "TidalMQObjectStoreUnwritable",
        "max by (namespace, broker) (tidalmq_storage_store_unwritable) > 0",
        "1m",
        "critical",
        "Broker {{ $labels.broker }} cannot write to the object store",
        "Its last PUT failed or timed out for a minute: appends are refused with "
        "KAFKA_STORAGE_ERROR and its /readyz answers 503. Check the store's availability, "
        "credentials and quotas.",
    ),
    Alert(
        "TidalMQBrokerFenced",
        "sum by (namespace) (increase(tidalmq_controller_brokers_declared_dead_total[10m])) > 0",
        "0m",
        "warning",
        "The controller declared a broker dead and fenced it",
        "A broker's session timed out (or it was killed) in the last 10 minutes: the "
        "controller fenced it and moved its partitions. See the controller's BrokerDead events "
        "and the broker's pod.",
    ),
    Alert(
        "TidalMQBrokerUnreachable",
        "(up == 0) and on (job, instance) group by (job, instance) "
        f"({BROKER_TARGET}) "
        "or (up == 0) and on (job) group by (job) (tidalmq_storage_store_unwritable)",
        "1m",
        "warning",
        "The broker at {{ $labels.instance }} does not answer its scrapes",
        "Prometheus has not scraped the broker for a minute: its process is stopped, hung or "
        "overloaded, or its pod is unreachable. If it does not heartbeat either, the controller "
        "declares it dead after the session timeout (TidalMQBrokerFenced) and moves its "
        "partitions; until then they wait. See the pod's status, events and log.",
    ),
    Alert(
        "TidalMQMoveStuck",
        "sum by (namespace) (tidalmq_controller_moves_in_flight) > 0 "
        "unless on (namespace) "
        "sum by (namespace) (increase(tidalmq_controller_reassignments_total[10m])) > 0",
        "5m",
        "warning",
        "Partition moves are in flight and none finished for 15 minutes",
        "A move or a reassignment is stuck: moves are in flight but none finished in the "
        "last 10 minutes, for 5 minutes. See the PartitionReassignment's status (each move's "
        "phase) and the controller's log.",
    ),
    Alert(
        "TidalMQMovesFailing",
        "sum by (namespace, outcome) "
        "(increase(tidalmq_controller_reassignments_total"
        f'{{outcome=~"{MOVE_TROUBLE}"}}[15m])) > 0',
        "0m",
        "warning",
        "Partition moves ended {{ $labels.outcome }}",
        "{{ $value }} move attempts ended {{ $labels.outcome }} in the last 15 minutes. "
        "target_lost: the target broker went away before serving the partition (rolled back to "
        "the source, or handed to another broker); retargeted: the target did not open the "
        "partition within the open timeout and the move was handed on to another broker (see "
        "the target broker's log); failed: the topic was deleted under the move. A user's "
        "cancel does not fire this. The PartitionReassignment's status and the controller's "
        "PartitionTargetLost / PartitionNotOpened events name the partitions.",
    ),
    Alert(
        "TidalMQStaticTopicInconsistent",
        "max by (namespace, topic) (tidalmq_static_topic_inconsistent) > 0",
        "5m",
        "warning",
        "The mapping copies of static topic {{ $labels.topic }} disagree",
        "Updates of its mapping are refused until it is repaired.",
    ),
    Alert(
        "TidalMQConsumerLagGrowing",
        "max by (namespace, group, topic) "
        "(deriv(tidalmq_consumer_group_lag_sum_records[10m])) > 0 "
        "and max by (namespace, group, topic) (tidalmq_consumer_group_lag_sum_records) > 0",
        "15m",
        "warning",
        "Consumer group {{ $labels.group }} falls behind on {{ $labels.topic }}",
        "The group's lag on the topic has grown for 15 minutes: its consumers do not keep up "
        "with the producers, or stopped. See the Topics and consumer lag dashboard.",
    ),
    Alert(
        "TidalMQTlsCertificateExpiring",
        "min by (namespace, broker, listener) "
        "(tidalmq_tls_certificate_expiry_timestamp_seconds) - time() < 14 * 86400",
        "1h",
        "warning",
        "The certificate of listener {{ $labels.listener }} on broker {{ $labels.broker }} "
        "expires within 14 days",
        'Renewed files are reloaded without a restart (docs/security.md, "Renewed '
        "certificates\"): renew the brokers' TLS Secret (cert-manager, or delete the chart's "
        "and upgrade). If it was renewed, tidalmq_tls_certificate_reloads_total "
        '{result="failed"} says whether the new files could not be loaded.',
    ),
    Alert(
        "TidalMQBrokersAtMaxReplicas",
        f"max by (namespace, horizontalpodautoscaler) "
        f"(kube_horizontalpodautoscaler_status_desired_replicas{{{HPA_SELECTOR}}}) "
        f">= on (namespace, horizontalpodautoscaler) max by (namespace, horizontalpodautoscaler) "
        f"(kube_horizontalpodautoscaler_spec_max_replicas{{{HPA_SELECTOR}}})",
        "15m",
        "warning",
        "The broker HPA {{ $labels.horizontalpodautoscaler }} is at its maximum",
        "The autoscaler wants at least its maxReplicas brokers for 15 minutes: the traffic may "
        "need more than it may add. Raise autoscaling.maxReplicas or look at the load. "
        "(Needs kube-state-metrics.)",
    ),
)


def rules_file() -> dict[str, Any]:
    """The Prometheus rules file (and the PrometheusRule's spec)."""
    return {"groups": [{"name": "tidalmq", "rules": [a.rule() for a in ALERTS]}]}
