"""The control plane refuses whoever has no token ([R1] item 5), on real processes.

What was measured before: a forged metadata push made a broker advertise a wrong address;
anyone could drain a broker, register as another one (flapping it), delete topics, remove or
kill brokers. Here each control call is forged against a real `tidalmq local up` (its
controller, and each broker's control endpoint) and against a real standalone broker: without
a token, with a wrong one, and with a broker's token acting for another broker. Every one is
refused (401, or 403 for the broker acting for another) and nothing changes: the cluster's
brokers, topics and processes, and the addresses a Kafka client is told. Then the same calls
with the right token do what they did before (and the forged push, made with the token, does
move the address: the test would see an attack that got through)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from tidalmq_core import snapshots, updates
from tidalmq_core.control_auth import broker_token
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata

from tests.support.broker_process import BrokerProcess
from tests.support.local_cluster import LocalClusterProcess

pytestmark = pytest.mark.integration

EVIL = "203.0.113.9"  # TEST-NET-3: where a forged push would send clients
WRONG = "wrong-" + secrets.token_urlsafe(32)


def call(
    url: str, body: Any = None, token: str | None = None, method: str = "POST"
) -> tuple[int, Any]:
    """(status, JSON answer) of one HTTP call; `body` bytes go as they are."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def kafka_brokers(bootstrap: str) -> dict[int, tuple[str, int]]:
    """The broker addresses a Kafka client is told (Metadata)."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20)
    return {b.id: (b.host, b.port) for b in meta.brokers.values()}


def forged_metadata(version: int) -> ClusterMetadata:
    """A metadata image that sends broker 0's clients to EVIL (as the measured attack did)."""
    return ClusterMetadata(
        cluster_id="forged",
        version=version,
        brokers={0: BrokerInfo(0, EVIL, 9092, incarnation="forged")},
    )


def forged_update(version: int) -> bytes:
    image = forged_metadata(version)
    return b"".join(updates.encode(version, snapshots.encode_bytes(image), []))


# an abort marker for another producer's transaction, as a coordinator sends it
FORGED_MARKERS = {
    "markers": [
        {
            "topic": "orders",
            "partition": 0,
            "producer_id": 1,
            "producer_epoch": 0,
            "commit": False,
            "coordinator_epoch": 99,
        }
    ]
}


def controller_calls(cluster: LocalClusterProcess, victim: int) -> list[tuple[str, str, Any]]:
    """(method, path, body) of every control call the local cluster's controller serves, each a
    forgery that would change something (or read what it should not) if let through."""
    info = BrokerInfo(victim, EVIL, 9092, incarnation="forged", control_url=f"http://{EVIL}:1")
    tp = {"topic": "orders", "partition": 0}
    return [
        ("POST", "/v1/brokers/register", {**info.to_json(), "protocol": 2}),
        (
            "POST",
            "/v1/brokers/heartbeat",
            {
                "broker_id": victim,
                "incarnation": "forged",
                "applied_version": 0,
                "protocol": 2,
                "full": True,
                "open": [],
                "hwm": [],
                "floors": [],
            },
        ),
        ("POST", "/v1/brokers/drain", {"broker_id": victim, "timeout_s": 5}),
        ("POST", "/v1/brokers/remove", {"broker_id": victim}),
        (
            "POST",
            "/v1/partitions/reports",
            {
                "broker_id": victim,
                "reports": [
                    {
                        "kind": "closed",
                        **tp,
                        "epoch": 99,
                        "topic_id": None,
                        "high_watermark": None,
                        "loss": None,
                        "stored": True,
                    }
                ],
            },
        ),
        ("POST", "/v1/partitions/closed", {"broker_id": victim, **tp, "epoch": 99}),
        ("POST", "/v1/partitions/opened", {"broker_id": victim, **tp, "epoch": 99}),
        (
            "POST",
            "/v1/partitions/lost",
            {
                "broker_id": victim,
                **tp,
                "epoch": 99,
                "loss": {
                    "expected_end": 10,
                    "found_end": 0,
                    "detected_ms": 0,
                    "broker": victim,
                    "reason": "forged",
                },
            },
        ),
        ("POST", "/v1/topics/create", {"topics": [{"name": "forged", "num_partitions": 1}]}),
        ("POST", "/v1/topics/delete", {"names": ["orders"]}),
        ("POST", "/v1/topics/partitions", {"name": "orders", "total": 9}),
        (
            "POST",
            "/v1/topics/configs",
            {
                "name": "orders",
                "changes": {"retention.ms": "1"},
                "incremental": True,
                "validate_only": False,
            },
        ),
        (
            "POST",
            "/v1/brokers/configs",
            {
                "scope": "",
                "changes": {"log.retention.ms": "1"},
                "incremental": True,
                "validate_only": False,
            },
        ),
        (
            "POST",
            "/v1/scram-credentials/alter",
            {
                "deletions": [],
                "upsertions": [
                    {
                        "name": "mallory",
                        "mechanism": 2,
                        "iterations": 4096,
                        "salt": "c2FsdA==",
                        "salted_password": "cGFzc3dvcmQ=",
                    }
                ],
            },
        ),
        # ACLs: ALL on every topic to User:mallory; every binding deleted
        ("POST", "/v1/acls/create", {"bindings": [[2, "*", 3, "User:mallory", "*", 2, 3]]}),
        ("POST", "/v1/acls/delete", {"filters": [[1, None, 1, None, None, 1, 1]]}),
        # transaction.version finalized at 2 behind the cluster's back
        (
            "POST",
            "/v1/features/update",
            {
                "updates": [{"name": "transaction.version", "level": 2, "upgrade_type": 1}],
                "validate_only": False,
            },
        ),
        ("POST", "/v1/producer-ids", {}),
        ("POST", "/v1/transactions/state-topic", {}),
        ("POST", "/v1/transactions/markers", {"broker_id": 1 - victim, "markers": FORGED_MARKERS}),
        ("POST", "/v1/reassignments/alter", {"entries": [{**tp, "target": 1 - victim}]}),
        ("POST", "/v1/reassignments/list", {}),
        ("POST", "/v1/data-loss/accept", {"topic": "orders", "partitions": None}),
        ("POST", "/v1/rebalance", {"reason": "forged"}),
        ("POST", "/v1/static-topics/create", {"name": "forged", "total_queues": 2}),
        ("POST", "/v1/static-topics/update", {"name": "forged", "total_queues": 4}),
        ("POST", "/v1/static-topics/describe", {"name": "forged"}),
        (
            "POST",
            "/v1/static-topics/remap",
            {"name": "forged", "moves": [{"queue": 0, "broker": 0}]},
        ),
        ("POST", "/v1/static-topics/repair", {"name": "forged"}),
        ("POST", "/v1/local/add-broker", {}),
        ("POST", "/v1/local/remove-broker", {"broker_id": victim}),
        ("POST", "/v1/local/kill-broker", {"broker_id": victim}),
        # reads: the metadata holds SCRAM credentials, the status the processes
        ("GET", "/v1/metadata", None),
        ("GET", "/v1/metadata/updates?since=-1", None),
        ("GET", "/v1/data-loss", None),
        ("GET", "/v1/moves", None),
        ("GET", "/v1/static-topics", None),
        ("GET", "/v1/static-topics/remaps", None),
        ("GET", "/v1/local/status", None),
    ]


