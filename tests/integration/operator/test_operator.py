"""The operator against a real Kubernetes API server, with real broker processes.

The API server (etcd + kube-apiserver) runs the project's CRDs; the operator runs as a process
(`tidalmq operator run`) with the controller in its Kopf daemon; three brokers run as processes
that reach the controller over its HTTP port, on a real object store. What the operator does to
pods and Services is the end-to-end tests' business (e2e/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support.broker_process import BrokerProcess, free_port
from tests.support.kube_apiserver import ApiServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


class OperatorProcess:
    def __init__(self, api: ApiServer, namespace: str, storage_url: str, workdir: Path,
                 name: str = "operator") -> None:  # fmt: skip
        self.api = api
        self.namespace = namespace
        self.storage_url = storage_url
        self.controller_port = free_port()
        self.http_port = free_port()
        self.log = workdir / f"{name}-{namespace}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def controller_url(self) -> str:
        return f"http://127.0.0.1:{self.controller_port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}/readyz", timeout=1
            ) as r:
                return r.status == 200
        except OSError:
            return False

    def launch(self) -> None:
        env = {
            **os.environ, "KUBECONFIG": str(self.api.kubeconfig),
            "TIDALMQ_OPERATOR_NAMESPACE": self.namespace, "TIDALMQ_STORAGE_URL": self.storage_url,
            "TIDALMQ_CONTROLLER_PORT": str(self.controller_port),
            "TIDALMQ_OPERATOR_HTTP_PORT": str(self.http_port), "TIDALMQ_OFFSETS_TOPIC_PARTITIONS": "4",
            "TIDALMQ_PEERING_LIFETIME_S": "20",
        }  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tidalmq_broker.cli", "operator", "run"],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip

    def start(self) -> None:
        self.launch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            if self.ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"operator not ready:\n{self.tail()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-60:])


@pytest.fixture(scope="module")
def api_with_crds(kube_apiserver: ApiServer) -> ApiServer:
    kube_apiserver.kubectl("apply", "-f", str(REPO / "crds"))
    for crd in ("topics", "partitionreassignments", "statictopics", "clusterstates"):
        kube_apiserver.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd}.tidalmq.io", "--timeout=60s"
        )
    return kube_apiserver


@pytest.fixture
def deployment(api_with_crds: ApiServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A namespace with the operator and three brokers on a local-directory object store."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    api_with_crds.kubectl("create", "namespace", ns)
    storage = f"file://{tmp_path / 'objects'}"
    op = OperatorProcess(api_with_crds, ns, storage, tmp_path)
    op.start()
    brokers = [
        BrokerProcess(storage, tmp_path / "logs", broker_id=i,
                      args=["--controller-url", op.controller_url])
        for i in range(3)
    ]  # fmt: skip
    for b in brokers:
        b.start()
    try:
        yield {"ns": ns, "operator": op, "brokers": brokers, "api": api_with_crds, "tmp": tmp_path}
    finally:
        for b in brokers:
            b.kill()
        op.stop()
        api_with_crds.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def apply(
    d: dict[str, Any], doc: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return d["api"].kubectl("-n", d["ns"], "apply", "-f", "-", input=json.dumps(doc), check=check)


def get(d: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return json.loads(d["api"].kubectl("-n", d["ns"], "get", kind, name, "-o", "json").stdout)


def wait_for(predicate, timeout_s: float = 60, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except subprocess.CalledProcessError:
            last = None
        if last:
            return last
        time.sleep(0.3)
    raise TimeoutError(f"{what} not reached (last: {last})")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def topic(name: str, partitions: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "tidalmq.io/v1alpha1", "kind": "Topic", "metadata": {"name": name},
            "spec": {"partitions": partitions, **spec}}  # fmt: skip


def test_topic_lifecycle(deployment: dict[str, Any]) -> None:
    d = deployment
    apply(d, topic("orders", 6, configs={"retention.ms": "3600000"}))

    def ready() -> bool:
        c = condition(get(d, "topic", "orders"), "Ready")
        return c is not None and c["status"] == "True"

    wait_for(ready, what="Topic Ready")
    status = get(d, "topic", "orders")["status"]
    assert status["partitionCount"] == 6 and len(status["partitions"]) == 6
    assert {p["broker"] for p in status["partitions"]} == {0, 1, 2}
    assert status["topicId"]

    # the topic is real: a Kafka client writes to it
    p = Producer({"bootstrap.servers": d["brokers"][0].bootstrap, "acks": "all"})
    for i in range(60):
        p.produce("orders", value=b"%d" % i)
    assert p.flush(30) == 0

    # grow
    apply(d, topic("orders", 8, configs={"retention.ms": "3600000"}))
    wait_for(
        lambda: get(d, "topic", "orders")["status"].get("partitionCount") == 8, what="8 partitions"
    )
    # shrinking is refused with a clear condition
    apply(d, topic("orders", 4, configs={"retention.ms": "3600000"}))

    def shrink_refused() -> bool:
        c = condition(get(d, "topic", "orders"), "Error")
        return c is not None and c["status"] == "True" and c["reason"] == "PartitionsCannotShrink"

    wait_for(shrink_refused, what="PartitionsCannotShrink condition")
    assert get(d, "topic", "orders")["status"]["partitionCount"] == 8

    # delete: the finalizer removes the topic and its data
    objects = d["tmp"] / "objects" / "partitions" / "orders"
    time.sleep(6)  # a checkpoint interval, so there is stored data to delete
    assert objects.exists()
    d["api"].kubectl("-n", d["ns"], "delete", "topic", "orders", "--timeout=60s")
    wait_for(lambda: not [f for f in objects.rglob("*") if f.is_file()] if objects.exists() else True,
             what="topic data deleted")  # fmt: skip


def test_invalid_specs_are_rejected(deployment: dict[str, Any]) -> None:
    d = deployment
    bad_schema = apply(d, topic("bad1", 0), check=False)
    assert bad_schema.returncode != 0 and "partitions" in bad_schema.stderr
    bad_config = apply(d, topic("bad2", 1, configs={"no.such.config": "1"}), check=False)
    assert bad_config.returncode != 0
    bad_name = apply(d, topic("bad3", 1, topicName="has space"), check=False)
    assert bad_name.returncode != 0


def test_reassignment_moves_partitions_and_reports_them(deployment: dict[str, Any]) -> None:
    d = deployment
    apply(d, topic("moving", 6))
    wait_for(lambda: (condition(get(d, "topic", "moving"), "Ready") or {}).get("status") == "True")
    parts = get(d, "topic", "moving")["status"]["partitions"]
    targets = [{"topic": "moving", "partition": p["partition"], "replicas": [(p["broker"] + 1) % 3]}
               for p in parts]  # fmt: skip
    apply(d, {"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
              "metadata": {"name": "spread"}, "spec": {"partitions": targets}})  # fmt: skip
    done = wait_for(lambda: get(d, "partitionreassignment", "spread").get("status", {}).get("phase") == "Completed",
                    what="reassignment Completed")  # fmt: skip
    assert done
    status = get(d, "partitionreassignment", "spread")["status"]
    assert status["progress"] == "6/6"
    assert all(r["phase"] == "Done" and r["unavailableMs"] >= 0 for r in status["partitions"])
    brokers = {
        p["partition"]: p["broker"] for p in get(d, "topic", "moving")["status"]["partitions"]
    }
    assert brokers == {t["partition"]: t["replicas"][0] for t in targets}
    events = d["api"].kubectl("-n", d["ns"], "get", "events", "--field-selector",
                              "involvedObject.name=spread", "-o", "json").stdout  # fmt: skip
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert "PartitionDone" in reasons


def test_bad_reassignment_fails_with_a_clear_condition(deployment: dict[str, Any]) -> None:
    d = deployment
    apply(d, topic("target", 1))
    wait_for(lambda: (condition(get(d, "topic", "target"), "Ready") or {}).get("status") == "True")
    apply(d, {"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
              "metadata": {"name": "nowhere"},
              "spec": {"partitions": [{"topic": "target", "partition": 0, "replicas": [9]}]}})  # fmt: skip

    def failed() -> dict[str, Any] | None:
        pr = get(d, "partitionreassignment", "nowhere")
        return pr if (pr.get("status") or {}).get("phase") == "Failed" else None

    pr = wait_for(failed, what="Failed phase")
    assert "unknown broker 9" in condition(pr, "Complete")["message"]  # type: ignore[index]


def test_operator_restart_in_the_middle_of_a_reassignment(deployment: dict[str, Any]) -> None:
    d = deployment
    apply(d, topic("resume", 4))
    wait_for(lambda: (condition(get(d, "topic", "resume"), "Ready") or {}).get("status") == "True")
    parts = get(d, "topic", "resume")["status"]["partitions"]
    targets = [{"topic": "resume", "partition": p["partition"], "replicas": [(p["broker"] + 2) % 3]}
               for p in parts]  # fmt: skip
    apply(d, {"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
              "metadata": {"name": "interrupted"}, "spec": {"partitions": targets}})  # fmt: skip
    wait_for(
        lambda: (
            get(d, "partitionreassignment", "interrupted").get("status", {}).get("phase")
            == "Running"
        )
    )
    d["operator"].kill()
    d["operator"].start()
    wait_for(lambda: get(d, "partitionreassignment", "interrupted").get("status", {}).get("phase") == "Completed",
             what="Completed after restart")  # fmt: skip
    brokers = {
        p["partition"]: p["broker"] for p in get(d, "topic", "resume")["status"]["partitions"]
    }
    assert brokers == {t["partition"]: t["replicas"][0] for t in targets}


def test_two_operator_replicas_never_both_act(deployment: dict[str, Any]) -> None:
    """Kopf peering keeps one replica active; the controller epoch fences any overlap."""
    d = deployment
    first: OperatorProcess = d["operator"]
    second = OperatorProcess(d["api"], d["ns"], first.storage_url, d["tmp"], name="standby")
    second.launch()
    try:
        both = 0
        samples = 0
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            a, b = first.ready(), second.ready()
            both += a and b
            samples += 1
            time.sleep(0.2)
        assert both == 0, f"both replicas active in {both} of {samples} samples"
        active, standby = (first, second) if first.ready() else (second, first)
        assert active.ready() and not standby.ready()
        epoch_before = get(d, "clusterstate", "tidalmq")["status"]["controllerEpoch"]
        active.kill()
        wait_for(standby.ready, timeout_s=120, what="the standby takes over")
        wait_for(lambda: get(d, "clusterstate", "tidalmq")["status"]["controllerEpoch"] > epoch_before,
                 what="a higher controller epoch")  # fmt: skip
    finally:
        second.stop()
