"""Kubernetes operations on a TidalMQ release lose nothing (issue [O2]'s acceptance), end to end:
each operation runs while an idempotent producer writes to a Topic of its own, and afterwards
every topic written so far on the release is read back whole (every acknowledged record once,
at its offset, in order; e2e/producing.py).

In file order:
- the previous chart (main before this work, from git) installed, then upgraded to the working
  tree's chart under a producer;
- a fresh install with default values (and only the image settings an offline cluster needs)
  scales to four brokers on the 2-core node with nothing Pending; then `helm uninstall` with a
  Topic, a StaticTopic and a PartitionReassignment present leaves only what the chart README
  says it keeps, and the namespace deletes within 60 s;
- one release (two brokers, the in-cluster object store on its PersistentVolumeClaim) shared by
  the steps that follow, in order: `helm upgrade` with unchanged values (no pod replaced or
  restarted), `helm upgrade` of a broker setting (the brokers roll, nothing else), `helm
  rollback` to the revision before it (the brokers roll back), the object store's pod deleted,
  and the node drained (every pod replaced, so the read-back after it comes from the object
  store, not from a broker's tail cache).

Figures (the `figures` fixture): how long each operation took and the longest a record waited
for its acknowledgement during it (the client-visible pause).
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, Producer

from e2e.kube import REPO_DIR, Cluster, CommandError, RecordFigure, wait_until
from e2e.producing import RateProducer, verify_all
from e2e.tidalmq_release import (
    BUCKET,
    CHART,
    FULL,
    PLAINTEXT_LISTENER,
    RELEASE,
    STS,
    bootstrap,
    bootstrap_service,
    broker_pods,
    object_store,
    other_tests_pods,
    other_tests_pods_gone,
    ready,
    release_pods,
    release_values,
    save_diagnosis,
    stored_objects,
    topic_status,
    uninstall,
)

PARTITIONS = 6
RATE = 200  # records per second of each step's producer
LEAD_S = 3.0  # producing before and after each operation
# The chart as it was on main before [O2] (object store on an emptyDir Deployment).
PREVIOUS_CHART_COMMIT = "66ac32b"
# A broker setting the upgrade changes (a real one: the WAL flush window, 5 ms by default).
BROKER_SETTING = ("TIDALMQ_FLUSH_INTERVAL_MS", "10")
NAMESPACE_DELETE_BOUND_S = 60  # the issue's bound for the namespace after `helm uninstall`
# What `helm uninstall` leaves in the namespace, as the chart README's "Uninstalling" section
# lists it: the object store's claim (its data), and the custom resources users created, their
# operator finalizers removed by the pre-delete hook. README words each must appear under.
KEPT_AFTER_UNINSTALL = {
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "topics.tidalmq.io": "Topic",
    "statictopics.tidalmq.io": "StaticTopic",
    "partitionreassignments.tidalmq.io": "PartitionReassignment",
    "clusterstates.tidalmq.io": "ClusterState",
}
# Namespaced objects Kubernetes itself puts in every namespace.
BUILT_IN = {("serviceaccounts", "default"), ("configmaps", "kube-root-ca.crt")}


# ------------------------------------------------------------------------------ helpers


@dataclass
class Release:
    """The release the operations steps share, and every topic written on it so far."""

    ns: str
    values: list[str]
    servers: str = ""
    install_s: float = 0.0
    written: dict[str, RateProducer] = field(default_factory=dict)
    revision_before_change: int = 0


def create_topic(cluster: Cluster, ns: str, name: str, partitions: int = PARTITIONS) -> None:
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


@contextmanager
def writing(cluster: Cluster, rel: Release, topic: str) -> Iterator[RateProducer]:
    """A new Topic written by its own idempotent producer while the body runs (and LEAD_S before
    and after); then every topic written on the release so far is read back whole."""
    create_topic(cluster, rel.ns, topic)
    producer = RateProducer(rel.servers, topic, rate=RATE).start()
    try:
        time.sleep(LEAD_S)
        yield producer
        time.sleep(LEAD_S)
    except BaseException:
        producer.abandon()
        raise
    producer.stop()
    rel.written[topic] = producer
    verify_all(rel.servers, rel.written)


def identities(pods: dict[str, dict[str, Any]], component: str | None = None) -> dict[str, Any]:
    """name -> (uid, restarts) of the pods (of one component)."""
    return {
        name: (p["uid"], p["restarts"])
        for name, p in pods.items()
        if component is None or p["component"] == component
    }


def pod_templates(cluster: Cluster, ns: str) -> dict[str, Any]:
    """The pod templates of the release's StatefulSets and Deployments, by kind/name."""
    out = {}
    for kind in ("statefulsets", "deployments"):
        items = cluster.kubectl_json(
            "-n", ns, "get", kind, "-l", f"app.kubernetes.io/instance={RELEASE}"
        )["items"]
        for obj in items:
            out[f"{kind}/{obj['metadata']['name']}"] = obj["spec"]["template"]
    return out


