"""`tidalmq reassign` (the kafka-reassign-partitions workflow) as a user runs it: a real process
against a real local cluster (`tidalmq local up`: a controller and three broker processes on a
local-directory object store). Bad plans exit 2 with a message naming the problem and change
nothing; --execute returns once the moves are started and --verify follows them; --cancel rolls a
stuck move back; --generate proposes a balanced plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalClusterProcess]:
    # long enough that a broker stopped with SIGSTOP for a few CLI calls is neither declared
    # dead nor fenced meanwhile (the cancel test holds a move half way that way)
    with LocalClusterProcess(
        tmp_path_factory.mktemp("reassign-cli") / "cluster",
        brokers=3,
        env={"TIDALMQ_SESSION_TIMEOUT_S": "60", "TIDALMQ_ELECTION_TIMEOUT_S": "60"},
    ) as c:
        yield c


def reassign(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "reassign",
            "--bootstrap-server",
            bootstrap,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def new_topic(cluster: LocalClusterProcess, partitions: int) -> str:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    cluster.wait_settled(30)
    return name


def plan_file(tmp_path: Path, partitions: list[dict[str, Any]]) -> str:
    path = tmp_path / f"plan-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"version": 1, "partitions": partitions}))
    return str(path)


def brokers(cluster: LocalClusterProcess) -> list[int]:
    return sorted(b["broker"] for b in cluster.status()["brokers"])


@pytest.mark.parametrize(
    ("mode", "entries", "message"),
    [
        ("--execute", [{"partition": 0, "replicas": [9]}], "unknown broker 9"),
        ("--execute", [{"partition": 7, "replicas": [0]}], "unknown partition"),
        ("--verify", [{"partition": 7, "replicas": [0]}], "unknown partition"),
        ("--cancel", [{"partition": 7, "replicas": [0]}], "unknown partition"),
        (
            "--cancel",
            [{"topic": "no-such-topic", "partition": 0, "replicas": [0]}],
            "unknown topic 'no-such-topic'",
        ),
        (
            "--execute",
            [{"partition": 0, "replicas": [1]}, {"partition": 0, "replicas": [2]}],
            "appears more than once",
        ),
        (
            "--cancel",
            [{"partition": 0, "replicas": [1]}, {"partition": 0, "replicas": [2]}],
            "appears more than once",
        ),
        # [U1]: an error, then "Successfully started partition reassignments for" nothing
        ("--execute", [{"partition": 0}, {"partition": 1, "replicas": [0]}], 'no "replicas"'),
    ],
)
def test_a_bad_plan_exits_2_and_changes_nothing(
    cluster: LocalClusterProcess,
    tmp_path: Path,
    mode: str,
    entries: list[dict[str, Any]],
    message: str,
) -> None:
    topic = new_topic(cluster, 2)
    leaders = cluster.leaders(topic)
    plan = plan_file(tmp_path, [{"topic": topic, **e} for e in entries])
    result = reassign(cluster.bootstrap, mode, "--reassignment-json-file", plan)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "invalid plan" in result.stderr and message in result.stderr, result.stderr
    assert "Successfully" not in result.stdout and "None of" not in result.stdout
    assert cluster.leaders(topic) == leaders
    assert not [m for m in cluster.moves()["active"] if m["topic"] == topic]


def test_execute_returns_at_once_and_verify_follows(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    topic = new_topic(cluster, 3)
    ids = brokers(cluster)
    targets = [ids[(ids.index(b) + 1) % len(ids)] for b in cluster.leaders(topic)]
    plan = plan_file(
        tmp_path, [{"topic": topic, "partition": p, "replicas": [b]} for p, b in enumerate(targets)]
    )
    not_yet = reassign(cluster.bootstrap, "--verify", "--reassignment-json-file", plan)
    assert not_yet.returncode == 1, not_yet.stderr
    assert "There is no active reassignment" in not_yet.stdout
    assert "0/3 partitions moved" in not_yet.stdout

    # Kafka's tools' client properties are read (this listener is PLAINTEXT: see
    # tests/integration/security/test_reassign_sasl_ssl.py for SASL_SSL)
    (tmp_path / "client.properties").write_text("security.protocol=PLAINTEXT\n")
    result = reassign(
        cluster.bootstrap,
        "--execute",
        "--reassignment-json-file",
        plan,
        "--timeout",
        "30000",
        "--command-config",
        str(tmp_path / "client.properties"),
        "--throttle",
        "1000",
    )
    assert result.returncode == 0, result.stderr
    assert "Successfully started partition reassignments" in result.stdout
    assert "Current partition replica assignment" in result.stdout
    assert "--throttle" in result.stderr  # noted
    assert "partitions moved" not in result.stdout, "--execute must not wait (Kafka's does not)"

    deadline = time.monotonic() + 60
    while True:
        verify = reassign(cluster.bootstrap, "--verify", "--reassignment-json-file", plan)
        assert verify.returncode in (0, 1), verify.stderr
        assert "partitions moved" in verify.stdout  # progress, whether done or in flight
        if verify.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert verify.returncode == 0, verify.stdout
    assert verify.stdout.count("is completed") == 3
    assert "3/3 partitions moved, 0 in flight" in verify.stdout
    assert cluster.leaders(topic) == targets


def test_cancel_rolls_a_stuck_move_back(cluster: LocalClusterProcess, tmp_path: Path) -> None:
    """The source of the move is stopped (SIGSTOP), so the move stays in flight: --verify shows
    it, --cancel rolls it back, and a second --cancel finds nothing active."""
    topic = new_topic(cluster, 1)
    source = cluster.leaders(topic)[0]
    target = next(b for b in brokers(cluster) if b != source)
    rows = {b["broker"]: b for b in cluster.status()["brokers"]}
    others = ",".join(r["address"] for b, r in rows.items() if b != source)  # not the stopped one
    plan = plan_file(tmp_path, [{"topic": topic, "partition": 0, "replicas": [target]}])
    os.kill(rows[source]["pid"], signal.SIGSTOP)
    try:
        started = reassign(others, "--execute", "--reassignment-json-file", plan)
        assert started.returncode == 0, started.stderr
        verify = reassign(others, "--verify", "--reassignment-json-file", plan)
        assert verify.returncode == 1, verify.stderr
        assert f"Reassignment of partition {topic}-0 is still in progress." in verify.stdout
        assert "0/1 partitions moved, 1 in flight" in verify.stdout
        assert f"{topic}-0: adding [{target}], removing [{source}]" in verify.stdout
        cancel = reassign(others, "--cancel", "--reassignment-json-file", plan)
        assert cancel.returncode == 0, cancel.stderr
        assert f"Successfully cancelled partition reassignment for: {topic}-0" in cancel.stdout
    finally:
        os.kill(rows[source]["pid"], signal.SIGCONT)
    cluster.wait_settled(60)
    assert cluster.leaders(topic) == [source]
    again = reassign(cluster.bootstrap, "--cancel", "--reassignment-json-file", plan)
    assert again.returncode == 0, again.stderr
    assert "None of the specified partition reassignments are active." in again.stdout


def test_generate_proposes_a_balanced_plan(cluster: LocalClusterProcess, tmp_path: Path) -> None:
    topic = new_topic(cluster, 6)
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    ids = brokers(cluster)[:2]
    result = reassign(
        cluster.bootstrap,
        "--generate",
        "--topics-to-move-json-file",
        str(topics),
        "--broker-list",
        ",".join(map(str, ids)),
        "--disable-rack-aware",
    )
    assert result.returncode == 0, result.stderr
    assert "--disable-rack-aware" in result.stderr  # noted
    current, proposed = result.stdout.split("Proposed partition reassignment configuration")
    assert "Current partition replica assignment" in current
    plan = json.loads(proposed.strip())
    replicas = {p["partition"]: p["replicas"] for p in plan["partitions"] if p["topic"] == topic}
    assert sorted(replicas) == list(range(6))
    per_broker = [sum(r == [b] for r in replicas.values()) for b in ids]
    assert per_broker == [3, 3], replicas
    unknown = reassign(
        cluster.bootstrap,
        "--generate",
        "--topics-to-move-json-file",
        str(topics),
        "--broker-list",
        "0,77",
    )
    assert unknown.returncode == 2 and "unknown brokers [77]" in unknown.stderr
