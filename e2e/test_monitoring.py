"""The chart's dashboards and alerts against a real Prometheus in the Kubernetes cluster
(docs/dashboards-and-alerts.md), the acceptance of issue #23 on the end-to-end cluster.

A Prometheus (e2e/prometheus.py) scrapes the release's broker pods, its operator (which hosts
the controller) and the cluster's kube-state-metrics add-on (the HPA series), and loads the
chart's rules file (charts/tidalmq/monitoring/alerts.rules.yaml) as a rule file, so Prometheus
itself evaluates every alert (its `for:` shortened to SHORT_FOR, everything else byte-identical
to the shipped file). The release's HPA is enabled, pinned at the two brokers the test relies
on (minReplicas = maxReplicas = 2), so kube-state-metrics' HPA series exist and
TidalMQBrokersAtMaxReplicas fires for it. The release also has a SASL listener beside the
PLAINTEXT one, per-partition lag series, and compaction and retention within seconds
(RELEASE_SETTINGS).

Provoked, in order:
- produce, consume (a group that lags), a partition move;
- every alert loaded and healthy (`/api/v1/rules`: health ok, no lastError);
- the HPA at its maximum: TidalMQBrokersAtMaxReplicas fires;
- the lagging group stays stopped while a producer goes on: TidalMQConsumerLagGrowing fires for
  that group and topic;
- the events whose series exist only once they happen: a StaticTopic with records, one logic
  queue remapped in availability order; records in a topic of 1 s retention (compacted, then
  deleted); a partition's checkpoint deleted from the store and its broker killed: the
  partition is lost (not served), TidalMQPartitionDataLost fires and the Topic is Degraded
  (DataLost) until the end; a SCRAM login as nobody on the SASL listener; a forged control
  call to each broker and to the controller (401);
- with an idempotent producer writing to a second topic throughout:
  - a broker's process frozen (SIGSTOP, sent inside its pod: it neither heartbeats nor answers
    scrapes, as a hung or partitioned broker): the controller declares it dead after the session
    timeout and TidalMQBrokerFenced fires, then TidalMQBrokerUnreachable for its pod alone;
    continued (SIGCONT), the broker re-registers, is scraped again and TidalMQBrokerUnreachable
    resolves (TidalMQBrokerFenced covers the 10 minutes after a fencing: not waited for);
  - the object store made unwritable (the data bucket's directories in the chart's MinIO made
    read-only for the MinIO process: every PUT into it fails, reads and the metadata bucket
    work; appends and produce requests fail): TidalMQObjectStoreUnwritable fires for both
    brokers; the directories writable again, it resolves;
  - every record the producer had acknowledged is read back, once, at its offset.
Then every dashboard query (panels and variables, variables at All) and every alert expression
runs without error, and every dashboard query returns data (tests/support/monitoring_queries.py,
shared with the integration test, also checks that a query has data exactly when every metric
it names is exported); the coverage is recorded as figures. Last, the loss is accepted (the
documented annotation) and the Topic is Ready again. The integration test tests/integration/chart/test_alerts_fire.py
provokes the other alerts on a local cluster.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from e2e.kube import Cluster, RecordFigure, wait_until
from e2e.producing import RateProducer, verify
from e2e.prometheus import SCRAPE, prometheus_manifests, prometheus_url
from e2e.tidalmq_release import (
    BUCKET,
    FULL,
    STS,
    bootstrap,
    broker_pods,
    installed_release,
    object_store,
    ready,
    release_pods,
    stored_objects,
    topic_status,
)
from observability.generate import OUT
from tests.support.monitoring_queries import (
    active_alerts,
    check_queries,
    evaluate,
    lagging_group,
    rule_failures,
    rules,
    short_for,
    targets,
)

RULES = OUT / "alerts.rules.yaml"
TOPIC = "monitored"
GROUP = "dashboards"
LEDGER = "ledger"  # written by an idempotent producer through the broker and store failures
# $__rate_interval: Grafana makes it at least four scrape intervals (20 s at 5 s); 30 s, as the
# bytes-in adapter's window, keeps two samples in it when a scrape lands late on a busy node
RATE_INTERVAL = "30s"
SHORT_FOR = "10s"  # two evaluations at the e2e Prometheus' 5 s
HPA_AT_TWO = [
    "--set",
    "autoscaling.enabled=true",
    "--set",
    "autoscaling.minReplicas=2",
    "--set",
    "autoscaling.maxReplicas=2",
]
HPA_DESIRED = "kube_horizontalpodautoscaler_status_desired_replicas"
STATIC = "ledger-static"  # a static topic, one of its logic queues remapped
EXPIRING = "expiring"  # a topic whose segments retention deletes within seconds
SASL_PORT = 9095
BROKER_CONTROL_PORT = 9645  # the chart's broker.ports.control
CONTROLLER_PORT = 9690  # the chart's operator.ports.controller
# The release's settings the dashboards need beyond the defaults here:
# - a second Kafka listener, SASL_PLAINTEXT (SCRAM) on SASL_PORT, beside the PLAINTEXT one the
#   test's clients use: the authentication failures panel has something to count (a PLAINTEXT
#   listener cannot fail a login). No authorizer: the PLAINTEXT clients stay anonymous, as they
#   are without the second listener.
# - the per-partition consumer lag series (off by default: one series per group and partition;
#   the "furthest behind" panel reads them);
# - compaction of WAL ranges 5 s old (default 60 s) and retention checked every 2 s (30 s):
#   compactions, retention and the garbage they leave happen within the test.
BROKER_ENV = {
    "TIDALMQ_LISTENERS": f"PLAINTEXT://0.0.0.0:9092,SASL_PLAINTEXT://0.0.0.0:{SASL_PORT}",
    "TIDALMQ_ADVERTISED_LISTENERS": (
        f"PLAINTEXT://$(POD_IP):9092,SASL_PLAINTEXT://$(POD_IP):{SASL_PORT}"
    ),
    "TIDALMQ_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-512",
    "TIDALMQ_CONSUMER_LAG_PARTITION_METRICS": "true",
    "TIDALMQ_COMPACTION_IDLE_S": "5",
    "TIDALMQ_RETENTION_CHECK_INTERVAL_S": "2",
}
RELEASE_SETTINGS = [
    "--set",
    "authorization.authorizer=none",
    "--set-json",
    "broker.extraEnv=" + json.dumps([{"name": k, "value": v} for k, v in BROKER_ENV.items()]),
]
VANISHING = "vanishing"  # a topic one of whose partitions loses its checkpoint
# An alert's metric no listener here exports: the expiry of a TLS listener's certificate (this
# release's listeners are PLAINTEXT and SASL_PLAINTEXT). Its alert's expression runs (checked).
ALERT_METRICS_NOT_EXPORTED = {"tidalmq_tls_certificate_expiry_timestamp_seconds"}


def create_topic(
    cluster: Cluster, ns: str, name: str, configs: dict[str, str] | None = None
) -> None:
    spec: dict[str, Any] = {"partitions": 2}
    if configs:
        spec["configs"] = configs
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": name},
                "spec": spec,
            }
        ),
        ns,
    )
    wait_until(f"Topic {name} Ready", lambda: ready(topic_status(cluster, ns, name)), timeout=180)


def leaders(cluster: Cluster, ns: str) -> dict[int, int]:
    return {p["partition"]: p["broker"] for p in topic_status(cluster, ns, TOPIC)["partitions"]}


def traffic(cluster: Cluster, ns: str) -> None:
    """Records in and out, a consumer group's committed offsets behind the end, one move."""
    create_topic(cluster, ns, TOPIC)
    servers = bootstrap(cluster, ns)
    lagging_group(servers, TOPIC, GROUP, 60)
    target = 1 - leaders(cluster, ns)[0]  # the brokers are 0 and 1 (their pods' ordinals)
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "PartitionReassignment",
                "metadata": {"name": "move-monitored"},
                "spec": {"partitions": [{"topic": TOPIC, "partition": 0, "replicas": [target]}]},
            }
        ),
        ns,
    )
    wait_until("partition 0 to move", lambda: leaders(cluster, ns).get(0) == target, timeout=120)


