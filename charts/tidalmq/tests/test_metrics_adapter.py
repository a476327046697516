"""The bytes-in autoscaling pipeline as the chart renders it (docs/autoscaling.md): the metrics
adapter (prometheus-adapter: its APIService, serving certificate, rule and RBAC), when the chart
installs it, and the HPA scaling on the metric it serves."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding

from tests.support.helm import FULL, NAMESPACE, STS, container, find, find_all, pod_spec, render

pytestmark = pytest.mark.usefixtures("helm")

ADAPTER = f"{FULL}-metrics-adapter"
PROMETHEUS = "http://prometheus.monitoring.svc:9090"
METRIC = "tidalmq_broker_bytes_in_per_second"
ADAPTER_KINDS = {"ServiceAccount", "Secret", "ConfigMap", "Deployment", "Service", "APIService",
                 "ClusterRole", "ClusterRoleBinding", "RoleBinding"}  # fmt: skip


def adapter_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "metrics-adapter"
    ]


def pods_metrics(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hpa = find(docs, "HorizontalPodAutoscaler", STS)
    return [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]


def adapter_rule(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(find(docs, "ConfigMap", ADAPTER)["data"]["config.yaml"])
    assert len(config["rules"]) == 1, config
    return config["rules"][0]


@pytest.fixture(scope="module")
def with_prometheus() -> list[dict[str, Any]]:
    """The chart with the planner's Prometheus URL only: the adapter comes with it."""
    return render({"operator": {"prometheusUrl": PROMETHEUS}})


def test_without_a_prometheus_the_chart_installs_no_adapter_and_scales_on_cpu() -> None:
    docs = render()
    assert not adapter_objects(docs)
    assert not find_all(docs, "APIService")
    assert not pods_metrics(docs)


def test_a_known_prometheus_brings_the_adapter_and_the_bytes_in_metric(
    with_prometheus: list[dict[str, Any]],
) -> None:
    assert {d["kind"] for d in adapter_objects(with_prometheus)} == ADAPTER_KINDS
    args = container(find(with_prometheus, "Deployment", ADAPTER), "adapter")["args"]
    assert f"--prometheus-url={PROMETHEUS}" in args
    # the HPA: bytes-in per broker pod, beside CPU (it follows whichever asks for more brokers)
    hpa = find(with_prometheus, "HorizontalPodAutoscaler", STS)
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource", "Pods"]
    assert pods_metrics(with_prometheus)[0]["pods"] == {
        "metric": {"name": METRIC},
        "target": {"type": "AverageValue", "averageValue": "20Mi"},
    }
    # the metric the HPA asks for is the one the adapter's rule serves
    assert adapter_rule(with_prometheus)["name"]["as"] == METRIC


def test_the_adapters_own_prometheus_url_wins() -> None:
    docs = render({
        "operator": {"prometheusUrl": PROMETHEUS},
        "metricsAdapter": {"prometheusUrl": "https://thanos.monitoring.svc:10902"},
    })  # fmt: skip
    args = container(find(docs, "Deployment", ADAPTER), "adapter")["args"]
    assert "--prometheus-url=https://thanos.monitoring.svc:10902" in args
    docs = render({"metricsAdapter": {"prometheusUrl": PROMETHEUS}})  # no planner needed
    assert adapter_objects(docs) and pods_metrics(docs)


@pytest.mark.parametrize(
    ("adapter", "bytes_in", "objects", "metric"),
    [
        (False, "auto", False, False),  # another adapter may hold the APIService: CPU only
        (False, True, False, True),  # ... one that serves the metric: declared by the user
        (True, False, True, False),  # the adapter without the HPA using it
        (True, "auto", True, True),
    ],
)
def test_adapter_and_bytes_in_switches(
    adapter: bool, bytes_in: bool | str, objects: bool, metric: bool
) -> None:
    docs = render({
        "operator": {"prometheusUrl": PROMETHEUS},
        "metricsAdapter": {"enabled": adapter},
        "autoscaling": {"bytesIn": {"enabled": bytes_in}},
    })  # fmt: skip
    assert bool(adapter_objects(docs)) is objects
    assert bool(pods_metrics(docs)) is metric


def test_hpa_behaviour_scales_out_at_once_and_in_after_a_window(
    with_prometheus: list[dict[str, Any]],
) -> None:
    behavior = find(with_prometheus, "HorizontalPodAutoscaler", STS)["spec"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    # out: no stabilization, and within one 15 s sync the fleet may double (or grow by 4)
    assert up["stabilizationWindowSeconds"] == 0
    assert up["selectPolicy"] == "Max"
    assert {"type": "Percent", "value": 100, "periodSeconds": 15} in up["policies"]
    assert {"type": "Pods", "value": 4, "periodSeconds": 15} in up["policies"]
    # in: only after five minutes of lower recommendations, then one broker (drained) a minute
    assert down["stabilizationWindowSeconds"] == 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]


