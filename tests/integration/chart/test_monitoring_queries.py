"""The chart's dashboards and alerts against a real Prometheus scraping a real local cluster
(2 brokers and the controller, with produce, consume and a partition move): promtool accepts the
rules file, Prometheus loads and evaluates every alert without error, every dashboard query
(panels and variables, with Grafana's variables filled in) runs without error, and a query
returns data exactly when every metric it names is exported. Killing a broker fires
TidalMQBrokerFenced. The metrics a local cluster cannot export (the operator's, kube-state-
metrics' HPA series, lag before the brokers export it) are named in the printed coverage."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from observability.alerts import ALERTS
from observability.generate import OUT
from tests.support.local_cluster import LocalClusterProcess
from tests.support.monitoring_queries import check_queries, lagging_group, rule_failures, rules
from tests.support.prometheus_server import PrometheusServer, prometheus_binary, prometheus_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RULES = OUT / "alerts.rules.yaml"
SCRAPE_S = 1.0
TOPIC = "monitored"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(tmp_path / "cluster", brokers=2) as c:
        yield c


prometheus = prometheus_fixture(SCRAPE_S)


def traffic(cluster: LocalClusterProcess) -> None:
    """Records in and out, a consumer group's committed offsets behind the end, one move."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    lagging_group(cluster.bootstrap, TOPIC, "dashboards", 30)
    leader = cluster.leaders(TOPIC)[0]
    cluster.reassign({(TOPIC, 0): 1 - leader})
    cluster.wait_settled()


@pytest.mark.timeout(300)
def test_every_alert_and_dashboard_query_runs_on_a_real_prometheus(
    cluster: LocalClusterProcess, prometheus: PrometheusServer
) -> None:
    promtool = Path(prometheus_binary()).with_name("promtool")
    promtool = Path(shutil.which("promtool") or promtool)
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout, checked.stdout

    status = cluster.status()
    prometheus.start(
        {
            "tidalmq-broker": [f"127.0.0.1:{row['http_port']}" for row in status["brokers"]],
            "tidalmq-controller": [cluster.controller_url.removeprefix("http://")],
        },
        rule_files=[RULES],
    )
    traffic(cluster)
    # a few scrapes after the traffic: every rate has two samples in its window
    prometheus.wait_for(
        f'count(tidalmq_partition_leader_epoch{{topic="{TOPIC}"}})',
        lambda r: bool(r) and float(r[0]["value"][1]) == 2,
        timeout_s=30,
    )
    time.sleep(4 * SCRAPE_S)
    assert all(prometheus.targets_up().values()), prometheus.targets_up()

    # every alert is loaded, evaluated, and healthy
    assert not rule_failures(rules(prometheus.url)), rule_failures(rules(prometheus.url))
    coverage = check_queries(prometheus.url, f"{int(SCRAPE_S * 10)}s")
    assert not coverage.failures, "\n".join(coverage.failures)
    print("\n" + coverage.report())

    # an alert fires when its condition is provoked: a broker killed is fenced
    cluster.kill_broker(1)
    prometheus.wait_for(
        'ALERTS{alertname="TidalMQBrokerFenced", alertstate="firing"}', bool, timeout_s=60
    )
