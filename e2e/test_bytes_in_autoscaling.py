"""Bytes-in autoscaling end to end (docs/autoscaling.md): the chart's metrics adapter
(prometheus-adapter, built from its Go module) serves each broker pod's produced bytes per second
under custom.metrics.k8s.io from a real Prometheus scraping the brokers, and the chart's HPA
scales the broker StatefulSet on it.

One release, one test (each release install costs a minute of CI): `kubectl get --raw` of the
custom metrics API returns a value for the broker pod (0 while idle, the produced rate during the
spike); then the acceptance of issue V1: a spike of large records (few requests, many bytes)
scales the fleet out on bytes-in at once, the operator moves partitions onto the new broker,
and after the spike the fleet scales back in, once. Figures: time from spike to the adapter
serving the rate, to the HPA's decision and to the new broker serving partitions; the HPA's
decisions.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from e2e.kube import Cluster, RecordFigure, wait_until
from e2e.producing import RecordLoad
from e2e.prometheus import prometheus_manifests
from e2e.tidalmq_release import (
    STS,
    bootstrap,
    installed_release,
    ready,
    topic_status,
)

METRIC = "tidalmq_broker_bytes_in_per_second"
RECORD_BYTES = 256 * 1024  # large records: a few requests per second carry MiBs


QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|Ki|Mi|Gi)?$")
FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: str) -> float:
    """A Kubernetes quantity (the custom metrics API's values: "123456m", "2Mi", ...)."""
    match = QUANTITY.match(text)
    assert match, text
    return float(match.group(1)) * FACTORS[match.group(2)]


def bytes_in_per_pod(cluster: Cluster, ns: str) -> dict[str, float]:
    """The custom metrics API's bytes-in of each broker pod, through the aggregation layer."""
    raw = cluster.kubectl(
        "get", "--raw", f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{METRIC}"
    )
    return {
        item["describedObject"]["name"]: quantity(item["value"])
        for item in json.loads(raw)["items"]
    }


def large_records(servers: str, topic: str, bytes_per_s: int) -> RecordLoad:
    """Records of RECORD_BYTES at a fixed byte rate to one topic, until stopped."""
    return RecordLoad(
        {
            "bootstrap.servers": servers,
            "acks": "all",
            "linger.ms": 5,
            "message.max.bytes": 4 * RECORD_BYTES,
            "topic.metadata.refresh.interval.ms": 2000,
        },
        topic,
        b"x" * RECORD_BYTES,
        {None: max(1, round(bytes_per_s / RECORD_BYTES / 10))},  # 10 steps a second
    )


def create_topic(cluster: Cluster, ns: str, name: str, partitions: int) -> None:
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": name},
                "spec": {"partitions": partitions},
            }
        ),
        ns,
    )
    wait_until(f"Topic {name} Ready", lambda: ready(topic_status(cluster, ns, name)), timeout=180)


def leaders(cluster: Cluster, ns: str, topic: str) -> dict[int, int]:
    return {p["partition"]: p["broker"] for p in topic_status(cluster, ns, topic)["partitions"]}


def adapter_values(ns: str) -> list[str]:
    """The adapter on the test's Prometheus: a rate window of six scrapes, a short relist."""
    return [
        "--set",
        f"metricsAdapter.prometheusUrl=http://prometheus.{ns}.svc:9090",
        "--set",
        "metricsAdapter.rateWindow=30s",
        "--set",
        "metricsAdapter.relistInterval=10s",
    ]


@pytest.fixture
def prometheus(cluster: Cluster, namespace: str, prometheus_image: str) -> Iterator[None]:
    cluster.apply(prometheus_manifests(prometheus_image, namespace), namespace)
    yield


def hpa_state(cluster: Cluster, ns: str) -> tuple[int, float | None]:
    """(the StatefulSet's spec.replicas, the HPA's current bytes-in per pod or None)."""
    sts = cluster.kubectl_json("-n", ns, "get", "statefulset", STS)
    hpa = cluster.kubectl_json("-n", ns, "get", "hpa", STS)
    current = None
    for metric in hpa.get("status", {}).get("currentMetrics") or []:
        if metric.get("type") == "Pods" and metric["pods"]["metric"]["name"] == METRIC:
            current = quantity(metric["pods"]["current"]["averageValue"])
    return sts["spec"]["replicas"], current


def hpa_decisions(cluster: Cluster, ns: str) -> list[str]:
    """The HPA's SuccessfulRescale events, oldest first ("New size: 2; reason: ...")."""
    events = cluster.kubectl_json(
        "-n",
        ns,
        "get",
        "events",
        "--field-selector",
        f"involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={STS}",
    )
    rescales = [e for e in events["items"] if e.get("reason") == "SuccessfulRescale"]
    rescales.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [e["message"] for e in rescales]


TARGET = 1024 * 1024  # bytes-in per broker the HPA aims at
SPIKE = 3 * TARGET  # the spike asks for 3 brokers; maxReplicas holds it at 2


def apiservice_available(cluster: Cluster) -> bool:
    api = cluster.kubectl_json("get", "apiservice", "v1beta1.custom.metrics.k8s.io")
    conditions = api.get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


