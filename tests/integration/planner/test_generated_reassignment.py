"""A planner-generated PartitionReassignment (`spec.generate`) through the operator's handlers,
against a real kube-apiserver with the project's CRDs: the handlers launch the planner with
tidalmq_operator.planning (a stand-in spark-submit creates the driver pod as Spark's submission
client does), the test plays the driver (there is no kubelet: it sets the pod's phase and writes
the result ConfigMap as tidalmq_planner.publish does), then approves; the moves must show up in a
real controller (its brokers played through its RPC surface, as in the controller's unit tests).
The run with the Spark image on a real cluster is the end-to-end tests' business."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_controller import Controller, ControllerSettings, NewTopic, ObjectStoreMetadataLog
from tidalmq_core.model import TopicPartition
from tidalmq_operator import handlers
from tidalmq_operator.kube import Kube
from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import OperatorSettings

from tests.support.fake_broker import FakeBroker
from tests.support.kube_apiserver import ApiServer

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]
GROUP, VERSION, PLURAL = "tidalmq.io", "v1alpha1", "partitionreassignments"
TOPIC = "orders"

# spark-submit as far as the operator can tell: creates the driver pod, returns; counts launches
FAKE_SUBMIT = """#!{python}
import os, sys
from kubernetes import client, config
args = sys.argv[1:]
conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
assert args[args.index("--deploy-mode") + 1] == "cluster"
with open(os.environ["FAKE_SUBMIT_LOG"], "a") as log:
    log.write(conf["spark.kubernetes.driver.pod.name"] + "\\n")
