"""A real Kubernetes API server (etcd + kube-apiserver, no nodes) for operator integration tests.

The binaries are the ones the end-to-end cluster uses, built from the Go module proxy by
`e2e/cluster/build-tools.sh etcd kubernetes` into `${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}` (built on
first use; the script's locks make a session wait for a build already running, e.g. the
background prebuild of `make test`). Authentication is a static token; authorization is
AlwaysAllow: these tests exercise the operator's logic against the real API (CRD validation,
status subresources, resourceVersion conflicts, finalizers, watches), while RBAC is checked by
the end-to-end tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.cache import cache_dir

REPO = Path(__file__).resolve().parents[2]


def _versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "e2e" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def build_tools(tools: list[str], binaries: list[Path], log_name: str) -> None:
    """Builds `tools` with `e2e/cluster/build-tools.sh` unless every binary's directory has its
    .done stamp (the stamps, not the binaries: a build in progress may have written some
    already; the script's lock makes this wait for a build already running)."""
    if all((binary.parent / ".done").exists() for binary in binaries):
        return
    log = cache_dir() / "logs" / log_name
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        result = subprocess.run(
            ["bash", str(REPO / "e2e/cluster/build-tools.sh"), *tools],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TIDALMQ_CACHE_DIR": str(cache_dir())},
        )
    if result.returncode != 0:
        raise RuntimeError(f"building {'/'.join(tools)} failed; see {log}")


def binaries() -> tuple[Path, Path]:
    """(etcd, kube-apiserver), building them if needed."""
    v = _versions()
    etcd = cache_dir() / "bin" / f"etcd-{v['ETCD_VERSION']}" / "etcd"
    apiserver = cache_dir() / "bin" / f"kubernetes-{v['KUBERNETES_VERSION']}" / "kube-apiserver"
    build_tools(["etcd", "kubernetes"], [etcd, apiserver], "apiserver-build.log")
    return etcd, apiserver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ApiServer:
    url: str
    token: str
    kubeconfig: Path
    workdir: Path
    procs: list[subprocess.Popen[bytes]]

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
            timeout=120,
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_apiserver() -> ApiServer:
    etcd_bin, apiserver_bin = binaries()
    work = Path(tempfile.mkdtemp(prefix="tidalmq-apiserver-"))
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    logs = work / "logs"
    logs.mkdir()
    etcd = subprocess.Popen(
        [
            str(etcd_bin),
            "--data-dir",
            str(work / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
        ],
        stdout=(logs / "etcd.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    sa_key = work / "sa.key"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
    )
    subprocess.run(
        ["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(work / "sa.pub")],
        check=True,
        capture_output=True,
    )
    token = os.urandom(16).hex()
    (work / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    apiserver = subprocess.Popen(
        [
            str(apiserver_bin),
            "--etcd-servers",
            f"http://127.0.0.1:{etcd_port}",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(api_port),
            "--cert-dir",
            str(work / "certs"),
            "--token-auth-file",
            str(work / "tokens.csv"),
            "--authorization-mode",
            "AlwaysAllow",
            "--service-account-key-file",
            str(work / "sa.pub"),
            "--service-account-signing-key-file",
            str(sa_key),
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--enable-priority-and-fairness=false",
            "--disable-admission-plugins",
            "ServiceAccount",
        ],
        stdout=(logs / "apiserver.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{api_port}"
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n"
        f"    server: {url}\n    insecure-skip-tls-verify: true\n"
        f"users:\n- name: t\n  user:\n    token: {token}\n"
        "contexts:\n- name: t\n  context:\n    cluster: t\n    user: t\n    namespace: default\n"
        "current-context: t\n"
    )
    server = ApiServer(url, token, kubeconfig, work, [etcd, apiserver])
    deadline = time.monotonic() + 120
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    while time.monotonic() < deadline:
        if apiserver.poll() is not None:
            server.stop()
            raise RuntimeError(
                f"kube-apiserver exited: {(logs / 'apiserver.log').read_text()[-3000:]}"
            )
        try:
            req = urllib.request.Request(
                url + "/readyz", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.25)
    server.stop()
    raise TimeoutError("kube-apiserver not ready within 120 s")


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[ApiServer]:
    server = start_apiserver()
    try:
        yield server
    finally:
        server.stop()
