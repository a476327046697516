"""The operator's planner launch: the spark-submit command line and reading the result (the run
loop is tested against a real kube-apiserver in tests/integration/planner)."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest
from tidalmq_operator.models import GenerateSpec
from tidalmq_operator.planning import (
    PlannerFailed,
    PlannerJob,
    read_result,
    run_name,
    submit_command,
    submitter_pod,
)

PLAN = json.dumps({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2]}]})


def job(**kw: Any) -> PlannerJob:
    base: dict[str, Any] = dict(
        name="tpr-rebalance-1a2b3c4d", namespace="tidalmq", image="reg/tidalmq-spark:0.1.0",
        service_account="tidalmq-spark", prometheus_url="http://prometheus:9090",
        bootstrap_servers="tidalmq-kafka.tidalmq.svc:9092", resource_name="rebalance",
    )  # fmt: skip
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
    assert cmd[:7] == ["spark-submit", "--master", "k8s://https://kubernetes.default.svc:443",
                       "--deploy-mode", "cluster", "--name", "tpr-rebalance-1a2b3c4d"]  # fmt: skip
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
    j = PlannerJob.from_settings(generate=spec, name="n", namespace="ns", image="i",
                                 service_account="sa", prometheus_url="http://p")  # fmt: skip
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
    plan, s, report = read_result({"data": {"plan.json": PLAN, "summary.json": json.dumps(summary),
                                            "report.txt": "table"}})  # fmt: skip
    assert plan == PLAN and s == summary and report == "table"
    packed = base64.b64encode(gzip.compress(PLAN.encode())).decode()
    plan, _, _ = read_result({"data": {}, "binaryData": {"plan.json.gz": packed}})
    assert plan == PLAN
    with pytest.raises(PlannerFailed, match=r"no plan\.json"):
        read_result({"data": {"summary.json": "{}"}})
