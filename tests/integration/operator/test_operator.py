"""The operator against a real Kubernetes API server, with real broker processes.

The API server (etcd + kube-apiserver) runs the project's CRDs; the operator runs as a process
(`tidalmq operator run`) with the controller in its Kopf daemon; three brokers run as processes
that reach the controller over its HTTP port, on a real object store. What the operator does to
pods and Services is the end-to-end tests' business (e2e/)."""

from __future__ import annotations

import json
import os
import signal
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
# the control plane's secrets, as the chart's Secret gives them: the operator holds both, the
# brokers the brokers' secret only (each derives its own broker token from it)
CONTROL_TOKEN = "operator-test-control-token-0123456789abcdef"
BROKER_SECRET = "operator-test-brokers-secret-0123456789abcdef"
BROKER_ENV = {"TIDALMQ_CONTROL_TOKEN": BROKER_SECRET}


class OperatorProcess:
    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        storage_url: str,
        workdir: Path,
        name: str = "operator",
        env: dict[str, str] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.storage_url = storage_url
        self.env = env or {}
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
            **os.environ,
            "KUBECONFIG": str(self.api.kubeconfig),
            "TIDALMQ_OPERATOR_NAMESPACE": self.namespace,
            "TIDALMQ_STORAGE_URL": self.storage_url,
            "TIDALMQ_CONTROLLER_PORT": str(self.controller_port),
            "TIDALMQ_OPERATOR_HTTP_PORT": str(self.http_port),
            "TIDALMQ_OFFSETS_TOPIC_PARTITIONS": "4",
            "TIDALMQ_CONTROL_TOKEN": CONTROL_TOKEN,
            "TIDALMQ_CONTROL_BROKER_SECRET": BROKER_SECRET,
            **self.env,
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tidalmq_broker.cli", "operator", "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

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
def deployment(
    api_with_crds: ApiServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """A namespace with the operator and three brokers on a local-directory object store
    (indirect parametrization: more TIDALMQ_* settings for the operator)."""
    ns = f"t-{uuid.uuid4().hex[:8]}"
    api_with_crds.kubectl("create", "namespace", ns)
    storage = f"file://{tmp_path / 'objects'}"
    op = OperatorProcess(api_with_crds, ns, storage, tmp_path, env=getattr(request, "param", None))
    op.start()
    brokers = [
        BrokerProcess(
            storage,
            tmp_path / "logs",
            broker_id=i,
            env=BROKER_ENV,
            args=["--controller-url", op.controller_url],
        )
        for i in range(3)
    ]
    for b in brokers:
        b.start()
    d = {"ns": ns, "operator": op, "brokers": brokers, "api": api_with_crds, "tmp": tmp_path}
    try:
        yield d
    finally:
        for b in brokers:
            if b.alive():
                os.kill(b.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            b.kill()
        # a test that restarted the operator put its successor here: stop that one too (it
        # outlived the suite otherwise, retrying against a deleted namespace)
        for running in {id(o): o for o in (op, d["operator"])}.values():
            running.stop()
        api_with_crds.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def apply(
    d: dict[str, Any], doc: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return d["api"].kubectl("-n", d["ns"], "apply", "-f", "-", input=json.dumps(doc), check=check)


def get(d: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return json.loads(d["api"].kubectl("-n", d["ns"], "get", kind, name, "-o", "json").stdout)


def wait_for(predicate, timeout_s: float = 60, what: str = "condition", detail=None) -> Any:  # type: ignore[no-untyped-def]
    """Poll `predicate` until it is true; on timeout, the error says what `detail()` returns
    (the state that was not reached, so a failure in CI can be diagnosed from its message)."""
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
    seen = f"; {detail()}" if detail is not None else ""
    raise TimeoutError(f"{what} not reached (last: {last}){seen}")


def events_of(d: dict[str, Any], name: str) -> list[dict[str, Any]]:
    out = (
        d["api"]
        .kubectl(
            "-n",
            d["ns"],
            "get",
            "events",
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        )
        .stdout
    )
    return list(json.loads(out)["items"])


def step_events(events: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The Partition* Events of one partition (messages start with `topic-partition:`), in the
    order of the steps they report (their timestamps are the steps' own)."""
    ours = [
        e for e in events if e["reason"].startswith("Partition") and e["message"].startswith(prefix)
    ]
    order = ["PartitionClosing", "PartitionElecting", "PartitionOpening"]
    # eventTime: to the microsecond (an election stamps Electing and Opening in one call, so
    # equal times are ordered by step)
    return sorted(
        ours,
        key=lambda e: (
            e["eventTime"],
            order.index(e["reason"]) if e["reason"] in order else len(order),
        ),
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return None


def topic(name: str, partitions: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {"partitions": partitions, **spec},
    }


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

    # stored data to delete: the first checkpoint comes within a checkpoint interval (5 s), a
    # loaded machine's later; waited for, not a fixed 6 s that a slow run could outlast
    def stored() -> bool:
        return objects.exists() and any(f.is_file() for f in objects.rglob("*"))

    wait_for(stored, timeout_s=60, what="the topic's stored data")
    d["api"].kubectl("-n", d["ns"], "delete", "topic", "orders", "--timeout=60s")
    wait_for(
        lambda: not [f for f in objects.rglob("*") if f.is_file()] if objects.exists() else True,
        what="topic data deleted",
    )


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
    targets = [
        {"topic": "moving", "partition": p["partition"], "replicas": [(p["broker"] + 1) % 3]}
        for p in parts
    ]
    apply(
        d,
        {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "PartitionReassignment",
            "metadata": {"name": "spread"},
            "spec": {"partitions": targets},
        },
    )
    done = wait_for(
        lambda: (
            get(d, "partitionreassignment", "spread").get("status", {}).get("phase") == "Completed"
        ),
        what="reassignment Completed",
    )
    assert done
    status = get(d, "partitionreassignment", "spread")["status"]
    assert status["progress"] == "6/6"
    assert all(r["phase"] == "Done" and r["unavailableMs"] >= 0 for r in status["partitions"])
    brokers = {
        p["partition"]: p["broker"] for p in get(d, "topic", "moving")["status"]["partitions"]
    }
    assert brokers == {t["partition"]: t["replicas"][0] for t in targets}
    # an Event for every step of every move, each once (even Electing, which lasts no time),
    # stamped in step order, and one for the outcome
    events = events_of(d, "spread")
    for t in targets:
        steps = step_events(events, f"moving-{t['partition']}:")
        assert [e["reason"] for e in steps] == [
            "PartitionClosing",
            "PartitionElecting",
            "PartitionOpening",
            "PartitionDone",
        ], steps
    assert [e["message"] for e in events if e["reason"] == "Completed"] == ["6 of 6 moved"]


def test_bad_reassignment_fails_with_a_clear_condition(deployment: dict[str, Any]) -> None:
    d = deployment
    apply(d, topic("target", 1))
    wait_for(lambda: (condition(get(d, "topic", "target"), "Ready") or {}).get("status") == "True")
    apply(
        d,
        {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "PartitionReassignment",
            "metadata": {"name": "nowhere"},
            "spec": {"partitions": [{"topic": "target", "partition": 0, "replicas": [9]}]},
        },
    )

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
    targets = [
        {"topic": "resume", "partition": p["partition"], "replicas": [(p["broker"] + 2) % 3]}
        for p in parts
    ]
    apply(
        d,
        {
            "apiVersion": "tidalmq.io/v1alpha1",
            "kind": "PartitionReassignment",
            "metadata": {"name": "interrupted"},
            "spec": {"partitions": targets},
        },
    )

    def phase() -> str | None:
        return get(d, "partitionreassignment", "interrupted").get("status", {}).get("phase")

    # Running, or already Completed: four moves can finish between two polls (a CI run saw no
    # Running in 60 s); the restart then finds a finished run, which must stay finished
    seen = wait_for(
        lambda: phase() in ("Running", "Completed") and phase(),
        what="Running (or Completed)",
        detail=lambda: get(d, "partitionreassignment", "interrupted").get("status"),
    )
    print(f"phase before the restart: {seen}")
    d["operator"].kill()
    d["operator"].start()
    wait_for(
        lambda: (
            get(d, "partitionreassignment", "interrupted").get("status", {}).get("phase")
            == "Completed"
        ),
        what="Completed after restart",
    )
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

        def roles() -> tuple[OperatorProcess, OperatorProcess] | None:
            # (active, standby) once exactly one answers ready. A /readyz that did not answer
            # within its 1 s on a loaded machine reads as not ready: one read each would take
            # the active replica for the standby
            a, b = first.ready(), second.ready()
            assert not (a and b), "both replicas active"
            return (first, second) if a else (second, first) if b else None

        active, standby = wait_for(roles, timeout_s=30, what="one replica active")
        epoch_before = get(d, "clusterstate", "tidalmq")["status"]["controllerEpoch"]
        active.kill()
        wait_for(standby.ready, timeout_s=120, what="the standby takes over")
        wait_for(
            lambda: get(d, "clusterstate", "tidalmq")["status"]["controllerEpoch"] > epoch_before,
            what="a higher controller epoch",
        )
    finally:
        second.stop()


def reassignment(name: str, moves: dict[int, int], topic_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "PartitionReassignment",
        "metadata": {"name": name},
        "spec": {
            "partitions": [
                {"topic": topic_name, "partition": p, "replicas": [b]}
                for p, b in sorted(moves.items())
            ],
            **spec,
        },
    }


def placement(d: dict[str, Any], topic_name: str) -> dict[int, tuple[int, int]]:
    """partition -> (broker, leader epoch), as the Topic's status reports them."""
    parts = get(d, "topic", topic_name)["status"]["partitions"]
    return {p["partition"]: (p["broker"], p["epoch"]) for p in parts}


def phase_of(d: dict[str, Any], name: str) -> str | None:
    return (get(d, "partitionreassignment", name).get("status") or {}).get("phase")


def ready_topic(d: dict[str, Any], name: str, partitions: int) -> dict[int, tuple[int, int]]:
    apply(d, topic(name, partitions))
    wait_for(
        lambda: (condition(get(d, "topic", name), "Ready") or {}).get("status") == "True",
        what=f"Topic {name} Ready",
    )
    return placement(d, name)


def test_a_reassignment_cancelled_before_it_starts_moves_nothing(
    deployment: dict[str, Any],
) -> None:
    """spec.cancel is honoured before submission: created with `cancel: true`, or cancelled
    while no operator could submit it. Nothing moves: every partition keeps its broker and its
    leader epoch (a move rolled back would have bumped it), no move Event is recorded."""
    d = deployment
    before = ready_topic(d, "still", 6)
    away = {p: (b + 1) % 3 for p, (b, _) in before.items()}
    # (a) created cancelled, the operator running
    apply(d, reassignment("born-cancelled", away, "still", cancel=True))
    # (b) created, then cancelled, while the operator is down: it finds both at once
    d["operator"].stop()
    apply(d, reassignment("cancelled-early", away, "still"))
    d["api"].kubectl(
        "-n",
        d["ns"],
        "patch",
        "partitionreassignment",
        "cancelled-early",
        "--type=merge",
        "-p",
        '{"spec": {"cancel": true}}',
    )
    d["operator"].start()
    for name in ("born-cancelled", "cancelled-early"):
        wait_for(lambda name=name: phase_of(d, name) == "Cancelled", what=f"{name} Cancelled")
        pr = get(d, "partitionreassignment", name)
        c = condition(pr, "Complete")
        assert c is not None and c["status"] == "True" and c["reason"] == "Cancelled", c
        assert "nothing was moved" in c["message"]
        assert pr["status"]["progress"] == "0/6"
        assert [r["phase"] for r in pr["status"]["partitions"]] == ["Cancelled"] * 6
        # the Cancelled Event follows the status patch: wait for it
        wait_for(
            lambda name=name: "Cancelled" in [e["reason"] for e in events_of(d, name)],
            what=f"{name}'s Cancelled event",
        )
        reasons = [e["reason"] for e in events_of(d, name)]
        assert not [r for r in reasons if r == "Started" or r.startswith("Partition")], reasons
    time.sleep(3)  # a move submitted by mistake would have shown by now
    assert placement(d, "still") == before


# The controller's failure detection is slowed down (a silent broker is dead after 60 s, a
# source that does not close is fenced after 60 s) so that a SIGSTOPped source keeps its moves
# in Closing - half way - for as long as the test needs.
SLOW_FAILOVER = {"TIDALMQ_SESSION_TIMEOUT_S": "60", "TIDALMQ_ELECTION_TIMEOUT_S": "60"}


def half_way(
    d: dict[str, Any], topic_name: str
) -> tuple[BrokerProcess, set[int], dict[int, int], dict[int, int]]:
    """A Topic of 6 partitions on 3 brokers whose broker `stuck` (the leader of partition 0) is
    stopped with SIGSTOP; returns (the stopped broker, its partitions, source of each partition,
    target of each partition):
    the stuck broker's partitions go to a live broker (their moves stay in Closing, their source
    cannot close), the others swap between the two live brokers (their moves finish)."""
    before = ready_topic(d, topic_name, 6)
    source = {p: b for p, (b, _) in before.items()}
    stuck = source[0]
    a, b = sorted({0, 1, 2} - {stuck})
    target = {p: (a if s == stuck else (b if s == a else a)) for p, s in source.items()}
    broker = next(x for x in d["brokers"] if x.broker_id == stuck)
    os.kill(broker.proc.pid, signal.SIGSTOP)
    return broker, {p for p, s in source.items() if s == stuck}, source, target


def rows_of(d: dict[str, Any], name: str) -> dict[int, dict[str, Any]]:
    st = get(d, "partitionreassignment", name).get("status") or {}
    return {r["partition"]: r for r in st.get("partitions", [])}


@pytest.mark.parametrize("deployment", [SLOW_FAILOVER], indirect=True)
def test_cancel_half_way_rolls_back_the_moves_in_flight(deployment: dict[str, Any]) -> None:
    """spec.cancel on a Running hand-written reassignment: the moves still in flight (their
    source is stopped, so they stay in Closing) roll back to their source brokers; the moves
    already Done stay Done; the resource ends Cancelled with a condition and Events."""
    d = deployment
    broker, stuck_parts, source, target = half_way(d, "halfway")
    try:
        apply(d, reassignment("half", target, "halfway"))

        def half_done() -> bool:
            rows = rows_of(d, "half")
            return len(rows) == 6 and all(
                rows[p]["phase"] == ("Closing" if p in stuck_parts else "Done") for p in rows
            )

        wait_for(half_done, what="the live brokers' moves Done, the stopped one's in Closing")
        d["api"].kubectl(
            "-n",
            d["ns"],
            "patch",
            "partitionreassignment",
            "half",
            "--type=merge",
            "-p",
            '{"spec": {"cancel": true}}',
        )
        wait_for(lambda: phase_of(d, "half") == "Cancelled", what="Cancelled")
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    pr = get(d, "partitionreassignment", "half")
    rows = rows_of(d, "half")
    for p in range(6):
        expected = "Cancelled" if p in stuck_parts else "Done"
        assert rows[p]["phase"] == expected, rows[p]
        assert rows[p]["source"] == source[p] and rows[p]["startTime"] and rows[p]["endTime"]
    assert pr["status"]["progress"] == f"{6 - len(stuck_parts)}/6"
    c = condition(pr, "Complete")
    assert c is not None and c["status"] == "True" and c["reason"] == "Cancelled", c
    assert c["message"] == f"{6 - len(stuck_parts)} of 6 moved, {len(stuck_parts)} rolled back"
    # the Topic agrees: rolled back to the source, or on the target

    def agrees() -> bool:
        now = placement(d, "halfway")
        return all(now[p][0] == (source[p] if p in stuck_parts else target[p]) for p in range(6))

    wait_for(agrees, what="the Topic's brokers agree with the reassignment's status")
    wait_for(
        lambda: (condition(get(d, "topic", "halfway"), "Ready") or {}).get("status") == "True",
        what="the rolled-back partitions served again",
    )
    events = events_of(d, "half")
    reasons = [e["reason"] for e in events]
    assert "Cancelling" in reasons and reasons.count("Cancelled") == 1, reasons
    for p in stuck_parts:
        steps = [e["reason"] for e in step_events(events, f"halfway-{p}:")]
        assert steps == ["PartitionClosing", "PartitionCancelled"], steps


@pytest.mark.parametrize("deployment", [SLOW_FAILOVER], indirect=True)
def test_an_operator_restart_keeps_the_figures_of_finished_moves(
    deployment: dict[str, Any],
) -> None:
    """Moves that finished before an operator restart keep their status rows (source, times,
    unavailability: the new controller no longer tracks them); a move in flight across the
    restart keeps its start; no step is announced twice."""
    d = deployment
    broker, stuck_parts, source, target = half_way(d, "restarted")
    try:
        apply(d, reassignment("across", target, "restarted"))

        def half_done() -> dict[int, dict[str, Any]] | None:
            rows = rows_of(d, "across")
            finished = [p for p in rows if p not in stuck_parts and "unavailableMs" in rows[p]]
            return rows if len(rows) == 6 and len(finished) == 6 - len(stuck_parts) else None

        before = wait_for(half_done, what="the live brokers' moves Done")
        d["operator"].kill()
        d["operator"].start()
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    wait_for(lambda: phase_of(d, "across") == "Completed", timeout_s=120, what="Completed")
    after = rows_of(d, "across")
    for p in range(6):
        assert after[p]["phase"] == "Done" and after[p]["source"] == source[p], after[p]
        if p in stuck_parts:
            assert after[p]["startTime"] == before[p]["startTime"], (before[p], after[p])
        else:
            assert after[p] == before[p]
    assert {p: b for p, (b, _) in placement(d, "restarted").items()} == target
    done = [
        e["message"].split(":")[0] for e in events_of(d, "across") if e["reason"] == "PartitionDone"
    ]
    assert sorted(done) == sorted(f"restarted-{p}" for p in range(6)), done
