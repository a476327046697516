"""`helm lint` and `helm install` of a minimal chart (e2e/charts/smoke), then its `helm test`
hook, on the session's cluster."""

from __future__ import annotations

import pytest

from e2e.kube import E2E_DIR, Cluster

CHART = E2E_DIR / "charts" / "smoke"


def image_values(cluster: Cluster) -> list[str]:
    repository, tag = cluster.images["broker"].rsplit(":", 1)
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


def test_helm_lint(cluster: Cluster) -> None:
    out = cluster.helm("lint", "--strict", str(CHART), *image_values(cluster))
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.timeout(600)
def test_helm_install_and_test(cluster: Cluster, namespace: str) -> None:
    message = "installed by helm on the e2e cluster"
    out = cluster.helm(
        "install",
        "smoke",
        str(CHART),
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        "4m",
        "--set",
        f"message={message}",
        *image_values(cluster),
    )
    assert "STATUS: deployed" in out, out
    status = cluster.helm("status", "smoke", "--namespace", namespace, "-o", "json")
    assert '"status":"deployed"' in status.replace(" ", "")
    deployment = cluster.kubectl_json("-n", namespace, "get", "deployment", "smoke-smoke")
    assert deployment["status"].get("readyReplicas") == 1

    tested = cluster.helm("test", "smoke", "--namespace", namespace, "--logs", "--timeout", "3m")
    assert "Phase:          Succeeded" in tested or "Succeeded" in tested, tested
    assert f"smoke test passed: {message}" in tested, tested

    cluster.helm("uninstall", "smoke", "--namespace", namespace, "--wait")
    remaining = cluster.kubectl(
        "-n",
        namespace,
        "get",
        "deployment,service,configmap",
        "-l",
        "app.kubernetes.io/instance=smoke",
        "-o",
        "name",
    )
    assert not remaining.strip(), remaining
