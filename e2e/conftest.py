"""Fixtures of the end-to-end tests: one real Kubernetes cluster per session, a fresh namespace
per test.

Which cluster (option ``--e2e-cluster`` or ``TIDALMQ_E2E_CLUSTER``):

- ``local`` (default): the project's own single-node cluster of host processes
  (``e2e/cluster/cluster.sh``), built offline and started here; needs root on Linux.
- ``kind``: a kind cluster through pytest-kind, when ``kind`` and a working Docker are available
  (a laptop). The images are built with that Docker from public Debian bases and loaded with
  ``kind load docker-image``.
- ``kubeconfig``: any existing cluster (``--e2e-kubeconfig`` or ``TIDALMQ_E2E_KUBECONFIG``); the
  images must then be pullable by it (``TIDALMQ_E2E_BROKER_IMAGE``, ``TIDALMQ_E2E_SPARK_IMAGE``),
  and metrics-server must run there.

The local and kind clusters are torn down at the end of the session unless ``--e2e-keep`` or
``TIDALMQ_E2E_KEEP=1`` keeps them for the next run (a kept local cluster is reused in seconds).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.kube import (
    CLUSTER_SCRIPTS,
    Cluster,
    CommandError,
    RecordFigure,
    logs_dir,
    run,
    script_settings,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tidalmq-e2e", "TidalMQ end-to-end cluster")
    group.addoption(
        "--e2e-cluster",
        choices=("local", "kind", "kubeconfig"),
        default=os.environ.get("TIDALMQ_E2E_CLUSTER", "local"),
        help="which cluster runs the end-to-end tests (env TIDALMQ_E2E_CLUSTER; default local)",
    )
    group.addoption(
        "--e2e-kubeconfig",
        default=os.environ.get("TIDALMQ_E2E_KUBECONFIG"),
        help="kubeconfig of an existing cluster, for --e2e-cluster=kubeconfig",
    )
    group.addoption(
        "--e2e-keep",
        action="store_true",
        default=os.environ.get("TIDALMQ_E2E_KEEP", "") not in ("", "0"),
        help="keep the local or kind cluster running after the session (env TIDALMQ_E2E_KEEP=1)",
    )


def stream(
    config: pytest.Config, args: list[str], log: Path, env: dict[str, str] | None = None
) -> None:
    """Runs a long setup command, showing its lines on the terminal and keeping them in log."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if reporter is not None and line.startswith("["):
                reporter.write_line(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-60:])
        pytest.fail(f"`{' '.join(args)}` exited {code} (full log: {log}):\n{tail}", pytrace=False)


def local_cluster(config: pytest.Config) -> Iterator[Cluster]:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.fail(
            "the local e2e cluster runs kubelet, containerd and iptables on the host: run as root "
            "on Linux, or choose --e2e-cluster=kind / --e2e-cluster=kubeconfig",
            pytrace=False,
        )
    settings = script_settings(
        "KUBECONFIG_FILE", "K8S_BIN", "HELM_BIN", "BROKER_IMAGE", "SPARK_IMAGE", "CACHE_DIR"
    )
    stream(
        config,
        [str(CLUSTER_SCRIPTS / "cluster.sh"), "up"],
        Path(settings["CACHE_DIR"]) / "logs" / "cluster-up.log",
    )
    try:
        yield Cluster(
            kind="local",
            kubeconfig=Path(settings["KUBECONFIG_FILE"]),
            kubectl_bin=str(Path(settings["K8S_BIN"]) / "kubectl"),
            helm_bin=str(Path(settings["HELM_BIN"]) / "helm"),
            images={"broker": settings["BROKER_IMAGE"], "spark": settings["SPARK_IMAGE"]},
        )
    finally:
        if not config.getoption("--e2e-keep"):
            stream(
                config,
                [str(CLUSTER_SCRIPTS / "cluster.sh"), "down"],
                Path(settings["CACHE_DIR"]) / "logs" / "cluster-down.log",
            )