def template_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What differs between two pod_templates results: the annotations shown in full (the
    checksums are what usually moves), other changes by name."""
    changes: dict[str, Any] = {}
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None or new is None:
            changes[name] = "added" if old is None else "removed"
            continue
        a_old = old["metadata"].get("annotations", {})
        a_new = new["metadata"].get("annotations", {})
        changes[name] = {
            "annotations": {
                k: (a_old.get(k), a_new.get(k))
                for k in set(a_old) | set(a_new)
                if a_old.get(k) != a_new.get(k)
            },
            "spec changed": old["spec"] != new["spec"],
            "labels changed": old["metadata"].get("labels") != new["metadata"].get("labels"),
        }
    return changes


def revision(cluster: Cluster, ns: str) -> int:
    history = json.loads(cluster.helm("history", RELEASE, "--namespace", ns, "-o", "json"))
    return max(int(r["revision"]) for r in history)


def broker_env(cluster: Cluster, ns: str, name: str) -> dict[str, list[str | None]]:
    """Each broker pod's values of the environment variable `name` (none: not set)."""
    pods = cluster.kubectl_json("-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=broker")
    out: dict[str, list[str | None]] = {}
    for pod in pods["items"]:
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "broker")
        out[pod["metadata"]["name"]] = [
            e.get("value") for e in container.get("env", []) if e["name"] == name
        ]
    return out


def all_ready(
    cluster: Cluster, ns: str, counts: dict[str, int]
) -> dict[str, dict[str, Any]] | None:
    """The release's pods once exactly `counts` (component -> pods) are there, all Ready."""
    pods = release_pods(cluster, ns)
    live = {n: p for n, p in pods.items() if not p["terminating"]}
    by_component = {c: [p for p in live.values() if p["component"] == c] for c in counts}
    if all(
        len(by_component[c]) == n and all(p["ready"] for p in by_component[c])
        for c, n in counts.items()
    ):
        return live
    return None


def component_counts(pods: dict[str, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in pods.values():
        counts[p["component"]] = counts.get(p["component"], 0) + 1
    return counts


def unschedulable(cluster: Cluster) -> list[str]:
    """Pods anywhere in the cluster the scheduler could not place, with its reason."""
    pods = cluster.kubectl_json("get", "pods", "-A", "--field-selector=status.phase=Pending")
    out = []
    for pod in pods["items"]:
        for c in pod["status"].get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                out.append(
                    f"{pod['metadata']['namespace']}/{pod['metadata']['name']}: "
                    f"{c.get('reason')}: {c.get('message')}"
                )
    return out


def the_node(cluster: Cluster) -> str:
    nodes = cluster.kubectl("get", "nodes", "-o", "name").split()
    assert len(nodes) == 1, f"the drain step is written for the single-node e2e cluster: {nodes}"
    return nodes[0].split("/", 1)[1]


# ------------------------------------------------------------------------------ previous chart


def previous_chart(dest: Path) -> Path:
    """charts/tidalmq as it was at PREVIOUS_CHART_COMMIT, extracted under `dest`."""
    if shutil.which("git") is None or not (REPO_DIR / ".git").exists():
        pytest.skip("the previous chart comes from git history, which is not available here")
    proc = subprocess.run(
        ["git", "-C", str(REPO_DIR), "archive", PREVIOUS_CHART_COMMIT, "charts/tidalmq"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"commit {PREVIOUS_CHART_COMMIT} (the previous chart) is not in this clone's "
            f"history: {proc.stderr.decode(errors='replace').strip()}"
        )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as archive:
        archive.extractall(dest, filter="data")
    return dest / "charts" / "tidalmq"


def control_secret(cluster: Cluster, ns: str) -> str:
    """A Secret with the control plane's two keys (as the chart's controlPlane.existingSecret
    wants them); its name."""
    name = "e2e-upgrade-control"
    cluster.kubectl(
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        name,
        f"--from-literal=admin-token={secrets.token_hex(24)}",
        f"--from-literal=broker-secret={secrets.token_hex(24)}",
    )
    return name


def tokens_through_env(secret: str, dest: Path) -> Path:
    """Values for the previous chart: its brokers and operator read the tokens of `secret`
    from their environment (TIDALMQ_CONTROL_TOKEN: a broker derives its own from the broker
    secret; the operator holds the admin token and the broker secret)."""

    def env(name: str, key: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}

    doc = {
        "broker": {"extraEnv": [env("TIDALMQ_CONTROL_TOKEN", "broker-secret")]},
        "operator": {
            "extraEnv": [
                env("TIDALMQ_CONTROL_TOKEN", "admin-token"),
                env("TIDALMQ_CONTROL_BROKER_SECRET", "broker-secret"),
            ]
        },
    }
    path = dest / "previous-chart-tokens.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def external_store(cluster: Cluster, ns: str, minio: str, access: str, secret: str) -> str:
    """A MinIO pod and Service of the test's own in the namespace (no chart involved); its URL."""
    labels = {"app.kubernetes.io/name": "e2e-s3"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "e2e-s3", "labels": labels},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
            "containers": [
                {
                    "name": "minio",
                    "image": minio,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "sh",
                        "-c",
                        f"mkdir -p /data/{BUCKET} && exec minio server /data --address :9000",
                    ],
                    "env": [
                        {"name": "MINIO_ROOT_USER", "value": access},
                        {"name": "MINIO_ROOT_PASSWORD", "value": secret},
                        {"name": "HOME", "value": "/tmp"},
                    ],
                    "ports": [{"name": "s3", "containerPort": 9000}],
                    "readinessProbe": {
                        "httpGet": {"path": "/minio/health/ready", "port": 9000},
                        "periodSeconds": 2,
                    },
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "e2e-s3"},
        "spec": {"selector": labels, "ports": [{"name": "s3", "port": 9000}]},
    }
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod, service]}), ns)
    cluster.wait_ready(ns, "pod/e2e-s3", timeout=120)
    return f"http://e2e-s3.{ns}.svc.cluster.local:9000"