@pytest.mark.timeout(900)
def test_spike_of_large_records_scales_out_on_bytes_in_and_back_in_once(
    cluster: Cluster, namespace: str, minio: str, prometheus: None, figures: RecordFigure
) -> None:
    ns = namespace
    hpa = [
        "--set",
        "autoscaling.enabled=true",
        "--set",
        "broker.replicas=1",
        "--set",
        "autoscaling.minReplicas=1",
        "--set",
        "autoscaling.maxReplicas=2",
        # CPU stays a metric, at the request (250m): the spike is bytes, not requests
        "--set",
        "broker.resources.requests.cpu=250m",
        "--set",
        "autoscaling.targetCPUUtilizationPercentage=100",
        "--set",
        f"autoscaling.bytesIn.targetAverageValue={TARGET}",
        # the chart's scale-in, with a 20 s window instead of 5 minutes (the test's length)
        "--set",
        "autoscaling.behavior.scaleDown.stabilizationWindowSeconds=20",
        "--set",
        "autoscaling.behavior.scaleDown.policies[0].type=Pods",
        "--set",
        "autoscaling.behavior.scaleDown.policies[0].value=1",
        "--set",
        "autoscaling.behavior.scaleDown.policies[0].periodSeconds=15",
    ]
    with installed_release(cluster, ns, minio, *adapter_values(ns), *hpa):
        # the chart registered its adapter behind the aggregation layer, and it is Available
        api = cluster.kubectl_json("get", "apiservice", "v1beta1.custom.metrics.k8s.io")
        assert api["spec"]["service"]["namespace"] == ns
        wait_until(
            "the custom metrics APIService to be Available",
            lambda: apiservice_available(cluster),
            timeout=120,
        )
        # the idle broker pod has a value (0 B/s) through `kubectl get --raw`
        idle = wait_until(
            "the adapter to serve the broker pod's bytes-in",
            lambda: (v := bytes_in_per_pod(cluster, ns)).keys() == {f"{STS}-0"} and v,
            timeout=120,
            interval=3,
        )
        assert idle == {f"{STS}-0": 0}, idle
        create_topic(cluster, ns, "spike", 4)
        wait_until(
            "the HPA to read the broker's bytes-in",
            lambda: hpa_state(cluster, ns)[1] is not None,
            timeout=180,
            interval=3,
        )
        assert hpa_state(cluster, ns)[0] == 1
        assert set(leaders(cluster, ns, "spike").values()) == {0}
        with large_records(bootstrap(cluster, ns), "spike", SPIKE) as load:
            spiked = time.monotonic()
            served = wait_until(
                "the adapter to serve the broker's bytes-in above the HPA's target",
                lambda: (v := bytes_in_per_pod(cluster, ns)).get(f"{STS}-0", 0) > TARGET and v,
                timeout=120,
                interval=2,
            )
            visible_s = time.monotonic() - spiked
            assert served[f"{STS}-0"] < 2 * SPIKE, served
            wait_until(
                "the HPA to scale the brokers out on bytes-in",
                lambda: hpa_state(cluster, ns)[0] == 2,
                timeout=180,
                interval=2,
            )
            out_s = time.monotonic() - spiked
            wait_until(
                "partitions to move onto the new broker",
                lambda: 1 in leaders(cluster, ns, "spike").values(),
                timeout=180,
                interval=2,
            )
            moved_s = time.monotonic() - spiked
            # the new broker serves: records are appended there (its bytes-in, via the adapter)
            both = wait_until(
                "the new broker to append records (its bytes-in through the adapter)",
                lambda: (v := bytes_in_per_pod(cluster, ns)).get(f"{STS}-1", 0) > 0 and v,
                timeout=120,
                interval=2,
            )
            serving_s = time.monotonic() - spiked
            decisions = hpa_decisions(cluster, ns)
        assert not load.errors, load.errors[:3]
        assert load.acked > 0
        # the scale-out was the bytes-in metric's doing
        assert decisions and METRIC in decisions[-1] and "above target" in decisions[-1], decisions
        stopped = time.monotonic()
        sizes = [2]

        def scaled_in() -> bool:
            size = hpa_state(cluster, ns)[0]
            if size != sizes[-1]:
                sizes.append(size)
            return size == 1

        wait_until("the fleet to scale back in after the spike", scaled_in, timeout=300, interval=2)
        in_s = time.monotonic() - stopped
        # once: straight back to the minimum, no out-in-out flapping while the rate decays
        time.sleep(20)
        scaled_in()
        assert sizes == [2, 1], sizes
        wait_until(
            "the partitions to be led by the remaining broker",
            lambda: set(leaders(cluster, ns, "spike").values()) == {0},
            timeout=60,
        )
        decisions = hpa_decisions(cluster, ns)
        figures(
            "bytes_in_visible_s",
            round(visible_s, 1),
            f"spike to the adapter serving more than the {TARGET} B/s target (scrape 5s, window 30s)",
        )
        figures(
            "bytes_in_per_pod",
            {k: round(v) for k, v in both.items()},
            f"B/s through kubectl get --raw, {SPIKE} B/s offered, once both serve",
        )
        figures(
            "spike_to_scale_out_s",
            round(out_s, 1),
            f"{SPIKE} B/s of {RECORD_BYTES} B records against a {TARGET} B/s target: the "
            "HPA's decision (HPA sync 15s)",
        )
        figures(
            "spike_to_new_broker_serving_s",
            round(serving_s, 1),
            "until the new broker appends records (pod started, registered, partition moved, "
            "producer redirected, two scrapes)",
        )
        figures(
            "spike_to_partition_on_new_broker_s",
            round(moved_s, 1),
            "until the Topic's status names the new broker for a partition",
        )
        figures(
            "lull_to_scale_in_s",
            round(in_s, 1),
            "after the spike stops: rate decay + 20 s stabilization + the drain",
        )
        figures("hpa_decisions", decisions, "the HPA's SuccessfulRescale events")
