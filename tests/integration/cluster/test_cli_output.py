"""The `tidalmq` commands as a script and a person run them ([U1] item 4), against a real
`tidalmq local up`: add-broker and remove-broker follow their moves to the end (progress, then
one JSON document or one line), `local status` and `reassign --list/--verify` print JSON with
--output json, and --verify after the target broker was removed says so."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess, tidalmq

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180, func_only=True)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(tmp_path_factory.mktemp("cli-output") / "cluster", brokers=2) as c:
        yield c


def test_add_and_remove_broker_follow_their_moves_and_verify_reports_the_removed_target(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    data = ["--data-dir", str(cluster.data_dir)]
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # kept until the topic exists
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    cluster.wait_settled(30)

    started = time.monotonic()
    added = tidalmq("local", "add-broker", "--output", "json", *data)
    assert added.returncode == 0, added.stdout + added.stderr
    doc = json.loads(added.stdout)  # stdout: the document only; the progress is on stderr
    broker = doc["broker"]
    assert doc["finished"] is True and doc["moves"]["done"] == doc["moves"]["total"] > 0, doc
    assert (
        f"{doc['moves']['total']}/{doc['moves']['total']} partitions moved onto it" in added.stderr
    )
    status = tidalmq("local", "status", "--output", "json", *data)
    assert status.returncode == 0, status.stderr
    rows = {r["broker"]: r for r in json.loads(status.stdout)["brokers"]}
    assert rows[broker]["moves_in"] == 0 and rows[broker]["partitions"] >= doc["moves"]["done"]
    assert rows[broker]["address"] == doc["address"]

    # a plan that moves a partition onto the new broker, then the broker goes
    led = [p for p, leader in enumerate(cluster.leaders(topic)) if leader == broker]
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [{"topic": topic, "partition": led[0], "replicas": [broker]}],
            }
        )
    )
    removed = tidalmq("local", "remove-broker", str(broker), *data)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    moved = rows[broker]["partitions"]
    assert f"{moved}/{moved} partitions moved off it" in removed.stdout, removed.stdout
    assert f"broker {broker} removed: {moved} partitions moved off it" in removed.stdout

    verify = tidalmq(
        "reassign",
        "--bootstrap-server",
        cluster.bootstrap,
        "--verify",
        "--reassignment-json-file",
        str(plan),
    )
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert f"its target broker {broker} is not in the cluster" in verify.stdout, verify.stdout
    verify_json = tidalmq(
        "reassign",
        "--bootstrap-server",
        cluster.bootstrap,
        "--verify",
        "--reassignment-json-file",
        str(plan),
        "--output",
        "json",
    )
    assert verify_json.returncode == 1, verify_json.stderr
    (row,) = json.loads(verify_json.stdout)["partitions"]
    assert row["status"] == "target_gone" and row["target"] == broker, row
    listed = tidalmq(
        "reassign", "--bootstrap-server", cluster.bootstrap, "--list", "--output", "json"
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == {"reassignments": []}
    print(f"CLI part: {time.monotonic() - started:.1f}s")
