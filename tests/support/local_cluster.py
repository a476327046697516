"""`tidalmq local up` as a real child process: a controller and broker processes, driven over
the controller's HTTP port as `tidalmq local add-broker | remove-broker | kill-broker` do (with
the control token `local up` keeps in the data dir)."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from tidalmq_core.control_tls import ControlTls

from tests.support.processes import log_tail, stop_process
from tests.support.started import StartedInWith

CLI = [sys.executable, "-m", "tidalmq_broker.cli"]


def tidalmq(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `tidalmq ARGS` as a user does (its own process; from `cwd`, with `env` added)."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def control_tls(data_dir: Path, controller_url: str) -> ControlTls | None:
    """The admin's certificate of a local cluster's data dir when its controller speaks HTTPS."""
    if not controller_url.startswith("https:"):
        return None
    admin, ca = data_dir / "control-tls" / "admin.pem", data_dir / "control-tls" / "ca.pem"
    return ControlTls(str(admin), str(admin), str(ca))


def control_context(data_dir: Path, controller_url: str) -> ssl.SSLContext | None:
    """The client context for a local cluster's controller (None: plain HTTP)."""
    tls = control_tls(data_dir, controller_url)
    return tls.client_context() if tls is not None else None


class LocalClusterProcess(StartedInWith):
    def __init__(
        self,
        data_dir: Path,
        *,
        brokers: int = 3,
        storage_url: str = "",
        env: dict[str, str] | None = None,
        port: int = 0,
        args: list[str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.args = args or []  # more `local up` flags (--security sasl_ssl)
        self.brokers = brokers
        # 0: any free ports; N: the brokers listen on N, N + 1, ... (lowest first, in the
        # order of their ids, at every start): N always answers as the bootstrap address
        self.port = port
        self.storage_url = storage_url
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self.controller_url = ""
        self.output = ""  # what `local up` printed since its last start

    @property
    def log_path(self) -> Path:
        return self.data_dir / "local-up.log"

    def start(self, timeout_s: float = 120.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "local",
            "up",
            "--brokers",
            str(self.brokers),
            "--port",
            str(self.port),
            "--controller-port",
            "0",
            "--data-dir",
            str(self.data_dir),
        ]
        if self.storage_url:
            cmd += ["--storage-url", self.storage_url]
        cmd += self.args
        # a restart appends to the same log: read only what this start writes
        start_at = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {
            **os.environ,
            "TIDALMQ_GROUP_INITIAL_REBALANCE_DELAY_MS": "200",
            "TIDALMQ_LOG_LEVEL": "INFO",
            **self.env,
        }
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"local cluster exited:\n{self.tail()}")
            text = self.log_path.read_bytes()[start_at:].decode(errors="replace")
            self.output = text
            boot = re.search(r"^bootstrap: (\S+)$", text, re.M)
            ctl = re.search(r"^controller: (\S+)", text, re.M)
            if boot and ctl:
                self.bootstrap, self.controller_url = boot.group(1), ctl.group(1)
                self.wait_settled(timeout_s=max(5.0, deadline - time.monotonic()))
                return
            time.sleep(0.1)
        raise TimeoutError(f"local cluster did not start:\n{self.tail()}")

    def stop(self) -> None:
        stop_process(self.proc, 60, signal.SIGINT)
        if self.controller_url:  # no broker may outlive the test
            subprocess.run(
                ["pkill", "-9", "-f", f"controller-url {self.controller_url}"], check=False
            )

    # ------------------------------------------------------------------ control
    @property
    def control_token(self) -> str:
        """The cluster's control token (`<data dir>/control-token`, made by `local up`)."""
        return (self.data_dir / "control-token").read_text().strip()

    @property
    def control_tls(self) -> ControlTls | None:
        """The admin's client certificate (`<data dir>/control-tls/admin.pem`, made by `local
        up`: its control plane runs with mTLS unless `--control-tls off`); None for HTTP."""
        return control_tls(self.data_dir, self.controller_url)

    @property
    def control_context(self) -> ssl.SSLContext | None:
        return control_context(self.data_dir, self.controller_url)

    def _get(self, path: str) -> Any:
        req = urllib.request.Request(
            self.controller_url + path, headers={"Authorization": f"Bearer {self.control_token}"}
        )
        with urllib.request.urlopen(req, timeout=30, context=self.control_context) as resp:
            return json.loads(resp.read())

    def _post(self, path: str, body: dict[str, Any], timeout_s: float = 180) -> Any:
        req = urllib.request.Request(
            self.controller_url + path,
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.control_token}",
            },
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout_s, context=self.control_context) as resp:
            return json.loads(resp.read())

    def call(self, path: str, body: dict[str, Any], timeout_s: float = 180) -> Any:
        """A controller route's result (e.g. the static-topic routes,
        docs/architecture/static-topics.md); a fault it answers fails the caller."""
        doc = self._post(path, body, timeout_s)
        assert "fault" not in doc, doc["fault"]
        return doc["result"]

    def status(self) -> dict[str, Any]:
        return self._get("/v1/local/status")

    def metadata(self) -> dict[str, Any]:
        return self._get("/v1/metadata")["metadata"]

    def moves(self) -> dict[str, Any]:
        return self._get("/v1/moves")

    def add_broker(self) -> int:
        return int(self._post("/v1/local/add-broker", {})["broker"])

    def remove_broker(self, broker_id: int) -> None:
        self._post("/v1/local/remove-broker", {"broker_id": broker_id})

    def kill_broker(self, broker_id: int) -> None:
        self._post("/v1/local/kill-broker", {"broker_id": broker_id})

    def reassign(self, targets: dict[tuple[str, int], int | None]) -> dict[str, Any]:
        return self._post(
            "/v1/reassignments/alter",
            {
                "entries": [
                    {"topic": t, "partition": p, "target": b} for (t, p), b in targets.items()
                ]
            },
        )

    def metric_samples(self, family: str) -> list[tuple[int, dict[str, str], float]]:
        """Every sample of the metric `family` on every broker's /metrics: (broker, labels,
        value)."""
        samples: list[tuple[int, dict[str, str], float]] = []
        for row in self.status()["brokers"]:
            url = f"http://127.0.0.1:{row['http_port']}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                for line in resp.read().decode().splitlines():
                    if line.startswith(family + "{"):
                        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
                        samples.append((row["broker"], labels, float(line.rsplit(" ", 1)[1])))
        return samples

    def metric_totals(self, family: str, label: str) -> Counter[str]:
        """`family` summed over the brokers, by the value of its label `label`."""
        totals: Counter[str] = Counter()
        for _, labels, value in self.metric_samples(family):
            if label in labels:
                totals[labels[label]] += value
        return totals

    def broker_pids(self) -> dict[int, int]:
        """Broker id -> pid of each broker process `local up` runs."""
        return {row["broker"]: row["pid"] for row in self.status()["brokers"] if row["pid"]}

    def leaders(self, topic: str) -> list[int]:
        return [p["leader"] for p in self.metadata()["topics"][topic]["partitions"]]

    def wait_settled(self, timeout_s: float = 60.0) -> None:
        """Until no move is in flight, every partition has a leader, every failed-over
        partition is open on its new broker, and every live broker serves (the status table
        is stable)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.status()
            if (
                st["moves_in_flight"] == 0
                and st["leaderless"] == 0
                and st.get("failovers_opening", 0) == 0
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(f"cluster not settled: {self.status()}")

    def tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)
