"""Fixtures of the end-to-end tests: one real Kubernetes cluster per session, a fresh namespace
per test.

Which cluster (option ``--e2e-cluster`` or ``TIDALMQ_E2E_CLUSTER``):

- ``local`` (default): the project's own single-node cluster of host processes
  (``e2e/cluster/cluster.sh``), built offline and started here; needs root on Linux.
- ``kind``: a multi-node kind cluster through pytest-kind. By default built offline like the local
  one: kind's own dockerd and a node image from the project's builds (``e2e/cluster/kind.sh``,
  needs root on Linux); ``--e2e-kind-public`` uses the public kindest/node image and the Docker of
  DOCKER_HOST instead (a laptop), with the images built FROM public Debian. Either way the
  project's images are loaded with ``kind load docker-image``.
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
import time
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
from e2e.tidalmq_release import addon_image

# the process ends with the session even if a test left a client thread running
pytest_plugins = ["tests.support.exit_guard", "tests.support.reruns"]


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
        "--e2e-kind-public",
        action="store_true",
        default=os.environ.get("TIDALMQ_E2E_KIND_PUBLIC", "") not in ("", "0"),
        help="--e2e-cluster=kind with the public kindest/node image and the Docker of DOCKER_HOST "
        "instead of the offline-built node image and kind's own dockerd (env "
        "TIDALMQ_E2E_KIND_PUBLIC=1)",
    )
    group.addoption(
        "--e2e-kind-spark",
        action="store_true",
        default=os.environ.get("TIDALMQ_E2E_KIND_SPARK", "") not in ("", "0"),
        help="--e2e-cluster=kind: also load the Spark image into the nodes (env "
        "TIDALMQ_E2E_KIND_SPARK=1; the Spark and planner tests need it)",
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
    """A multi-node kind cluster (e2e/cluster/kind-config.yaml) through pytest-kind.

    By default everything comes from the project's own builds, with no registry: kind's own
    dockerd and node image (e2e/cluster/kind.sh), the project's images built with that dockerd
    by images.sh for `kind load`. With --e2e-kind-public (a laptop with Docker and
    registry access): the public kindest/node image, the Docker of DOCKER_HOST, and the images
    built FROM public Debian."""
    from pytest_kind import KindCluster  # only needed for this choice

    settings = script_settings(
        "KIND_BIN",
        "K8S_BIN",
        "HELM_BIN",
        "BROKER_IMAGE",
        "SPARK_IMAGE",
        "METRICS_SERVER_IMAGE",
        "KUBE_STATE_METRICS_IMAGE",
        "CACHE_DIR",
        "KIND_DOCKER_SOCK",
        "KIND_NODE_IMAGE",
    )
    public = config.getoption("--e2e-kind-public")
    logs = Path(settings["CACHE_DIR"]) / "logs"
    images = [
        settings["BROKER_IMAGE"],
        settings["METRICS_SERVER_IMAGE"],
        settings["KUBE_STATE_METRICS_IMAGE"],
    ]
    # The Spark image (1.6 GB) unpacked on four nodes takes ~10 GB of disk and minutes to load:
    # only when asked for (the Spark and planner tests need it).
    if config.getoption("--e2e-kind-spark"):
        images.append(settings["SPARK_IMAGE"])
    started = time.monotonic()
    if public:
        kind_bin, kubectl_bin, helm_bin = public_kind_tools(config, settings, logs)
        node_image = config.getoption("--kind-image")
    else:
        kind_bin = str(Path(settings["KIND_BIN"]) / "kind")
        kubectl_bin = str(Path(settings["K8S_BIN"]) / "kubectl")
        helm_bin = str(Path(settings["HELM_BIN"]) / "helm")
        stream(
            config,
            [str(CLUSTER_SCRIPTS / "build-tools.sh"), "kind", "kubernetes", "helm"],
            logs / "build-tools.log",
        )
        stream(config, [str(CLUSTER_SCRIPTS / "kind.sh"), "node-image"], logs / "kind-node.log")
        # The project's images are built with kind's dockerd too (`kind load` reads them from
        # there), on the debootstrap base, apart from the shared image builds' dockerd.
        kind_docker = f"unix://{settings['KIND_DOCKER_SOCK']}"
        stream(
            config,
            [str(CLUSTER_SCRIPTS / "images.sh"), "build-kind"],
            logs / "images-kind.log",
            {"TIDALMQ_E2E_DOCKER_HOST": kind_docker},
        )
        # kind and pytest-kind run `docker` with this environment: kind's own dockerd.
        os.environ["DOCKER_HOST"] = kind_docker
        node_image = settings["KIND_NODE_IMAGE"]
    built = time.monotonic()
    kind = KindCluster(
        config.getoption("--cluster-name"),
        image=node_image,
        kind_path=Path(kind_bin),
        kubectl_path=Path(kubectl_bin),
    )
    kind.create(config_file=CLUSTER_SCRIPTS / "kind-config.yaml")
    created = time.monotonic()
    try:
        for image in images:
            kind.load_docker_image(image)
        loaded = time.monotonic()
        cluster = Cluster(
            kind="kind",
            kubeconfig=kind.kubeconfig_path.resolve(),
            kubectl_bin=kubectl_bin,
            helm_bin=helm_bin,
            images={"broker": settings["BROKER_IMAGE"], "spark": settings["SPARK_IMAGE"]},
        )
        # kind has no metrics-server; its kubelets serve self-signed certificates.
        manifest = (CLUSTER_SCRIPTS / "manifests" / "metrics-server.yaml").read_text()
        manifest = manifest.replace("@METRICS_SERVER_IMAGE@", settings["METRICS_SERVER_IMAGE"])
        manifest = manifest.replace(
            "--kubelet-certificate-authority=/etc/kubelet-ca/ca.crt", "--kubelet-insecure-tls"
        )
        cluster.apply(manifest)
        # nor kube-state-metrics (the HPA series of e2e/test_monitoring.py), as cluster.sh's
        manifest = (CLUSTER_SCRIPTS / "manifests" / "kube-state-metrics.yaml").read_text()
        cluster.apply(
            manifest.replace("@KUBE_STATE_METRICS_IMAGE@", settings["KUBE_STATE_METRICS_IMAGE"])
        )
        cluster.wait_ready("kube-system", "deployment/metrics-server")
        cluster.wait_ready("kube-system", "deployment/kube-state-metrics")
        nodes = len(cluster.kubectl_json("get", "nodes")["items"])
        record_session_figures(
            config,
            "kind cluster",
            {
                "nodes": nodes,
                "build_s": round(built - started, 1),
                "create_s": round(created - built, 1),
                "load_images_s": round(loaded - created, 1),
                "ready_s": round(time.monotonic() - started, 1),
            },
            "build: tools and images (seconds when cached); create: `kind create cluster`; "
            "load: `kind load docker-image` of the project's images; ready: all of it",
        )
        yield cluster
    finally:
        if not (config.getoption("--e2e-keep") or config.getoption("--keep-cluster")):
            kind.delete()


def public_kind_tools(
    config: pytest.Config, settings: dict[str, str], logs: Path
) -> tuple[str, str, str]:
    """kind, kubectl and helm for --e2e-kind-public (from the options or PATH; the pinned versions
    are built, which needs Go, only when missing), and the project's images built with the
    Docker of DOCKER_HOST FROM public Debian."""
    docker_host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if shutil.which("docker") is None or run(["docker", "info"], check=False).returncode != 0:
        pytest.fail(f"--e2e-kind-public needs a working Docker (DOCKER_HOST={docker_host})")
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
    build_env = {"TIDALMQ_E2E_DOCKER_HOST": docker_host, "TIDALMQ_E2E_PUBLIC_BASE": "1"}
    stream(
        config, [str(CLUSTER_SCRIPTS / "images.sh"), "build-kind"], logs / "images.log", build_env
    )
    return str(tools["kind"]), str(tools["kubectl"]), str(tools["helm"])


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


def record_session_figures(
    config: pytest.Config, name: str, values: dict[str, Any], note: str = ""
) -> None:
    """Figures of the session's setup (no test owns them), shown and written like a test's."""
    store = config.stash.setdefault(FIGURES, {})
    for key, value in values.items():
        store.setdefault(f"session: {name}", {})[key] = {"value": value, "note": note}
        note = ""  # once per group


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
        doc = {
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "exitstatus": int(exitstatus),
            "figures": recorded,
        }
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        terminalreporter.write_line(f"(written to {path})")
    except OSError as exc:
        terminalreporter.write_line(f"(could not write {path}: {exc})")


@pytest.fixture(scope="module")
def minio(cluster: Cluster) -> str:
    """The in-cluster MinIO image (built and loaded once the cluster is up), for the modules
    whose releases store their data in it."""
    return addon_image("minio")


@pytest.fixture(scope="module")
def prometheus_image(cluster: Cluster) -> str:
    """The Prometheus add-on image (e2e/prometheus.py deploys it)."""
    return addon_image("prometheus")