config.load_kube_config(os.environ["KUBECONFIG"])
client.CoreV1Api().create_namespaced_pod(conf["spark.kubernetes.namespace"], {{
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {{"name": conf["spark.kubernetes.driver.pod.name"]}},
    "spec": {{"restartPolicy": "Never",
             "containers": [{{"name": "spark-kubernetes-driver",
                             "image": conf["spark.kubernetes.container.image"]}}]}},
}})
print("driver pod created")
"""

SETTINGS = ControllerSettings(
    heartbeat_interval_s=0.1,
    lease_s=2.0,
    session_timeout_s=4.0,
    clock_margin_s=0.2,
    election_timeout_s=30.0,
    auto_rebalance=False,
    offsets_topic_partitions=1,
    tick_s=0.02,
)


@pytest.fixture(scope="module")
def api(kube_apiserver: ApiServer) -> ApiServer:
    kube_apiserver.kubectl("apply", "-f", str(REPO / "crds"))
    kube_apiserver.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/partitionreassignments.tidalmq.io",
        "--timeout=60s",
    )
    return kube_apiserver


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    c = Controller(ObjectStoreMetadataLog(LocalDirObjectStore(tmp_path / "objects")), SETTINGS)
    await c.start()
    # live brokers that never close a partition, so moves stay in flight (the tests only check
    # that they were recorded)
    brokers = [FakeBroker(c, i, interval_s=SETTINGS.heartbeat_interval_s) for i in range(3)]
    for b in brokers:
        await b.register()
    (result,) = await c.create_topics([NewTopic(TOPIC, 6)])
    assert result.error is None, result.error
    spy_on(c)
    try:
        yield c
    finally:
        for b in brokers:
            b.silence()
        await c.stop()


class Env:
    """One namespace, the operator's runtime (handlers called as Kopf would), the driver."""

    def __init__(self, api: ApiServer, controller: Controller, tmp_path: Path) -> None:
        self.api = api
        self.controller = controller
        self.ns = f"gen-{uuid.uuid4().hex[:6]}"
        self.core = client.CoreV1Api()
        self.custom = client.CustomObjectsApi()
        self.core.create_namespace({"metadata": {"name": self.ns}})
        self.submit_log = tmp_path / "submits.log"
        self.submit_log.touch()
        self.spark_submit = tmp_path / "spark-submit"
        self.spark_submit.write_text(FAKE_SUBMIT.format(python=sys.executable))
        self.spark_submit.chmod(0o755)
        self.rt = self.runtime()

    def runtime(self) -> OperatorRuntime:
        """A fresh operator (as after a restart): nothing in memory, the same controller."""
        settings = OperatorSettings(
            namespace=self.ns,
            spark_image="tidalmq-spark:dev",
            spark_service_account="tidalmq-spark",
            prometheus_url="http://prometheus:9090",
            spark_submit=str(self.spark_submit),
            planner_poll_s=0.2,
            planner_timeout_s=120,
        )
        rt = OperatorRuntime(settings, Kube(self.ns))
        rt.controller = self.controller
        return rt

    @property
    def memo(self) -> dict[str, Any]:
        return {"runtime": self.rt}

    def submits(self) -> list[str]:
        return self.submit_log.read_text().split()

    # ------------------------------------------------------------------ the resource
    def create(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PartitionReassignment",
            "metadata": {"name": name},
            "spec": {"generate": {"window": "1h"}, **spec},
        }
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def set_spec(self, name: str, **spec: Any) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec}
        )

    async def start(self, body: dict[str, Any]) -> None:
        """The on.create / on.resume handler, as Kopf calls it."""
        await handlers.start_reassignment(
            spec=body["spec"],
            name=body["metadata"]["name"],
            meta=body["metadata"],
            status=body.get("status"),
            memo=self.memo,
            patch=kopf.Patch(),
        )

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def events(self, name: str) -> list[Any]:
        items = self.core.list_namespaced_event(self.ns).items
        return [e for e in items if e.involved_object.name == name]

    def reasons(self, name: str) -> set[str]:
        return {e.reason for e in self.events(name)}

    # ------------------------------------------------------------------ the driver
    def job(self, body: dict[str, Any]) -> Any:
        meta = body["metadata"]
        return handlers.planner_job(self.rt, meta["name"], meta["uid"], None)

    def exists(self, fn: Callable[..., Any], name: str) -> bool:
        try:
            fn(name, self.ns)
            return True
        except ApiException as exc:
            assert exc.status == 404
            return False

    async def driver_started(self, body: dict[str, Any]) -> str:
        pod = self.job(body).driver_pod
        await wait_until(lambda: self.exists(self.core.read_namespaced_pod, pod), "driver pod")
        return pod

    def plan_moves(self, count: int) -> list[dict[str, Any]]:
        """What the planner would propose: `count` partitions to the next broker."""
        parts = self.controller.metadata.topics[TOPIC].partitions
        return [
            {"topic": TOPIC, "partition": i, "replicas": [(parts[i].leader + 1) % 3]}
            for i in range(count)
        ]

    async def play_driver(
        self, body: dict[str, Any], moves: list[dict[str, Any]] | None, *, fail: bool = False
    ) -> None:
        """The driver's life: Running, then the result ConfigMap and Succeeded (or Failed)."""
        job = self.job(body)
        await self.driver_started(body)
        self.core.patch_namespaced_pod_status(
            job.driver_pod, self.ns, {"status": {"phase": "Running"}}
        )
        await wait_until(
            lambda: (
                (cond(self.get(body["metadata"]["name"]), "Planned") or {}).get("reason")
                == "Running"
            ),
            "the Running driver reported",
        )
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
            summary = {
                "moves": len(moves or []),
                "imbalanceBefore": 1.6,
                "imbalanceAfter": 1.05,
                "lowerBound": len(moves or []),
                "withinThreshold": True,
            }
            self.core.create_namespaced_config_map(
                self.ns,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": job.configmap},
                    "data": {
                        "plan.json": json.dumps({"version": 1, "partitions": moves}),
                        "summary.json": json.dumps(summary),
                        "report.txt": "BROKER  BEFORE  AFTER\n0  160  105\n",
                    },
                },
            )
            status = {"phase": "Succeeded"}
        self.core.patch_namespaced_pod_status(job.driver_pod, self.ns, {"status": status})


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]], what: str, timeout_s: float = 60
) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(predicate)
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what} not reached (last: {last})")


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def phase_is(env: Env, name: str, phase: str) -> Callable[[], bool]:
    return lambda: env.status(name).get("phase") == phase


