"""bench/metadata_scale.py ([M1]) cannot rot: its --quick mode at 200 partitions, all three
parts (Apache Kafka 3 -> 4 brokers with kafka-reassign-partitions, a TidalMQ local cluster 3 -> 4
with add-broker, and the 4 -> 5 -> 4 scenario with its idempotent producer and full read-back),
its page written into a temporary directory. Every phase must finish, the read-back must pass and
the page and chart must be there; the figures themselves are not judged (the targets are for
50,000 partitions on a quiet machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.kafka.harness import KafkaDist

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]


def test_quick_mode_at_200_partitions(tmp_path: Path, apache_kafka_dist: KafkaDist) -> None:
    out = tmp_path / "RESULTS-metadata.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "metadata_scale.py"),
            "--quick",
            "--sizes",
            "200",
            "--scenario-partitions",
            "200",
            # no wait for a quiet machine before each part (up to 120 s each): the figures are
            # not judged here, and in a test session the load never settles
            "--settle-max",
            "0",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    tail = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, tail
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    controller = [key for key in runs if key.startswith("controller@")]
    assert set(runs) - set(controller) == {"kafka@200", "tidalmq@200", "scenario@200"}, tail
    assert len(controller) == 1, tail
    for key, entry in runs.items():
        assert not entry.get("error"), (key, entry["error"])
        if key in controller:
            continue
        for name, phase in entry["phases"].items():
            if name != "producer":
                assert phase["ok"], (key, name, phase.get("failure"))
    # the controller alone: the joining broker got its fair share, nobody fenced or dead
    move = runs[controller[0]]["phases"]["move"]
    assert move["done"] == move["fair_share"] > 0, move
    assert move["fenced"] == 0 and move["dead"] == 0, move
    assert runs["kafka@200"]["phases"]["move"]["moved"] == 50
    assert runs["kafka@200"]["phases"]["move"]["served"] == 50
    assert runs["tidalmq@200"]["phases"]["move"]["served"] >= 1
    scenario = runs["scenario@200"]["phases"]
    assert scenario["remove"]["served"] == scenario["remove"]["sample"] >= 1
    producer = scenario["producer"]
    assert producer["readback_ok"], producer.get("readback_failure")
    assert producer["errors"] == 0 and producer["acknowledged"] == producer["sent"] > 0
    for phase_name in ("create", "add", "remove"):
        metrics = scenario[phase_name]["metrics"]
        assert metrics["declared_dead"] is not None, (phase_name, metrics)
    page = out.read_text()
    assert "| 200 | " in page
    assert "## 2. Acceptance scenario" in page
    assert "## 3. The controller alone" in page
    assert (tmp_path / "charts" / "metadata-moves-200.png").stat().st_size > 0
