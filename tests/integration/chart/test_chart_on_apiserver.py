"""The CRDs and the chart against a real kube-apiserver (no nodes: nothing runs, everything is
admitted or refused by the real API): schema and CEL validation with their messages, defaults,
status subresources, printer columns, and `helm install`/`upgrade`/`uninstall` of the chart."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.helm import CHART, REPO, run_helm
from tests.support.kube_apiserver import ApiServer, binaries

pytestmark = pytest.mark.integration


class Api:
    """kubectl and helm on the test API server."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.kubectl_bin = str(binaries()[1].parent / "kubectl")
        self.env = {"KUBECONFIG": str(server.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.server.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc

    def apply(
        self, ns: str, obj: dict[str, Any], check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(obj), check=check)

    def get(self, ns: str, *what: str) -> Any:
        scope = ["-n", ns] if ns else []
        return json.loads(self.kubectl(*scope, "get", *what, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_helm(*args, env=self.env, check=check)


@pytest.fixture(scope="module")
def api(kube_apiserver: ApiServer) -> Api:
    api = Api(kube_apiserver)
    api.kubectl("apply", "-f", str(REPO / "crds"))
    api.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    return api


@pytest.fixture
def ns(api: Api) -> Iterator[str]:
    name = f"chart-{secrets.token_hex(3)}"
    api.kubectl("create", "namespace", name)
    yield name
    api.kubectl("delete", "namespace", name, "--wait=false", check=False)


def cr(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_crds_are_established_and_structural(api: Api) -> None:
    crds = api.get("", "crd")["items"]
    ours = {c["metadata"]["name"]: c for c in crds}
    for name in (
        "topics.tidalmq.io",
        "partitionreassignments.tidalmq.io",
        "statictopics.tidalmq.io",
        "clusterstates.tidalmq.io",
        "users.tidalmq.io",
        "kopfpeerings.kopf.dev",
    ):
        conditions = {c["type"]: c["status"] for c in ours[name]["status"]["conditions"]}
        assert conditions.get("Established") == "True", (name, conditions)
        assert conditions.get("NonStructuralSchema") is None, (name, conditions)
    assert ours["topics.tidalmq.io"]["status"]["acceptedNames"]["shortNames"] == ["tmt"]


GOOD = [
    cr(
        "Topic",
        "orders",
        {"partitions": 24, "configs": {"retention.ms": 604800000, "compression.type": "producer"}},
    ),
    cr(
        "Topic",
        "named",
        {"topicName": "orders.v2", "partitions": 3, "configs": {"retention.bytes": "-1"}},
    ),
    cr(
        "Topic",
        "word-counts-changelog",
        {
            "partitions": 3,
            "configs": {
                "cleanup.policy": "compact,delete",
                "min.cleanable.dirty.ratio": 0.1,
                "delete.retention.ms": "3600000",
                "unclean.leader.election.enable": False,
                "preallocate": True,
                "compression.zstd.level": -5,
                "follower.replication.throttled.replicas": "0:1, 1:2",
            },
        },
    ),
    cr(
        "PartitionReassignment",
        "move",
        {
            "version": 1,
            "partitions": [
                {"topic": "orders", "partition": 0, "replicas": [1], "log_dirs": ["any"]},
                {"topic": "orders", "partition": 1, "replicas": [2]},
            ],
        },
    ),
    cr(
        "PartitionReassignment",
        "plan",
        {"generate": {"maxMoves": 6, "topics": ["orders"]}, "autoApprove": True},
    ),
    cr(
        "StaticTopic",
        "ledger",
        {"totalQueues": 8, "brokers": [0, 1, 2], "remap": [{"queue": 3, "broker": 1}]},
    ),
    cr("ClusterState", "state", {"clusterId": "abc", "document": {"version": 1, "topics": {}}}),
    cr(
        "User",
        "alice",
        {
            "authentication": {"type": "scram-sha-512"},
            "authorization": {
                "acls": [
                    {
                        "resource": {"type": "topic", "name": "orders"},
                        "operations": ["Read", "Describe"],
                    },
                    {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
                ]
            },
        },
    ),
    cr("User", "bob", {"authentication": {"type": "tls"}}),
]

# (resource, a fragment of the API server's answer)
BAD = [
    (
        cr("Topic", "zero", {"partitions": 0}),
        "spec.partitions in body should be greater than or equal to 1",
    ),
    (
        cr("Topic", "space", {"partitions": 1, "topicName": "a b"}),
        "spec.topicName in body should match",
    ),
    (cr("Topic", "dot", {"partitions": 1, "topicName": ".."}), "topicName cannot be '.' or '..'"),
    (
        cr("Topic", "unknown", {"partitions": 1, "configs": {"foo": "1"}}),
        'unknown field "spec.configs.foo"',
    ),
    (
        cr("StaticTopic", "compact", {"totalQueues": 1, "configs": {"cleanup.policy": "compact"}}),
        "spec.configs.cleanup.policy in body should match",
    ),
    (
        cr(
            "Topic",
            "unclean",
            {"partitions": 1, "configs": {"unclean.leader.election.enable": True}},
        ),
        'supported values: "false"',
    ),
    (
        cr("Topic", "tiered", {"partitions": 1, "configs": {"remote.storage.enable": "false"}}),
        'spec.configs.remote.storage.enable: Invalid value: "string": spec.configs.remote.storage.enable in body must be of type boolean',
    ),
    (
        cr("Topic", "isr", {"partitions": 1, "configs": {"min.insync.replicas": 2}}),
        "spec.configs.min.insync.replicas in body should be less than or equal to 1",
    ),
    (
        cr("Topic", "ratio", {"partitions": 1, "configs": {"min.cleanable.dirty.ratio": 1.5}}),
        "spec.configs.min.cleanable.dirty.ratio in body should be less than or equal to 1",
    ),
    (
        cr("Topic", "retention", {"partitions": 1, "configs": {"retention.ms": "1 week"}}),
        "spec.configs.retention.ms in body should match",
    ),
    (
        cr(
            "PartitionReassignment",
            "both",
            {"partitions": [{"topic": "a", "partition": 0, "replicas": [1]}], "generate": {}},
        ),
        "set exactly one of spec.partitions",
    ),
    (
        cr("PartitionReassignment", "neither", {"approved": True}),
        "set exactly one of spec.partitions",
    ),
    (
        cr(
            "PartitionReassignment",
            "two",
            {"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2]}]},
        ),
        "must have at most 1 items",
    ),
    (
        cr(
            "PartitionReassignment",
            "auto",
            {"partitions": [{"topic": "a", "partition": 0, "replicas": [1]}], "autoApprove": True},
        ),
        "spec.autoApprove applies to planner-generated plans",
    ),
    (
        cr("StaticTopic", "queue", {"totalQueues": 4, "remap": [{"queue": 4, "broker": 0}]}),
        "every spec.remap[].queue must be below spec.totalQueues",
    ),
    (
        cr(
            "StaticTopic",
            "broker",
            {"totalQueues": 4, "brokers": [0], "remap": [{"queue": 1, "broker": 2}]},
        ),
        "must be one of spec.brokers",
    ),
    (cr("StaticTopic", "big", {"totalQueues": 2000}), "should be less than or equal to 1024"),
    (
        cr(
            "User",
            "pw",
            {
                "authentication": {
                    "type": "tls",
                    "password": {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                }
            },
        ),
        "a tls user has no password",
    ),
    (
        cr(
            "User",
            "noname",
            {
                "authentication": {"type": "tls"},
                "authorization": {
                    "acls": [{"resource": {"type": "topic"}, "operations": ["Read"]}]
                },
            },
        ),
        "name is required for topic, group and transactionalId resources",
    ),
    (
        cr(
            "User",
            "op",
            {
                "authentication": {"type": "tls"},
                "authorization": {
                    "acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}]
                },
            },
        ),
        "supported values",
    ),
]


def test_good_resources_are_accepted(api: Api, ns: str) -> None:
    for obj in GOOD:
        api.apply(ns, obj)
    plan = api.get(ns, "partitionreassignment", "plan")
    assert plan["spec"]["generate"]["window"] == "7d" and plan["spec"]["generate"]["step"] == "1m"
    assert plan["spec"]["approved"] is False and plan["spec"]["cancel"] is False
    ledger = api.get(ns, "statictopic", "ledger")
    assert ledger["spec"]["remap"] == [{"queue": 3, "broker": 1, "mode": "available"}]
    table = api.kubectl("-n", ns, "get", "tmt").stdout.splitlines()
    assert table[0].split() == ["NAME", "PARTITIONS", "READY", "REASON", "AGE"]
    assert table[1].split()[:2] == ["named", "3"]
    changelog = api.get(ns, "topic", "word-counts-changelog")["spec"]["configs"]
    assert changelog["min.cleanable.dirty.ratio"] == 0.1 and changelog["preallocate"] is True
    wide = api.kubectl("-n", ns, "get", "tpr", "-o", "wide").stdout.splitlines()[0].split()
    assert wide == ["NAME", "PHASE", "PROGRESS", "MESSAGE", "APPROVED", "CANCEL", "AGE"]
    alice = api.get(ns, "user", "alice")
    assert alice["spec"]["authorization"]["acls"][0]["host"] == "*"  # defaults
    assert alice["spec"]["authorization"]["acls"][0]["type"] == "allow"
    assert alice["spec"]["authorization"]["acls"][1]["resource"]["patternType"] == "literal"
    users = api.kubectl("-n", ns, "get", "tmu").stdout.splitlines()
    assert users[0].split() == ["NAME", "AUTHENTICATION", "READY", "REASON", "AGE"]
    assert api.kubectl("-n", ns, "get", "tst").stdout.splitlines()[0].split() == [
        "NAME",
        "QUEUES",
        "EPOCH",
        "READY",
        "REASON",
        "AGE",
    ]


@pytest.mark.parametrize(
    "index", range(len(BAD)), ids=[f"{o['kind']}-{o['metadata']['name']}" for o, _ in BAD]
)
def test_bad_resources_are_refused_with_a_clear_message(api: Api, ns: str, index: int) -> None:
    obj, fragment = BAD[index]
    proc = api.apply(ns, obj, check=False)
    assert proc.returncode != 0, f"{obj} was accepted"
    assert fragment in proc.stderr, proc.stderr


def test_updates_checked_against_the_old_object(api: Api, ns: str) -> None:
    for obj in GOOD:
        api.apply(ns, obj)

    def patch(kind: str, name: str, patch: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return api.kubectl(
            "-n", ns, "patch", kind, name, "--type", "merge", "-p", json.dumps(patch), check=False
        )

    refused = [
        (("topic", "named", {"spec": {"topicName": "other"}}), "spec.topicName is immutable"),
        (("topic", "orders", {"spec": {"topicName": "orders"}}), "spec.topicName is immutable"),
        (
            (
                "partitionreassignment",
                "move",
                {"spec": {"partitions": [{"topic": "x", "partition": 0, "replicas": [0]}]}},
            ),
            "spec.partitions is immutable",
        ),
        (
            ("partitionreassignment", "plan", {"spec": {"generate": {"maxMoves": 7}}}),
            "spec.generate is immutable",
        ),
        (
            ("clusterstate", "state", {"spec": {"clusterId": "other"}}),
            "spec.clusterId is immutable",
        ),
    ]
    for (kind, name, body), fragment in refused:
        proc = patch(kind, name, body)
        assert proc.returncode != 0 and fragment in proc.stderr, (kind, name, proc.stderr)
    # shrinking a Topic is admitted: the operator refuses it with a condition
    assert patch("topic", "orders", {"spec": {"partitions": 12}}).returncode == 0
    # so is changing a static topic's totalQueues (the operator refuses it with a condition,
    # and setting it back clears it); cancel is one-way
    assert patch("statictopic", "ledger", {"spec": {"totalQueues": 4}}).returncode == 0
    assert patch("statictopic", "ledger", {"spec": {"totalQueues": 16}}).returncode == 0
    assert patch("partitionreassignment", "move", {"spec": {"cancel": True}}).returncode == 0
    proc = patch("partitionreassignment", "move", {"spec": {"cancel": False}})
    assert proc.returncode != 0 and "spec.cancel cannot be undone" in proc.stderr
    # the document is written whole (compare-and-swap replaces keep any shape)
    assert (
        patch(
            "clusterstate", "state", {"spec": {"document": {"any": {"shape": [1, 2]}}}}
        ).returncode
        == 0
    )


def test_status_is_a_subresource(api: Api, ns: str) -> None:
    api.apply(ns, cr("Topic", "orders", {"partitions": 2}))
    status = {
        "observedGeneration": 1,
        "topicId": "abc",
        "partitionCount": 2,
        "partitions": [
            {"partition": 0, "broker": 1, "epoch": 3, "moving": False},
            {"partition": 1, "broker": None, "epoch": 0, "moving": True},
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "PartitionsMoving",
                "message": "1 partitions without a leader",
                "observedGeneration": None,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    # through the main endpoint status is ignored ...
    api.kubectl(
        "-n",
        ns,
        "patch",
        "topic",
        "orders",
        "--type",
        "merge",
        "-p",
        json.dumps({"status": status}),
    )
    assert "status" not in api.get(ns, "topic", "orders")
    # ... through /status it is stored (nulls pruned, as the operator's publisher sends them)
    api.kubectl(
        "-n",
        ns,
        "patch",
        "topic",
        "orders",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        json.dumps({"status": status}),
    )
    stored = api.get(ns, "topic", "orders")["status"]
    assert stored["partitions"][1] == {"partition": 1, "epoch": 0, "moving": True}
    assert "observedGeneration" not in stored["conditions"][0]
    row = api.kubectl("-n", ns, "get", "topic", "orders").stdout.splitlines()[1].split()
    assert row[1:4] == ["2", "False", "PartitionsMoving"]
    bad = {"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}}
    proc = api.kubectl(
        "-n",
        ns,
        "patch",
        "topic",
        "orders",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        json.dumps(bad),
        check=False,
    )
    assert proc.returncode != 0 and "Unsupported value" in proc.stderr


def test_kopf_peering_status_is_kept_whole(api: Api, ns: str) -> None:
    api.apply(ns, {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "p"}})
    peer = {"status": {"op-1": {"priority": 7, "lifetime": 60, "lastseen": "2026-01-01T00:00:00"}}}
    api.kubectl("-n", ns, "patch", "kopfpeering", "p", "--type", "merge", "-p", json.dumps(peer))
    assert api.get(ns, "kopfpeering", "p")["status"] == peer["status"]


def test_helm_install_upgrade_uninstall(api: Api, ns: str) -> None:
    release = "tmq"
    installed = api.helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--set",
        "inClusterObjectStore.enabled=true",
        "--set",
        "image.tag=0.1.0-test",
    ).stdout
    notes = installed.split("NOTES:", 1)[1]
    assert f"bootstrap.servers=tmq-tidalmq-bootstrap.{ns}.svc.cluster.local:9092" in notes
    # a fresh install with the defaults is secure: SASL_SSL and control-plane mTLS
    assert "security.protocol=SASL_SSL" in notes
    assert security_modes(api, ns) == {"tls": True, "sasl": True, "controlTls": True}
    # and its bootstrap admin (a SCRAM User), kept by upgrades
    admin = api.get(ns, "user", "tmq-tidalmq-admin")
    assert admin["spec"]["authentication"]["type"] == "scram-sha-512"
    assert f"kubectl -n {ns} port-forward pod/tmq-tidalmq-broker-0 9092:9092" in notes
    assert f"kubectl -n {ns} get partitionreassignments -w" in notes

    names = set(
        api.kubectl(
            "-n",
            ns,
            "get",
            "deployment,statefulset,service,hpa,pdb,role,rolebinding,"
            "serviceaccount,secret,kopfpeering,networkpolicy",
            "-l",
            f"app.kubernetes.io/instance={release}",
            "-o",
            "name",
        ).stdout.split()
    )
    for name in (
        "deployment.apps/tmq-tidalmq-operator",
        "statefulset.apps/tmq-tidalmq-object-store",
        "statefulset.apps/tmq-tidalmq-broker",
        "service/tmq-tidalmq-brokers",
        "service/tmq-tidalmq-bootstrap",
        "service/tmq-tidalmq-operator",
        "horizontalpodautoscaler.autoscaling/tmq-tidalmq-broker",
        "poddisruptionbudget.policy/tmq-tidalmq-broker",
        "role.rbac.authorization.k8s.io/tmq-tidalmq-operator",
        "serviceaccount/tmq-tidalmq-operator",
        "serviceaccount/tmq-tidalmq-spark",
        "secret/tmq-tidalmq-object-store",
        "kopfpeering.kopf.dev/tmq-tidalmq",
        "secret/tmq-tidalmq-control",
        "networkpolicy.networking.k8s.io/tmq-tidalmq-broker",
        "networkpolicy.networking.k8s.io/tmq-tidalmq-operator",
    ):
        assert name in names, (name, sorted(names))
    cluster_role = f"{ns}-tmq-tidalmq-operator"
    api.kubectl("get", "clusterrole", cluster_role)

    # An upgrade keeps the generated credentials, the control plane's tokens and the HPA's
    # broker count.
    secret = api.get(ns, "secret", "tmq-tidalmq-object-store")["data"]
    control = api.get(ns, "secret", "tmq-tidalmq-control")["data"]
    assert set(control) == {"admin-token", "broker-secret"}
    api.kubectl("-n", ns, "scale", "statefulset", "tmq-tidalmq-broker", "--replicas", "5")
    api.helm(
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "broker.logLevel=DEBUG",
    )
    assert api.get(ns, "secret", "tmq-tidalmq-object-store")["data"] == secret
    assert api.get(ns, "secret", "tmq-tidalmq-control")["data"] == control
    assert api.get(ns, "statefulset", "tmq-tidalmq-broker")["spec"]["replicas"] == 5
    assert security_modes(api, ns) == {"tls": True, "sasl": True, "controlTls": True}
    # and its bootstrap admin (a SCRAM User), kept by upgrades
    admin = api.get(ns, "user", "tmq-tidalmq-admin")
    assert admin["spec"]["authentication"]["type"] == "scram-sha-512"

    # A bad value never reaches the cluster.
    proc = api.helm(
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "image.tag=latest",
        check=False,
    )
    assert proc.returncode != 0 and "tag" in proc.stderr

    # --no-hooks: this API server has no nodes, so the pre-delete hook's Job would never run
    # (test_uninstall_hook_command runs its command against this API server)
    api.helm("uninstall", release, "--namespace", ns, "--no-hooks")
    left = api.kubectl(
        "-n",
        ns,
        "get",
        "deployment,statefulset,service,secret,kopfpeering,networkpolicy",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
    ).stdout
    assert not left.strip(), left
    assert api.kubectl("get", "clusterrole", cluster_role, check=False).returncode != 0
    # Helm never deletes CRDs (nor, with them, every Topic in the cluster).
    api.kubectl("get", "crd", "topics.tidalmq.io")


WORKLOADS = "deployment,statefulset"


def workloads(api: Api, ns: str) -> dict[str, dict[str, Any]]:
    """Every workload of the namespace: its generation and pod template, by KIND/NAME."""
    items = api.get(ns, WORKLOADS)["items"]
    return {
        f"{o['kind']}/{o['metadata']['name']}": {
            "generation": o["metadata"]["generation"],
            "template": o["spec"]["template"],
        }
        for o in items
    }


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "inClusterObjectStore.enabled=true"],
        ["--set", "objectStore.accessKey=AK", "--set", "objectStore.secretKey=SK"],
        [
            "--set",
            "inClusterObjectStore.enabled=true",
            "--set",
            "listeners.tls.enabled=true",
            "--set",
            "listeners.sasl.enabled=true",
            "--set",
            "controlPlane.tls.enabled=true",
        ],
    ],
    ids=["generated-credentials", "keys-in-values", "tls-and-sasl"],
)
def test_an_upgrade_with_unchanged_values_changes_no_pod_template(
    api: Api, ns: str, values: list[str]
) -> None:
    """helm install, then helm upgrade with the same values: the upgrade's render finds the
    stored Secret through lookup (the install's found none and generated the keys), and every
    pod template, annotations included, is what the install wrote: no workload's generation
    moves, so no pod would restart. A value that matters does change them."""
    release = "tmq"
    common = ["--namespace", ns, "--set", "image.tag=0.1.0-test", *values]
    api.helm("install", release, str(CHART), *common)
    installed = workloads(api, ns)
    assert set(installed) >= {"Deployment/tmq-tidalmq-operator", "StatefulSet/tmq-tidalmq-broker"}
    secret = api.get(ns, "secret", "tmq-tidalmq-object-store")["data"]
    control = api.get(ns, "secret", "tmq-tidalmq-control")["data"]

    tls = {
        name: api.get(ns, "secret", name)["data"]
        for name in ("tmq-tidalmq-broker-tls", "tmq-tidalmq-clients-ca")
        if "listeners.tls.enabled=true" in values
    }
    if "controlPlane.tls.enabled=true" in values:  # the control plane's CA and certificates
        tls["tmq-tidalmq-control-tls"] = api.get(ns, "secret", "tmq-tidalmq-control-tls")["data"]

    api.helm("upgrade", release, str(CHART), *common)
    assert workloads(api, ns) == installed
    # the generated certificates are kept (lookup), as the generated keys are
    for name, data in tls.items():
        assert api.get(ns, "secret", name)["data"] == data, name
    assert api.get(ns, "secret", "tmq-tidalmq-object-store")["data"] == secret
    assert api.get(ns, "secret", "tmq-tidalmq-control")["data"] == control
    api.helm("upgrade", release, str(CHART), *common)
    assert workloads(api, ns) == installed

    api.helm("upgrade", release, str(CHART), *common, "--set", "broker.logLevel=DEBUG")
    changed = workloads(api, ns)
    broker = "StatefulSet/tmq-tidalmq-broker"
    assert changed[broker]["generation"] == installed[broker]["generation"] + 1
    operator = "Deployment/tmq-tidalmq-operator"
    assert changed[operator] == installed[operator], "a broker setting leaves the operator be"
    api.helm("uninstall", release, "--namespace", ns, "--no-hooks")


MODES = "tidalmq.io/security-modes"


def security_modes(api: Api, ns: str) -> dict[str, bool]:
    sts = api.get(ns, "statefulset", "tmq-tidalmq-broker")
    return dict(json.loads(sts["metadata"]["annotations"][MODES]))


@pytest.mark.parametrize(
    "running",
    [
        {"tls": False, "sasl": False, "controlTls": False},
        {"tls": True, "sasl": True, "controlTls": False},
    ],
    ids=["plaintext-release", "sasl-ssl-release-without-control-tls"],
)
def test_auto_keeps_what_a_release_runs_at_an_upgrade(
    api: Api, ns: str, running: dict[str, bool]
) -> None:
    """listeners.*.enabled and controlPlane.tls.enabled default to auto: on at a fresh install,
    but an upgrade keeps what the release runs (docs/security.md, "Secure by default"). A
    release installed with explicit values, upgraded with the defaults: read from the
    StatefulSet's security-modes annotation, then (the annotation removed, as on a release of
    the chart before auto) from the broker's environment, no pod template changes either time.
    Explicit values still win at an upgrade."""
    release = "tmq"
    common = [
        "--namespace",
        ns,
        "--set",
        "image.tag=0.1.0-test",
        "--set",
        "inClusterObjectStore.enabled=true",
    ]
    explicit = [
        "--set",
        f"listeners.tls.enabled={str(running['tls']).lower()}",
        "--set",
        f"listeners.sasl.enabled={str(running['sasl']).lower()}",
        "--set",
        f"controlPlane.tls.enabled={str(running['controlTls']).lower()}",
    ]
    # no admin User at the install: as on a release of the chart before users.admin
    api.helm(
        "install", release, str(CHART), *common, *explicit, "--set", "users.admin.enabled=false"
    )
    installed = workloads(api, ns)
    assert security_modes(api, ns) == running

    api.helm("upgrade", release, str(CHART), *common)  # the defaults: auto
    assert workloads(api, ns) == installed
    assert security_modes(api, ns) == running

    api.kubectl("-n", ns, "annotate", "statefulset", "tmq-tidalmq-broker", f"{MODES}-")
    api.helm("upgrade", release, str(CHART), *common)
    assert workloads(api, ns) == installed, "read from the broker's environment"
    assert security_modes(api, ns) == running
    secrets = set(api.kubectl("-n", ns, "get", "secret", "-o", "name").stdout.split())
    assert ("secret/tmq-tidalmq-control-tls" in secrets) == running["controlTls"]
    assert ("secret/tmq-tidalmq-broker-tls" in secrets) == running["tls"]
    # users.admin.enabled auto never adds an admin credential to a running release
    names = {u["metadata"]["name"] for u in api.get(ns, "user")["items"]}
    assert "tmq-tidalmq-admin" not in names, names

    # an explicit value wins over what runs
    api.helm("upgrade", release, str(CHART), *common, "--set", "controlPlane.tls.enabled=true")
    assert security_modes(api, ns) == {**running, "controlTls": True}
    api.helm("uninstall", release, "--namespace", ns, "--no-hooks")


def test_uninstall_hook_command(api: Api, ns: str) -> None:
    """`tidalmq operator uninstall`, the chart's pre-delete hook, against the API server: it
    scales the operator's Deployment to 0, waits while an operator pod is left, then removes
    the operator's finalizer (and only that one) from every TidalMQ resource, deleting none."""
    labels = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/instance": "tmq"}
    api.apply(
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "tmq-operator"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "operator", "image": "tidalmq:test"}]},
                },
            },
        },
    )
    # no nodes, no controllers: this pod stands for a running operator replica until deleted
    api.apply(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "tmq-operator-abc", "labels": labels},
            "spec": {"containers": [{"name": "operator", "image": "tidalmq:test"}]},
        },
    )
    finalized = []
    for obj in GOOD:
        body = {
            **obj,
            "metadata": {
                **obj["metadata"],
                "finalizers": [
                    "tidalmq.io/finalizer",
                    *(["example.com/keep"] if obj["kind"] == "Topic" else []),
                ],
            },
        }
        api.apply(ns, body)
        finalized.append(f"{obj['kind'].lower()}/{obj['metadata']['name']}")
    api.kubectl("-n", ns, "delete", "topic", "named", "--wait=false")  # deleting: held by both

    hook = subprocess.Popen(
        [
            str(REPO / ".venv" / "bin" / "tidalmq"),
            "operator",
            "uninstall",
            "--namespace",
            ns,
            "--operator-deployment",
            "tmq-operator",
            "--timeout",
            "60",
        ],
        env={**os.environ, **api.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while api.get(ns, "deployment", "tmq-operator")["spec"]["replicas"] != 0:
            assert time.monotonic() < deadline, "the operator was not scaled to 0"
            time.sleep(0.2)
        time.sleep(2)
        assert hook.poll() is None, f"did not wait for the operator pod: {hook.stdout.read()}"  # type: ignore[union-attr]
        for name in finalized:
            assert "tidalmq.io/finalizer" in api.get(ns, name)["metadata"]["finalizers"], name
        api.kubectl("-n", ns, "delete", "pod", "tmq-operator-abc", "--wait=false")
        out, _ = hook.communicate(timeout=60)
    finally:
        hook.kill()
    assert hook.returncode == 0, out
    assert "operator stopped" in out, out
    for name in finalized:
        obj = api.get(ns, name)  # still there: nothing is deleted
        finalizers = obj["metadata"].get("finalizers", [])
        assert "tidalmq.io/finalizer" not in finalizers, (name, finalizers)
        if name == "topic/named":
            assert finalizers == ["example.com/keep"], "another finalizer stays"
