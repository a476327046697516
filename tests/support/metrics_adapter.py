"""The chart's custom metrics adapter (prometheus-adapter) as a host process, for tests.

The binary is the one the chart's image holds, built from its Go module by
`e2e/cluster/build-tools.sh prometheus-adapter` into `${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}`
(built on first use; the script's lock makes a test wait for a build already running, e.g. the
background prebuild). It serves custom.metrics.k8s.io over HTTPS with a self-signed certificate,
lists pods and namespaces from a Kubernetes API server and delegates the authentication and
authorization of each request to it, as in a cluster.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.cache import cache_dir
from tests.support.kube_apiserver import _versions, build_tools
from tests.support.processes import log_tail, stop_process


def adapter_binary() -> Path:
    version = _versions()["PROMETHEUS_ADAPTER_VERSION"]
    binary = cache_dir() / "bin" / f"prometheus-adapter-{version}" / "adapter"
    build_tools(["prometheus-adapter"], [binary], "prometheus-adapter-build.log")
    return binary


class MetricsAdapter:
    """`with MetricsAdapter(workdir, config, prometheus_url, kubeconfig, token) as a:`
    then `a.get("/apis/custom.metrics.k8s.io/v1beta1/...")`."""

    def __init__(
        self, workdir: Path, config: str, prometheus_url: str, kubeconfig: Path, token: str
    ) -> None:
        self.workdir = workdir
        self.config = config
        self.prometheus_url = prometheus_url
        self.kubeconfig = kubeconfig
        self.token = token
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        # the adapter's own self-signed certificate: this client checks the metric, not TLS
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    @property
    def log_path(self) -> Path:
        return self.workdir / "adapter.log"

    def __enter__(self) -> MetricsAdapter:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "config.yaml").write_text(self.config)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        kubeconfig = str(self.kubeconfig)
        cmd = [
            str(adapter_binary()),
            f"--prometheus-url={self.prometheus_url}",
            f"--config={self.workdir / 'config.yaml'}",
            "--metrics-relist-interval=2s",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # the test API server has no front proxy (requestheader) settings to look up
            "--authentication-skip-lookup",
        ]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the adapter exited:\n{self.tail()}")
            try:
                self.get("/readyz", raw=True)
                return self
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"the adapter was not ready within 60 s:\n{self.tail()}")

    def __exit__(self, *_exc: object) -> None:
        stop_process(self.proc, 20)

    def get(self, path: str, *, raw: bool = False) -> Any:
        """GET a path as the API server's admin (the adapter asks the API server who that is
        and whether they may)."""
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.port}{path}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=20, context=self._tls) as resp:
            body = resp.read()
        return body if raw else json.loads(body)

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


__all__ = ["MetricsAdapter", "adapter_binary"]