def state_of(cluster: LocalClusterProcess) -> dict[str, Any]:
    """What a forgery would change: brokers, topics and their leaders and epochs, credentials,
    feature levels, producer ids, the processes, and the addresses clients are told."""
    meta = cluster.metadata()
    status = cluster.status()
    return {
        "brokers": meta["brokers"],
        "topics": {
            n: [(p["leader"], p["leader_epoch"]) for p in t["partitions"]]
            for n, t in meta["topics"].items()
        },
        "configs": {n: t["configs"] for n, t in meta["topics"].items()},
        "broker_configs": meta["broker_configs"],
        "scram": meta.get("scram_credentials", {}),
        "acls": meta.get("acls", []),
        "features": meta.get("features", {}),
        "static": meta["static_topics"],
        "producer_ids": meta["next_producer_id"],
        "processes": [(r["broker"], r["state"], r["process"], r["pid"]) for r in status["brokers"]],
        "lost": status["lost"],
        "kafka": kafka_brokers(cluster.bootstrap),
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    env = {"TIDALMQ_OFFSETS_TOPIC_PARTITIONS": "2"}
    # the tokens alone (control-plane mTLS off): test_control_plane_mtls.py forges with it on
    with LocalClusterProcess(
        tmp_path / "cluster", brokers=2, env=env, args=["--control-tls", "off"]
    ) as c:
        yield c


def test_forged_control_calls_change_nothing_in_a_local_cluster(
    cluster: LocalClusterProcess,
) -> None:
    started = time.monotonic()
    token = cluster.control_token
    assert (cluster.data_dir / "control-token").stat().st_mode & 0o777 == 0o600
    status, _ = call(
        f"{cluster.controller_url}/v1/topics/create",
        {"topics": [{"name": "orders", "num_partitions": 4}]},
        token,
    )
    assert status == 200
    cluster.wait_settled()
    before = state_of(cluster)
    assert set(before["kafka"]) == {0, 1}
    http = {r["broker"]: r["http_port"] for r in cluster.status()["brokers"]}
    base = cluster.controller_url
    zero, one = broker_token(token, 0), broker_token(token, 1)
    forged_secret = broker_token(secrets.token_urlsafe(32), 1)  # well formed, wrong secret

    refused = 0
    for method, path, body in controller_calls(cluster, victim=1):
        for bad in (None, WRONG, forged_secret):
            status, doc = call(base + path, body, bad, method)
            assert status == 401, (method, path, bad, status, doc)
            refused += 1
    # a broker's own token acts for that broker only
    for method, path, body in controller_calls(cluster, victim=1)[:5]:
        status, doc = call(base + path, body, zero, method)
        assert status == 403 and "may not act for broker 1" in doc["error"], (path, doc)
        refused += 1
    for path in ("/v1/local/kill-broker", "/v1/data-loss/accept", "/v1/static-topics/create"):
        status, _ = call(
            base + path, {"broker_id": 0, "topic": "orders", "name": "x", "total_queues": 1}, zero
        )
        assert status == 403, path
        refused += 1
    # each broker's control endpoints: a forged push, a forged update, a drain
    for broker_id, port in http.items():
        url = f"http://127.0.0.1:{port}"
        other = broker_token(token, 1 - broker_id)
        for path, body in (
            ("/v1/metadata", forged_metadata(10**9).to_json()),
            ("/v1/metadata/updates", forged_update(10**9)),
            ("/v1/drain", {"timeout_s": 5}),
            ("/v1/transactions/markers", FORGED_MARKERS),
        ):
            for bad in (None, WRONG, other, token):  # the cluster token is not a broker's
                status, doc = call(url + path, body, bad)
                assert status == 401, (broker_id, path, bad, status, doc)
                refused += 1
    # no trace of any of it, and what clients are told is unchanged
    time.sleep(1.5)  # a let-through heartbeat or push would have shown by now
    assert state_of(cluster) == before
    assert cluster.proc is not None and cluster.proc.poll() is None
    log = (cluster.data_dir / "local-up.log").read_text()
    assert "Traceback" not in log and "control call refused (401)" in log
    print(f"\n{refused} forged calls refused")

    # the same calls with the right tokens work
    heartbeat = {
        "broker_id": 0,
        "incarnation": before["brokers"]["0"]["incarnation"],
        "applied_version": 0,
        "protocol": 2,
        "full": False,
        "open": [],
        "hwm": [],
        "floors": [],
    }
    status, doc = call(base + "/v1/brokers/heartbeat", heartbeat, zero)
    assert status == 200 and doc["reply"]["fenced"] is False, doc
    status, doc = call(
        base + "/v1/topics/create", {"topics": [{"name": "extra", "num_partitions": 1}]}, token
    )
    assert status == 200 and doc["results"][0]["error"] is None, doc
    status, doc = call(base + "/v1/topics/delete", {"names": ["extra"]}, one)  # as a broker would
    assert status == 200 and doc["results"][0]["error"] is None, doc
    status, doc = call(f"http://127.0.0.1:{http[1]}/v1/drain", {"timeout_s": 30}, one)
    assert status == 200 and doc["drained"] is True, doc
    cli = [sys.executable, "-m", "tidalmq_broker.cli"]
    data = ["--data-dir", str(cluster.data_dir)]
    for args in (
        ["local", "status"],
        ["recover"],
        ["static-topic", "list"],
        ["local", "remove-broker", "1"],
        ["local", "kill-broker", "0"],
    ):
        done = subprocess.run([*cli, *args, *data], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    rows = {r["broker"]: r["process"] for r in cluster.status()["brokers"]}
    assert rows == {0: "killed"}, rows  # broker 1 drained, stopped and forgotten
    print(f"local cluster part: {time.monotonic() - started:.1f}s")


def test_forged_control_calls_are_refused_by_a_standalone_broker(tmp_path: Path) -> None:
    started = time.monotonic()
    token = secrets.token_urlsafe(32)
    broker = BrokerProcess(
        f"file://{tmp_path / 'objects'}", tmp_path / "logs", env={"TIDALMQ_CONTROL_TOKEN": token}
    )
    with broker:
        before = kafka_brokers(broker.bootstrap)
        assert before == {0: ("127.0.0.1", broker.port)}
        url = broker.http_url
        calls = (
            ("/v1/metadata", forged_metadata(10**9).to_json()),
            ("/v1/metadata/updates", forged_update(10**9)),
            ("/v1/drain", {"timeout_s": 5}),
        )
        for path, body in calls:
            for bad in (None, WRONG, broker_token(token, 1), broker_token(WRONG, 0)):
                status, doc = call(url + path, body, bad)
                assert status == 401, (path, bad, status, doc)
        for path in ("/healthz", "/readyz", "/metrics"):
            assert call(url + path, method="GET")[0] == 200
        assert kafka_brokers(broker.bootstrap) == before
        assert "Traceback" not in broker.log_path.read_text()
        # with the token: its own (derived) token, or the token it was given
        status, doc = call(url + "/v1/drain", {"timeout_s": 5}, broker_token(token, 0))
        assert status == 200 and doc["drained"] is False  # standalone: nowhere to move to
        status, doc = call(url + "/v1/metadata", forged_metadata(10**9).to_json(), token)
        assert status == 200 and doc["applied"] == 10**9
        assert kafka_brokers(broker.bootstrap)[0] == (EVIL, 9092), "what the refusal prevented"
    print(f"\nstandalone broker part: {time.monotonic() - started:.1f}s")
