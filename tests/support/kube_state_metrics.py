"""kube-state-metrics as a host process, for tests: the Kubernetes objects of an API server as
Prometheus series (kube_horizontalpodautoscaler_*, what the chart's HPA alert and panel read).

The binary is built from its Go module at the version pinned in e2e/versions.env by
`e2e/cluster/build-tools.sh kube-state-metrics` into `${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}`
(built on first use; the script's lock makes a test wait for a build already running, e.g. the
background prebuild). It lists and watches the API server with the kubeconfig it is given and
serves /metrics over plain HTTP on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from bench.cache import cache_dir
from tests.support.broker_process import free_port
from tests.support.kube_apiserver import _versions, build_tools
from tests.support.processes import log_tail, stop_process


def kube_state_metrics_binary() -> Path:
    version = _versions()["KUBE_STATE_METRICS_VERSION"]
    binary = cache_dir() / "bin" / f"kube-state-metrics-{version}" / "kube-state-metrics"
    build_tools(["kube-state-metrics"], [binary], "kube-state-metrics-build.log")
    return binary


class KubeStateMetrics:
    """`with KubeStateMetrics(workdir, kubeconfig, ["horizontalpodautoscalers"], [ns]) as k:`
    then scrape `k.address` (host:port); `k.metrics()` is its /metrics text."""

    def __init__(
        self, workdir: Path, kubeconfig: Path, resources: list[str], namespaces: list[str]
    ) -> None:
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.resources = resources
        self.namespaces = namespaces
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "kube-state-metrics.log"

    def __enter__(self) -> KubeStateMetrics:
        binary = kube_state_metrics_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cmd = [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--resources={','.join(self.resources)}",
            f"--namespaces={','.join(self.namespaces)}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={free_port()}",
        ]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kube-state-metrics exited:\n{self.tail()}")
            try:
                self.metrics()
                return self
            except OSError:
                time.sleep(0.25)
        self.__exit__()
        raise RuntimeError(f"kube-state-metrics did not serve within 60 s:\n{self.tail()}")

    def __exit__(self, *_exc: object) -> None:
        stop_process(self.proc, 20)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


__all__ = ["KubeStateMetrics", "kube_state_metrics_binary"]
