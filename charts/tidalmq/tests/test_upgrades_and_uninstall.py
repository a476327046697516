"""What makes `helm upgrade` and `helm uninstall` lose nothing: pod templates that change only
when a value that matters changes (the checksum/object-store annotation hashes values, never a
render of the generated Secret), the in-cluster object store's PersistentVolumeClaim, and the
pre-delete hook that stops the operator and removes its finalizers. The install-then-upgrade
check with the Secret stored in a real API server is in tests/integration/chart."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from tidalmq_broker.cli import build_parser

from tests.support.helm import (
    CHART,
    FULL,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    container,
    find,
    find_all,
    pod_spec,
    render,
    run_helm,
    write_values,
)

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
STORE = f"{FULL}-object-store"
HOOK = f"{FULL}-uninstall"
IN_CLUSTER = {"inClusterObjectStore": {"enabled": True}}

pytestmark = pytest.mark.usefixtures("helm")


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every workload's pod template, by KIND/NAME."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet", "Job"}
    }


def checksums(docs: list[dict[str, Any]], key: str = "checksum/object-store") -> dict[str, str]:
    return {
        name: template["metadata"].get("annotations", {}).get(key, "")
        for name, template in pod_templates(docs).items()
        if not name.startswith("Job/")
    }


def render_notes(values: dict[str, Any]) -> str:
    """NOTES.txt as helm renders it at install. Only install/upgrade render NOTES, and those need
    a cluster, so a copy of the chart renders the same file through `tpl` into a ConfigMap."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "tidalmq"
        shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("tests"))
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
            'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}\n'
        )
        out = run_helm("template", RELEASE, str(chart), "--namespace", NAMESPACE,
                       "-f", str(write_values(values)), "--show-only", "templates/zz-notes.yaml")  # fmt: skip
    return yaml.safe_load(out.stdout)["data"]["notes"]


# ---------------------------------------------------------------------------- checksums
@pytest.mark.parametrize(
    "values",
    [IN_CLUSTER, {}, {"objectStore": {"accessKey": "AK", "secretKey": "SK"}},
     {"objectStore": {"existingSecret": "s3-credentials"}}],
    ids=["generated-credentials", "pod-identity", "keys-in-values", "existing-secret"],
)  # fmt: skip
def test_two_renders_give_identical_pod_templates(values: dict[str, Any]) -> None:
    """Only the generated Secrets' data may differ between two renders (a render that finds no
    stored Secret draws new keys: the object store's, the control plane's tokens); every pod
    template is the same, annotations included."""
    first, second = render(values), render(values)
    assert pod_templates(first) == pod_templates(second)
    assert all(checksums(first).values())
    secrets = [
        {d["metadata"]["name"]: d for d in find_all(docs, "Secret")} for docs in (first, second)
    ]
    # the control tokens, and the certificates of the secure defaults (the Kafka listener's
    # CA and certificate, the clients CA, the control plane's CA and certificates)
    for name in ("control", "control-tls", "broker-tls", "clients-ca"):
        generated = f"{FULL}-{name}"
        assert secrets[0].pop(generated)["data"] != secrets[1].pop(generated)["data"], name
    if values is IN_CLUSTER:
        assert secrets[0][STORE]["data"] != secrets[1][STORE]["data"], (
            "keys are generated per render"
        )
    else:
        assert secrets[0] == secrets[1]


def test_generated_credentials_checksum_is_a_constant_of_the_values() -> None:
    """The checksum of generated keys does not hash the keys (they are random until stored), so
    it is the same at install (no Secret yet) and at every upgrade (the stored Secret)."""
    docs = render(IN_CLUSTER)
    sums = set(checksums(docs).values())
    assert len(sums) == 1, "brokers, operator and store hash the same thing"
    assert set(checksums(render(IN_CLUSTER)).values()) == sums
    # a value that does not concern the store leaves it as it is
    assert set(checksums(render({**IN_CLUSTER, "broker": {"logLevel": "DEBUG"}})).values()) == sums


def test_checksum_follows_the_credentials_that_pods_read() -> None:
    def checksum(values: dict[str, Any]) -> str:
        (value,) = set(checksums(render(values)).values())
        return value

    keys = {"objectStore": {"accessKey": "AK", "secretKey": "SK"}}
    rotated = {"objectStore": {"accessKey": "AK", "secretKey": "SK2"}}
    secret_a = {"objectStore": {"existingSecret": "a"}}
    secret_b = {"objectStore": {"existingSecret": "b"}}
    other_bucket = {**IN_CLUSTER, "objectStore": {"bucket": "other"}}
    distinct = [checksum(v) for v in (keys, rotated, secret_a, secret_b, IN_CLUSTER, other_bucket)]
    assert len(set(distinct)) == len(distinct), distinct
    assert checksum(keys) == checksum(dict(keys))