def static_topic_remapped(cluster: Cluster, ns: str) -> None:
    """A StaticTopic of two logic queues with records in both, then logic queue 0 remapped to
    the other broker in availability order (the CRD's default mode): the mapping's epoch and
    consistency, a remap and its unavailability, the logic offsets it skips."""
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "StaticTopic",
                "metadata": {"name": STATIC},
                "spec": {"totalQueues": 2},
            }
        ),
        ns,
    )

    def status() -> dict[str, Any]:
        found: dict[str, Any] = (
            cluster.kubectl_json("-n", ns, "get", "statictopic", STATIC).get("status") or {}
        )
        return found

    wait_until(f"StaticTopic {STATIC} Ready", lambda: ready(status()), timeout=180)
    producer = Producer({"bootstrap.servers": bootstrap(cluster, ns), "linger.ms": 5})
    for i in range(100):
        producer.produce(STATIC, b"s" * 100, partition=i % 2)
    assert producer.flush(60) == 0
    before = next(q for q in status()["queues"] if q["queue"] == 0)
    target = 1 - before["broker"]
    remap = {"spec": {"remap": [{"queue": 0, "broker": target}]}}
    cluster.kubectl(
        "-n", ns, "patch", "statictopic", STATIC, "--type", "merge", "-p", json.dumps(remap)
    )

    def remapped() -> bool:
        now = status()
        queue = next(q for q in now.get("queues", []) if q["queue"] == 0)
        return ready(now) and queue.get("broker") == target and queue["gen"] > before["gen"]

    wait_until(f"logic queue 0 of {STATIC} remapped to broker {target}", remapped, timeout=120)


