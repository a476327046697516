"""Status that can be trusted ([O2]), against a real kube-apiserver with the operator and three
broker processes (the fixtures of test_operator.py): a Topic or StaticTopic whose partitions are
on a broker that is not alive is Degraded and not Ready, with the reason in `kubectl get`; a
failed PartitionReassignment says why in `kubectl get`; a move elected before an operator
restart keeps its unavailableMs; a Topic whose data vanished from the store is Degraded
(DataLost) with an Event, and the annotation tidalmq.io/accept-data-loss recovers it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from tests.integration.operator.test_operator import (  # noqa: F401  (fixtures)
    CONTROL_TOKEN,
    SLOW_FAILOVER,
    api_with_crds,
    apply,
    condition,
    deployment,
    events_of,
    get,
    phase_of,
    placement,
    ready_topic,
    reassignment,
    rows_of,
    wait_for,
)
from tests.integration.operator.test_static_topics import ready, static_topic, status_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def cond(d: dict[str, Any], kind: str, name: str, type_: str) -> dict[str, Any]:
    return condition(get(d, kind, name), type_) or {}


def printed(d: dict[str, Any], kind: str, name: str) -> str:
    """`kubectl get` as a person sees it: the CRD's printer columns, evaluated by the server."""
    return d["api"].kubectl("-n", d["ns"], "get", kind, name).stdout


def operator_metrics(d: dict[str, Any]) -> str:
    url = f"http://127.0.0.1:{d['operator'].http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def broker(d: dict[str, Any], broker_id: int) -> Any:
    return next(b for b in d["brokers"] if b.broker_id == broker_id)


@pytest.mark.parametrize("deployment", [SLOW_FAILOVER], indirect=True)
def test_a_topic_on_a_broker_that_is_not_alive_is_degraded(deployment: dict[str, Any]) -> None:  # noqa: F811
    """The controller declares a silent broker dead only after its session timeout (60 s here,
    as a slow node might need): until then its partitions are not served, and the Topic says
    so (it said Ready/Serving)."""
    d = deployment
    before = ready_topic(d, "orders", 6)
    victim = before[0][0]
    on_victim = sorted(p for p, (b, _) in before.items() if b == victim)
    ready_since = cond(d, "topic", "orders", "Ready")["lastTransitionTime"]
    broker(d, victim).kill()

    def degraded() -> dict[str, Any] | None:
        c = cond(d, "topic", "orders", "Degraded")
        return c if c.get("status") == "True" else None

    c = wait_for(degraded, timeout_s=30, what="Degraded")
    assert c["reason"] == "BrokerNotAlive", c
    assert f"on broker {victim}, which is not alive" in c["message"], c
    assert (
        f"{len(on_victim)} partitions: " in c["message"]
        or f"partition {on_victim[0]}" in c["message"]
    )
    topic = get(d, "topic", "orders")
    r = condition(topic, "Ready")
    assert r is not None and r["status"] == "False" and r["reason"] == "BrokerNotAlive", r
    assert (
        r["lastTransitionTime"] >= ready_since
        and r["observedGeneration"] == topic["metadata"]["generation"]
    )
    rows = {p["partition"]: p for p in topic["status"]["partitions"]}
    assert (
        sorted(p for p, row in rows.items() if row.get("problem") == "BrokerNotAlive") == on_victim
    )
    assert "BrokerNotAlive" in printed(d, "topic", "orders")  # the Reason column
    metrics = operator_metrics(d)
    assert (
        'tidalmq_operator_degraded{kind="Topic",reason="BrokerNotAlive",resource="orders"} 1.0'
        in metrics
    )
    # the condition is stable while nothing changes (no churn of its transition time)
    first = cond(d, "topic", "orders", "Degraded")["lastTransitionTime"]
    time.sleep(2.5)
    assert cond(d, "topic", "orders", "Degraded")["lastTransitionTime"] == first

    # the broker comes back (a new incarnation takes its partitions again): served, not degraded
    broker(d, victim).start()
    wait_for(
        lambda: cond(d, "topic", "orders", "Ready").get("status") == "True",
        timeout_s=60,
        what="Ready again",
    )
    c = cond(d, "topic", "orders", "Degraded")
    assert c["status"] == "False" and c["lastTransitionTime"] >= first, c
    assert not [p for p in get(d, "topic", "orders")["status"]["partitions"] if p.get("problem")]