def test_previous_chart_upgraded_loses_nothing(
    cluster: Cluster, namespace: str, minio: str, figures: RecordFigure, tmp_path: Path
) -> None:
    """The chart of main before this work, installed, then upgraded to the working tree's with
    the same values while a producer writes. The partition data lives in an S3 server of the
    test's own (objectStore.endpoint), because the previous chart's in-cluster store kept its
    data on an emptyDir that no upgrade could carry over; that store is still enabled (with the
    same credentials, unused by the brokers) so that the upgrade also replaces the previous
    chart's store Deployment by the new StatefulSet."""
    ns = namespace
    old_chart = previous_chart(tmp_path)
    access, secret = "e2e-upgrade", secrets.token_hex(16)
    endpoint = external_store(cluster, ns, minio, access, secret)
    values = [
        *release_values(cluster, minio),
        "--set",
        f"objectStore.endpoint={endpoint}",
        "--set",
        f"objectStore.accessKey={access}",
        "--set",
        f"objectStore.secretKey={secret}",
    ]
    # Today's image needs control-plane tokens, which the previous chart knows nothing of: the
    # previous release gets them through its extraEnv from a Secret of the test's own, and the
    # upgrade points the new chart at the same Secret (controlPlane.existingSecret), so the
    # brokers and the operator of both revisions hold the same tokens throughout the roll.
    control = control_secret(cluster, ns)
    try:
        started = time.monotonic()
        # inside the try: a failed install's pods' logs are saved too (a CI run once saw the
        # previous chart's operator restart for 6 minutes, with nothing kept to say why)
        cluster.helm(
            "install",
            RELEASE,
            str(old_chart),
            "--namespace",
            ns,
            "--wait",
            "--timeout",
            "6m",
            *values,
            "-f",
            str(tokens_through_env(control, tmp_path)),
            timeout=420,
        )
        figures("previous_chart_install_s", round(time.monotonic() - started, 1))
        other_tests_pods_gone(cluster, ns)
        old_store = cluster.kubectl(
            "-n",
            ns,
            "get",
            "deployment,statefulset",
            "-l",
            "app.kubernetes.io/component=object-store",
            "-o",
            "name",
        ).split()
        rel = Release(ns=ns, values=values, servers=bootstrap_service(cluster, ns))
        with writing(cluster, rel, "across-chart-upgrade") as producer:
            started = time.monotonic()
            # the chart README's upgrade step: helm never upgrades CRDs itself
            cluster.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds")
            )
            # no listeners/controlPlane.tls values: their auto keeps what the previous release
            # runs (a PLAINTEXT listener, plain HTTP control plane), which the producer relies on
            cluster.helm(
                "upgrade",
                RELEASE,
                str(CHART),
                "--namespace",
                ns,
                "--wait",
                "--timeout",
                "6m",
                *values,
                "--set",
                f"controlPlane.existingSecret={control}",
                timeout=420,
            )
            cluster.wait_ready(ns, f"statefulset/{STS}", timeout=300)
            figures(
                "chart_upgrade_s",
                round(time.monotonic() - started, 1),
                "CRDs applied, helm upgrade --wait, brokers rolled",
            )
        figures("chart_upgrade_worst_ack_wait_s", round(producer.worst_wait(), 3))
        new_store = cluster.kubectl(
            "-n",
            ns,
            "get",
            "deployment,statefulset",
            "-l",
            "app.kubernetes.io/component=object-store",
            "-o",
            "name",
        ).split()
        figures("object_store_workloads", {"before": old_store, "after": new_store})
        assert new_store == [f"statefulset.apps/{FULL}-object-store"], (old_store, new_store)
        cluster.wait_ready(ns, f"statefulset/{FULL}-object-store", timeout=180)
    finally:
        save_diagnosis(cluster, ns)
        uninstall(cluster, ns)


# ------------------------------------------------------------------------------ defaults, uninstall


def offline_settings(cluster: Cluster, minio: str) -> list[str]:
    """The settings of a default install on the e2e cluster: the in-cluster object store, and
    the broker image only if the chart's default name is not the one the e2e build loaded (the
    NOTES: image.repository/tag for an image of another name). The object store's default
    image must be the one the project builds."""
    defaults = yaml.safe_load(cluster.helm("show", "values", str(CHART)))
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    store = defaults["inClusterObjectStore"]["image"]
    assert f"{store['repository']}:{store['tag']}" == minio, (
        f"the chart's default object-store image is not the one the project builds ({minio})"
    )
    settings = ["--set", "inClusterObjectStore.enabled=true"]
    image = defaults["image"]
    if f"{image['repository']}:{image['tag'] or app_version}" != cluster.images["broker"]:
        repository, tag = cluster.images["broker"].rsplit(":", 1)
        settings += ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
    return settings


def leftovers(cluster: Cluster, ns: str) -> dict[str, list[str]]:
    """Every object in the namespace, by resource, but events, metrics and what Kubernetes
    itself puts in every namespace."""
    kinds = [
        k
        for k in cluster.kubectl(
            "api-resources", "--verbs=list", "--namespaced", "-o", "name"
        ).split()
        if not k.startswith("events") and not k.endswith(".metrics.k8s.io")
    ]
    items = cluster.kubectl_json("-n", ns, "get", ",".join(kinds), "--ignore-not-found")["items"]
    plural = {}
    for line in cluster.kubectl("api-resources", "--namespaced", "--no-headers").splitlines():
        cols = line.split()
        # NAME [SHORTNAMES] APIVERSION NAMESPACED KIND
        name, api_version, kind = cols[0], cols[-3], cols[-1]
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        plural[(group, kind)] = f"{name}.{group}" if group else name
    out: dict[str, list[str]] = {}
    for obj in items:
        group = obj["apiVersion"].rsplit("/", 1)[0] if "/" in obj["apiVersion"] else ""
        resource = plural.get((group, obj["kind"]), obj["kind"])
        if (resource, obj["metadata"]["name"]) not in BUILT_IN:
            out.setdefault(resource, []).append(obj["metadata"]["name"])
    return out


