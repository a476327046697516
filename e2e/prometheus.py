"""A real Prometheus in the end-to-end cluster, next to a TidalMQ release in the same namespace:
the one the bytes-in autoscaling, the planner and the monitoring tests deploy (the add-on image
of e2e/images/prometheus: Debian's package).

Debian's Prometheus has no Kubernetes service discovery, so it finds the pods through DNS:
- the brokers through the SRV records of the chart's headless Service (its `http` port, which
  serves /metrics): each names a broker pod's host name, which is its pod name;
- with `operator=True`, the operator (which hosts the controller) through its Service's metrics
  port (the Service selects the active replica).
- with `kube_state_metrics=True`, the cluster's kube-state-metrics add-on (kube-system,
  e2e/cluster/manifests/kube-state-metrics.yaml: the HPA series) through its headless Service;
  its series keep their own `namespace` label, the HPA's (honor_labels).
Every TidalMQ series gets the `namespace` and `pod` labels that the Prometheus Operator and Kubernetes
service discovery put on it (the metrics adapter maps series to pods through them).
`rule_files` (file name -> content) are mounted next to prometheus.yml and evaluated every scrape.
"""

from __future__ import annotations

import json
from typing import Any

from e2e.kube import Cluster
from e2e.tidalmq_release import FULL

SCRAPE = "5s"
OPERATOR_METRICS_PORT = 9691  # the chart's operator.ports.metrics
CONFIG_DIR = "/etc/prometheus-e2e"
KUBE_STATE_METRICS = "kube-state-metrics.kube-system.svc.cluster.local"
KUBE_STATE_METRICS_PORT = 8080


def prometheus_manifests(
    image: str,
    ns: str,
    *,
    operator: bool = False,
    kube_state_metrics: bool = False,
    rule_files: dict[str, str] | None = None,
) -> str:
    """The ConfigMap, Deployment and Service (`prometheus`, port 9090) of the namespace's
    Prometheus (see the module's docstring)."""
    rule_files = rule_files or {}
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "tidalmq-brokers",
            "dns_sd_configs": [
                {
                    "names": [f"_http._tcp.{FULL}-brokers.{ns}.svc.cluster.local"],
                    "type": "SRV",
                    "refresh_interval": SCRAPE,
                }
            ],
            "relabel_configs": [
                {
                    "source_labels": ["__meta_dns_srv_record_target"],
                    "regex": r"([^.]+)\..*",
                    "target_label": "pod",
                    "replacement": "$1",
                },
                {"target_label": "namespace", "replacement": ns},
            ],
        }
    ]
    if operator:
        jobs.append(
            {
                "job_name": "tidalmq-operator",
                "dns_sd_configs": [
                    {
                        "names": [f"{FULL}-operator.{ns}.svc.cluster.local"],
                        "type": "A",
                        "port": OPERATOR_METRICS_PORT,
                        "refresh_interval": SCRAPE,
                    }
                ],
                "relabel_configs": [{"target_label": "namespace", "replacement": ns}],
            }
        )
    if kube_state_metrics:
        jobs.append(
            {
                "job_name": "kube-state-metrics",
                # its `namespace` label is the object's: not renamed to exported_namespace
                "honor_labels": True,
                "dns_sd_configs": [
                    {
                        "names": [KUBE_STATE_METRICS],
                        "type": "A",
                        "port": KUBE_STATE_METRICS_PORT,
                        "refresh_interval": SCRAPE,
                    }
                ],
            }
        )
    config: dict[str, Any] = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "scrape_configs": jobs,
    }
    if rule_files:
        config["rule_files"] = [f"{CONFIG_DIR}/{name}" for name in sorted(rule_files)]
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prometheus"},
            "data": {"prometheus.yml": json.dumps(config, indent=1), **rule_files},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "prometheus"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "prometheus"}},
                "template": {
                    # the chart's NetworkPolicies let app.kubernetes.io/name=prometheus scrape
                    "metadata": {
                        "labels": {"app": "prometheus", "app.kubernetes.io/name": "prometheus"}
                    },
                    "spec": {
                        "containers": [
                            {
                                "name": "prometheus",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "args": [
                                    f"--config.file={CONFIG_DIR}/prometheus.yml",
                                    "--storage.tsdb.path=/prometheus",
                                    "--web.listen-address=:9090",
                                ],
                                "ports": [{"containerPort": 9090}],
                                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090}},
                                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                                "volumeMounts": [
                                    {"name": "config", "mountPath": CONFIG_DIR},
                                    {"name": "data", "mountPath": "/prometheus"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": "prometheus"}},
                            {"name": "data", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "prometheus"},
            "spec": {
                "selector": {"app": "prometheus"},
                "ports": [{"port": 9090, "targetPort": 9090}],
            },
        },
    ]
    return "\n---\n".join(json.dumps(o) for o in objects)


def prometheus_url(cluster: Cluster, ns: str) -> str:
    """The Prometheus pod's address from the host (the tests run on the host and reach pod IPs,
    as they reach the brokers), once its rollout is done."""
    cluster.kubectl(
        "-n", ns, "rollout", "status", "deployment/prometheus", "--timeout=180s", timeout=200
    )
    pod = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app=prometheus")
    ips = [p["status"]["podIP"] for p in pod["items"] if p.get("status", {}).get("podIP")]
    assert ips, pod
    return f"http://{ips[0]}:9090"