def expiring_records(cluster: Cluster, ns: str) -> None:
    """Records in a topic whose retention is a second: compacted into segments once their WAL
    ranges are 5 s old (the release's setting), which retention then deletes. Records in
    VANISHING too (partition_data_lost)."""
    create_topic(cluster, ns, EXPIRING, {"retention.ms": "1000"})
    create_topic(cluster, ns, VANISHING)
    producer = Producer({"bootstrap.servers": bootstrap(cluster, ns), "linger.ms": 5})
    for i in range(100):
        producer.produce(EXPIRING, b"e" * 100, partition=i % 2)
        producer.produce(VANISHING, b"v" * 100, partition=i % 2)
    assert producer.flush(60) == 0


def partition_data_lost(cluster: Cluster, ns: str, prom: str, figures: RecordFigure) -> None:
    """The checkpoint of partition 0 of VANISHING (records acknowledged long before, so its
    broker has nothing left to write for it) deleted from the store, as a mistaken cleanup or a
    lifecycle rule would, then its broker's process killed (SIGKILL: no clean close writes a
    new checkpoint). Whichever broker opens the partition next, its restarted self or the other
    one, finds it lost and does not serve it: the missing offsets gauge, the Topic Degraded
    (DataLost), TidalMQPartitionDataLost fires. The loss stays until accepted (at the end of
    the test). Done before the events whose counters live in the brokers (a killed broker's
    start at 0 again)."""
    leader = next(
        p["broker"]
        for p in topic_status(cluster, ns, VANISHING)["partitions"]
        if p["partition"] == 0
    )
    prefix = f"partitions/{VANISHING}/"
    (checkpoint,) = [k for k in stored_objects(cluster, ns, prefix) if k.endswith("/0/checkpoint")]
    pod = f"{STS}-{leader}"
    signal_broker(cluster, ns, pod, "SIGSTOP")  # frozen, it writes no checkpoint any more
    object_store(cluster, ns).delete_object(Bucket=BUCKET, Key=checkpoint)
    started = time.monotonic()
    signal_broker(cluster, ns, pod, "SIGKILL")
    figures(
        "data_lost_alert_fired_after_s",
        wait_firing(prom, "TidalMQPartitionDataLost", started, namespace=ns),
        f"a partition's checkpoint deleted, its broker killed; for: {SHORT_FOR}, scrape {SCRAPE}",
    )
    wait_until(
        f"Topic {VANISHING} Degraded (DataLost)",
        lambda: any(
            c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "DataLost"
            for c in topic_status(cluster, ns, VANISHING).get("conditions", [])
        ),
        timeout=60,
    )
    # the killed broker back (its container restarted) and scraped, its pod's alert resolved
    broker_pods_ready(cluster, ns)
    wait_until(
        "the killed broker to be scraped again, TidalMQBrokerUnreachable resolved",
        lambda: all_up(prom) and not active_alerts(prom, "TidalMQBrokerUnreachable"),
        timeout=120,
        interval=2,
    )


