"""`helm install` of charts/tidalmq on the session's cluster with the locally built image.

These tests check what the chart itself guarantees, whatever the state of the operator and
broker code: the CRDs are established and refuse bad resources with a clear message, every
object is created, the pods are created from the local image and their containers start (no
image pull, Secret or security-context error), and the operator's ServiceAccount has exactly
the rights the chart promises (checked by the API server's own RBAC with `kubectl auth can-i`).
Whether the operator becomes the active controller and the brokers serve is for the operator's
end-to-end tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.kube import REPO_DIR, Cluster, run, wait_until
from e2e.tidalmq_release import other_tests_pods_gone, uninstall

CHART = REPO_DIR / "charts" / "tidalmq"
RELEASE = "tmq"
FULL = f"{RELEASE}-tidalmq"
CRDS = (
    "topics.tidalmq.io",
    "partitionreassignments.tidalmq.io",
    "statictopics.tidalmq.io",
    "clusterstates.tidalmq.io",
    "users.tidalmq.io",
    "kopfpeerings.kopf.dev",
)
# A waiting reason that means the chart (not the code in the image) is wrong.
CHART_ERRORS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


def image_values(cluster: Cluster) -> list[str]:
    repository, tag = cluster.images["broker"].rsplit(":", 1)
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


@pytest.fixture
def installed(cluster: Cluster, namespace: str) -> Iterator[str]:
    out = cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        *image_values(cluster),
        # the local image is never pulled
        "--set",
        "image.pullPolicy=IfNotPresent",
        # two brokers, no HPA: this test does not depend on metrics-server
        "--set",
        "autoscaling.enabled=false",
        "--set",
        "broker.replicas=2",
        # an unreachable endpoint: the chart's job ends at handing it over
        "--set",
        "objectStore.endpoint=http://object-store.invalid:9000",
        "--set",
        "objectStore.accessKey=e2e",
        "--set",
        "objectStore.secretKey=e2e-secret",
        timeout=300,
    )
    assert "STATUS: deployed" in out, out
    # the previous test's release may still be going (uninstall does not wait for its pods), and
    # the scheduler counts a terminating pod's requests (250m per broker by default)
    other_tests_pods_gone(cluster, namespace)
    yield namespace
    # the object store is unreachable, so the operator cannot finish a Topic's finalizer (its
    # data lives nowhere): the finalizers of what it handles are dropped by hand
    uninstall(cluster, namespace, through_operator=False)


def kubectl_result(cluster: Cluster, *args: str, input: str | None = None) -> Any:
    return run([cluster.kubectl_bin, *args], env=cluster.env, input=input, check=False)


@pytest.mark.timeout(600)
def test_chart_installs_its_objects(cluster: Cluster, installed: str) -> None:
    ns = installed
    for crd in CRDS:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    names = set(
        cluster.kubectl(
            "-n",
            ns,
            "get",
            "deployment,statefulset,service,pdb,role,rolebinding,serviceaccount,secret,kopfpeering,"
            "networkpolicy",
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
            "-o",
            "name",
        ).split()
    )
    expected = {
        f"deployment.apps/{FULL}-operator",
        f"statefulset.apps/{FULL}-broker",
        f"service/{FULL}-brokers",
        f"service/{FULL}-bootstrap",
        f"service/{FULL}-operator",
        f"poddisruptionbudget.policy/{FULL}-broker",
        f"role.rbac.authorization.k8s.io/{FULL}-operator",
        f"rolebinding.rbac.authorization.k8s.io/{FULL}-operator",
        f"serviceaccount/{FULL}-operator",
        f"serviceaccount/{FULL}-spark",
        f"secret/{FULL}-object-store",
        f"kopfpeering.kopf.dev/{FULL}",
        # the control plane's tokens and who may reach the control ports ([R1] item 5); whether
        # the policies are enforced depends on the network plugin: the local cluster's bridge CNI
        # does not enforce them, the tokens refuse forged calls there (tests/integration)
        f"secret/{FULL}-control",
        f"networkpolicy.networking.k8s.io/{FULL}-broker",
        f"networkpolicy.networking.k8s.io/{FULL}-operator",
    }
    assert expected <= names, sorted(expected - names)
    headless = cluster.kubectl_json("-n", ns, "get", "service", f"{FULL}-brokers")
    assert headless["spec"]["clusterIP"] == "None"


@pytest.mark.timeout(600)
def test_chart_pods_start_from_the_local_image(cluster: Cluster, installed: str) -> None:
    """The StatefulSet and the Deployment create their pods, the scheduler places them and the
    kubelet starts their containers from the imported image with the chart's env, Secret
    references and security context."""
    ns = installed
    wanted = {f"{FULL}-broker-0", f"{FULL}-broker-1"}

    def pods() -> dict[str, Any]:
        items = cluster.kubectl_json(
            "-n", ns, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}"
        )
        return {p["metadata"]["name"]: p for p in items["items"]}

    def started() -> bool:
        current = pods()
        operators = [n for n in current if n.startswith(f"{FULL}-operator-")]
        if not (wanted <= set(current) and operators):
            return False
        for pod in current.values():
            for status in pod["status"].get("containerStatuses", []):
                reason = status["state"].get("waiting", {}).get("reason")
                assert reason not in CHART_ERRORS, (
                    f"{pod['metadata']['name']}: {reason}: {status['state']['waiting'].get('message')}"
                )
            statuses = pod["status"].get("containerStatuses", [])
            # started once: running now, or ran and exited (code problems are not the chart's)
            if not statuses or not all(
                "running" in s["state"]
                or "terminated" in s["state"]
                or s.get("lastState", {}).get("terminated")
                for s in statuses
            ):
                return False
        return True

    wait_until("the chart's pods to start their containers", started, timeout=300, interval=3)
    for name, pod in pods().items():
        # A container that stopped must not have stopped because of the chart's security
        # context (read-only root filesystem, uid 10001).
        for status in pod["status"].get("containerStatuses", []):
            if "terminated" in status["state"] or status.get("lastState", {}).get("terminated"):
                previous = "--previous" if status.get("lastState", {}).get("terminated") else ""
                args = [
                    "-n",
                    ns,
                    "logs",
                    name,
                    "-c",
                    status["name"],
                    *([previous] if previous else []),
                ]
                logs = kubectl_result(cluster, *args).stdout
                for sign in ("Read-only file system", "Permission denied"):
                    assert sign not in logs, f"{name}/{status['name']}: {sign}:\n{logs[-2000:]}"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, name
        assert pod["spec"]["containers"][0]["image"] == cluster.images["broker"], name
        if name in wanted:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            assert (
                env["TIDALMQ_ADVERTISED_HOST"]
                == f"$(POD_NAME).{FULL}-brokers.{ns}.svc.cluster.local"
            )


def can_i(
    cluster: Cluster, ns: str, verb: str, resource: str, *, namespace: str | None = None
) -> bool:
    sa = f"system:serviceaccount:{ns}:{FULL}-operator"
    where = ["--all-namespaces"] if namespace == "*" else ["-n", namespace or ns]
    proc = kubectl_result(cluster, "auth", "can-i", verb, resource, "--as", sa, *where)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stdout + proc.stderr
    return answer == "yes"


@pytest.mark.timeout(600)
def test_operator_rights_are_exactly_the_promised_ones(cluster: Cluster, installed: str) -> None:
    ns = installed
    granted = [
        ("get", "topics.tidalmq.io"),
        ("watch", "partitionreassignments.tidalmq.io"),
        ("patch", "topics.tidalmq.io/status"),
        ("update", "clusterstates.tidalmq.io"),
        ("create", "clusterstates.tidalmq.io"),
        ("patch", "statictopics.tidalmq.io/status"),
        ("update", "topics.tidalmq.io/finalizers"),
        ("patch", "kopfpeerings.kopf.dev"),
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "statefulsets.apps"),
        ("create", "events"),
        ("create", "pods"),
        ("delete", "pods"),
        ("create", "configmaps"),
        # the active replica labels its own pod tidalmq.io/controller=active (the controller
        # Service selects it); a Role cannot name a pod before it exists, so this is not narrowed
        ("patch", "pods"),
        # User resources: their Secrets, by name (users.enabled, the default)
        ("patch", "users.tidalmq.io/status"),
        ("get", "secrets"),
        ("create", "secrets"),
        ("delete", "secrets"),
    ]
    refused = [
        ("list", "secrets"),
        ("watch", "secrets"),
        ("delete", "statefulsets.apps"),
        ("update", "statefulsets.apps"),
        ("create", "deployments.apps"),
        ("update", "nodes"),
        ("create", "roles.rbac.authorization.k8s.io"),
        ("create", "serviceaccounts"),
    ]
    for verb, resource in granted:
        assert can_i(cluster, ns, verb, resource), f"the operator cannot {verb} {resource}"
    for verb, resource in refused:
        assert not can_i(cluster, ns, verb, resource), f"the operator may {verb} {resource}"
    # other namespaces: nothing namespaced
    assert not can_i(cluster, ns, "list", "pods", namespace="kube-system")
    assert not can_i(cluster, ns, "get", "topics.tidalmq.io", namespace="default")
    # cluster-wide: only what Kopf reads
    assert can_i(
        cluster, ns, "watch", "customresourcedefinitions.apiextensions.k8s.io", namespace="*"
    )
    assert can_i(cluster, ns, "list", "namespaces", namespace="*")
    assert not can_i(
        cluster, ns, "create", "customresourcedefinitions.apiextensions.k8s.io", namespace="*"
    )
    assert not can_i(cluster, ns, "list", "nodes", namespace="*")


@pytest.mark.timeout(600)
def test_topics_are_validated_by_the_schema(cluster: Cluster, installed: str) -> None:
    ns = installed

    def apply(obj: dict[str, Any]) -> Any:
        return kubectl_result(cluster, "-n", ns, "apply", "-f", "-", input=json.dumps(obj))

    def topic(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": name},
            "spec": spec,
        }

    bad = [
        (
            topic("zero", {"partitions": 0}),
            "spec.partitions in body should be greater than or equal to 1",
        ),
        (
            topic("name", {"partitions": 3, "topicName": "no spaces"}),
            "spec.topicName in body should match",
        ),
        (
            topic("config", {"partitions": 3, "configs": {"unclean.leader.election.enable": True}}),
            'supported values: "false"',
        ),
        (
            topic("unknown", {"partitions": 3, "configs": {"retention.hours": 1}}),
            'unknown field "spec.configs.retention.hours"',
        ),
    ]
    for obj, message in bad:
        proc = apply(obj)
        assert proc.returncode != 0, f"accepted {obj}"
        assert message in proc.stderr, proc.stderr
    good = topic("orders", {"partitions": 24, "configs": {"retention.ms": 604800000}})
    proc = apply(good)
    assert proc.returncode == 0, proc.stderr
    header = cluster.kubectl("-n", ns, "get", "topics").splitlines()[0].split()
    assert header == ["NAME", "PARTITIONS", "READY", "REASON", "AGE"]
    move = {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "PartitionReassignment",
        "metadata": {"name": "both"},
        "spec": {
            "partitions": [{"topic": "orders", "partition": 0, "replicas": [1]}],
            "generate": {},
        },
    }
    proc = apply(move)
    assert proc.returncode != 0 and "set exactly one of spec.partitions" in proc.stderr, proc.stderr