@pytest.mark.parametrize("deployment", [SLOW_FAILOVER], indirect=True)
def test_a_static_topic_remapped_onto_a_broker_that_dies_is_not_ready(
    deployment: dict[str, Any],  # noqa: F811
) -> None:
    d = deployment
    apply(d, static_topic("events", 4))
    wait_for(lambda: ready(d, "events"), what="StaticTopic Ready")
    queues = status_of(d, "events")["queues"]
    target = (queues[0]["broker"] + 1) % 3
    apply(d, static_topic("events", 4, remap=[{"queue": 0, "broker": target, "mode": "strict"}]))
    wait_for(
        lambda: status_of(d, "events")["queues"][0]["broker"] == target and ready(d, "events"),
        what="logic queue 0 remapped",
    )
    on_target = sorted(
        q["queue"] for q in status_of(d, "events")["queues"] if q["broker"] == target
    )
    broker(d, target).kill()

    def not_ready() -> dict[str, Any] | None:
        c = cond(d, "statictopic", "events", "Ready")
        return c if c.get("status") == "False" else None

    c = wait_for(not_ready, timeout_s=30, what="StaticTopic not Ready")
    assert (
        c["reason"] == "BrokerNotAlive"
        and f"on broker {target}, which is not alive" in c["message"]
    ), c
    degraded = cond(d, "statictopic", "events", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "BrokerNotAlive", degraded
    rows = {q["queue"]: q for q in status_of(d, "events")["queues"]}
    assert (
        sorted(q for q, row in rows.items() if row.get("problem") == "BrokerNotAlive") == on_target
    )
    assert "BrokerNotAlive" in printed(d, "statictopic", "events")


def test_a_failed_reassignment_says_why_in_kubectl_get(deployment: dict[str, Any]) -> None:  # noqa: F811
    d = deployment
    ready_topic(d, "target", 1)
    apply(d, reassignment("nowhere", {0: 9}, "target"))
    wait_for(lambda: phase_of(d, "nowhere") == "Failed", what="Failed")
    out = printed(d, "partitionreassignment", "nowhere")
    header, row = out.splitlines()[:2]
    assert "MESSAGE" in header and "unknown broker 9" in row, out


@pytest.mark.parametrize("deployment", [SLOW_FAILOVER], indirect=True)
def test_a_move_elected_before_an_operator_restart_keeps_its_unavailability(
    deployment: dict[str, Any],  # noqa: F811
) -> None:
    """The target of a move is stopped, so the move stays elected and not open (Opening) while
    the operator is killed and restarted. The new controller does not track it (only moves
    still recorded as moving are resumed): the row must stay Opening until the target serves,
    then be Done with its unavailability measured, not Done at once with no figure."""
    d = deployment
    before = ready_topic(d, "across", 6)
    source = before[0][0]
    target = (source + 1) % 3
    stuck = broker(d, target)
    os.kill(stuck.proc.pid, signal.SIGSTOP)
    try:
        apply(d, reassignment("elected", {0: target}, "across"))
        wait_for(
            lambda: rows_of(d, "elected").get(0, {}).get("phase") == "Opening",
            what="the move elected, its target not opening it",
        )
        d["operator"].kill()
        d["operator"].start()
        time.sleep(3)  # the new operator publishes: the target still has not opened it
        row = rows_of(d, "elected")[0]
        assert row["phase"] == "Opening", row
    finally:
        os.kill(stuck.proc.pid, signal.SIGCONT)
    wait_for(lambda: phase_of(d, "elected") == "Completed", timeout_s=120, what="Completed")
    row = rows_of(d, "elected")[0]
    assert row["phase"] == "Done" and row["source"] == source, row
    assert row["unavailableMs"] >= 3000 and "measured by the new operator" in row["message"], row
    assert placement(d, "across")[0][0] == target


# ------------------------------------------------------------------------- lost data
def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> dict[int, int]:
    """`count` records with an idempotent producer; partition -> next offset acknowledged."""
    ends: dict[int, int] = {}
    errors: list[Any] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(start, start + count):
        p.produce(topic, key=b"k%d" % (i % 17), value=b"%d" % i, on_delivery=done)
    assert p.flush(60) == 0 and not errors, errors
    return ends


def produce_error(bootstrap: str, topic: str, partition: int) -> KafkaError | None:
    """The error of one record to one partition (None: acknowledged). Without retries, so the
    broker's own error is what the delivery report says (an idempotent producer retries a
    retriable error until its timeout and reports that)."""
    p = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "retries": 0, "message.timeout.ms": 10000}
    )
    out: list[KafkaError | None] = []
    p.produce(topic, value=b"probe", partition=partition, on_delivery=lambda e, m: out.append(e))
    p.flush(15)
    return out[0] if out else KafkaError(KafkaError._MSG_TIMED_OUT)


