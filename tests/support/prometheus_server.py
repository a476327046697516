"""A real Prometheus for tests: Debian's `prometheus` package, installed with apt-get when
missing (the tests run as root; if it cannot be installed the test fails with the reason, it is
never skipped).

    server = PrometheusServer(workdir, scrape_interval_s=2)
    server.start({"tidalmq-broker": ["127.0.0.1:8081", ...], "tidalmq-controller": [...]})
    server.set_targets({...})        # file-based discovery: picked up within seconds
    server.query("sum by (broker) (rate(tidalmq_partition_bytes_in_total[20s]))")
    server.alerts()                  # the alerts pending or firing
    server.stop()

It is a context manager (stopped on exit), and `prometheus_fixture(scrape_interval_s)` makes the
`prometheus` fixture a test module needs (`prometheus = prometheus_fixture(1.0)`).

Targets are given per job; every target also gets an `instance` label as usual.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.support.processes import log_tail, stop_process

DEBIAN_PACKAGE = "prometheus"
REPO_ROOT = Path(__file__).resolve().parents[2]


class PrometheusError(RuntimeError):
    pass


def prometheus_binary() -> str:
    """The prometheus executable, installed from Debian's package if missing."""
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if found:
        return found
    if os.geteuid() != 0:
        raise PrometheusError(
            "prometheus is not installed and this is not root: apt-get install prometheus"
        )
    # the project's one installer: a machine-wide lock, and an interrupted install finished first
    done = subprocess.run(
        [str(REPO_ROOT / ".ci" / "apt-install"), DEBIAN_PACKAGE],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise PrometheusError(
            f"apt-get install {DEBIAN_PACKAGE} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    found = shutil.which("prometheus")
    if not found:
        raise PrometheusError("apt-get installed prometheus but it is not on PATH")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tls(targets: list[str]) -> str:
    """The scrape settings of https:// targets (the local cluster's controller with control-plane
    mTLS: /metrics needs no client certificate; its CA is the cluster's own)."""
    if not any(t.startswith("https://") for t in targets):
        return ""
    return "\n    scheme: https\n    tls_config:\n      insecure_skip_verify: true"


class PrometheusServer:
    def __init__(self, workdir: Path, *, scrape_interval_s: float = 2.0) -> None:
        self.workdir = workdir
        self.scrape_interval_s = scrape_interval_s
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def _targets_file(self, job: str) -> Path:
        return self.workdir / f"targets-{job}.json"

    def set_targets(
        self, jobs: dict[str, list[str]], labels: dict[str, dict[str, str]] | None = None
    ) -> None:
        """Targets are host:port, or https://host:port (scraped over TLS: a job's targets are
        all one or the other). `labels`: target labels of some targets (as Kubernetes service
        discovery gives each pod's `namespace` and `pod`), by target."""
        labels = labels or {}
        for job, targets in jobs.items():
            path = self._targets_file(job)
            tmp = path.with_suffix(".tmp")
            groups = [
                {"targets": [t.removeprefix("https://")], "labels": labels.get(t, {})}
                for t in targets
            ]
            tmp.write_text(json.dumps(groups))
            tmp.replace(path)  # atomic: discovery never reads half a file

    def start(
        self,
        jobs: dict[str, list[str]],
        timeout_s: float = 60.0,
        rule_files: Sequence[Path] = (),
        labels: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """`rule_files`: Prometheus rules files to load (evaluated every scrape interval);
        `labels`: as for set_targets."""
        binary = prometheus_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.set_targets(jobs, labels)
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        scrape_configs = "".join(
            f"""
  - job_name: {json.dumps(job)}
    scrape_interval: {interval}
    scrape_timeout: {interval}{_tls(targets)}
    file_sd_configs:
      - files: [{json.dumps(str(self._targets_file(job)))}]
        refresh_interval: 5s
"""
            for job, targets in jobs.items()
        )
        config = self.workdir / "prometheus.yml"
        rules = "".join(f"\n  - {json.dumps(str(p))}" for p in rule_files)
        config.write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            + (f"rule_files:{rules}\n" if rules else "")
            + f"scrape_configs:{scrape_configs}"
        )
        self.port = _free_port()
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout_s}s:\n{self.tail()}")

    def stop(self) -> None:
        stop_process(self.proc, 30)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    # ------------------------------------------------------------------ queries
    def _api(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {doc}")
        return doc["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("query", params)["result"]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule, with its group's name, its health and its last evaluation's error."""
        groups = self._api("rules", {})["groups"]
        return [{**rule, "group": g["name"]} for g in groups for rule in g["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts (/api/v1/alerts): each with its `labels` (alertname included),
        `state` (pending or firing) and `activeAt`. An alert that resolved is no longer listed."""
        return list(self._api("alerts", {})["alerts"])

    def metric_names(self) -> set[str]:
        return set(self._api("label/__name__/values", {}))

    def targets_up(self) -> dict[str, bool]:
        data = self._api("targets", {"state": "active"})
        return {t["scrapeUrl"]: t["health"] == "up" for t in data["activeTargets"]}

    def wait_for(
        self, promql: str, predicate: Any, timeout_s: float = 60.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if predicate(result):
                return result
            time.sleep(1.0)
        raise PrometheusError(f"timed out waiting on {promql!r}; last result: {result}")


def prometheus_fixture(scrape_interval_s: float) -> Callable[..., Iterator[PrometheusServer]]:
    """A test module's `prometheus` fixture: a server in the test's tmp_path scraping every
    `scrape_interval_s` (not started: the test starts it with its targets), stopped after."""

    @pytest.fixture(name="prometheus")
    def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
        with PrometheusServer(
            tmp_path / "prometheus", scrape_interval_s=scrape_interval_s
        ) as server:
            yield server

    return prometheus