def kind_cluster(config: pytest.Config) -> Iterator[Cluster]:
    from pytest_kind import KindCluster  # only needed for this choice

    settings = script_settings(
        "KIND_BIN", "K8S_BIN", "HELM_BIN", "BROKER_IMAGE", "SPARK_IMAGE", "METRICS_SERVER_IMAGE",
        "CACHE_DIR",
    )  # fmt: skip
    docker_host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if shutil.which("docker") is None or run(["docker", "info"], check=False).returncode != 0:
        pytest.fail(f"--e2e-cluster=kind needs a working Docker (DOCKER_HOST={docker_host})")
    build_env = {"TIDALMQ_E2E_DOCKER_HOST": docker_host, "TIDALMQ_E2E_PUBLIC_BASE": "1"}
    logs = Path(settings["CACHE_DIR"]) / "logs"
    # Tools from the options or PATH; the pinned versions are built (needs Go) only when missing.
    tools = {
        "kind": config.getoption("--kind-bin") or shutil.which("kind"),
        "kubectl": config.getoption("--kind-kubectl-bin") or shutil.which("kubectl"),
        "helm": shutil.which("helm"),
    }
    built = {
        "kind": Path(settings["KIND_BIN"]) / "kind",
        "kubectl": Path(settings["K8S_BIN"]) / "kubectl",
        "helm": Path(settings["HELM_BIN"]) / "helm",
    }
    missing = [name for name, path in tools.items() if not path]
    if missing:
        targets = ["kubernetes" if name == "kubectl" else name for name in missing]
        stream(
            config, [str(CLUSTER_SCRIPTS / "build-tools.sh"), *targets], logs / "build-tools.log"
        )
        tools.update({name: str(built[name]) for name in missing})
    stream(
        config, [str(CLUSTER_SCRIPTS / "images.sh"), "build-kind"], logs / "images.log", build_env
    )
    kind_bin, kubectl_bin = str(tools["kind"]), str(tools["kubectl"])
    kind = KindCluster(
        config.getoption("--cluster-name"),
        image=config.getoption("--kind-image"),
        kind_path=Path(kind_bin),
        kubectl_path=Path(kubectl_bin),
    )
    kind.create(config_file=CLUSTER_SCRIPTS / "kind-config.yaml")
    try:
        for image in (
            settings["BROKER_IMAGE"],
            settings["SPARK_IMAGE"],
            settings["METRICS_SERVER_IMAGE"],
        ):
            kind.load_docker_image(image)
        cluster = Cluster(
            kind="kind",
            kubeconfig=kind.kubeconfig_path.resolve(),
            kubectl_bin=kubectl_bin,
            helm_bin=str(tools["helm"]),
            images={"broker": settings["BROKER_IMAGE"], "spark": settings["SPARK_IMAGE"]},
        )
        # kind has no metrics-server; its kubelets serve self-signed certificates.
        manifest = (CLUSTER_SCRIPTS / "manifests" / "metrics-server.yaml").read_text()
        manifest = manifest.replace("@METRICS_SERVER_IMAGE@", settings["METRICS_SERVER_IMAGE"])
        manifest = manifest.replace(
            "--kubelet-certificate-authority=/etc/kubelet-ca/ca.crt", "--kubelet-insecure-tls"
        )
        cluster.apply(manifest)
        cluster.wait_ready("kube-system", "deployment/metrics-server")
        yield cluster
    finally:
        if not (config.getoption("--e2e-keep") or config.getoption("--keep-cluster")):
            kind.delete()


def kubeconfig_cluster(config: pytest.Config) -> Iterator[Cluster]:
    path = config.getoption("--e2e-kubeconfig")
    if not path or not Path(path).is_file():
        pytest.fail(
            "--e2e-cluster=kubeconfig needs --e2e-kubeconfig=PATH (or TIDALMQ_E2E_KUBECONFIG)"
        )
    settings = script_settings("BROKER_IMAGE", "SPARK_IMAGE", "HELM_BIN")
    helm = shutil.which("helm") or str(Path(settings["HELM_BIN"]) / "helm")
    yield Cluster(
        kind="kubeconfig",
        kubeconfig=Path(path).resolve(),
        kubectl_bin=shutil.which("kubectl") or "kubectl",
        helm_bin=helm,
        images={
            "broker": os.environ.get("TIDALMQ_E2E_BROKER_IMAGE", settings["BROKER_IMAGE"]),
            "spark": os.environ.get("TIDALMQ_E2E_SPARK_IMAGE", settings["SPARK_IMAGE"]),
        },
    )


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """The session's Kubernetes cluster (see the module docstring for the choices)."""
    choice = pytestconfig.getoption("--e2e-cluster")
    factory = {"local": local_cluster, "kind": kind_cluster, "kubeconfig": kubeconfig_cluster}[
        choice
    ]
    yield from factory(pytestconfig)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (its state is printed if the test failed)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = cluster.create_namespace(f"e2e-{base}-{secrets.token_hex(3)}")
    try:
        yield name
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            sys.stderr.write(f"\n--- state of namespace {name} ---\n{cluster.describe(name)}\n")
        try:  # a test may have deleted it already (e.g. to time the deletion)
            cluster.delete_namespace(name)
        except CommandError as exc:  # the session teardown removes it with the cluster anyway
            sys.stderr.write(f"could not delete namespace {name}: {exc}\n")


# The first end-to-end test's setup may build the cluster from cold (Go builds, images): the
# suite-wide 2400 s limit of pyproject.toml would cut it off, so end-to-end tests get 70 minutes.
E2E_TIMEOUT_S = 4200


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None and item.nodeid.startswith("e2e/"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


# ---------------------------------------------------------------------------- measured figures
# pytest captures what a passing test prints, so CI logs never showed the figures the tests
# measure. A test records them through the `figures` fixture instead: they are shown in the
# terminal summary (whatever the outcome) and written to <build cache>/logs/e2e-figures.json.
FIGURES = pytest.StashKey[dict[str, dict[str, dict[str, Any]]]]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> RecordFigure:
    """`figures(name, value, note="")`: record a figure this test measured (also as a JUnit
    property); `note` says what it includes or how it compares with its target."""
    store = request.config.stash.setdefault(FIGURES, {})
    test = request.node.nodeid

    def record(name: str, value: Any, note: str = "") -> None:
        store.setdefault(test, {})[name] = {"value": value, "note": note}
        request.node.user_properties.append((name, value))

    return record


def figures_file() -> Path:
    """<build cache>/logs/e2e-figures.json."""
    return logs_dir() / "e2e-figures.json"


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    recorded = config.stash.get(FIGURES, {})
    if not recorded:
        return
    terminalreporter.section("TidalMQ end-to-end figures")
    for test, named in recorded.items():
        terminalreporter.write_line(test)
        for name, figure in named.items():
            note = f"  ({figure['note']})" if figure["note"] else ""
            terminalreporter.write_line(f"    {name} = {_shown(figure['value'])}{note}")
    path = figures_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               "exitstatus": int(exitstatus), "figures": recorded}  # fmt: skip
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        terminalreporter.write_line(f"(written to {path})")
    except OSError as exc:
        terminalreporter.write_line(f"(could not write {path}: {exc})")
