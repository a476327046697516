"""The cluster is real: a Ready node, pods from locally built images with working logs and exec,
Service discovery through cluster DNS, and resource metrics."""

from __future__ import annotations

import json
import re

from e2e.kube import Cluster, wait_until


def pod(name: str, image: str, command: list[str], labels: str = "") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}{labels}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: {image}
      imagePullPolicy: IfNotPresent
      command: {json.dumps(command)}
      resources:
        requests: {{cpu: 10m, memory: 32Mi}}
"""


def test_node_is_ready(cluster: Cluster) -> None:
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    assert nodes, "the cluster has no node"
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["status"]["conditions"]
    version = cluster.kubectl_json("version")["serverVersion"]["gitVersion"]
    assert version.startswith("v1.")


def test_pod_from_local_image_logs_and_exec(cluster: Cluster, namespace: str) -> None:
    script = "import sys, time; print('tidalmq e2e says hello', flush=True); time.sleep(3600)"
    cluster.apply(pod("hello", cluster.images["broker"], ["python3", "-c", script]), namespace)
    cluster.wait_ready(namespace, "pod/hello")

    wait_until(
        "the pod's log line",
        lambda: "tidalmq e2e says hello" in cluster.kubectl("-n", namespace, "logs", "hello"),
        timeout=30,
    )
    # exec runs in the same container: the image's own CLI, as its non-root user.
    version = cluster.kubectl("-n", namespace, "exec", "hello", "--", "tidalmq", "--version")
    assert version.startswith("tidalmq "), version
    uid = cluster.kubectl("-n", namespace, "exec", "hello", "--", "id", "-u").strip()
    assert uid == "10001"


def test_service_reached_by_dns_name(cluster: Cluster, namespace: str) -> None:
    image = cluster.images["broker"]
    server = [
        "sh",
        "-c",
        "mkdir -p /tmp/www && echo tidalmq-web > /tmp/www/index.html && "
        "exec python3 -m http.server 8080 --directory /tmp/www",
    ]
    cluster.apply(pod("web", image, server), namespace)
    cluster.apply(
        """
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: ClusterIP
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
""",
        namespace,
    )
    cluster.apply(pod("client", image, ["sleep", "3600"]), namespace)
    cluster.wait_ready(namespace, "pod/web")
    cluster.wait_ready(namespace, "pod/client")

    cluster_ip = cluster.kubectl(
        "-n", namespace, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"
    )
    fetch = (
        "import socket, sys, urllib.request; host = sys.argv[1]; "
        "print(socket.gethostbyname(host)); "
        "print(urllib.request.urlopen(f'http://{host}/', timeout=5).read().decode().strip())"
    )
    for host in (f"web.{namespace}.svc.cluster.local", "web"):
        out = wait_until(
            f"GET http://{host}/ from another pod",
            lambda host=host: cluster.kubectl(
                "-n", namespace, "exec", "client", "--", "python3", "-c", fetch, host
            ),
            timeout=60,
        )
        resolved, body = out.split()
        assert resolved == cluster_ip, f"{host} resolved to {resolved}, the Service is {cluster_ip}"
        assert body == "tidalmq-web"


def test_kubectl_top_pods_returns_numbers(cluster: Cluster, namespace: str) -> None:
    busy = "import time\nwhile True:\n    sum(range(10000)); time.sleep(0.01)"
    cluster.apply(pod("busy", cluster.images["broker"], ["python3", "-c", busy]), namespace)
    cluster.wait_ready(namespace, "pod/busy")

    line = wait_until(
        "kubectl top pods to report the pod",
        lambda: cluster.kubectl(
            "-n", namespace, "top", "pods", "--no-headers", check=False
        ).strip(),
        timeout=120,
        interval=5,
    )
    match = re.fullmatch(r"busy\s+(\d+)m\s+(\d+)Mi", line)
    assert match, f"unexpected `kubectl top pods` output: {line!r}"
    assert int(match.group(2)) > 0, "a running Python process uses memory"
    node_line = cluster.kubectl("top", "nodes", "--no-headers").split()
    assert node_line[1].endswith("m") and node_line[1][:-1].isdigit(), node_line
