"""The operator's planner launch (tidalmq_operator.planning.run_planner) against a real
kube-apiserver: a stand-in spark-submit creates the driver pod as Spark's submission client does;
the test then plays the driver (writes the result ConfigMap, reports the pod's phase through the
status subresource) since the API server has no nodes to run pods. The run on a real cluster with
the Spark image is the end-to-end test's."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from tidalmq_operator.planning import PlannerFailed, PlannerJob, PlannerNotReady, run_planner

from tests.support.kube_apiserver import ApiServer

pytestmark = [pytest.mark.integration]

PLAN = {
    "version": 1,
    "partitions": [
        {"topic": "orders", "partition": 3, "replicas": [2]},
        {"topic": "orders", "partition": 7, "replicas": [0]},
    ],
}

FAKE_SUBMIT = """
import os, sys
from kubernetes import client, config
args = sys.argv[1:]
conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
assert args[args.index("--deploy-mode") + 1] == "cluster"
config.load_kube_config(os.environ["KUBECONFIG"])
labels = {k.removeprefix("spark.kubernetes.driver.label."): v for k, v in conf.items()
          if k.startswith("spark.kubernetes.driver.label.")}
client.CoreV1Api().create_namespaced_pod(conf["spark.kubernetes.namespace"], {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": conf["spark.kubernetes.driver.pod.name"], "labels": labels},
    "spec": {"serviceAccountName": conf["spark.kubernetes.authenticate.driver.serviceAccountName"],
             "restartPolicy": "Never",
             "containers": [{"name": "spark-kubernetes-driver",
                             "image": conf["spark.kubernetes.container.image"],
                             "args": ["driver", *args[args.index("local:///opt/tidalmq/lib/python3.11/site-packages/tidalmq_planner/job.py"):]]}]},
})
print("driver pod created")
"""


@pytest.fixture
def core(kube_apiserver: ApiServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KUBECONFIG", str(kube_apiserver.kubeconfig))
    api = client.CoreV1Api(
        config.new_client_from_config(config_file=str(kube_apiserver.kubeconfig))
    )
    name = f"planner-{uuid.uuid4().hex[:6]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    api.test_namespace = name  # type: ignore[attr-defined]
    return api


def submit(tmp_path: Path, job: PlannerJob) -> list[str]:
    script = tmp_path / "spark-submit.py"
    script.write_text(FAKE_SUBMIT)
    from tidalmq_operator.planning import submit_command

    return [sys.executable, str(script), *submit_command(job, in_cluster=False)[1:]]


def job_for(core: Any) -> PlannerJob:
    return PlannerJob(
        name=f"tpr-test-{uuid.uuid4().hex[:8]}",
        namespace=core.test_namespace,
        image="tidalmq-spark:dev",
        service_account="tidalmq-spark",
        prometheus_url="http://prometheus:9090",
        resource_name="rebalance",
    )


async def play_driver(
    core: Any, job: PlannerJob, *, fail: bool = False, seen: list[str] | None = None
) -> None:
    ns = job.namespace
    for _ in range(300):
        try:
            await asyncio.to_thread(core.read_namespaced_pod, job.driver_pod, ns)
            break
        except ApiException as exc:
            assert exc.status == 404
            await asyncio.sleep(0.1)
    await asyncio.to_thread(
        core.patch_namespaced_pod_status, job.driver_pod, ns, {"status": {"phase": "Running"}}
    )
    for _ in range(100):  # until the launcher saw it running (when the test watches)
        if seen is None or "Running" in seen:
            break
        await asyncio.sleep(0.1)
    if fail:
        status = {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "spark-kubernetes-driver",
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": "Prometheus unreachable",
                        }
                    },
                }
            ],
        }
    else:
        await asyncio.to_thread(
            core.create_namespaced_config_map,
            ns,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": job.configmap},
                "data": {
                    "plan.json": json.dumps(PLAN),
                    "summary.json": json.dumps({"moves": 2}),
                    "report.txt": "BROKER ...",
                },
            },
        )
        status = {"phase": "Succeeded"}
    await asyncio.to_thread(
        core.patch_namespaced_pod_status, job.driver_pod, ns, {"status": status}
    )


def exists(fn: Any, name: str, ns: str) -> bool:
    try:
        fn(name, ns)
        return True
    except ApiException as exc:
        assert exc.status == 404
        return False


@pytest.mark.timeout(120)
async def test_run_planner_returns_the_plan_and_cleans_up(core: Any, tmp_path: Path) -> None:
    job = job_for(core)
    phases: list[str] = []
    driver = asyncio.create_task(play_driver(core, job, seen=phases))
    outcome = await run_planner(
        job,
        core,
        command=submit(tmp_path, job),
        poll_s=0.2,
        progress=lambda phase, _: phases.append(phase),
    )
    await driver
    assert [(e.tp.topic, e.tp.partition, e.target) for e in outcome.entries] == [
        ("orders", 3, 2),
        ("orders", 7, 0),
    ]
    assert outcome.summary == {"moves": 2} and outcome.driver_pod == job.driver_pod
    assert phases[0] == "Submitting" and phases[-2:] == ["Succeeded", "Planned"]
    assert "Running" in phases
    ns = job.namespace
    assert not exists(core.read_namespaced_pod, job.driver_pod, ns)
    assert not exists(core.read_namespaced_config_map, job.configmap, ns)


@pytest.mark.timeout(120)
async def test_run_planner_surfaces_a_failed_driver(core: Any, tmp_path: Path) -> None:
    job = job_for(core)
    driver = asyncio.create_task(play_driver(core, job, fail=True))
    with pytest.raises(PlannerFailed, match=r"Error \(exit code 1\): Prometheus unreachable"):
        await run_planner(job, core, command=submit(tmp_path, job), poll_s=0.2)
    await driver
    assert not exists(core.read_namespaced_pod, job.driver_pod, job.namespace)


@pytest.mark.timeout(120)
async def test_a_leftover_result_of_an_earlier_run_is_not_taken(core: Any, tmp_path: Path) -> None:
    job = job_for(core)
    ns = job.namespace
    core.create_namespaced_config_map(
        ns,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": job.configmap},
            "data": {"plan.json": '{"partitions": []}'},
        },
    )
    driver = asyncio.create_task(play_driver(core, job))
    outcome = await run_planner(job, core, command=submit(tmp_path, job), poll_s=0.2)
    await driver
    assert len(outcome.entries) == 2


@pytest.mark.timeout(120)
async def test_spark_submit_failures_fail_the_run(core: Any, tmp_path: Path) -> None:
    job = job_for(core)
    failing = tmp_path / "failing-submit.py"
    failing.write_text(
        "import sys\nprint('Exception in thread main: 403 Forbidden')\nsys.exit(3)\n"
    )
    with pytest.raises(PlannerFailed, match=r"spark-submit exited with 3: .*403 Forbidden"):
        await run_planner(job, core, command=[sys.executable, str(failing)])
    with pytest.raises(PlannerFailed, match="cannot run"):
        await run_planner(job, core, command=[str(tmp_path / "no-spark-submit")])


@pytest.mark.timeout(120)
async def test_a_driver_that_never_finishes_times_out(core: Any, tmp_path: Path) -> None:
    job = job_for(core)
    # the stand-in spark-submit (a Python importing the Kubernetes client) needs a few seconds on
    # a loaded machine: 3 s timed the submission out instead of the driver
    with pytest.raises(PlannerFailed, match="the planner did not finish within 8 s"):
        await run_planner(job, core, command=submit(tmp_path, job), poll_s=0.2, timeout_s=8)
    assert not exists(core.read_namespaced_pod, job.driver_pod, job.namespace)


async def play_submit_pod(core: Any, job: PlannerJob, *, fail: bool = False) -> dict[str, Any]:
    """Be the kubelet of the submit pod: when it exists, create the driver pod as spark-submit
    would (or fail with spark-submit's reason in the termination message); returns its spec."""
    ns = job.namespace
    for _ in range(300):
        try:
            pod = await asyncio.to_thread(core.read_namespaced_pod, job.submit_pod, ns)
            break
        except ApiException as exc:
            assert exc.status == 404
            await asyncio.sleep(0.1)
    if fail:
        status = {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "spark-submit",
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": "KubernetesClientException: configmaps is forbidden",
                        }
                    },
                }
            ],
        }
    else:
        await asyncio.to_thread(
            core.create_namespaced_pod,
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": job.driver_pod},
                "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": job.image}]},
            },
        )
        status = {"phase": "Succeeded"}
    await asyncio.to_thread(
        core.patch_namespaced_pod_status, job.submit_pod, ns, {"status": status}
    )
    return pod.to_dict()


