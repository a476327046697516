"""What `helm template` renders: the contract between the chart and the broker/operator code
(environment, ports, probes, commands), and the objects around it (Services, HPA, PDB, RBAC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.cli import build_parser

from tests.support.helm import (
    FULL,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    STS,
    container,
    env_of,
    find,
    find_all,
    pod_spec,
    render,
)

HEADLESS = f"{FULL}-brokers"
# the Secrets a default install generates: the control tokens, the control plane's certificates,
# the Kafka listener's certificate and the clients CA (secure by default: docs/security.md)
GENERATED_SECRETS = [f"{FULL}-control", f"{FULL}-control-tls", f"{FULL}-broker-tls",
                     f"{FULL}-clients-ca"]  # fmt: skip
SELECTOR = "app.kubernetes.io/name=tidalmq,app.kubernetes.io/instance=rel,app.kubernetes.io/component=broker"

pytestmark = pytest.mark.usefixtures("helm")
AUTH_READER = "extension-apiserver-authentication-reader"

NAMESPACED = {
    "ServiceAccount", "Role", "RoleBinding", "Deployment", "StatefulSet", "Service",
    "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret", "KopfPeering", "Pod",
    "ServiceMonitor", "Job", "NetworkPolicy", "User", "ConfigMap", "PrometheusRule",
}  # fmt: skip


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def full() -> list[dict[str, Any]]:
    return render(None, "full.yaml")


# ---------------------------------------------------------------------------- every object
@pytest.mark.parametrize("values_file", [None, "full.yaml", "aws.yaml"])
def test_every_object_has_the_standard_labels_and_namespace(values_file: str | None) -> None:
    docs = render(None, *([values_file] if values_file else []))
    for doc in docs:
        where = f"{doc['kind']} {doc['metadata']['name']}"
        labels = doc["metadata"].get("labels", {})
        for key in ("name", "instance", "component", "version", "managed-by"):
            assert f"app.kubernetes.io/{key}" in labels, f"{where} lacks app.kubernetes.io/{key}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/component"] in {
            "broker", "operator", "object-store", "planner", "admin", "test", "uninstall", "monitoring",
            "metrics-adapter",
        }, where  # fmt: skip
        if doc["kind"] in NAMESPACED:
            # the one exception: the metrics adapter reads the aggregation layer's front-proxy
            # settings, which live in kube-system
            auth_reader = doc.get("roleRef", {}).get("name") == AUTH_READER
            assert doc["metadata"]["namespace"] == ("kube-system" if auth_reader else NAMESPACE), (
                where
            )
        else:
            assert doc["kind"] in {"ClusterRole", "ClusterRoleBinding", "APIService"}, where


@pytest.mark.parametrize("values_file", [None, "full.yaml", "aws.yaml"])
def test_images_have_explicit_tags_never_latest(values_file: str | None) -> None:
    docs = render(None, *([values_file] if values_file else []))
    images = []
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Pod"}:
            spec = pod_spec(doc)
            for c in spec.get("initContainers", []) + spec["containers"]:
                images.append(c["image"])
    assert images
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and "/" not in tag, f"{image} has no explicit tag"
        assert tag != "latest", image


def test_default_image_is_the_app_version() -> None:
    chart = (Path(__file__).resolve().parents[1] / "Chart.yaml").read_text()
    app_version = next(
        line.split(":", 1)[1].strip().strip('"')
        for line in chart.splitlines()
        if line.startswith("appVersion:")
    )
    sts = find(render(), "StatefulSet", STS)
    # the name e2e/cluster/images.sh builds (test_defaults.py checks the two agree)
    assert container(sts, "broker")["image"] == f"tidalmq.local/tidalmq:{app_version}"


# ---------------------------------------------------------------------------- brokers
def test_broker_statefulset(default: list[dict[str, Any]]) -> None:
    sts = find(default, "StatefulSet", STS)
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == HEADLESS
    assert "volumeClaimTemplates" not in spec, "brokers keep no durable state"
    assert spec["replicas"] == 2  # autoscaling on by default: starts at minReplicas
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 60
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    broker = container(sts, "broker")
    assert broker["args"] == ["broker"]  # the image's entrypoint is `tini -- tidalmq`
    assert {p["name"]: p["containerPort"] for p in broker["ports"]} == {
        "kafka": 9092, "http": 9644, "control": 9645,
    }  # fmt: skip
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tidalmq",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "broker",
    }


def test_broker_environment_contract(default: list[dict[str, Any]]) -> None:
    """The variables the broker reads (tidalmq_broker.settings), exactly."""
    env = env_of(container(find(default, "StatefulSet", STS), "broker"))
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TIDALMQ_BROKER_ID_FROM_HOSTNAME"] == "true"
    assert env["TIDALMQ_HOST"] == "0.0.0.0"
    assert env["TIDALMQ_PORT"] == "9092"
    assert env["TIDALMQ_ADVERTISED_HOST"] == (
        f"$(POD_NAME).{HEADLESS}.{NAMESPACE}.svc.cluster.local"
    )
    # the HTTP ports listen on the pod's IP, where probes and Prometheus come, not 0.0.0.0
    assert env["TIDALMQ_HTTP_HOST"] == "$(POD_IP)"
    assert env["TIDALMQ_HTTP_PORT"] == "9644"
    assert env["TIDALMQ_CONTROL_HOST"] == "$(POD_IP)"
    assert env["TIDALMQ_CONTROL_PORT"] == "9645"
    assert env["TIDALMQ_CONTROL_TOKEN_FILE"] == "/etc/tidalmq/control/broker-secret"
    # https: control-plane mTLS is on by default (test_control_tls.py)
    assert env["TIDALMQ_CONTROLLER_URL"] == f"https://{OPERATOR}.{NAMESPACE}.svc:9690"
    assert env["TIDALMQ_DEFAULT_PARTITIONS"] == "3"
    assert env["TIDALMQ_AUTO_CREATE_TOPICS"] == "false"  # topics are Topic resources here
    assert env["TIDALMQ_STORAGE_URL"] == "s3://tidalmq?region=us-east-1"
    assert env["TIDALMQ_LOG_FORMAT"] == "json"
    assert env["TIDALMQ_LOG_LEVEL"] == "INFO"
    # $(VAR) references only work for variables defined earlier in the list
    names = list(env)
    assert names.index("POD_NAME") < names.index("TIDALMQ_ADVERTISED_HOST")
    assert names.index("POD_IP") < names.index("TIDALMQ_CONTROL_HOST")
    assert names.index("POD_IP") < names.index("TIDALMQ_HTTP_HOST")
    # default values pass no credentials (pod identity): no AWS keys
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def test_broker_probes_and_prestop_drain(default: list[dict[str, Any]]) -> None:
    broker = container(find(default, "StatefulSet", STS), "broker")
    assert broker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert broker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert broker["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # the drain finds the control port (at the pod's IP) and the token in the broker's env
    command = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["tidalmq", "drain", "--timeout", "50"]
    args = build_parser(every=True).parse_args(command[1:])
    assert (args.command, args.http_url, args.timeout) == ("drain", "", 50.0)


def test_broker_settings_follow_values() -> None:
    docs = render({
        "broker": {"ports": {"kafka": 19092, "http": 19644, "control": 19645},
                   "drainTimeoutSeconds": 100,
                   "terminationGracePeriodSeconds": 120, "defaultPartitions": 8,
                   "autoCreateTopics": True,
                   "extraEnv": [{"name": "TIDALMQ_CACHE_BYTES", "value": "1000"}]},
        "clusterDomain": "corp.example",
        "autoscaling": {"enabled": False},
    })  # fmt: skip
    sts = find(docs, "StatefulSet", STS)
    broker = container(sts, "broker")
    env = env_of(broker)
    assert sts["spec"]["replicas"] == 3  # broker.replicas when not autoscaled
    assert env["TIDALMQ_PORT"] == "19092" and env["TIDALMQ_HTTP_PORT"] == "19644"
    assert env["TIDALMQ_CONTROL_PORT"] == "19645"
    assert env["TIDALMQ_ADVERTISED_HOST"].endswith(".svc.corp.example")
    assert env["TIDALMQ_DEFAULT_PARTITIONS"] == "8"
    assert env["TIDALMQ_AUTO_CREATE_TOPICS"] == "true"
    assert env["TIDALMQ_CACHE_BYTES"] == "1000"
    assert broker["lifecycle"]["preStop"]["exec"]["command"][-2:] == ["--timeout", "100"]
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    assert not find_all(docs, "HorizontalPodAutoscaler")
    headless = find(docs, "Service", HEADLESS)
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {
        "kafka": 19092, "http": 19644,
    }  # fmt: skip


def test_broker_services(default: list[dict[str, Any]]) -> None:
    sts = find(default, "StatefulSet", STS)
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    headless = find(default, "Service", HEADLESS)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    bootstrap = find(default, "Service", f"{FULL}-bootstrap")
    assert bootstrap["spec"]["type"] == "ClusterIP"
    assert bootstrap["spec"]["ports"] == [
        {"name": "kafka", "port": 9092, "targetPort": "kafka", "protocol": "TCP"}
    ]
    for svc in (headless, bootstrap):
        assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_hpa_targets_the_broker_statefulset(default: list[dict[str, Any]]) -> None:
    hpa = find(default, "HorizontalPodAutoscaler", STS)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": STS,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}
    ]  # fmt: skip
    scale_down = hpa["spec"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] == 300
    assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    # the CPU target needs CPU requests on the broker
    assert container(find(default, "StatefulSet", STS), "broker")["resources"]["requests"]["cpu"]


def test_hpa_bytes_in_metric(full: list[dict[str, Any]]) -> None:
    hpa = find(full, "HorizontalPodAutoscaler", "tmq-broker")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    pods_metric = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")
    assert pods_metric["pods"] == {
        "metric": {"name": "tidalmq_broker_bytes_in_per_second"},
        "target": {"type": "AverageValue", "averageValue": "50Mi"},
    }


def test_pdb_covers_the_brokers(default: list[dict[str, Any]]) -> None:
    pdb = find(default, "PodDisruptionBudget", STS)
    assert pdb["spec"]["maxUnavailable"] == 1
    sts = find(default, "StatefulSet", STS)
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    assert not find_all(render({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


# ---------------------------------------------------------------------------- operator
def test_operator_deployment_and_environment_contract(default: list[dict[str, Any]]) -> None:
    """The variables the operator reads (tidalmq_operator.settings) and where things are."""
    deployment = find(default, "Deployment", OPERATOR)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    operator = container(deployment, "operator")
    assert operator["args"] == ["operator", "run"]
    env = env_of(operator)
    assert env["TIDALMQ_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["TIDALMQ_BROKER_STATEFULSET"] == STS
    assert env["TIDALMQ_BROKER_SELECTOR"] == SELECTOR
    assert env["TIDALMQ_CLUSTER_STATE_NAME"] == FULL
    assert env["TIDALMQ_PEERING_NAME"] == FULL
    assert env["TIDALMQ_CONTROLLER_PORT"] == "9690"
    assert env["TIDALMQ_OPERATOR_HTTP_PORT"] == "9691"
    # both listen on the pod's IP (the controller Service and the probes come to it)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TIDALMQ_CONTROLLER_HOST"] == env["TIDALMQ_OPERATOR_HTTP_HOST"] == "$(POD_IP)"
    names = list(env)
    assert names.index("POD_IP") < names.index("TIDALMQ_CONTROLLER_HOST")
    assert env["TIDALMQ_CONTROL_TOKEN_FILE"] == "/etc/tidalmq/control/admin-token"
    assert env["TIDALMQ_CONTROL_BROKER_SECRET_FILE"] == "/etc/tidalmq/control/broker-secret"
    assert env["TIDALMQ_STORAGE_URL"] == "s3://tidalmq?region=us-east-1"
    assert env["TIDALMQ_BROKER_SERVICE"] == HEADLESS
    assert env["TIDALMQ_BOOTSTRAP_SERVERS"] == f"{FULL}-bootstrap.{NAMESPACE}.svc:9092"
    assert env["TIDALMQ_SPARK_SERVICE_ACCOUNT"] == f"{FULL}-spark"
    assert env["TIDALMQ_SPARK_IMAGE"] == "tidalmq.local/spark:0.1.0"
    assert env["TIDALMQ_SPARK_SUBMIT"] == "pod"  # the operator image has no Java
    assert "TIDALMQ_PROMETHEUS_URL" not in env
    assert {p["name"]: p["containerPort"] for p in operator["ports"]} == {
        "controller": 9690, "metrics": 9691,
    }  # fmt: skip
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # every replica is Ready; the controller Service selects the active one by its label
    assert operator["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_operator_selector_matches_the_broker_pods(default: list[dict[str, Any]]) -> None:
    """TIDALMQ_BROKER_SELECTOR selects exactly the StatefulSet's pods (and not the operator)."""
    env = env_of(container(find(default, "Deployment", OPERATOR), "operator"))
    wanted = dict(part.split("=", 1) for part in env["TIDALMQ_BROKER_SELECTOR"].split(","))
    sts = find(default, "StatefulSet", STS)
    assert wanted.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    operator_labels = find(default, "Deployment", OPERATOR)["spec"]["template"]["metadata"][
        "labels"
    ]
    assert not wanted.items() <= operator_labels.items()