def annotate(d: dict[str, Any], kind: str, name: str, value: str) -> None:
    d["api"].kubectl(
        "-n", d["ns"], "annotate", "--overwrite", kind, name, f"tidalmq.io/accept-data-loss={value}"
    )


def annotations(d: dict[str, Any], kind: str, name: str) -> dict[str, str]:
    return get(d, kind, name)["metadata"].get("annotations") or {}


def test_a_topic_whose_data_vanished_is_degraded_until_the_loss_is_accepted(
    deployment: dict[str, Any],  # noqa: F811
) -> None:
    """The issue's scenario on Kubernetes: acknowledged records, every broker killed, the
    partitions' data deleted from the store (its identity marker and the metadata kept), the
    brokers back. No partition serves from offset 0: producers get KAFKA_STORAGE_ERROR, the Topic
    is Degraded (DataLost) naming the partitions and the missing offsets, with a warning Event
    and a metric. An invalid annotation is refused with a reason; `true` accepts the loss: the
    annotation goes, an Event records the offsets given up, and the partitions serve again at
    their old end, never at 0."""
    d = deployment
    ready_topic(d, "ledger", 3)
    bootstrap = d["brokers"][0].bootstrap
    ends = produce(bootstrap, "ledger", 600)
    assert set(ends) == {0, 1, 2}

    def floors() -> dict[int, int]:
        """The end-offset floors of ledger's partitions in the controller's metadata."""
        req = urllib.request.Request(
            d["operator"].controller_url + "/v1/metadata",
            headers={"Authorization": f"Bearer {CONTROL_TOKEN}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            parts = json.loads(r.read())["metadata"]["topics"]["ledger"]["partitions"]
        return {i: p["end_offset_floor"] for i, p in enumerate(parts)}

    # the controller commits the brokers' high watermarks (floors) every 10 s: waited for in
    # its metadata, not a fixed 12 s that a loaded machine (heartbeats late) could outlast
    wait_for(
        lambda: floors() == ends, timeout_s=60, what="floors at the produced ends", detail=floors
    )
    for b in d["brokers"]:
        b.kill()
    objects = d["tmp"] / "objects"
    for sub in ("partitions", "wal"):
        shutil.rmtree(objects / sub, ignore_errors=True)
    for b in d["brokers"]:
        b.start()

    def degraded() -> dict[str, Any] | None:
        """Degraded/DataLost naming all three (each broker reports its own partition when it
        finds it lost: the status may name fewer first)."""
        c = cond(d, "topic", "ledger", "Degraded")
        if c.get("status") == "True" and c.get("reason") == "DataLost":
            return c if "data lost in 3 partitions: 0-2" in c["message"] else None
        return None

    c = wait_for(degraded, timeout_s=90, what="Degraded/DataLost of partitions 0-2")
    assert f"{sum(ends.values())} acknowledged offsets missing" in c["message"], c
    topic = get(d, "topic", "ledger")
    assert condition(topic, "Ready")["reason"] == "DataLost"  # type: ignore[index]
    rows = {r["partition"]: r for r in topic["status"]["partitions"]}
    for p, end in ends.items():
        assert rows[p]["lost"] is True and rows[p]["missingOffsets"] == end, rows[p]
        assert rows[p]["expectedEnd"] == end and rows[p]["foundEnd"] == 0, rows[p]
    assert "DataLost" in printed(d, "topic", "ledger")
    err = produce_error(bootstrap, "ledger", 0)
    assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR, err

    # a warning Event per detection (brokers find their partitions lost one by one): each
    # partition is named once, with its missing offsets
    def lost_events() -> list[dict[str, Any]] | None:
        events = [e for e in events_of(d, "ledger") if e["reason"] == "DataLost"]
        text = " ".join(e["message"] for e in events)
        return events if all(f"partition {p}: offsets" in text for p in ends) else None

    events = wait_for(lost_events, what="DataLost Events naming every partition")
    text = " ".join(e["message"] for e in events)
    assert all(e["type"] == "Warning" for e in events), events
    for p, end in ends.items():
        assert text.count(f"partition {p}: offsets 0 to {end - 1} missing ({end};") == 1, text
    assert (
        'tidalmq_operator_lost_partitions{kind="Topic",resource="ledger",topic="ledger"} 3.0'
        in operator_metrics(d)
    )

    # an invalid value: refused with a reason, nothing accepted, the annotation stays
    annotate(d, "topic", "ledger", "0,7")

    def refused() -> dict[str, Any] | None:
        c = cond(d, "topic", "ledger", "Error")
        return c if c.get("reason") == "InvalidAnnotation" else None

    c = wait_for(refused, what="InvalidAnnotation")
    assert "has no partition 7" in c["message"], c
    assert [e for e in events_of(d, "ledger") if e["reason"] == "InvalidAnnotation"]
    assert cond(d, "topic", "ledger", "Degraded")["reason"] == "DataLost"

    # partition 1 only, then the rest
    annotate(d, "topic", "ledger", "1")
    wait_for(
        lambda: "tidalmq.io/accept-data-loss" not in annotations(d, "topic", "ledger"),
        what="the annotation removed",
    )
    wait_for(
        lambda: (
            "data lost in 2 partitions: 0, 2"
            in cond(d, "topic", "ledger", "Degraded").get("message", "")
        ),
        what="partition 1 accepted",
    )
    annotate(d, "topic", "ledger", "true")
    wait_for(
        lambda: cond(d, "topic", "ledger", "Ready").get("status") == "True",
        timeout_s=60,
        what="Ready after the loss was accepted",
    )
    assert cond(d, "topic", "ledger", "Degraded")["status"] == "False"
    assert cond(d, "topic", "ledger", "Error")["status"] == "False"
    assert "tidalmq.io/accept-data-loss" not in annotations(d, "topic", "ledger")
    accepted = wait_for(
        lambda: (
            [e for e in events_of(d, "ledger") if e["reason"] == "DataLossAccepted"]
            if len([e for e in events_of(d, "ledger") if e["reason"] == "DataLossAccepted"]) == 2
            else None
        ),
        what="two DataLossAccepted Events",
    )
    text = " ".join(e["message"] for e in accepted)
    for p, end in ends.items():
        assert f"partition {p}: offsets 0 to {end - 1} given up, continues at {end}" in text, text
    # served again, at the old end: no offset is reused
    after = produce(bootstrap, "ledger", 90, start=600)
    for p, end in after.items():
        assert end > ends[p], (p, end, ends[p])
    assert (
        'tidalmq_operator_lost_partitions{kind="Topic",resource="ledger",topic="ledger"} 0.0'
        in operator_metrics(d)
    )