def test_default_install_runs_four_brokers_and_uninstalls_cleanly(
    cluster: Cluster, namespace: str, minio: str, figures: RecordFigure
) -> None:
    ns = namespace
    settings = offline_settings(cluster, minio)
    figures("default_install_settings", settings[1::2])
    # The node's two cores for this release alone: other tests' releases gone first.
    wait_until(
        "the other tests' pods gone",
        lambda: not other_tests_pods(cluster, ns),
        timeout=300,
        interval=3,
    )
    started = time.monotonic()
    cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        ns,
        "--wait",
        "--timeout",
        "6m",
        *settings,
        timeout=420,
    )
    figures("default_install_s", round(time.monotonic() - started, 1))
    # four brokers, whether the HPA (default) or the StatefulSet's replicas decide the count
    started = time.monotonic()
    cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "autoscaling.minReplicas=4",
        "--set",
        "broker.replicas=4",
        timeout=300,
    )

    def four_brokers() -> dict[str, dict[str, Any]] | None:
        stuck = unschedulable(cluster)
        assert not stuck, f"pods the scheduler cannot place: {stuck}"
        return all_ready(cluster, ns, {"broker": 4, "operator": 1, "object-store": 1})

    try:
        wait_until("four brokers Ready", four_brokers, timeout=360, interval=2)
        figures("scale_to_four_brokers_s", round(time.monotonic() - started, 1))
        requested = cluster.kubectl("describe", "node", the_node(cluster))
        figures("node_requests", requested.split("Allocated resources:", 1)[-1][:400].strip())

        # what uninstall must cope with: a Topic, a StaticTopic, a reassignment in flight
        create_topic(cluster, ns, "orders", 12)
        cluster.apply(
            json.dumps(
                {
                    "apiVersion": "tidalmq.io/v1alpha1",
                    "kind": "StaticTopic",
                    "metadata": {"name": "ledger"},
                    "spec": {"totalQueues": 4},
                }
            ),
            ns,
        )
        wait_until(
            "StaticTopic Ready",
            lambda: ready(
                cluster.kubectl_json("-n", ns, "get", "statictopic", "ledger").get("status") or {}
            ),
            timeout=180,
        )
        leaders = {
            p["partition"]: p["broker"] for p in topic_status(cluster, ns, "orders")["partitions"]
        }
        moves = [
            {"topic": "orders", "partition": p, "replicas": [(b + 1) % 4]}
            for p, b in sorted(leaders.items())[:4]
        ]
        cluster.apply(
            json.dumps(
                {
                    "apiVersion": "tidalmq.io/v1alpha1",
                    "kind": "PartitionReassignment",
                    "metadata": {"name": "move-orders"},
                    "spec": {"partitions": moves},
                }
            ),
            ns,
        )
    except BaseException:
        save_diagnosis(cluster, ns)
        uninstall(cluster, ns)
        raise
    save_diagnosis(cluster, ns)
    claims = cluster.kubectl("-n", ns, "get", "pvc", "-o", "name").split()
    volumes = {
        c: cluster.kubectl("-n", ns, "get", c, "-o", "jsonpath={.spec.volumeName}") for c in claims
    }

    started = time.monotonic()
    cluster.helm("uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "3m", timeout=200)
    wait_until("the release's pods gone", lambda: not release_pods(cluster, ns), timeout=120)
    figures(
        "uninstall_s",
        round(time.monotonic() - started, 1),
        "helm uninstall --wait (pre-delete hook included) to the last pod gone",
    )

    def only_kept() -> dict[str, list[str]]:
        """What is left, once it is only what the README lists (the garbage collector deletes
        the workloads' dependents, e.g. ControllerRevisions, a moment after them)."""
        left = leftovers(cluster, ns)
        unexpected = {k: v for k, v in left.items() if k not in KEPT_AFTER_UNINSTALL}
        if unexpected:
            raise ValueError(f"left, and not in the chart README's list: {unexpected}")
        return left or {"(nothing)": []}

    left = wait_until(
        "only what the chart README lists left after helm uninstall",
        only_kept,
        timeout=60,
        interval=2,
    )
    left.pop("(nothing)", None)
    figures("left_after_uninstall", left)
    readme = (CHART / "README.md").read_text()
    undocumented = [KEPT_AFTER_UNINSTALL[k] for k in left if KEPT_AFTER_UNINSTALL[k] not in readme]
    assert not undocumented, f"kept by uninstall but not in the chart README: {undocumented}"
    assert left.get("persistentvolumeclaims", []) == [c.split("/", 1)[1] for c in claims], left
    for obj in ("clusterroles", "clusterrolebindings"):
        named = [n for n in cluster.kubectl("get", obj, "-o", "name").split() if f"/{ns}-" in n]
        assert not named, f"cluster-wide objects of the release left: {named}"
    finalizers = {
        f"{k}/{n}": cluster.kubectl("-n", ns, "get", k, n, "-o", "jsonpath={.metadata.finalizers}")
        for k in left
        if k.endswith(".tidalmq.io")
        for n in left[k]
    }
    assert not any(finalizers.values()), (
        f"finalizers left that no operator will remove: {finalizers}"
    )

    try:
        deleted_s = cluster.delete_namespace(ns, wait=True, timeout=NAMESPACE_DELETE_BOUND_S)
    except CommandError as exc:
        raise AssertionError(
            f"namespace {ns} not deleted within {NAMESPACE_DELETE_BOUND_S} s: "
            f"{cluster.kubectl('get', 'namespace', ns, '-o', 'json', check=False)[-3000:]}"
            f"\nleft: {leftovers(cluster, ns)}"
        ) from exc
    figures("namespace_delete_s", round(deleted_s, 1), f"bound {NAMESPACE_DELETE_BOUND_S} s")
    # the store's claim went with the namespace, and the provisioner deleted its volume
    wait_until(
        "the store's PersistentVolumes deleted",
        lambda: (
            not [
                v
                for v in volumes.values()
                if v and cluster.kubectl("get", "pv", v, "--ignore-not-found", "-o", "name")
            ]
        ),
        timeout=60,
    )


# ------------------------------------------------------------------------------ a lost store


def produce_acked(servers: str, topic: str, count: int) -> dict[int, int]:
    """`count` acknowledged records (acks=all, idempotent); each partition's next offset."""
    producer = Producer(
        {"bootstrap.servers": servers, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    ends: dict[int, int] = {}

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=done)
        producer.poll(0)
    assert producer.flush(120) == 0, "records not acknowledged"
    return ends


def produce_error(servers: str, topic: str, partition: int) -> Any:
    """The error of one record sent to `partition` (None if it was acknowledged). Without
    retries, so the broker's own error is what the delivery report says (a retriable error
    retried until the timeout is reported as the timeout)."""
    producer = Producer(
        {"bootstrap.servers": servers, "message.timeout.ms": 15000, "acks": "all", "retries": 0}
    )
    seen: list[Any] = []
    producer.produce(
        topic, value=b"probe", partition=partition, on_delivery=lambda err, msg: seen.append(err)
    )
    producer.flush(30)
    return seen[0] if seen else "no delivery report"


def degraded(cluster: Cluster, ns: str, topic: str, reason: str) -> dict[str, Any] | None:
    for c in topic_status(cluster, ns, topic).get("conditions", []):
        if c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == reason:
            return c
    return None


def accept_the_loss(cluster: Cluster, ns: str, topic: str) -> float:
    """The documented recovery: annotate the Topic; the operator removes the annotation once
    the loss is accepted and the partitions serve again. Seconds it took."""
    started = time.monotonic()
    cluster.kubectl(
        "-n", ns, "annotate", "--overwrite", "topic", topic, "tidalmq.io/accept-data-loss=true"
    )
    wait_until(
        f"Topic {topic} Ready after the accepted loss",
        lambda: ready(topic_status(cluster, ns, topic)),
        timeout=180,
    )
    annotations = cluster.kubectl_json("-n", ns, "get", "topic", topic)["metadata"].get(
        "annotations", {}
    )
    assert "tidalmq.io/accept-data-loss" not in annotations, "the annotation is one-shot"
    return time.monotonic() - started


def broker_refuses_store(ip: str) -> bool:
    """The broker at `ip` says its object store is lost: tidalmq_store_lost is 1 and its
    readiness endpoint answers 503."""
    try:
        metrics = urllib.request.urlopen(f"http://{ip}:9644/metrics", timeout=10).read().decode()
    except OSError:
        return False  # not listening yet
    if not any(
        line.startswith("tidalmq_store_lost{") and line.endswith(" 1.0")
        for line in metrics.splitlines()
    ):
        return False
    try:
        urllib.request.urlopen(f"http://{ip}:9644/readyz", timeout=10)
        return False  # 200: still ready
    except urllib.error.HTTPError as exc:
        return exc.code == 503
    except OSError:
        return False


def store_lost_everywhere(cluster: Cluster, ns: str) -> bool:
    """Every broker pod says the object store is lost."""
    pods = broker_pods(cluster, ns)
    return bool(pods) and all(
        p["status"].get("podIP") and broker_refuses_store(p["status"]["podIP"]) for p in pods
    )


def updated_brokers_refusing(cluster: Cluster, ns: str) -> list[str]:
    """The broker pods of the StatefulSet's update revision that run and refuse the store."""
    revision = cluster.kubectl_json("-n", ns, "get", "statefulset", STS)["status"].get(
        "updateRevision"
    )
    out = []
    for pod in broker_pods(cluster, ns):
        if pod["metadata"]["labels"].get("controller-revision-hash") != revision:
            continue
        if "deletionTimestamp" in pod["metadata"] or not pod["status"].get("podIP"):
            continue
        if broker_refuses_store(pod["status"]["podIP"]):
            out.append(pod["metadata"]["name"])
    return out


def events_of(cluster: Cluster, ns: str, reason: str) -> list[str]:
    items = cluster.kubectl_json("-n", ns, "get", "events")["items"]
    return [e.get("message", "") for e in items if e.get("reason") == reason]


def test_a_lost_bucket_is_never_served_as_empty(
    cluster: Cluster, namespace: str, minio: str, figures: RecordFigure
) -> None:
    """[O2]: the data bucket emptied under a running release, then a fresh bucket given to the
    release (helm upgrade of objectStore.bucket): no partition serves from offset 0, producers
    get KAFKA_STORAGE_ERROR, the Topic is Degraded (StoreLost) naming its partitions, and after
    the documented recovery (the accept-data-loss annotation) the partitions serve again at
    their acknowledged ends, never reusing an offset, with the loss recorded in an Event. The
    metadata log lives in its own bucket (the chart's default with the in-cluster store), so it
    keeps the record of what was there."""
    ns = namespace
    values = [*release_values(cluster, minio), *PLAINTEXT_LISTENER]
    cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        ns,
        "--wait",
        "--timeout",
        "6m",
        *values,
        timeout=420,
    )
    try:
        other_tests_pods_gone(cluster, ns)
        servers = bootstrap_service(cluster, ns)
        create_topic(cluster, ns, "ledger", 3)
        ends = produce_acked(servers, "ledger", 300)
        assert set(ends) == {0, 1, 2}, ends
        time.sleep(12)  # the controller commits the acknowledged ends (floors) every 10 s

        # (1) the bucket emptied under the running release
        s3 = object_store(cluster, ns)
        keys = stored_objects(cluster, ns, "")
        assert keys, "nothing in the data bucket"
        for i in range(0, len(keys), 1000):
            s3.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
            )
        started = time.monotonic()
        c = wait_until(
            "Topic Degraded (StoreLost)",
            lambda: degraded(cluster, ns, "ledger", "StoreLost"),
            timeout=120,
        )
        figures(
            "store_wiped_detected_s",
            round(time.monotonic() - started, 1),
            "bucket emptied to the Topic Degraded/StoreLost",
        )
        assert "partition" in c["message"], c
        # each broker checks the marker itself (every 5 s, --identity-check-interval-ms): the
        # Topic's condition comes from the controller's own check and may be the first to know
        wait_until(
            "every broker stopped serving the lost store (tidalmq_store_lost 1, /readyz 503)",
            lambda: store_lost_everywhere(cluster, ns),
            timeout=30,
        )
        figures(
            "store_wiped_brokers_stopped_s",
            round(time.monotonic() - started, 1),
            "bucket emptied to every broker refusing the store",
        )
        # to the brokers' pod IPs: the bootstrap Service routes only to Ready brokers, and none is
        err = produce_error(bootstrap(cluster, ns), "ledger", 0)
        assert (
            err is not None
            and getattr(err, "code", lambda: None)() == KafkaError.KAFKA_STORAGE_ERROR
        ), err
        figures(
            "store_wiped_recovery_s",
            round(accept_the_loss(cluster, ns, "ledger"), 1),
            "annotation to the Topic Ready again",
        )
        after = produce_acked(servers, "ledger", 30)
        for p, end in after.items():
            assert end > ends[p], (
                f"partition {p} served from {end} after {ends[p]} were acknowledged"
            )
        wait_until(
            "a DataLossAccepted Event",
            lambda: events_of(cluster, ns, "DataLossAccepted"),
            timeout=60,
        )
        ends = {p: max(ends[p], after.get(p, 0)) for p in ends}
        time.sleep(12)

        # (2) a fresh bucket given to the release. The brokers' rolling update halts at the
        # first broker restarted onto it (a broker whose store is lost is never Ready, so
        # `helm upgrade --wait` would time out): checked, then the rollout is finished by hand
        # (the brokers of the old revision deleted), as an administrator who meant it would
        started = time.monotonic()
        cluster.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            ns,
            *values,
            "--set",
            "objectStore.bucket=fresh",
            timeout=120,
        )
        first = wait_until(
            "a broker of the new revision refusing the fresh bucket",
            lambda: updated_brokers_refusing(cluster, ns),
            timeout=240,
        )
        figures(
            "fresh_bucket_first_broker_refusing_s",
            round(time.monotonic() - started, 1),
            "helm upgrade to a fresh bucket until its first broker refused it",
        )
        time.sleep(10)
        sts = cluster.kubectl_json("-n", ns, "get", "statefulset", STS)
        assert sts["status"].get("updatedReplicas", 0) == len(first), (
            "the rollout went on past a broker that is not Ready",
            sts["status"],
        )
        revision = sts["status"]["updateRevision"]
        old = [
            p["metadata"]["name"]
            for p in broker_pods(cluster, ns)
            if p["metadata"]["labels"].get("controller-revision-hash") != revision
        ]
        cluster.kubectl("-n", ns, "delete", "pod", "--wait=false", *old)
        wait_until(
            "every broker on the fresh bucket refusing it",
            lambda: len(updated_brokers_refusing(cluster, ns)) == len(old) + len(first),
            timeout=240,
        )
        wait_until(
            "Topic Degraded (StoreLost) on the fresh bucket",
            lambda: degraded(cluster, ns, "ledger", "StoreLost"),
            timeout=120,
        )
        figures(
            "fresh_bucket_detected_s",
            round(time.monotonic() - started, 1),
            "helm upgrade to a fresh bucket until every broker and the Topic say StoreLost",
        )
        servers = bootstrap_service(cluster, ns)
        err = produce_error(bootstrap(cluster, ns), "ledger", 1)
        assert (
            err is not None
            and getattr(err, "code", lambda: None)() == KafkaError.KAFKA_STORAGE_ERROR
        ), err
        accept_the_loss(cluster, ns, "ledger")
        wait_until(
            "every broker Ready on the fresh bucket",
            lambda: all(
                p["ready"] for p in release_pods(cluster, ns).values() if p["component"] == "broker"
            ),
            timeout=120,
        )
        again = produce_acked(servers, "ledger", 30)
        for p, end in again.items():
            assert end > ends[p], (
                f"partition {p} served from {end} after {ends[p]} were acknowledged"
            )
    finally:
        save_diagnosis(cluster, ns)
        uninstall(cluster, ns)