def test_operator_service_and_peering(default: list[dict[str, Any]]) -> None:
    svc = find(default, "Service", OPERATOR)
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "controller": 9690,
        "metrics": 9691,
    }
    pod_labels = find(default, "Deployment", OPERATOR)["spec"]["template"]["metadata"]["labels"]
    # the Service reaches only the replica that labelled itself the active controller
    assert svc["spec"]["selector"].pop("tidalmq.io/controller") == "active"
    assert "tidalmq.io/controller" not in pod_labels
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    peering = find(default, "KopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == FULL


def test_operator_follows_values(full: list[dict[str, Any]]) -> None:
    deployment = find(full, "Deployment", "tmq-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "tmq-operator-sa"
    env = env_of(container(deployment, "operator"))
    assert env["TIDALMQ_PEERING_NAME"] == "tmq-peering"
    assert env["TIDALMQ_PROMETHEUS_URL"] == "http://prometheus.monitoring.svc:9090"
    assert env["TIDALMQ_ELECTION_TIMEOUT_S"] == "5"
    assert find(full, "KopfPeering")["metadata"]["name"] == "tmq-peering"
    sa = find(full, "ServiceAccount", "tmq-operator-sa")
    assert sa["metadata"]["annotations"] == {"example.com/role": "tidalmq"}
    binding = find(full, "RoleBinding", "tmq-operator")
    assert binding["subjects"][0]["name"] == "tmq-operator-sa"


# ---------------------------------------------------------------------------- RBAC
def rules_of(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return find(docs, kind, name)["rules"]


def allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


@pytest.mark.parametrize("values_file", [None, "full.yaml"])
def test_rbac_has_no_wildcards(values_file: str | None) -> None:
    docs = render(None, *([values_file] if values_file else []))
    roles = find_all(docs, "Role") + find_all(docs, "ClusterRole")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: {rule}"
            assert "nonResourceURLs" not in rule


def test_operator_role_is_least_privilege(default: list[dict[str, Any]]) -> None:
    rules = rules_of(default, "Role", OPERATOR)
    for plural in ("topics", "partitionreassignments", "statictopics", "clusterstates", "users"):
        for verb in ("get", "list", "watch", "patch", "create", "update"):
            assert allowed(rules, "tidalmq.io", plural, verb), (plural, verb)
        assert allowed(rules, "tidalmq.io", f"{plural}/status", "patch")
        assert allowed(rules, "tidalmq.io", f"{plural}/finalizers", "update")
    for verb in ("get", "list", "watch", "patch"):
        assert allowed(rules, "kopf.dev", "kopfpeerings", verb)
    for verb in ("get", "list", "watch"):
        assert allowed(rules, "", "pods", verb)
        assert allowed(rules, "apps", "statefulsets", verb)
    assert allowed(rules, "apps", "statefulsets", "patch")
    assert allowed(rules, "", "events", "create")
    # never: listing or watching secrets (pods get credentials from Secret volumes; the Secrets
    # of User resources are read and written by name: test_security_values.py), nodes, deleting
    # StatefulSets
    for resource, verb in (("secrets", "list"), ("secrets", "watch"), ("nodes", "list")):
        assert not allowed(rules, "", resource, verb), (resource, verb)
    assert not allowed(rules, "apps", "statefulsets", "delete")
    assert not allowed(rules, "apps", "statefulsets", "update")


def test_operator_cluster_role_only_what_kopf_needs(default: list[dict[str, Any]]) -> None:
    role = find(default, "ClusterRole")
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert grants == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }
    binding = find(default, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
    ]
    # per-namespace names: two releases in two namespaces do not collide
    assert NAMESPACE in role["metadata"]["name"]


def test_spark_rbac_follows_spark_enabled(default: list[dict[str, Any]]) -> None:
    rules = rules_of(default, "Role", OPERATOR)
    for verb in ("create", "delete", "get", "list", "watch"):
        for resource in ("pods", "services", "configmaps"):
            assert allowed(rules, "", resource, verb), (resource, verb)
    spark_rules = rules_of(default, "Role", f"{FULL}-spark")
    assert allowed(spark_rules, "", "pods", "create") and allowed(spark_rules, "", "pods", "delete")
    # spark-submit server-side applies the driver's ConfigMap and Service (a PATCH)
    assert allowed(spark_rules, "", "configmaps", "patch")
    assert allowed(spark_rules, "", "services", "patch")
    find(default, "ServiceAccount", f"{FULL}-spark")

    docs = render({"spark": {"enabled": False}})
    rules = rules_of(docs, "Role", OPERATOR)
    assert not allowed(rules, "", "pods", "create")
    assert not allowed(rules, "", "pods", "delete")
    assert not allowed(rules, "", "configmaps", "create")
    assert [r["metadata"]["name"] for r in find_all(docs, "Role")] == [
        OPERATOR, f"{FULL}-uninstall",
    ]  # fmt: skip
    env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert "TIDALMQ_SPARK_SERVICE_ACCOUNT" not in env


# ---------------------------------------------------------------------------- object store
def storage_env(docs: list[dict[str, Any]], sts: str = STS) -> dict[str, Any]:
    return env_of(container(find(docs, "StatefulSet", sts), "broker"))


def test_metadata_store_from_values() -> None:
    """An external S3: the metadata log in the data bucket unless metadataStore names another."""
    env = env_of(container(find(render(None, "aws.yaml"), "Deployment", OPERATOR), "operator"))
    assert "TIDALMQ_METADATA_URL" not in env  # the operator's default: the data store
    docs = render({"metadataStore": {"bucket": "acme-metadata", "prefix": "/tidalmq/"}}, "aws.yaml")
    env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert env["TIDALMQ_METADATA_URL"] == (
        "s3://acme-metadata/tidalmq?endpoint_url=https://s3.eu-central-1.amazonaws.com"
        "&region=eu-central-1"
    )


def test_in_cluster_store_beside_an_external_endpoint_keeps_the_metadata_in_the_data_bucket() -> (
    None
):
    """The data on another S3 server (objectStore.endpoint) while the in-cluster server also
    runs: the metadata goes where the data is, never to a bucket of a server not used."""
    docs = render({"inClusterObjectStore": {"enabled": True},
                   "objectStore": {"endpoint": "http://s3.example:9000"}})  # fmt: skip
    env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    assert "TIDALMQ_METADATA_URL" not in env
    init = pod_spec(find(docs, "StatefulSet", f"{FULL}-object-store"))["initContainers"][0]
    assert init["command"] == ["mkdir", "-p", "/data/tidalmq"]


def test_storage_url_from_values() -> None:
    docs = render(None, "aws.yaml")
    env = storage_env(docs)
    assert env["TIDALMQ_STORAGE_URL"] == (
        "s3://acme-streaming/tidalmq?endpoint_url=https://s3.eu-central-1.amazonaws.com"
        "&region=eu-central-1"
    )
    assert env["AWS_REGION"] == "eu-central-1"
    for name, key in (("AWS_ACCESS_KEY_ID", "access-key"), ("AWS_SECRET_ACCESS_KEY", "secret-key")):
        assert env[name] == {"secretKeyRef": {"name": "acme-s3-credentials", "key": key}}
    assert [d["metadata"]["name"] for d in find_all(docs, "Secret")] == GENERATED_SECRETS, (
        "an existing Secret is used for the object store, none is created"
    )
    operator_env = env_of(container(find(docs, "Deployment", OPERATOR), "operator"))
    for name in ("TIDALMQ_STORAGE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert operator_env[name] == env[name]


def test_credentials_from_values_become_a_secret() -> None:
    docs = render({"objectStore": {"endpoint": "http://10.0.0.5:9000/", "accessKey": "AK",
                                   "secretKey": "SK", "prefix": "/a/b/", "region": ""}})  # fmt: skip
    env = storage_env(docs)
    assert env["TIDALMQ_STORAGE_URL"] == "s3://tidalmq/a/b?endpoint_url=http://10.0.0.5:9000/"
    assert "AWS_REGION" not in env
    secret = find(docs, "Secret", f"{FULL}-object-store")
    assert secret["data"] == {"access-key": "QUs=", "secret-key": "U0s="}
    assert env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == f"{FULL}-object-store"


def test_in_cluster_object_store(full: list[dict[str, Any]]) -> None:
    env = storage_env(full, "tmq-broker")
    assert env["TIDALMQ_STORAGE_URL"] == (
        "s3://tidalmq/clusters/prod?endpoint_url=http://tmq-object-store.streaming.svc:9000"
        "&region=eu-west-1"
    )
    secret = find(full, "Secret", "tmq-object-store")
    assert set(secret["data"]) == {"access-key", "secret-key"}
    minio = find(full, "StatefulSet", "tmq-object-store")
    assert minio["metadata"]["labels"]["app.kubernetes.io/component"] == "object-store"
    server = container(minio, "minio")
    assert server["command"][:3] == ["minio", "server", "/data"]
    minio_env = env_of(server)
    assert minio_env["MINIO_ROOT_USER"] == {
        "secretKeyRef": {"name": "tmq-object-store", "key": "access-key"}
    }
    assert minio_env["MINIO_ROOT_PASSWORD"] == {
        "secretKeyRef": {"name": "tmq-object-store", "key": "secret-key"}
    }
    assert server["readinessProbe"]["httpGet"]["path"] == "/minio/health/ready"
    init = pod_spec(minio)["initContainers"][0]
    # the buckets: the data, and the metadata log apart from it
    assert init["command"] == ["mkdir", "-p", "/data/tidalmq", "/data/tidalmq-metadata"]
    operator_env = env_of(container(find(full, "Deployment", "tmq-operator"), "operator"))
    assert operator_env["TIDALMQ_METADATA_URL"] == (
        "s3://tidalmq-metadata?endpoint_url=http://tmq-object-store.streaming.svc:9000"
        "&region=eu-west-1"
    )
    assert "TIDALMQ_METADATA_URL" not in storage_env(full, "tmq-broker")  # the operator's only
    svc = find(full, "Service", "tmq-object-store")
    assert svc["spec"]["ports"][0]["port"] == 9000
    # the StatefulSet's one pod, by the pod-name label its controller adds (never a pod of the
    # Deployment earlier chart versions made, during an upgrade)
    selector = dict(svc["spec"]["selector"])
    assert selector.pop("statefulset.kubernetes.io/pod-name") == "tmq-object-store-0"
    assert selector.items() <= minio["spec"]["template"]["metadata"]["labels"].items()


def test_no_object_store_objects_by_default(default: list[dict[str, Any]]) -> None:
    assert [d["metadata"]["name"] for d in find_all(default, "Secret")] == GENERATED_SECRETS
    assert [d["metadata"]["name"] for d in find_all(default, "Deployment")] == [OPERATOR]
    assert [d["metadata"]["name"] for d in find_all(default, "StatefulSet")] == [STS]


# ---------------------------------------------------------------------------- metrics
def test_prometheus_annotations(default: list[dict[str, Any]]) -> None:
    for kind, name, port in (("StatefulSet", STS, "9644"), ("Deployment", OPERATOR, "9691")):
        annotations = find(default, kind, name)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == port
        assert annotations["prometheus.io/path"] == "/metrics"
    docs = render({"metrics": {"podAnnotations": False}})
    annotations = find(docs, "StatefulSet", STS)["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations


def test_service_monitors(default: list[dict[str, Any]], full: list[dict[str, Any]]) -> None:
    assert not find_all(default, "ServiceMonitor")
    monitors = {m["metadata"]["name"]: m for m in find_all(full, "ServiceMonitor")}
    assert set(monitors) == {"tmq-broker", "tmq-operator"}
    broker = monitors["tmq-broker"]
    assert broker["metadata"]["labels"]["release"] == "prometheus"
    assert broker["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert monitors["tmq-operator"]["spec"]["endpoints"][0]["port"] == "metrics"
    headless = find(full, "Service", "tmq-brokers")
    assert (
        broker["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    )


# ---------------------------------------------------------------------------- helm test hook
def test_helm_test_pod_checks_the_bootstrap_service(default: list[dict[str, Any]]) -> None:
    pod = find(default, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = container(pod, "api-versions")["args"][0]
    assert f'"{FULL}-bootstrap.{NAMESPACE}.svc", 9092' in script
    compile(script, "helm-test", "exec")  # valid Python


def test_brokers_can_advertise_pod_ips() -> None:
    docs = render({"broker": {"advertise": "podIP"}})
    env = env_of(container(find(docs, "StatefulSet", STS), "broker"))
    assert env["TIDALMQ_ADVERTISED_HOST"] == "$(POD_IP)"
    default_env = env_of(container(find(render(), "StatefulSet", STS), "broker"))
    assert default_env["TIDALMQ_ADVERTISED_HOST"].startswith("$(POD_NAME).")