def test_apiservice_trusts_the_adapters_certificate_only(
    with_prometheus: list[dict[str, Any]],
) -> None:
    """No insecureSkipTLSVerify: the caBundle is the CA that signed the adapter's serving
    certificate, whose names are the adapter Service's."""
    api = find(with_prometheus, "APIService", "v1beta1.custom.metrics.k8s.io")
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == ("custom.metrics.k8s.io", "v1beta1")
    assert spec["service"] == {"name": ADAPTER, "namespace": NAMESPACE, "port": 443}
    assert "insecureSkipTLSVerify" not in spec

    ca = x509.load_pem_x509_certificate(base64.b64decode(spec["caBundle"]))
    secret = find(with_prometheus, "Secret", f"{ADAPTER}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert base64.b64decode(secret["data"]["ca.crt"]) == base64.b64decode(spec["caBundle"])
    ca.public_key().verify(  # type: ignore[union-attr,call-arg]
        cert.signature,
        cert.tbs_certificate_bytes,
        padding.PKCS1v15(),
        cert.signature_hash_algorithm,
    )
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{ADAPTER}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(
        days=365
    )
    # the Service reaches the container's port; the container serves with that certificate
    deployment = find(with_prometheus, "Deployment", ADAPTER)
    adapter = container(deployment, "adapter")
    service = find(with_prometheus, "Service", ADAPTER)
    assert service["spec"]["ports"][0]["port"] == 443
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in adapter["ports"]}
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    mounts = {m["name"]: m["mountPath"] for m in adapter["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{ADAPTER}-tls"
    assert f"--tls-cert-file={mounts['tls']}/tls.crt" in adapter["args"]
    assert f"--tls-private-key-file={mounts['tls']}/tls.key" in adapter["args"]


def test_adapter_rule_reads_what_the_brokers_export(with_prometheus: list[dict[str, Any]]) -> None:
    """The rule's series are listed from a family every broker exports from its start and valued
    from the bytes-in counter; both are the broker's (its own registry), per broker."""
    from tidalmq_broker import metrics

    rule = adapter_rule(with_prometheus)
    assert rule["seriesQuery"] == 'tidalmq_partitions_led{namespace!="",pod!=""}'
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    query = rule["metricsQuery"]
    assert "rate(tidalmq_topic_bytes_in_total{<<.LabelMatchers>>}[1m])" in query
    # a broker leading nothing yet reads 0 B/s, not "missing" (which the HPA would guess at)
    assert "or sum by (<<.GroupBy>>) (0 * tidalmq_partitions_led{<<.LabelMatchers>>})" in query
    # prometheus_client names a counter's family without _total
    assert metrics.PARTITIONS_LED._name == "tidalmq_partitions_led"
    assert metrics.PARTITIONS_LED._labelnames == ("broker",)
    assert metrics.TOPIC_BYTES_IN._name == "tidalmq_topic_bytes_in"
    assert metrics.TOPIC_BYTES_IN._type == "counter"


def test_series_labels_and_rate_window_are_values() -> None:
    docs = render({
        "operator": {"prometheusUrl": PROMETHEUS},
        "metricsAdapter": {
            "rateWindow": "2m",
            "seriesLabels": {"namespace": "kubernetes_namespace", "pod": "kubernetes_pod_name"},
        },
    })  # fmt: skip
    rule = adapter_rule(docs)
    assert rule["seriesQuery"] == (
        'tidalmq_partitions_led{kubernetes_namespace!="",kubernetes_pod_name!=""}'
    )
    assert rule["resources"]["overrides"] == {
        "kubernetes_namespace": {"resource": "namespace"},
        "kubernetes_pod_name": {"resource": "pod"},
    }
    assert "[2m]" in rule["metricsQuery"]


def test_adapter_rbac_is_read_only_and_delegates_auth(
    with_prometheus: list[dict[str, Any]],
) -> None:
    sa = {"kind": "ServiceAccount", "name": ADAPTER, "namespace": NAMESPACE}
    role = next(
        r
        for r in find_all(with_prometheus, "ClusterRole")
        if r["metadata"]["name"].endswith("metrics-adapter")
    )
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services"],
         "verbs": ["get", "list", "watch"]}
    ]  # fmt: skip
    bound = {
        b["roleRef"]["name"]: b
        for b in find_all(with_prometheus, "ClusterRoleBinding")
        + find_all(with_prometheus, "RoleBinding")
        if sa in b["subjects"]
    }
    assert set(bound) == {
        role["metadata"]["name"],
        "system:auth-delegator",
        "extension-apiserver-authentication-reader",
    }
    assert bound["extension-apiserver-authentication-reader"]["metadata"]["namespace"] == (
        "kube-system"
    )
    assert pod_spec(find(with_prometheus, "Deployment", ADAPTER))["serviceAccountName"] == ADAPTER


def test_adapter_container_is_locked_down(with_prometheus: list[dict[str, Any]]) -> None:
    adapter = container(find(with_prometheus, "Deployment", ADAPTER), "adapter")
    security = adapter["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert adapter["image"] == "tidalmq.local/prometheus-adapter:v0.12.0"
    assert adapter["resources"]["requests"]["cpu"] == "50m"


def test_cluster_scoped_names_stay_unique_in_a_long_namespace() -> None:
    """A 50-character namespace (the e2e tests' kind): truncated to 63 characters, the adapter's
    ClusterRole and bindings were named as the operator's, and the install failed."""
    from tests.support.helm import run_helm, template_args

    namespace = "e2e-test-spike-of-large-records-scales-out-o-572e31"
    args = template_args({"operator": {"prometheusUrl": PROMETHEUS}})
    args[args.index("--namespace") + 1] = namespace
    docs = [d for d in yaml.safe_load_all(run_helm(*args).stdout) if d]
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        names = [d["metadata"]["name"] for d in find_all(docs, kind)]
        assert len(names) == len(set(names)), names
        assert all(len(n) <= 63 for n in names), names