# ------------------------------------------------------------------------------ the shared release


@pytest.fixture(scope="module")
def operated(cluster: Cluster, minio: str, request: pytest.FixtureRequest) -> Iterator[Release]:
    """A release with `release_values` (two brokers, the in-cluster object store with the
    chart's default persistence), shared by the operations steps in file order."""
    ns = cluster.create_namespace(f"e2e-operations-{secrets.token_hex(3)}")
    failed_before = request.session.testsfailed
    rel = Release(ns=ns, values=[*release_values(cluster, minio), *PLAINTEXT_LISTENER])
    try:
        started = time.monotonic()
        cluster.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            ns,
            "--wait",
            "--timeout",
            "6m",
            *rel.values,
            timeout=420,
        )
        rel.install_s = time.monotonic() - started
        other_tests_pods_gone(cluster, ns)
        rel.servers = bootstrap_service(cluster, ns)
        yield rel
    finally:
        if request.session.testsfailed > failed_before:
            sys.stderr.write(f"\n--- state of namespace {ns} ---\n{cluster.describe(ns)}\n")
        save_diagnosis(cluster, ns)
        try:
            uninstall(cluster, ns)
        except (CommandError, AssertionError) as exc:
            sys.stderr.write(f"could not uninstall the release of {ns}: {exc}\n")
        cluster.delete_namespace(ns)