@pytest.fixture
async def env(
    api: ApiServer, controller: Controller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Env]:
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
    monkeypatch.setenv("FAKE_SUBMIT_LOG", str(tmp_path / "submits.log"))
    config.load_kube_config(config_file=str(api.kubeconfig))
    e = Env(api, controller, tmp_path)
    yield e
    for task in e.rt.planners.values():
        task.cancel()
    api.kubectl("delete", "namespace", e.ns, "--wait=false", check=False)


def moving(controller: Controller) -> dict[TopicPartition, int]:
    """The moves the controller has recorded: partition -> target broker."""
    return {tp: adding[0] for tp, _, adding, _ in controller.list_reassignments() if adding}


def submitted(controller: Controller) -> list[tuple[TopicPartition, int | None]]:
    """Every move the controller was asked for (recorded by `spy_on`)."""
    return controller.asked  # type: ignore[attr-defined,no-any-return]


def spy_on(controller: Controller) -> None:
    controller.asked = []  # type: ignore[attr-defined]
    alter = controller.alter_reassignments

    async def recording(entries: list[Any]) -> Any:
        controller.asked.extend((e.tp, e.target) for e in entries)  # type: ignore[attr-defined]
        return await alter(entries)

    controller.alter_reassignments = recording  # type: ignore[method-assign]


def on_the_way(controller: Controller, moves: list[dict[str, Any]]) -> bool:
    """Every move is recorded in the controller: in flight to its target, or done already (the
    played brokers report nothing open, so a move may finish quickly)."""
    for m in moves:
        part = controller.metadata.topics[m["topic"]].partitions[m["partition"]]
        target = m["replicas"][0]
        if part.target_replicas != [target] and not (not part.moving and part.leader == target):
            return False
    return True


def as_moves(moves: list[dict[str, Any]]) -> list[tuple[TopicPartition, int | None]]:
    return [(TopicPartition(m["topic"], m["partition"]), m["replicas"][0]) for m in moves]


async def test_plan_then_approve_moves_the_partitions(env: Env) -> None:
    body = env.create("rebalance")
    await env.start(body)
    assert env.status("rebalance")["phase"] == "Planning"
    moves = env.plan_moves(2)
    await env.play_driver(body, moves)
    await wait_until(phase_is(env, "rebalance", "AwaitingApproval"), "AwaitingApproval")
    pr = env.get("rebalance")
    status = pr["status"]
    assert status["plan"]["partitions"] == moves
    report = status["plan"]["report"]
    assert report["movesCount"] == 2 and report["imbalanceBefore"] == 1.6
    assert report["imbalanceAfter"] == 1.05 and report["chart"].startswith("BROKER")
    assert status["progress"] == "0/2"
    planned = cond(pr, "Planned")
    assert planned is not None and planned["status"] == "True"
    assert (
        "2 moves proposed; imbalance (busiest broker / mean) 1.600 -> 1.050" in planned["message"]
    )
    job = env.job(body)
    await wait_until(
        lambda: not env.exists(env.core.read_namespaced_pod, job.driver_pod), "driver pod deleted"
    )
    assert not env.exists(env.core.read_namespaced_config_map, job.configmap)
    reasons = env.reasons("rebalance")
    assert {"Planning", "PlannerSubmitting", "PlannerRunning", "Planned"} <= reasons, reasons
    assert submitted(env.controller) == [] and moving(env.controller) == {}  # not before approval
    assert env.submits() == [job.driver_pod]

    approved = env.set_spec("rebalance", approved=True)
    await handlers.approve_reassignment(
        new=True, name="rebalance", spec=approved["spec"], memo=env.memo
    )
    assert submitted(env.controller) == as_moves(moves) and on_the_way(env.controller, moves)
    status = env.status("rebalance")
    assert status["phase"] == "Running" and status["progress"] == "0/2" and status["startTime"]
    assert "Started" in env.reasons("rebalance")
    # the spec.partitions path's progress tracking takes over
    await env.rt.publish()
    rows = env.status("rebalance")["partitions"]
    assert [(r["partition"], r["target"]) for r in rows] == [
        (m["partition"], m["replicas"][0]) for m in moves
    ]
    assert cond(env.get("rebalance"), "Planned")["status"] == "True"  # type: ignore[index]
    # an approval seen twice (Kopf retries, a restart) submits nothing twice
    await handlers.approve_reassignment(
        new=True, name="rebalance", spec=approved["spec"], memo=env.memo
    )
    env.rt = env.runtime()
    await env.start(env.get("rebalance"))  # on.resume after a restart: watch, do not resubmit
    assert "rebalance" in env.rt.reassignments
    assert submitted(env.controller) == as_moves(moves) and on_the_way(env.controller, moves)
    assert env.submits() == [job.driver_pod]