@pytest.mark.timeout(120)
async def test_spark_submit_in_a_pod_of_the_spark_image(core: Any) -> None:
    """spark_submit="pod" (what the chart sets): the submission runs in `<run>-submit` from the
    Spark image as the Spark ServiceAccount; the pod goes once it is done."""
    job = dataclasses.replace(job_for(core), spark_submit="pod")
    submitting = asyncio.create_task(play_submit_pod(core, job))
    driver = asyncio.create_task(play_driver(core, job))
    outcome = await run_planner(job, core, poll_s=0.2)
    pod = await submitting
    await driver
    assert len(outcome.entries) == 2
    spec = pod["spec"]
    assert spec["service_account_name"] == "tidalmq-spark"
    (container,) = spec["containers"]
    assert container["image"] == "tidalmq-spark:dev" and container["args"][0] == "submit"
    assert not exists(core.read_namespaced_pod, job.submit_pod, job.namespace)
    assert not exists(core.read_namespaced_pod, job.driver_pod, job.namespace)

    # a failed submission: its reason (the pod's termination message) fails the run
    job = dataclasses.replace(job_for(core), spark_submit="pod")
    submitting = asyncio.create_task(play_submit_pod(core, job, fail=True))
    with pytest.raises(PlannerFailed, match=r"spark-submit failed: .*configmaps is forbidden"):
        await run_planner(job, core, poll_s=0.2)
    await submitting
    assert not exists(core.read_namespaced_pod, job.submit_pod, job.namespace)


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