def test_upgrade_with_unchanged_values_restarts_nothing(
    cluster: Cluster, operated: Release, figures: RecordFigure
) -> None:
    rel, ns = operated, operated.ns
    figures("install_s", round(rel.install_s, 1), "helm install --wait, two brokers and the store")
    pods, templates = release_pods(cluster, ns), pod_templates(cluster, ns)
    assert component_counts(pods) == {"broker": 2, "operator": 1, "object-store": 1}, pods
    with writing(cluster, rel, "unchanged-upgrade") as producer:
        started = time.monotonic()
        # the same values again, as a values file kept with the deployment would give them
        cluster.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            ns,
            "--wait",
            "--timeout",
            "5m",
            *rel.values,
            timeout=330,
        )
        # and the other common way: helm's stored values
        cluster.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            ns,
            "--reuse-values",
            "--wait",
            "--timeout",
            "5m",
            timeout=330,
        )
        figures("unchanged_upgrades_s", round(time.monotonic() - started, 1), "two helm upgrades")
        time.sleep(10)  # a changed pod template would have its first pod replaced by now
    figures("unchanged_upgrade_worst_ack_wait_s", round(producer.worst_wait(), 3))
    changes = template_changes(templates, pod_templates(cluster, ns))
    assert not changes, f"helm upgrade with unchanged values changed pod templates: {changes}"
    assert identities(release_pods(cluster, ns)) == identities(pods), (
        "a pod was replaced or restarted by helm upgrade with unchanged values"
    )