def test_no_checksum_renders_a_template() -> None:
    """No annotation hashes a render of another template (which re-runs randAlphaNum)."""
    for path in (CHART / "templates").glob("*.yaml"):
        text = path.read_text()
        assert "$.Template.BasePath" not in text, path.name
        generated = {"object-store-secret.yaml", "control-secret.yaml"}
        assert "randAlphaNum" not in text or path.name in generated, path.name


# ---------------------------------------------------------------------------- the store
def test_in_cluster_store_keeps_its_data_on_a_claim() -> None:
    docs = render(IN_CLUSTER)
    assert not [d for d in find_all(docs, "Deployment") if d["metadata"]["name"] == STORE]
    sts = find(docs, "StatefulSet", STORE)
    spec = sts["spec"]
    assert spec["replicas"] == 1
    assert spec["serviceName"] == STORE
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"], "the cluster's default class"
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Retain",
    }  # fmt: skip
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert "data" not in volumes, "the data volume is the claim, not a pod volume"
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "minio")["volumeMounts"]}
    assert mounts["data"] == "/data"
    # same selector as the Deployment of earlier chart versions (helm upgrade replaces it)
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tidalmq",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "object-store",
    }
    # the Service (the brokers' endpoint) keeps its name and port
    svc = find(docs, "Service", STORE)
    assert svc["spec"]["ports"][0]["port"] == 9000
    assert svc["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"{STORE}-0"


def test_store_persistence_values() -> None:
    docs = render({"inClusterObjectStore": {
        "enabled": True, "persistence": {"size": "3Gi", "storageClass": "fast-ssd"},
    }})  # fmt: skip
    (claim,) = find(docs, "StatefulSet", STORE)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    docs = render({"inClusterObjectStore": {"enabled": True, "persistence": {"storageClass": "-"}}})
    (claim,) = find(docs, "StatefulSet", STORE)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "", "'-': no class (a pre-created volume)"


def test_store_on_an_empty_dir_only_when_asked_and_said_loudly() -> None:
    values = {"inClusterObjectStore": {"enabled": True, "persistence": {"enabled": False}}}
    sts = find(render(values), "StatefulSet", STORE)
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    notes = render_notes(values)
    assert "WARNING" in notes and "emptyDir" in notes
    notes = render_notes(IN_CLUSTER)
    assert "WARNING" not in notes
    assert f"data-{STORE}-0" in notes


# ---------------------------------------------------------------------------- uninstall hook
def test_uninstall_hook_stops_the_operator_then_releases_finalizers() -> None:
    docs = render()
    job = find(docs, "Job", HOOK)
    hook_objects = [d for d in docs if d["metadata"]["name"] == HOOK]
    assert {d["kind"] for d in hook_objects} == {"ServiceAccount", "Role", "RoleBinding", "Job"}
    for obj in hook_objects:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete", obj["kind"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        if obj["kind"] != "Job":  # its rights exist before it runs
            assert int(annotations["helm.sh/hook-weight"]) < int(
                job["metadata"]["annotations"]["helm.sh/hook-weight"]
            )
    pod = pod_spec(job)
    assert pod["serviceAccountName"] == HOOK
    # the hook waits for the pods of the operator's selector to go: its own is not one of them
    operator_selector = find(docs, "Deployment", OPERATOR)["spec"]["selector"]["matchLabels"]
    assert not operator_selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert pod["restartPolicy"] == "Never"
    hook = container(job, "uninstall")
    assert hook["image"] == container(find(docs, "Deployment", OPERATOR), "operator")["image"]
    # the arguments are the real CLI's (the image's entrypoint is `tidalmq`)
    args = build_parser(every=True).parse_args(hook["args"])
    assert (args.command, args.operator_command) == ("operator", "uninstall")
    assert args.namespace == NAMESPACE
    assert args.operator_deployment == OPERATOR
    assert args.timeout == 120
    assert job["spec"]["activeDeadlineSeconds"] > args.timeout


def test_uninstall_hook_rights_are_the_least_it_needs() -> None:
    rules = find(render(), "Role", HOOK)["rules"]
    grants = {
        (g, r, v, tuple(rule.get("resourceNames", [])))
        for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip
    assert ("apps", "deployments/scale", "patch", (OPERATOR,)) in grants
    assert ("apps", "deployments", "get", (OPERATOR,)) in grants
    assert ("", "pods", "list", ()) in grants
    for plural in ("topics", "statictopics", "partitionreassignments", "users", "clusterstates"):
        assert ("tidalmq.io", plural, "patch", ()) in grants
        assert ("tidalmq.io", plural, "list", ()) in grants
    verbs = {v for _, _, v, _ in grants}
    assert not verbs & {"delete", "deletecollection", "create", "update", "*"}, verbs
    # a Deployment other than the operator's is out of reach
    assert all(names == (OPERATOR,) for g, r, _, names in grants if g == "apps")


def test_uninstall_hook_can_be_turned_off() -> None:
    docs = render({"uninstallHook": {"enabled": False, "timeoutSeconds": 30}})
    assert not find_all(docs, "Job")
    assert not [d for d in docs if d["metadata"]["name"] == HOOK]
    job = find(render({"uninstallHook": {"timeoutSeconds": 30}}), "Job", HOOK)
    assert container(job, "uninstall")["args"][-2:] == ["--timeout", "30"]


# ---------------------------------------------------------------------------- NOTES
def test_notes_name_what_works_offline() -> None:
    notes = render_notes({})
    assert "edenhill/kcat" not in notes
    image = f"tidalmq.local/tidalmq:{APP_VERSION}"
    # the in-cluster client is the chart's own image, running a real sub-command
    line = next(x for x in notes.splitlines() if "run tidalmq-client" in x)
    assert f"--image={image}" in line
    args = line.split(" -- ", 1)[1].split()
    parsed = build_parser(every=True).parse_args(args)
    assert parsed.command == "reassign"
    assert parsed.bootstrap_server == f"{FULL}-bootstrap.{NAMESPACE}.svc.cluster.local:9092"
    # image loading without a registry, and host access through the advertised address
    assert f"docker save {image} | ctr -n k8s.io images import -" in notes
    assert "--set broker.advertise=podIP" in notes
    assert "status.podIP" in render_notes({"broker": {"advertise": "podIP"}})
    # what uninstall keeps
    assert "helm uninstall rel" in notes and "CRDs" in notes


def test_notes_say_where_the_control_tokens_are_and_how_to_run_admin_commands() -> None:
    notes = render_notes({})
    assert f"Secret\n{FULL}-control" in notes or f"Secret {FULL}-control" in notes
    assert "NetworkPolicies let only the operator" in notes
    line = next(x for x in notes.splitlines() if "exec deploy/" in x)
    assert f"kubectl -n {NAMESPACE} exec deploy/{OPERATOR} -- sh -c " in line
    # the command is the real CLI's, against the operator's controller port on its pod IP
    command = line.split("sh -c ", 1)[1].strip("'").split()
    assert command[0] == "tidalmq"
    args = build_parser(every=True).parse_args(command[1:])
    # https: the control plane speaks mTLS by default (the CLI takes the operator's certificate
    # from its environment); http when it is off
    assert (args.command, args.controller_url) == ("recover", "https://$POD_IP:9690")
    off = render_notes({"controlPlane": {"tls": {"enabled": False}}})
    assert "--controller-url http://$POD_IP:9690" in off
    assert "NetworkPolicies" not in render_notes({"networkPolicy": {"enabled": False}})


def test_notes_say_the_security_modes_and_where_the_credentials_and_ca_are() -> None:
    """Secure by default: NOTES name the resolved listener and control plane, how to opt out,
    and the commands that get the admin's SCRAM credentials and the brokers' CA."""
    notes = render_notes({})
    assert "security.protocol=SASL_SSL" in notes
    assert "Kafka listener SASL_SSL (SCRAM: SCRAM-SHA-512), control plane mTLS" in notes
    assert "listeners.tls.enabled=false and listeners.sasl.enabled=false" in notes
    admin = f"{FULL}-admin"
    for key in ("username", "password"):
        assert (f"kubectl -n {NAMESPACE} get secret {admin} -o jsonpath='{{.data.{key}}}' "
                "| base64 -d") in notes  # fmt: skip
    assert (f"kubectl -n {NAMESPACE} get secret {FULL}-broker-tls -o jsonpath='{{.data.ca\\.crt}}'"
            " | base64 -d > ca.crt") in notes  # fmt: skip
    plain = render_notes({"listeners": {"tls": {"enabled": False}, "sasl": {"enabled": False}}})
    assert "security.protocol=PLAINTEXT" in plain and admin not in plain
    assert "ca.crt" not in plain
