"""The operator's planner launch: the spark-submit command line and reading the result (the run
loop is tested against a real kube-apiserver in tests/integration/planner)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from tidalmq_core.client_properties import from_file
from tidalmq_operator import users
from tidalmq_operator.models import GenerateSpec
from tidalmq_operator.planning import (
    CLIENT_DIR,
    PlannerFailed,
    PlannerJob,
    client_secret_data,
    read_result,
    run_name,
    submit_command,
    submitter_pod,
)

PLAN = json.dumps({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2]}]})


def job(**kw: Any) -> PlannerJob:
    base: dict[str, Any] = dict(
        name="tpr-rebalance-1a2b3c4d",
        namespace="tidalmq",
        image="reg/tidalmq-spark:0.1.0",
        service_account="tidalmq-spark",
        prometheus_url="http://prometheus:9090",
        bootstrap_servers="tidalmq-kafka.tidalmq.svc:9092",
        resource_name="rebalance",
    )
    base.update(kw)
    return PlannerJob(**base)


def confs(cmd: list[str]) -> dict[str, str]:
    out = {}
    for i, arg in enumerate(cmd):
        if arg == "--conf":
            key, value = cmd[i + 1].split("=", 1)
            out[key] = value
    return out


def test_submit_command_runs_the_job_in_cluster_mode() -> None:
    cmd = submit_command(job(), in_cluster=False)
    assert cmd[:7] == [
        "spark-submit",
        "--master",
        "k8s://https://kubernetes.default.svc:443",
        "--deploy-mode",
        "cluster",
        "--name",
        "tpr-rebalance-1a2b3c4d",
    ]
    c = confs(cmd)
    assert c["spark.kubernetes.namespace"] == "tidalmq"
    assert c["spark.kubernetes.container.image"] == "reg/tidalmq-spark:0.1.0"
    assert c["spark.kubernetes.authenticate.driver.serviceAccountName"] == "tidalmq-spark"
    assert c["spark.kubernetes.driver.pod.name"] == "tpr-rebalance-1a2b3c4d-driver"
    assert c["spark.kubernetes.submission.waitAppCompletion"] == "false"
    assert c["spark.kubernetes.driver.label.tidalmq.io/planner-run"] == "tpr-rebalance-1a2b3c4d"
    assert c["spark.kubernetes.executor.label.app.kubernetes.io/component"] == "planner"
    assert "spark.kubernetes.authenticate.submission.oauthTokenFile" not in c
    app = cmd.index("local:///opt/tidalmq/lib/python3.11/site-packages/tidalmq_planner/job.py")
    args = cmd[app + 1 :]
    assert args[args.index("--prometheus") + 1] == "http://prometheus:9090"
    assert args[args.index("--configmap") + 1] == "tpr-rebalance-1a2b3c4d-plan"
    assert args[args.index("--namespace") + 1] == "tidalmq"
    assert args[args.index("--bootstrap-server") + 1] == "tidalmq-kafka.tidalmq.svc:9092"
    assert args[args.index("--name") + 1] == "rebalance"
    assert "--max-moves" not in args and "--topics" not in args


def test_submitter_pod_runs_spark_submit_from_the_spark_image() -> None:
    pod = submitter_pod(job(spark_submit="pod"))
    assert pod["metadata"]["name"] == "tpr-rebalance-1a2b3c4d-submit"
    assert pod["metadata"]["labels"]["tidalmq.io/planner-run"] == "tpr-rebalance-1a2b3c4d"
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "tidalmq-spark" and spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["image"] == "reg/tidalmq-spark:0.1.0"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"  # its output on failure
    args = c["args"]
    assert args[0] == "submit" and args[1:3] == [
        "--master",
        "k8s://https://kubernetes.default.svc:443",
    ]
    # inside the pod it authenticates with its ServiceAccount, like any in-cluster submission
    conf = confs(args)
    assert conf["spark.kubernetes.authenticate.submission.oauthTokenFile"].endswith("/token")
    assert args[args.index("--prometheus") + 1] == "http://prometheus:9090"


def test_generate_spec_becomes_the_job_arguments() -> None:
    spec = GenerateSpec.model_validate(
        {"window": "3d", "step": "5m", "maxMoves": 40, "threshold": 1.2, "topics": ["a", "b"]}
    )
    j = PlannerJob.from_settings(
        generate=spec,
        name="n",
        namespace="ns",
        image="i",
        service_account="sa",
        prometheus_url="http://p",
    )
    cmd = submit_command(j, in_cluster=True)
    args = cmd[cmd.index(j.job_file) + 1 :]
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--window"] == "3d" and pairs["--step"] == "5m"
    assert pairs["--max-moves"] == "40" and pairs["--threshold"] == "1.2"
    assert pairs["--topics"] == "a,b"
    assert "--bootstrap-server" not in args
    c = confs(cmd)
    assert c["spark.kubernetes.authenticate.submission.oauthTokenFile"].endswith("/token")
    assert c["spark.kubernetes.authenticate.submission.caCertFile"].endswith("/ca.crt")


def test_extra_conf_overrides() -> None:
    c = confs(submit_command(job(extra_conf={"spark.executor.instances": "5"}), in_cluster=False))
    assert c["spark.executor.instances"] == "5"


def test_run_names_are_dns_labels_and_unique() -> None:
    a = run_name("Rebalance_After.Scale-Out" * 3, "uid-1", when=1.0)
    b = run_name("Rebalance_After.Scale-Out" * 3, "uid-1", when=2.0)
    assert a != b
    for name in (a, b, a + "-driver", a + "-plan"):
        assert len(name) <= 63 and name == name.lower()
        assert all(ch.isalnum() or ch == "-" for ch in name)


def test_read_result_plain_and_compressed() -> None:
    summary = {"moves": 1}
    plan, s, report = read_result(
        {"data": {"plan.json": PLAN, "summary.json": json.dumps(summary), "report.txt": "table"}}
    )
    assert plan == PLAN and s == summary and report == "table"
    packed = base64.b64encode(gzip.compress(PLAN.encode())).decode()
    plan, _, _ = read_result({"data": {}, "binaryData": {"plan.json.gz": packed}})
    assert plan == PLAN
    with pytest.raises(PlannerFailed, match=r"no plan\.json"):
        read_result({"data": {"summary.json": "{}"}})


SCRAM_USER = {
    "username": "tidalmq-planner",
    "password": 'pw"x',
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.jaas.config": users.jaas_config("tidalmq-planner", 'pw"x'),
}


def test_a_plaintext_run_mounts_no_client_secret() -> None:
    cmd = submit_command(job(), in_cluster=False)
    assert not [k for k in confs(cmd) if k.startswith("spark.kubernetes.driver.secrets.")]
    assert "--command-config" not in cmd


def test_a_secured_run_mounts_its_client_secret_in_the_driver_only() -> None:
    j = job(security_protocol="SASL_SSL", client_user_secret="tidalmq-planner")
    cmd = submit_command(j, in_cluster=False)
    c = confs(cmd)
    assert c["spark.kubernetes.driver.secrets.tpr-rebalance-1a2b3c4d-client"] == CLIENT_DIR
    assert not [k for k in c if k.startswith("spark.kubernetes.executor.secrets.")]
    assert cmd[cmd.index("--command-config") + 1] == f"{CLIENT_DIR}/client.properties"


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT"])
def test_scram_client_properties_read_the_mounted_credentials(
    protocol: str, tmp_path: Path
) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    data = client_secret_data(protocol, SCRAM_USER, ca, mount=str(tmp_path))
    assert "pw" not in data["client.properties"]  # the credentials stay in their own file
    for name, text in data.items():  # as the kubelet mounts a Secret: a file per key
        (tmp_path / name).write_text(text)
    security = from_file(str(tmp_path / "client.properties"))
    assert (security.protocol, security.mechanism) == (protocol, "SCRAM-SHA-512")
    assert (security.username, security.password) == ("tidalmq-planner", 'pw"x')
    if protocol == "SASL_SSL":
        assert security.ca_file == str(tmp_path / "broker-ca.crt")
    else:
        assert "broker-ca.crt" not in data and not security.tls


def test_tls_client_properties_carry_the_users_certificate(tmp_path: Path) -> None:
    user = {"username": "p", "user.crt": "CERT", "user.key": "KEY", "ca.crt": "CLIENTS CA"}
    data = client_secret_data("SSL", user, "BROKER CA", mount=str(tmp_path))
    assert set(data) == {"client.properties", "user.crt", "user.key", "broker-ca.crt"}
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    security = from_file(str(tmp_path / "client.properties"))
    assert security.protocol == "SSL"
    assert security.cert_file == str(tmp_path / "user.crt")
    assert security.key_file == str(tmp_path / "user.key")
    assert security.ca_file == str(tmp_path / "broker-ca.crt")


@pytest.mark.parametrize(
    ("protocol", "user", "ca", "message"),
    [
        (
            "SASL_SSL",
            {"username": "p", "user.crt": "C", "user.key": "K"},
            "CA",
            "needs a scram-sha-512 or scram-sha-256 User",
        ),
        ("SSL", SCRAM_USER, "CA", "needs a tls User"),
        ("SASL_SSL", SCRAM_USER, None, "no ca.crt"),
        ("PLAINTEXT", SCRAM_USER, None, "no client Secret for the PLAINTEXT protocol"),
    ],
)
def test_client_secret_data_names_what_is_missing(
    protocol: str, user: dict[str, str], ca: str | None, message: str
) -> None:
    with pytest.raises(PlannerFailed, match=message):
        client_secret_data(protocol, user, ca)