async def test_a_restarted_operator_attaches_to_its_planner_and_auto_approves(env: Env) -> None:
    body = env.create("auto", autoApprove=True)
    await env.start(body)
    await env.driver_started(body)
    # the operator goes away mid-planning (its task dies with it; the driver pod stays)
    task = env.rt.planners["auto"]
    task.cancel()
    await asyncio.wait([task])
    assert env.exists(env.core.read_namespaced_pod, env.job(body).driver_pod)
    env.rt = env.runtime()
    await env.start(env.get("auto"))  # on.resume: Planning and no plan yet
    assert "auto" in env.rt.planners
    moves = env.plan_moves(3)
    await env.play_driver(body, moves)
    await wait_until(phase_is(env, "auto", "Running"), "Running without an approval")
    assert env.submits() == [env.job(body).driver_pod]  # one launch only
    assert submitted(env.controller) == as_moves(moves) and on_the_way(env.controller, moves)
    # the Event follows the status patch: wait for it rather than read the list once
    await wait_until(
        lambda: {"PlannerAttached", "Planned", "Started"} <= env.reasons("auto"),
        "PlannerAttached, Planned and Started events",
    )


async def test_cancel_while_planning_stops_the_driver(env: Env) -> None:
    body = env.create("stop")
    await env.start(body)
    pod = await env.driver_started(body)
    cancelled = env.set_spec("stop", cancel=True)
    await handlers.cancel_reassignment(new=True, name="stop", spec=cancelled["spec"], memo=env.memo)
    status = env.status("stop")
    assert status["phase"] == "Cancelled"
    assert cond(env.get("stop"), "Complete")["reason"] == "Cancelled"  # type: ignore[index]
    assert "stop" not in env.rt.planners
    await wait_until(lambda: not env.exists(env.core.read_namespaced_pod, pod), "driver deleted")
    # a late approval changes nothing
    approved = env.set_spec("stop", approved=True)
    await handlers.approve_reassignment(new=True, name="stop", spec=approved["spec"], memo=env.memo)
    assert env.status("stop")["phase"] == "Cancelled" and submitted(env.controller) == []


async def test_a_failed_planner_fails_the_resource(env: Env) -> None:
    body = env.create("broken", autoApprove=True)
    await env.start(body)
    await env.play_driver(body, None, fail=True)
    await wait_until(phase_is(env, "broken", "Failed"), "Failed")
    await wait_until(lambda: "PlannerFailed" in env.reasons("broken"), "PlannerFailed event")
    pr = env.get("broken")
    assert "Error (exit code 1): Prometheus unreachable" in cond(pr, "Planned")["message"]  # type: ignore[index]
    assert cond(pr, "Complete")["reason"] == "Failed"  # type: ignore[index]
    warnings = [e for e in env.events("broken") if e.reason == "PlannerFailed"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert not env.exists(env.core.read_namespaced_pod, env.job(body).driver_pod)
    assert submitted(env.controller) == []


async def test_an_empty_plan_completes_at_once(env: Env) -> None:
    body = env.create("balanced")
    await env.start(body)
    await env.play_driver(body, [])
    await wait_until(phase_is(env, "balanced", "Completed"), "Completed")
    pr = env.get("balanced")
    complete = cond(pr, "Complete")
    assert complete is not None and complete["reason"] == "AlreadyBalanced"
    assert "already balanced: 0 moves proposed" in complete["message"]
    assert pr["status"]["progress"] == "0/0" and pr["status"]["plan"]["partitions"] == []
