"""TidalMQ installed with its Helm chart on the end-to-end cluster: the release the end-to-end
tests of the broker fleet and of the planner share, and what they read from it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from e2e.kube import REPO_DIR, Cluster, run

CHART = REPO_DIR / "charts" / "tidalmq"
RELEASE = "tmq"
FULL = f"{RELEASE}-tidalmq"
STS = f"{FULL}-broker"


def addon_image(addon: str) -> str:
    """Build an add-on image (minio, prometheus) and load it into the cluster; its reference."""
    out = run(
        ["bash", str(REPO_DIR / "e2e/cluster/addon-image.sh"), addon, "import"], timeout=3600
    ).stdout
    return out.strip().splitlines()[-1]


@contextmanager
def installed_release(
    cluster: Cluster, namespace: str, minio: str, *extra: str
) -> Iterator[dict[str, Any]]:
    """The chart with the locally built images, two brokers and the in-cluster MinIO; `extra`:
    more helm arguments. Uninstalled afterwards."""
    repository, tag = cluster.images["broker"].rsplit(":", 1)
    m_repo, m_tag = minio.rsplit(":", 1)
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", namespace, "--wait", "--timeout", "6m",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "inClusterObjectStore.enabled=true",
        "--set", f"inClusterObjectStore.image.repository={m_repo}",
        "--set", f"inClusterObjectStore.image.tag={m_tag}",
        "--set", "broker.replicas=2", "--set", "broker.advertise=podIP",
        "--set", "broker.resources.requests.cpu=100m",
        "--set", "broker.resources.requests.memory=256Mi",
        "--set", "autoscaling.enabled=false",
        "--set", "broker.drainTimeoutSeconds=30",
        "--set", "operator.resources.requests.cpu=50m",
        *extra,
        timeout=420,
    )  # fmt: skip
    try:
        yield {"ns": namespace}
    finally:
        if hasattr(cluster, "describe"):
            print(cluster.describe(namespace)[-4000:])
        cluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m")


def broker_pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=broker")
    return sorted(pods["items"], key=lambda p: p["metadata"]["name"])


def bootstrap(cluster: Cluster, ns: str) -> str:
    ips = [p["status"].get("podIP") for p in broker_pods(cluster, ns) if p["status"].get("podIP")]
    assert ips, "no broker pod has an IP"
    return ",".join(f"{ip}:9092" for ip in ips)


def topic_status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.kubectl_json("-n", ns, "get", "topic", name).get("status") or {}


def ready(obj_status: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in obj_status.get("conditions", [])
    )