def test_upgrade_of_a_broker_setting_rolls_the_brokers(
    cluster: Cluster, operated: Release, figures: RecordFigure
) -> None:
    rel, ns = operated, operated.ns
    rel.revision_before_change = revision(cluster, ns)
    before = release_pods(cluster, ns)
    name, value = BROKER_SETTING
    with writing(cluster, rel, "setting-upgrade") as producer:
        started = time.monotonic()
        cluster.helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            ns,
            "--wait",
            "--timeout",
            "6m",
            *rel.values,
            "--set",
            f"broker.extraEnv[0].name={name}",
            "--set-string",
            f"broker.extraEnv[0].value={value}",
            timeout=400,
        )
        cluster.wait_ready(ns, f"statefulset/{STS}", timeout=300)
        figures(
            "setting_upgrade_rollout_s",
            round(time.monotonic() - started, 1),
            "helm upgrade --wait to the brokers' rollout done",
        )
    figures("setting_upgrade_worst_ack_wait_s", round(producer.worst_wait(), 3))
    after = release_pods(cluster, ns)
    assert broker_env(cluster, ns, name) == {p: [value] for p in identities(after, "broker")}
    replaced = set(identities(before, "broker").values()) & set(
        identities(after, "broker").values()
    )
    assert not replaced, f"brokers not replaced by the rolling restart: {replaced}"
    for component in ("operator", "object-store"):
        assert identities(after, component) == identities(before, component), component


def test_rollback_rolls_the_brokers_back(
    cluster: Cluster, operated: Release, figures: RecordFigure
) -> None:
    rel, ns = operated, operated.ns
    assert rel.revision_before_change, "needs the broker-setting upgrade step first"
    before = release_pods(cluster, ns)
    with writing(cluster, rel, "rollback") as producer:
        started = time.monotonic()
        cluster.helm(
            "rollback",
            RELEASE,
            str(rel.revision_before_change),
            "--namespace",
            ns,
            "--wait",
            "--timeout",
            "6m",
            timeout=400,
        )
        cluster.wait_ready(ns, f"statefulset/{STS}", timeout=300)
        figures("rollback_rollout_s", round(time.monotonic() - started, 1))
    figures("rollback_worst_ack_wait_s", round(producer.worst_wait(), 3))
    after = release_pods(cluster, ns)
    assert broker_env(cluster, ns, BROKER_SETTING[0]) == {
        p: [] for p in identities(after, "broker")
    }
    replaced = set(identities(before, "broker").values()) & set(
        identities(after, "broker").values()
    )
    assert not replaced, f"brokers not replaced by the rollback: {replaced}"
    for component in ("operator", "object-store"):
        assert identities(after, component) == identities(before, component), component