@pytest.mark.timeout(120)
async def test_a_secured_run_gives_its_driver_a_client_secret_and_removes_it(
    core: Any, tmp_path: Path
) -> None:
    ns = core.test_namespace
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="p" password="pw";'
    core.create_namespaced_secret(
        ns,
        secret(
            "tidalmq-planner",
            {
                "username": "p",
                "password": "pw",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": jaas,
            },
        ),
    )
    core.create_namespaced_secret(
        ns,
        secret(
            "tidalmq-broker-tls",
            {"ca.crt": "BROKER CA", "tls.crt": "CERT", "tls.key": "BROKER KEY"},
        ),
    )
    job = dataclasses.replace(
        job_for(core),
        bootstrap_servers="tidalmq-bootstrap:9092",
        security_protocol="SASL_SSL",
        client_user_secret="tidalmq-planner",
        broker_ca_secret="tidalmq-broker-tls",
    )
    seen: dict[str, str] = {}

    async def driver() -> None:
        # what the driver pod would mount: the run's Secret exists while the driver runs
        for _ in range(300):
            try:
                got = await asyncio.to_thread(core.read_namespaced_secret, job.client_secret, ns)
                break
            except ApiException as exc:
                assert exc.status == 404
                await asyncio.sleep(0.1)
        seen.update({k: base64.b64decode(v).decode() for k, v in got.data.items()})
        await play_driver(core, job)

    played = asyncio.create_task(driver())
    outcome = await run_planner(job, core, command=submit(tmp_path, job), poll_s=0.2)
    await played
    assert len(outcome.entries) == 2
    # the credentials and the CA, never the brokers' key; the properties hold no password
    assert set(seen) == {"client.properties", "sasl.jaas.config", "broker-ca.crt"}
    assert seen["sasl.jaas.config"] == jaas and seen["broker-ca.crt"] == "BROKER CA"
    assert "pw" not in seen["client.properties"]
    assert "security.protocol=SASL_SSL" in seen["client.properties"]
    assert not exists(core.read_namespaced_secret, job.client_secret, ns)


@pytest.mark.timeout(60)
async def test_a_secured_run_waits_for_its_users_secret(core: Any, tmp_path: Path) -> None:
    job = dataclasses.replace(
        job_for(core),
        bootstrap_servers="tidalmq-bootstrap:9092",
        security_protocol="SASL_PLAINTEXT",
        client_user_secret="tidalmq-planner",
    )
    with pytest.raises(PlannerNotReady, match="Secret tidalmq-planner does not exist yet"):
        await run_planner(job, core, command=submit(tmp_path, job), poll_s=0.2)
    assert not exists(core.read_namespaced_pod, job.driver_pod, job.namespace)