def broker_pods_ready(cluster: Cluster, ns: str) -> None:
    """Until every broker pod of the release is ready (a frozen or killed one back)."""
    wait_until(
        "the broker pods to be ready",
        lambda: all(
            p["ready"] for p in release_pods(cluster, ns).values() if p["component"] == "broker"
        ),
        timeout=120,
    )


def accept_the_loss(cluster: Cluster, ns: str) -> None:
    """The documented recovery (the accept-data-loss annotation): VANISHING is Ready again."""
    cluster.kubectl(
        "-n", ns, "annotate", "--overwrite", "topic", VANISHING, "tidalmq.io/accept-data-loss=true"
    )
    wait_until(
        f"Topic {VANISHING} Ready after the accepted loss",
        lambda: ready(topic_status(cluster, ns, VANISHING)),
        timeout=180,
    )


def failed_login(cluster: Cluster, ns: str) -> None:
    """A SCRAM login as a user that does not exist, on a broker's SASL listener: refused (the
    client never gets metadata)."""
    ip = broker_pods(cluster, ns)[0]["status"]["podIP"]
    admin = AdminClient(
        {
            "bootstrap.servers": f"{ip}:{SASL_PORT}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "intruder",
            "sasl.password": "guessed",
            "reconnect.backoff.ms": 1000,  # a few attempts, not hundreds
            "reconnect.backoff.max.ms": 1000,
        }
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    del admin


def forged_control_call(address: str) -> int:
    """The HTTP status of a control call to `address` with a forged token and no client
    certificate (the control plane serves HTTPS with mTLS here)."""
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE  # who answers does not matter: it must refuse
    request = urllib.request.Request(
        f"https://{address}/v1/metadata", headers={"Authorization": "Bearer forged"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=tls) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def control_calls_refused(cluster: Cluster, ns: str) -> None:
    """A forged control call to each broker's control port and one to the controller (the
    operator's Service): each refused with 401."""
    brokers = [p["status"]["podIP"] for p in broker_pods(cluster, ns)]
    operator = cluster.kubectl_json("-n", ns, "get", "service", f"{FULL}-operator")
    for address in (
        *(f"{ip}:{BROKER_CONTROL_PORT}" for ip in brokers),
        f"{operator['spec']['clusterIP']}:{CONTROLLER_PORT}",
    ):
        assert forged_control_call(address) == 401, address


# Signals the broker's process inside its pod: the pod's PID 1 is tini, whose one child is the
# broker (a process exec'd into the pod has no parent there). Portable to any cluster (kubectl
# exec); a signal to PID 1 itself would be ignored by the kernel.
SIGNAL_BROKER = """
import os, signal, sys
def parent(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    except FileNotFoundError:  # ended since the listing
        return None
broker = [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1" and parent(p) == 1]
assert len(broker) == 1, broker
os.kill(broker[0], getattr(signal, sys.argv[1]))
"""


def signal_broker(cluster: Cluster, ns: str, pod: str, signal_name: str) -> None:
    cluster.kubectl(
        "-n", ns, "exec", pod, "-c", "broker", "--", "python3", "-c", SIGNAL_BROKER, signal_name
    )


def object_store_pod(cluster: Cluster, ns: str) -> str:
    return next(
        name
        for name, pod in release_pods(cluster, ns).items()
        if pod["component"] == "object-store" and pod["ready"]
    )


def bucket_writable(cluster: Cluster, ns: str, pod: str, writable: bool) -> None:
    """The data bucket's directory tree (MinIO's data directory holds a bucket as a directory,
    an object as a directory named by its key) writable by its owner, the MinIO process, or
    not: a PUT into the bucket creates or renames into one of those directories, a GET only
    reads. Until no directory is left in the other state (one created or removed while chmod
    walks the tree is seen by the next pass)."""
    mode, left = ("u+w", "! -perm -u+w") if writable else ("a-w", "-perm -u+w")
    bucket = f"/data/{BUCKET}"
    walk = f"chmod -R {mode} {bucket} 2>/dev/null; find {bucket} -type d {left} 2>/dev/null"
    wait_until(
        f"the data bucket {'writable' if writable else 'read-only'}",
        lambda: (
            not cluster.kubectl(
                "-n", ns, "exec", pod, "-c", "minio", "--", "sh", "-c", walk
            ).strip()
        ),
        timeout=60,
        interval=1,
    )


def firing(prom: str, alertname: str, **labels: str) -> list[dict[str, Any]]:
    return [a for a in active_alerts(prom, alertname, **labels) if a["state"] == "firing"]


def wait_firing(
    prom: str,
    alertname: str,
    since: float,
    *,
    timeout: float = 120,
    interval: float = 1,
    each: tuple[str, set[str]] | None = None,
    **labels: str,
) -> float:
    """Until `alertname` fires with `labels` (with `each` = (label, values): an alert for each
    of those values); the seconds since `since` (time.monotonic()), for a figure."""
    what = ", ".join(f"{k}={v}" for k, v in labels.items())
    if each is not None:
        what += f"{', ' if what else ''}each {each[0]} of {sorted(each[1])}"

    def fires() -> bool:
        alerts = firing(prom, alertname, **labels)
        if each is None:
            return bool(alerts)
        return {a["labels"].get(each[0]) for a in alerts} == each[1]

    wait_until(f"{alertname} to fire ({what})", fires, timeout=timeout, interval=interval)
    return round(time.monotonic() - since, 1)


def all_up(prom: str) -> dict[str, str]:
    """The targets once they are the two brokers, the operator and kube-state-metrics, all up
    (else ValueError naming each target's health and last error: wait_until shows the last
    one)."""
    found = targets(prom)
    jobs = sorted(name.split()[0] for name in found)
    expected = ["kube-state-metrics", "tidalmq-brokers", "tidalmq-brokers", "tidalmq-operator"]
    if jobs != expected or set(found.values()) != {"up"}:
        raise ValueError(found)
    return found


@pytest.mark.timeout(900)  # the first run of a session may build the add-on images
def test_every_dashboard_query_and_alert_runs_on_the_clusters_prometheus(
    cluster: Cluster, namespace: str, minio: str, prometheus_image: str, figures: RecordFigure
) -> None:
    ns = namespace
    hpa = f'namespace="{ns}", horizontalpodautoscaler="{STS}"'
    cluster.apply(
        prometheus_manifests(
            prometheus_image,
            ns,
            operator=True,
            kube_state_metrics=True,
            rule_files={RULES.name: short_for(RULES.read_text(), SHORT_FOR)},
        ),
        ns,
    )
    # this test's Prometheus alone: the bytes-in adapter has its own test. The HPA on CPU,
    # held at the two brokers (release_values turns it off).
    with installed_release(
        cluster,
        ns,
        minio,
        *HPA_AT_TWO,
        "--set",
        "metricsAdapter.enabled=false",
        *RELEASE_SETTINGS,
    ):
        installed = time.monotonic()
        prom = prometheus_url(cluster, ns)
        traffic(cluster, ns)
        # two brokers, the operator and kube-state-metrics scraped (a target's lastError says why
        # not)
        wait_until(
            "Prometheus to scrape both brokers, the operator and kube-state-metrics",
            lambda: all_up(prom),
            timeout=120,
            interval=3,
        )
        wait_until(
            "Prometheus to hold the topic's partitions",
            lambda: evaluate(
                prom, f'count(tidalmq_partition_leader_epoch{{topic="{TOPIC}"}}) == 2'
            )[1],
            timeout=120,
            interval=3,
        )
        # the HPA controller has set the release's HPA's status (its sync period is 15 s)
        wait_until(
            "Prometheus to hold the broker HPA's desired replicas",
            lambda: evaluate(prom, f"{HPA_DESIRED}{{{hpa}}} == 2")[1],
            timeout=120,
            interval=3,
        )

        # every alert is loaded and evaluated by Prometheus (health "unknown" until then), healthy
        wait_until(
            "every alert rule to be evaluated",
            lambda: all(r.get("health") != "unknown" for r in rules(prom).values()),
            timeout=60,
            interval=3,
        )
        assert not rule_failures(rules(prom)), rule_failures(rules(prom))

        # the HPA at its maximum (by construction here): the alert fires for it
        figures(
            "brokers_at_max_replicas_alert_fired_after_s",
            wait_firing(
                prom,
                "TidalMQBrokersAtMaxReplicas",
                installed,
                timeout=60,
                interval=2,
                namespace=ns,
                horizontalpodautoscaler=STS,
            ),
            "HPA minReplicas = maxReplicas = 2, since the release was installed (HPA sync 15 s, "
            f"for: {SHORT_FOR})",
        )

        # a consumer group stopped while producing goes on: its lag grows and the alert fires
        producer = RateProducer(bootstrap(cluster, ns), TOPIC, rate=20).start()
        try:
            figures(
                "lag_growing_alert_fired_after_s",
                wait_firing(
                    prom,
                    "TidalMQConsumerLagGrowing",
                    time.monotonic(),
                    timeout=180,
                    interval=3,
                    group=GROUP,
                    topic=TOPIC,
                ),
                f"producing 20 records/s to a stopped group; for: {SHORT_FOR}, scrape {SCRAPE}",
            )
        finally:
            producer.stop()

        # the events whose series only exist once they happened (the lag alert's step comes
        # first: a minute later the group's first lag alone has fired it)
        static_topic_remapped(cluster, ns)
        expiring_records(cluster, ns)
        partition_data_lost(cluster, ns, prom, figures)
        failed_login(cluster, ns)
        control_calls_refused(cluster, ns)

        create_topic(cluster, ns, LEDGER)
        ledger = RateProducer(bootstrap(cluster, ns), LEDGER, rate=20).start()
        try:
            broker_frozen_then_continued(cluster, ns, prom, figures)
            store_unwritable_then_writable(cluster, ns, prom, figures)
        except BaseException:
            ledger.abandon()
            raise
        ledger.stop()
        verify(bootstrap(cluster, ns), LEDGER, ledger)
        figures("ledger_records_acknowledged_and_read_back", ledger.sent, "through both failures")

        every_query_has_data(prom, figures)
        accept_the_loss(cluster, ns)


def every_query_has_data(prom: str, figures: RecordFigure) -> None:
    """After everything the test provoked: every dashboard query and alert expression runs
    without error, and every dashboard query has data. A series that appeared moments ago has
    one sample in a rate window: checked again every 5 s for up to 75 s."""
    started = time.monotonic()
    coverage = check_queries(prom, RATE_INTERVAL)
    while (coverage.failures or coverage.no_data) and time.monotonic() - started < 75:
        time.sleep(5)
        coverage = check_queries(prom, RATE_INTERVAL)
    figures(
        "dashboard_queries_with_data",
        f"{len(coverage.data)} of {len(coverage.data) + len(coverage.no_data)}",
        f"scrape {SCRAPE}, $__rate_interval {RATE_INTERVAL}; after the events the test provokes",
    )
    figures(
        "dashboard_queries_without_data",
        coverage.no_data,
        "query -> the metrics it names that nothing in this cluster exports",
    )
    figures("alert_metrics_not_exported", coverage.alert_metrics_missing)
    figures("query_checks_s", round(time.monotonic() - started, 1), "until every one passed")
    print("\n" + coverage.report())
    assert not coverage.failures, "\n".join(coverage.failures)
    assert not coverage.no_data, coverage.report()
    assert set(coverage.alert_metrics_missing) == ALERT_METRICS_NOT_EXPORTED, coverage.report()


def broker_frozen_then_continued(
    cluster: Cluster, ns: str, prom: str, figures: RecordFigure
) -> None:
    """A broker's process frozen: TidalMQBrokerFenced and TidalMQBrokerUnreachable fire;
    continued, the broker is back and the second resolves."""
    pod = f"{STS}-1"
    signal_broker(cluster, ns, pod, "SIGSTOP")
    started = time.monotonic()
    try:
        figures(
            "broker_fenced_alert_fired_after_s",
            wait_firing(prom, "TidalMQBrokerFenced", started, namespace=ns),
            f"a broker frozen (SIGSTOP); for: 0m, scrape {SCRAPE}",
        )
        figures(
            "broker_unreachable_alert_fired_after_s",
            wait_firing(prom, "TidalMQBrokerUnreachable", started, namespace=ns, pod=pod),
            f"a broker frozen (SIGSTOP); for: {SHORT_FOR}, scrape {SCRAPE}",
        )
        assert [a["labels"]["pod"] for a in active_alerts(prom, "TidalMQBrokerUnreachable")] == [
            pod
        ]
    finally:
        signal_broker(cluster, ns, pod, "SIGCONT")
    started = time.monotonic()
    # back: scraped again, its pod ready (it re-registered: /readyz), the topics served
    wait_until(
        "TidalMQBrokerUnreachable to resolve",
        lambda: not active_alerts(prom, "TidalMQBrokerUnreachable"),
        timeout=120,
        interval=1,
    )
    figures("broker_unreachable_alert_resolved_after_s", round(time.monotonic() - started, 1))
    wait_until(
        "the continued broker to be scraped again", lambda: all_up(prom), timeout=120, interval=2
    )
    broker_pods_ready(cluster, ns)
    wait_until(
        "both Topics Ready",
        lambda: all(ready(topic_status(cluster, ns, t)) for t in (TOPIC, LEDGER)),
        timeout=120,
    )
    figures("broker_continued_back_after_s", round(time.monotonic() - started, 1))


def store_unwritable_then_writable(
    cluster: Cluster, ns: str, prom: str, figures: RecordFigure
) -> None:
    """The data bucket read-only: TidalMQObjectStoreUnwritable fires for both brokers and
    resolves once it is writable again."""
    pod = object_store_pod(cluster, ns)
    bucket_writable(cluster, ns, pod, False)
    started = time.monotonic()
    try:
        figures(
            "store_unwritable_alert_fired_after_s",
            wait_firing(
                prom,
                "TidalMQObjectStoreUnwritable",
                started,
                interval=2,
                each=("broker", {"0", "1"}),
            ),
            f"the data bucket read-only; for: {SHORT_FOR}, scrape {SCRAPE}",
        )
    finally:
        bucket_writable(cluster, ns, pod, True)
    started = time.monotonic()
    wait_until(
        "TidalMQObjectStoreUnwritable to resolve",
        lambda: not active_alerts(prom, "TidalMQObjectStoreUnwritable"),
        timeout=120,
        interval=2,
    )
    figures("store_unwritable_alert_resolved_after_s", round(time.monotonic() - started, 1))
