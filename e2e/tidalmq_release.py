"""TidalMQ installed with its Helm chart on the end-to-end cluster: the release the end-to-end
tests of the broker fleet and of the planner share, what they read from it, and its removal.

Removal goes through the operator: every custom resource it handles carries its finalizer
(`tidalmq.io/finalizer`), and a Topic's finalizer deletes the topic's data in object storage.
Uninstalling the release first would leave them with a finalizer nobody removes, and the test's
namespace stuck in Terminating on a kept cluster; so `remove_custom_resources` runs before every
`helm uninstall` of the chart, in every end-to-end module.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3

from e2e.kube import REPO_DIR, Cluster, CommandError, logs_dir, run, wait_until

CHART = REPO_DIR / "charts" / "tidalmq"
RELEASE = "tmq"
FULL = f"{RELEASE}-tidalmq"
STS = f"{FULL}-broker"
BUCKET = "tidalmq"  # objectStore.bucket of the releases installed here
# What the operator handles, each with its finalizer: the data holders first, the ClusterState
# (the controller's metadata, whose daemon runs the controller) last.
CUSTOM_RESOURCES = (
    "topics.tidalmq.io",
    "statictopics.tidalmq.io",
    "partitionreassignments.tidalmq.io",
)
CLUSTER_STATE = "clusterstates.tidalmq.io"
FINALIZER = "tidalmq.io/finalizer"


def addon_image(addon: str) -> str:
    """Build an add-on image (minio, prometheus) and load it into the cluster; its reference."""
    out = run(
        ["bash", str(REPO_DIR / "e2e/cluster/addon-image.sh"), addon, "import"], timeout=3600
    ).stdout
    return out.strip().splitlines()[-1]


def release_values(cluster: Cluster, minio: str) -> list[str]:
    """The helm arguments of the releases installed here: the locally built images, two brokers
    (no HPA, small requests, so several releases fit the 2-core node), brokers advertising their
    pod IPs (the tests run on the host), and the in-cluster MinIO."""
    repository, tag = cluster.images["broker"].rsplit(":", 1)
    m_repo, m_tag = minio.rsplit(":", 1)
    return [
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "inClusterObjectStore.enabled=true",
        "--set",
        f"objectStore.bucket={BUCKET}",
        "--set",
        f"inClusterObjectStore.image.repository={m_repo}",
        "--set",
        f"inClusterObjectStore.image.tag={m_tag}",
        "--set",
        "broker.replicas=2",
        "--set",
        "broker.advertise=podIP",
        "--set",
        "broker.resources.requests.cpu=100m",
        "--set",
        "broker.resources.requests.memory=256Mi",
        "--set",
        "autoscaling.enabled=false",
        "--set",
        "broker.drainTimeoutSeconds=30",
        "--set",
        "operator.resources.requests.cpu=50m",
    ]


# The chart's Kafka listener is SASL_SSL by default (listeners.*.enabled auto: on at a fresh
# install); the end-to-end clients here speak PLAINTEXT, so the releases they use turn both
# listener switches off (test_security.py turns them on again: a later --set wins). The control
# plane keeps its default (mTLS at a fresh install): only the operator and the brokers speak it.
# Not in release_values: test_operations installs the previous chart with those, and its schema
# knows no listeners (its upgrade to this chart keeps PLAINTEXT by itself: auto at an upgrade).
PLAINTEXT_LISTENER = [
    "--set",
    "listeners.tls.enabled=false",
    "--set",
    "listeners.sasl.enabled=false",
]


@contextmanager
def installed_release(
    cluster: Cluster, namespace: str, minio: str, *extra: str
) -> Iterator[dict[str, Any]]:
    """The chart with `release_values` and a PLAINTEXT listener; `extra`: more helm arguments.
    Uninstalled afterwards."""
    cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        "6m",
        *release_values(cluster, minio),
        *PLAINTEXT_LISTENER,
        *extra,
        timeout=420,
    )
    try:
        other_tests_pods_gone(cluster, namespace)
        yield {"ns": namespace}
    finally:
        save_diagnosis(cluster, namespace)
        uninstall(cluster, namespace)


def save_diagnosis(cluster: Cluster, namespace: str) -> None:
    """Print the namespace's state and keep every pod's logs in the build cache, before the
    release (and with it the logs) goes."""
    print(cluster.describe(namespace)[-4000:])
    logs = logs_dir() / "e2e-pods" / namespace
    try:
        count = cluster.save_pod_logs(namespace, logs)
        print(f"logs of {count} pods of {namespace}: {logs}")
    except Exception as exc:  # the logs are a diagnosis aid: never the reason a test fails
        print(f"could not save the pod logs of {namespace}: {exc}", file=sys.stderr)


def uninstall(cluster: Cluster, namespace: str, *, through_operator: bool = True) -> None:
    """Remove the custom resources (see remove_custom_resources), then the release. A failure
    of the first is raised after the uninstall, unless the test already failed (then it is
    printed: the test's own failure is the one to report)."""
    problem: AssertionError | None = None
    try:
        remove_custom_resources(cluster, namespace, through_operator=through_operator)
    except AssertionError as exc:
        problem = exc
    # No `--wait`: the namespace is deleted right after (by the `namespace` fixture or the
    # module's own), so nothing needs the pods gone, and waiting for them took ~25-40 s per
    # release (the brokers' preStop drain, up to drainTimeoutSeconds=30, then their stop). The
    # next test's install overlaps their going; its body waits for them (other_tests_pods_gone).
    # The pre-delete hook still runs to completion (Helm waits for hooks with or without
    # --wait, within --timeout). The test of the chart's uninstall itself keeps `--wait`.
    cluster.helm("uninstall", RELEASE, "--namespace", namespace, "--timeout", "3m")
    if problem is not None:
        if sys.exc_info()[0] is None:
            raise problem
        sys.stderr.write(f"\n{problem}\n")


def other_tests_pods(cluster: Cluster, ns: str) -> list[str]:
    """Pods of the other tests' namespaces (e2e-*; releases of earlier tests still going)."""
    pods = cluster.kubectl_json("get", "pods", "-A")["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if p["metadata"]["namespace"].startswith("e2e-") and p["metadata"]["namespace"] != ns
    ]


# Longer than a release's going (a broker's terminationGracePeriodSeconds is 60 s).
OTHER_TESTS_PODS_WAIT_S = 150.0


def other_tests_pods_gone(cluster: Cluster, ns: str) -> None:
    """Until the pods of earlier tests' namespaces are gone, so that a test's body has the node
    to its release, as when `uninstall` waited for them (its install overlapped their going).
    Pods still there after OTHER_TESTS_PODS_WAIT_S (a namespace that could not be deleted) are
    named on stderr and the test goes on: they are not its failure."""
    try:
        wait_until(
            "the other tests' pods gone",
            lambda: not other_tests_pods(cluster, ns),
            timeout=OTHER_TESTS_PODS_WAIT_S,
            interval=2.0,
        )
    except AssertionError as exc:
        try:
            left: object = other_tests_pods(cluster, ns)
        except CommandError as err:
            left = err
        sys.stderr.write(f"\n{exc}; still there: {left} (the test goes on)\n")


def remove_custom_resources(
    cluster: Cluster, ns: str, *, through_operator: bool = True, timeout: float = 300
) -> None:
    """Delete the namespace's TidalMQ resources while the operator still runs, and wait until
    its finalizer let each go (for a Topic: once the controller deleted the topic's data in
    object storage). With `through_operator=False` (a release whose operator cannot work, e.g.
    an unreachable object store) the finalizers are dropped by hand instead. Resources the
    operator did not release in time have their finalizer dropped too, so the namespace can
    go, and an AssertionError says which."""
    stuck: list[str] = []
    for kinds in (CUSTOM_RESOURCES, (CLUSTER_STATE,)):
        kind_list = ",".join(kinds)
        cluster.kubectl("-n", ns, "delete", kind_list, "--all", "--wait=false", timeout=60)
        if through_operator:
            try:
                wait_until(
                    f"the operator to release every {kind_list}",
                    lambda kind_list=kind_list: not _names(cluster, ns, kind_list),
                    timeout=timeout,
                    interval=1.0,
                )
                continue
            except AssertionError:
                stuck += _names(cluster, ns, kind_list)
        for name in _names(cluster, ns, kind_list):
            cluster.kubectl(
                "-n",
                ns,
                "patch",
                name,
                "--type=merge",
                "-p",
                '{"metadata": {"finalizers": null}}',
                check=False,
            )
    if stuck:
        raise AssertionError(
            f"the operator did not release {stuck} within {timeout:.0f} s (their {FINALIZER} "
            "was dropped by hand so that the namespace can go)"
        )


def _names(cluster: Cluster, ns: str, kinds: str) -> list[str]:
    return cluster.kubectl("-n", ns, "get", kinds, "-o", "name").split()


def object_store(cluster: Cluster, ns: str) -> Any:
    """An S3 client of the release's in-cluster object store (the chart's trial MinIO), with
    the credentials the chart generated."""
    secret = cluster.kubectl_json("-n", ns, "get", "secret", f"{FULL}-object-store")["data"]
    pods = cluster.kubectl_json(
        "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=object-store"
    )["items"]
    ip = next(p["status"]["podIP"] for p in pods if p["status"].get("podIP"))
    return boto3.client(
        "s3",
        endpoint_url=f"http://{ip}:9000",
        region_name="us-east-1",
        aws_access_key_id=base64.b64decode(secret["access-key"]).decode(),
        aws_secret_access_key=base64.b64decode(secret["secret-key"]).decode(),
    )


def stored_objects(cluster: Cluster, ns: str, prefix: str) -> list[str]:
    """Keys under `prefix` in the release's bucket."""
    s3 = object_store(cluster, ns)
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def broker_pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=broker")
    return sorted(pods["items"], key=lambda p: p["metadata"]["name"])


def release_pods(cluster: Cluster, ns: str) -> dict[str, dict[str, Any]]:
    """The release's pods by name: component, uid, containers' restarts, phase, whether Ready."""
    pods = cluster.kubectl_json(
        "-n", ns, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}"
    )
    out = {}
    for pod in pods["items"]:
        status = pod.get("status", {})
        out[pod["metadata"]["name"]] = {
            "component": pod["metadata"].get("labels", {}).get("app.kubernetes.io/component"),
            "uid": pod["metadata"]["uid"],
            "restarts": sum(c.get("restartCount", 0) for c in status.get("containerStatuses", [])),
            "phase": status.get("phase"),
            "ready": any(
                c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
            ),
            "terminating": "deletionTimestamp" in pod["metadata"],
        }
    return out


def bootstrap_service(cluster: Cluster, ns: str) -> str:
    """The bootstrap Service's cluster IP and Kafka port: an address that stays the same while
    every broker pod is replaced (kube-proxy routes the host's connections to a ready broker),
    so a client on the host finds the brokers again after all of them moved to new pod IPs."""
    svc = cluster.kubectl_json("-n", ns, "get", "service", f"{FULL}-bootstrap")
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "kafka")
    return f"{svc['spec']['clusterIP']}:{port}"


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
