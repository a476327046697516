"""An autoscaling/v2 HorizontalPodAutoscaler on CPU scales a StatefulSet out under load the test
generates, and back in when the load stops (the way the broker fleet is meant to follow traffic)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from e2e.kube import E2E_DIR, Cluster, wait_until

APP = (E2E_DIR / "apps" / "cpu_app.py").read_text()
LOAD_SECONDS = 300


def indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line for line in text.splitlines(keepends=True))


def statefulset(image: str) -> str:
    return f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: cpu-app}}
data:
  cpu_app.py: |
{indent(APP, 4)}
---
apiVersion: v1
kind: Service
metadata: {{name: cpu-app}}
spec:
  selector: {{app: cpu-app}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: cpu-app}}
spec:
  serviceName: cpu-app
  replicas: 1
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: cpu-app}}
  template:
    metadata:
      labels: {{app: cpu-app}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: app
          image: {image}
          imagePullPolicy: IfNotPresent
          command: [python3, /app/cpu_app.py, serve, "8080"]
          ports: [{{containerPort: 8080}}]
          readinessProbe:
            tcpSocket: {{port: 8080}}
            periodSeconds: 2
          resources:
            requests: {{cpu: 100m, memory: 32Mi}}
            limits: {{cpu: 400m, memory: 128Mi}}
          volumeMounts: [{{name: app, mountPath: /app}}]
      volumes:
        - name: app
          configMap: {{name: cpu-app}}
"""


HPA = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: cpu-app}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: StatefulSet, name: cpu-app}
  minReplicas: 1
  maxReplicas: 3
  metrics:
    - type: Resource
      resource:
        name: cpu
        target: {type: Utilization, averageUtilization: 50}
  behavior:
    scaleUp:
      stabilizationWindowSeconds: 0
      policies: [{type: Pods, value: 2, periodSeconds: 5}]
    scaleDown:
      stabilizationWindowSeconds: 20
      policies: [{type: Percent, value: 100, periodSeconds: 5}]
"""


def load_generator(image: str, seconds: int) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: load}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: load
      image: {image}
      imagePullPolicy: IfNotPresent
      command: [python3, /app/cpu_app.py, load, "http://cpu-app/", "{seconds}", "4"]
      resources:
        requests: {{cpu: 10m, memory: 32Mi}}
      volumeMounts: [{{name: app, mountPath: /app}}]
  volumes:
    - name: app
      configMap: {{name: cpu-app}}
"""


def replicas(cluster: Cluster, namespace: str) -> tuple[int, int]:
    """(the StatefulSet's spec.replicas, the HPA's currentCPUUtilization or -1)."""
    sts = cluster.kubectl_json("-n", namespace, "get", "statefulset", "cpu-app")
    hpa = cluster.kubectl_json("-n", namespace, "get", "hpa", "cpu-app")
    metrics = hpa.get("status", {}).get("currentMetrics") or []
    usage = -1
    for metric in metrics:
        if metric.get("type") == "Resource":
            usage = metric["resource"]["current"].get("averageUtilization", -1)
    return sts["spec"]["replicas"], usage


@pytest.mark.timeout(900)
def test_hpa_scales_statefulset_out_and_in(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    image = cluster.images["broker"]
    cluster.apply(statefulset(image), namespace)
    cluster.wait_ready(namespace, "statefulset/cpu-app")
    cluster.apply(HPA, namespace)

    # The HPA first sees the idle pod (its metrics prove the pipeline before any load).
    wait_until(
        "the HPA to read the idle pod's CPU",
        lambda: replicas(cluster, namespace)[1] >= 0,
        timeout=180,
        interval=5,
    )
    assert replicas(cluster, namespace)[0] == 1

    started = time.monotonic()
    cluster.apply(load_generator(image, LOAD_SECONDS), namespace)
    scaled_out = wait_until(
        "the HPA to scale the StatefulSet to at least 2 replicas under load",
        lambda: (r := replicas(cluster, namespace))[0] >= 2 and r,
        timeout=LOAD_SECONDS - 30,
        interval=3,
    )
    out_seconds = time.monotonic() - started
    cluster.wait_ready(namespace, "statefulset/cpu-app", timeout=120)
    pods = cluster.kubectl(
        "-n", namespace, "get", "pods", "-l", "app=cpu-app", "-o", "name"
    ).split()
    assert len(pods) >= 2, pods

    # Stop the load; the fleet shrinks back to the minimum.
    cluster.kubectl("-n", namespace, "delete", "pod", "load", "--grace-period=1")
    stopped = time.monotonic()
    wait_until(
        "the HPA to scale the StatefulSet back to 1 replica",
        lambda: replicas(cluster, namespace)[0] == 1,
        timeout=300,
        interval=3,
    )
    in_seconds = time.monotonic() - stopped
    (tmp_path / "timings.txt").write_text(
        f"out {out_seconds:.0f}s {scaled_out}; in {in_seconds:.0f}s\n"
    )
    print(f"scaled out to {scaled_out[0]} in {out_seconds:.0f}s, back to 1 in {in_seconds:.0f}s")
