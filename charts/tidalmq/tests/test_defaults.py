"""The chart's defaults run where the project's own tests run: every default image is one the
project's image script builds under that very name (so the chart installs on the e2e cluster
offline, with no image value), the requests of four brokers, the operator and the in-cluster
object store fit the 2-core e2e node, and the broker's memory is sized from the measured RSS."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from tests.support.helm import REPO, container, find, find_all, pod_spec, render

pytestmark = pytest.mark.usefixtures("helm")

FULL = "rel-tidalmq"
# The e2e node: 2 cores, all allocatable (cluster.sh reserves none). CoreDNS, metrics-server and
# local-path-provisioner ask for 110m (e2e/cluster/manifests); the chart's own requests, for four
# brokers, the operator and the object store, must leave at least 0.3 cores besides for the
# rest of a test (a `helm test` pod, a client pod, the uninstall hook, a Spark driver's submit).
NODE_MILLICORES = 2000
BUDGET_MILLICORES = 1500


def millicores(quantity: str | int | float) -> int:
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def mebibytes(quantity: str) -> float:
    units = {
        "Ki": 1 / 1024,
        "Mi": 1,
        "Gi": 1024,
        "k": 1e3 / 2**20,
        "M": 1e6 / 2**20,
        "G": 1e9 / 2**20,
    }
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * units[unit] if unit else float(number) / 2**20


def addon_requests() -> int:
    """CPU requested by the e2e cluster's add-on pods (their manifests)."""
    total = 0
    for path in (REPO / "e2e" / "cluster" / "manifests").glob("*.yaml"):
        for match in re.finditer(r"requests: \{cpu: (\d+m)", path.read_text()):
            total += millicores(match.group(1))
    return total


def built_images() -> set[str]:
    out = subprocess.run(
        ["bash", str(REPO / "e2e" / "cluster" / "images.sh"), "list"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return set(out.stdout.split())


def images_of(docs: list[dict[str, Any]]) -> set[str]:
    images = set()
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job", "Pod"}:
            spec = pod_spec(doc)
            images |= {c["image"] for c in spec.get("initContainers", []) + spec["containers"]}
    return images


def test_every_default_image_is_built_by_the_image_script() -> None:
    docs = render({"inClusterObjectStore": {"enabled": True}})
    wanted = images_of(docs)
    spark = {
        e["value"]
        for e in container(find(docs, "Deployment", f"{FULL}-operator"), "operator")["env"]
        if e["name"] == "TIDALMQ_SPARK_IMAGE"
    }
    wanted |= spark
    assert len(wanted) == 3, wanted  # TidalMQ, MinIO, Spark
    built = built_images()
    assert wanted <= built, f"not built by e2e/cluster/images.sh: {sorted(wanted - built)}"


def test_default_requests_fit_four_brokers_on_the_two_core_node() -> None:
    docs = render({"inClusterObjectStore": {"enabled": True}})
    broker = container(find(docs, "StatefulSet", f"{FULL}-broker"), "broker")
    operator_deployment = find(docs, "Deployment", f"{FULL}-operator")
    operator = container(operator_deployment, "operator")
    store = container(find(docs, "StatefulSet", f"{FULL}-object-store"), "minio")
    chart = (
        4 * millicores(broker["resources"]["requests"]["cpu"])
        + operator_deployment["spec"]["replicas"] * millicores(operator["resources"]["requests"]["cpu"])
        + millicores(store["resources"]["requests"]["cpu"])
    )  # fmt: skip
    assert chart <= BUDGET_MILLICORES, f"{chart}m requested for 4 brokers, operator and store"
    assert chart + addon_requests() <= NODE_MILLICORES - 300
    # the autoscaler may add brokers up to maxReplicas: its CPU target needs the request
    assert 200 <= millicores(broker["resources"]["requests"]["cpu"]) <= 250
    # hooks and test pods are small enough to run beside them
    for doc in find_all(docs, "Job"):
        for c in pod_spec(doc)["containers"]:
            assert millicores(c["resources"]["requests"]["cpu"]) <= 50


def test_broker_memory_is_sized_from_the_measured_rss() -> None:
    """bench/RESULTS-broker.md measures the broker's peak RSS (local store and MinIO, default
    256 MiB tail cache): the request covers the larger peak, the limit leaves headroom."""
    results = (REPO / "bench" / "RESULTS-broker.md").read_text()
    peaks = [
        int(mb) for mb in re.findall(r"Broker peak RSS over the whole .* run: (\d+) MB", results)
    ]
    assert len(peaks) == 2, peaks
    peak_mib = max(peaks) * 1e6 / 2**20
    resources = container(find(render(), "StatefulSet", f"{FULL}-broker"), "broker")["resources"]
    request = mebibytes(resources["requests"]["memory"])
    limit = mebibytes(resources["limits"]["memory"])
    assert peak_mib <= request <= 1.25 * peak_mib, (peak_mib, request)
    assert limit >= 1.5 * peak_mib, (peak_mib, limit)
    assert "cpu" not in resources.get("limits", {}), "no CPU limit: brokers burst into idle cores"
