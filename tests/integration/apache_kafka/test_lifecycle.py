"""Starting and stopping Apache Kafka: the CLI (start/status/stop --dir) and the Python context
manager, including adding a broker to a running cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.kafka.harness import KafkaCluster, console_consume, console_produce, run_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

LAUNCHER = str(Path(__file__).resolve().parents[3] / "bench/kafka/kafka")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_cli_start_status_stop(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cli-cluster"
    started = subprocess.run(
        [LAUNCHER, "start", "--brokers", "1", "--dir", str(cluster_dir)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        assert bootstrap.startswith("127.0.0.1:")
        assert bootstrap != "127.0.0.1:9092"
        status = subprocess.run(
            [LAUNCHER, "status", "--dir", str(cluster_dir)], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout + status.stderr
        state = json.loads(status.stdout)
        assert state["bootstrap"] == bootstrap
        pids = [n["pid"] for n in state["nodes"]]
        assert all(_alive(pid) for pid in pids)
        # The started cluster outlives the CLI process and serves clients.
        topic = "cli-topic"
        run_tool("kafka-topics", "--create", "--topic", topic, bootstrap=bootstrap, check=True)
        console_produce(bootstrap, topic, ["hello"])
        assert console_consume(bootstrap, topic, 1) == ["hello"]
        assert (cluster_dir / "node-1/logs/server.log").stat().st_size > 0
    finally:
        stopped = subprocess.run(
            [LAUNCHER, "stop", "--dir", str(cluster_dir)], capture_output=True, text=True
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not any(_alive(pid) for pid in pids)
    assert not (cluster_dir / "cluster.json").exists()


def test_context_manager_adds_a_broker_and_cleans_up() -> None:
    with KafkaCluster(brokers=1) as cluster:
        cluster_dir = cluster.dir
        assert cluster.broker_ids == [1]
        new = cluster.add_broker()
        assert new.node_id == 2
        assert cluster.broker_ids == [1, 2]
        versions = run_tool("kafka-broker-api-versions", bootstrap=cluster.bootstrap, check=True)
        assert "(id: 2 rack" in versions.stdout
        run_tool(
            "kafka-topics",
            "--create",
            "--topic",
            "on-new",
            "--replica-assignment",
            "2",
            bootstrap=cluster.nodes[1].address,
            check=True,
        )
        console_produce(cluster.bootstrap, "on-new", ["served by broker 2"])
        assert console_consume(cluster.bootstrap, "on-new", 1) == ["served by broker 2"]
        # A stopped broker restarts on its old port with its data.
        cluster.stop_node(2)
        assert not cluster.nodes[2].running()
        cluster.start_node(2)
        assert cluster.nodes[2].running()
        assert console_consume(cluster.nodes[2].address, "on-new", 1) == ["served by broker 2"]
        pids = [n.pid for n in cluster.nodes.values()]
    assert pids and not any(pid is not None and _alive(pid) for pid in pids)
    assert not cluster_dir.exists()