def store_pods(cluster: Cluster, ns: str) -> list[dict[str, Any]]:
    """The object store's pods, but those being deleted."""
    pods = cluster.kubectl_json(
        "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=object-store"
    )["items"]
    return [p for p in pods if "deletionTimestamp" not in p["metadata"]]


def data_claim(pod: dict[str, Any]) -> str | None:
    volume = next((v for v in pod["spec"]["volumes"] if v["name"] == "data"), {})
    return (volume.get("persistentVolumeClaim") or {}).get("claimName")


def test_object_store_pod_deleted_loses_nothing(
    cluster: Cluster, operated: Release, figures: RecordFigure
) -> None:
    rel, ns = operated, operated.ns
    (pod,) = store_pods(cluster, ns)
    claim = data_claim(pod)
    assert claim, (
        "the in-cluster object store keeps its data on "
        f"{next(v for v in pod['spec']['volumes'] if v['name'] == 'data')}, not on a "
        "PersistentVolumeClaim (inClusterObjectStore.persistence)"
    )
    with writing(cluster, rel, "store-pod-deleted") as producer:
        started = time.monotonic()
        cluster.kubectl("-n", ns, "delete", "pod", pod["metadata"]["name"], timeout=120)

        def replaced() -> dict[str, Any] | None:
            pods = store_pods(cluster, ns)
            new = [p for p in pods if p["metadata"]["uid"] != pod["metadata"]["uid"]]
            return new[0] if len(pods) == 1 and new and ready(new[0]["status"]) else None

        back = wait_until("a new object-store pod Ready", replaced, timeout=240)
        figures(
            "store_pod_back_s", round(time.monotonic() - started, 1), "delete to the new pod Ready"
        )
        time.sleep(5)  # the brokers' flushes that waited for the store go through
    figures("store_pod_deleted_worst_ack_wait_s", round(producer.worst_wait(), 3))
    assert data_claim(back) == claim


def test_node_drained_loses_nothing(
    cluster: Cluster, operated: Release, figures: RecordFigure
) -> None:
    """`kubectl drain` of the single node, then uncordon. The brokers' PodDisruptionBudget
    (maxUnavailable 1) is respected first: the evicted broker's replacement cannot schedule on
    the cordoned node, so the budget refuses to evict the second one. That refusal is checked,
    and once everything else is evicted the drain is finished with --disable-eviction (deletes,
    past the budget): with one node there is no other way to empty it."""
    rel, ns = operated, operated.ns
    node = the_node(cluster)
    before = release_pods(cluster, ns)
    with writing(cluster, rel, "node-drained") as producer:
        started = time.monotonic()
        try:
            held = drain_until_the_budget_refuses(cluster, node, ns)
            figures(
                "drain_held_by_the_budget",
                held,
                "evictions respected the brokers' PDB: this broker stayed until the rest "
                "was evicted; then deleted past the budget (--disable-eviction)",
            )
            cluster.kubectl(
                "drain",
                node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--force",
                "--disable-eviction",
                "--timeout=240s",
                timeout=270,
            )
            figures("drain_s", round(time.monotonic() - started, 1))
        finally:
            cluster.kubectl("uncordon", node)
        back = wait_until(
            "every pod of the release back and Ready",
            lambda: all_ready(cluster, ns, component_counts(before)),
            timeout=360,
            interval=2,
        )
        figures(
            "drain_to_all_ready_s",
            round(time.monotonic() - started, 1),
            "drain start to every pod of the release Ready after uncordon",
        )
        for deployment in ("coredns", "metrics-server"):  # the next tests need them
            cluster.wait_ready("kube-system", f"deployment/{deployment}", timeout=240)
    figures("drain_worst_ack_wait_s", round(producer.worst_wait(), 3))
    kept = set(identities(before).values()) & set(identities(back).values())
    assert not kept, f"pods that were not replaced by the drain: {kept}"


def drain_until_the_budget_refuses(cluster: Cluster, node: str, ns: str) -> str:
    """Runs `kubectl drain` (evictions, which respect PodDisruptionBudgets) until the brokers'
    budget refused to evict one of them and every other pod of the release was evicted (their
    replacements Pending on the cordoned node); stops it there and returns the refused pod.
    --force: bare pods other tests may have left would stop the drain otherwise."""
    proc = subprocess.Popen(
        [
            cluster.kubectl_bin,
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            "--timeout=300s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **cluster.env},
    )
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    refused_line = re.compile(rf'pods/"([^"]+)" -n "{re.escape(ns)}".*disruption budget')

    def only_the_refused_one_left() -> str | None:
        refused = {m.group(1) for line in list(lines) if (m := refused_line.search(line))}
        if proc.poll() is not None:
            reader.join(5)
            raise AssertionError(
                f"kubectl drain ended ({proc.returncode}) without the brokers' budget refusing "
                f"an eviction:\n{''.join(lines)[-3000:]}"
            )
        if len(refused) != 1:
            return None
        (name,) = refused
        pods = release_pods(cluster, ns)
        others = [n for n, p in pods.items() if n != name and p["phase"] != "Pending"]
        return name if pods.get(name, {}).get("component") == "broker" and not others else None

    try:
        return wait_until(
            "the PodDisruptionBudget to hold one broker, the rest evicted",
            only_the_refused_one_left,
            timeout=240,
            interval=1,
        )
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
