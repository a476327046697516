"""The planner job in Spark local mode over a saved history file (synthetic, with skew and a
daily cycle): the profiles Spark computes match a direct computation, the plan meets the
threshold near the lower bound, the outputs are written, and the move budget holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from tidalmq_core.reassignment import parse_plan
from tidalmq_operator.planning import read_result
from tidalmq_planner.job import run, spark_session
from tidalmq_planner.options import PlanRequest
from tidalmq_planner.publish import configmap_body
from tidalmq_planner.synthetic import Spec, generate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = Spec(partitions=400, brokers=5, joined=1, days=2, step_s=300, seed=7)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", "1g")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(SPEC, tmp_path_factory.mktemp("history") / "history.parquet")


@pytest.mark.timeout(600)
def test_offline_plan_from_a_history_file(spark: Any, history: Path, tmp_path: Path) -> None:
    req = PlanRequest(
        history=str(history),
        brokers=list(range(SPEC.brokers)),
        threshold=1.1,
        out=str(tmp_path / "plan.json"),
        report_dir=str(tmp_path / "report"),
        name="offline",
    )
    result = run(req, spark=spark)
    profiles = result.profiles.set_index(["topic", "partition"])
    assert len(profiles) == SPEC.partitions

    # Spark's profiles against numpy on the raw rows
    table = pq.read_table(history).to_pandas()
    for _, row in table.sample(5, random_state=1).iterrows():
        raw = np.asarray(row["bytes_in"], dtype=np.float64)
        raw = raw[~np.isnan(raw)]
        prof = profiles.loc[(row["topic"], row["partition"])]
        assert prof["bytes_in_mean"] == pytest.approx(raw.mean(), rel=1e-5)
        assert prof["bytes_in_peak"] == pytest.approx(raw.max(), rel=1e-5)
        assert prof["broker"] == row["broker"]
        assert prof["points"] == SPEC.points

    report, plan = result.report, result.plan
    assert report.window == "2d" and report.step == "5m"
    assert report.imbalance_before["bytes_in"] > 1.1  # broker 4 just joined: empty
    assert report.within_threshold and plan.balanced
    assert max(report.imbalance_after.values()) <= 1.1 + 1e-9
    assert plan.lower_bound <= report.moves <= 1.3 * plan.lower_bound + 2
    joined = next(b for b in report.brokers if b.broker == SPEC.brokers - 1)
    assert joined.partitions_before == 0 and joined.partitions_after > 0
    assert joined.after["bytes_in_peak_hour"] > 0

    entries = parse_plan((tmp_path / "plan.json").read_text())
    assert len(entries) == report.moves
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert written["moves"] == report.moves
    assert (tmp_path / "report" / "load.png").read_bytes()[:4] == b"\x89PNG"

    # what the driver hands the operator on Kubernetes reads back the same
    plan_json, summary, table = read_result(configmap_body("offline-plan", result))
    assert parse_plan(plan_json) == entries
    assert summary["moves"] == report.moves and summary["lowerBound"] == plan.lower_bound
    assert "imbalance" in table

    budget = run(
        PlanRequest(history=str(history), brokers=list(range(SPEC.brokers)), max_moves=5),
        spark=spark,
    )
    assert budget.report.moves <= 5 and budget.plan.stopped == "budget"
    assert budget.report.imbalance_after["bytes_in"] < report.imbalance_before["bytes_in"]
