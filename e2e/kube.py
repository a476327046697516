"""Small helpers over kubectl and helm for the end-to-end tests.

The tests drive the cluster with the same command-line tools a person would use, so a failure
reads like a terminal session: every call raises `CommandError` with the command, exit code and
output.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.cache import cache_dir

E2E_DIR = Path(__file__).resolve().parent
REPO_DIR = E2E_DIR.parent

T = TypeVar("T")


class RecordFigure(Protocol):
    """The `figures` fixture (conftest.py): records a figure a test measured."""

    def __call__(self, name: str, value: Any, note: str = "") -> None: ...


class CommandError(RuntimeError):
    """A kubectl/helm/script call that exited non-zero."""

    def __init__(self, args: Sequence[str], returncode: int, output: str) -> None:
        super().__init__(f"`{shlex.join(args)}` exited {returncode}:\n{output[-4000:]}")
        self.returncode = returncode
        self.output = output


def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 120,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs a command; raises CommandError (with its output) when it fails and check is set."""
    proc = subprocess.run(
        list(args),
        env={**os.environ, **(env or {})},
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stdout + proc.stderr)
    return proc


CLUSTER_SCRIPTS = E2E_DIR / "cluster"


def script_settings(*names: str) -> dict[str, str]:
    """Values computed by e2e/cluster/lib.sh (the one place that names images and paths)."""
    script = f"source {CLUSTER_SCRIPTS / 'lib.sh'}; " + "; ".join(f'echo "{n}=${n}"' for n in names)
    out = run(["bash", "-c", script]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def logs_dir() -> Path:
    """<build cache>/logs (the cache as e2e/cluster/lib.sh finds it): where the cluster scripts
    log, and where the end-to-end figures and the pods' logs of each release are kept."""
    try:
        cache = Path(script_settings("CACHE_DIR")["CACHE_DIR"])
    except (CommandError, KeyError, OSError):
        cache = cache_dir()
    return cache / "logs"


def read_versions() -> dict[str, str]:
    """The pinned versions of e2e/versions.env (KEY=VALUE lines, # comments)."""
    versions: dict[str, str] = {}
    for line in (E2E_DIR / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            versions[key.strip()] = value.strip()
    return versions


def wait_until(
    what: str, probe: Callable[[], T | None], *, timeout: float, interval: float = 2.0
) -> T:
    """Calls probe until it returns something truthy; fails with the last error after timeout."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (CommandError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}")
        time.sleep(interval)


@dataclass
class Cluster:
    """A running cluster the tests use: its kubeconfig, tools and the project's image names."""

    kind: str
    kubeconfig: Path
    kubectl_bin: str
    helm_bin: str
    images: dict[str, str]
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), **self.extra_env}

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 120, check: bool = True
    ) -> str:
        proc = run(
            [self.kubectl_bin, *args], env=self.env, input=input, timeout=timeout, check=check
        )
        return proc.stdout

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, manifest: str, namespace: str | None = None) -> str:
        ns = ["-n", namespace] if namespace else []
        return self.kubectl(*ns, "apply", "-f", "-", input=manifest)

    def create_namespace(self, name: str) -> str:
        """Creates the namespace and waits for its default ServiceAccount (pods are refused
        until it exists); returns the name."""
        self.kubectl("create", "namespace", name)
        wait_until(
            f"the default ServiceAccount of {name}",
            lambda: self.kubectl("-n", name, "get", "serviceaccount", "default", "-o", "name"),
            timeout=60,
            interval=0.5,
        )
        return name

    def delete_namespace(self, name: str, *, wait: bool = False, timeout: float = 300) -> float:
        """Deletes the namespace (nothing if it is gone already); with `wait`, until it is gone,
        failing after `timeout`. Returns the seconds it took."""
        started = time.monotonic()
        self.kubectl(
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            f"--wait={str(wait).lower()}",
            f"--timeout={int(timeout)}s",
            timeout=timeout + 30,
        )
        return time.monotonic() - started

    def helm(self, *args: str, timeout: float = 300) -> str:
        return run([self.helm_bin, *args], env=self.env, timeout=timeout).stdout

    def wait_pod_phase(
        self, namespace: str, name: str, phases: Sequence[str], timeout: float = 180
    ) -> str:
        def probe() -> str | None:
            phase = self.kubectl(
                "-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.phase}"
            )
            if phase == "Failed" and "Failed" not in phases:
                raise AssertionError(f"pod {namespace}/{name} failed:\n{self.describe(namespace)}")
            return phase if phase in phases else None

        return wait_until(f"pod {namespace}/{name} in {list(phases)}", probe, timeout=timeout)

    def wait_ready(self, namespace: str, kind_name: str, timeout: float = 180) -> None:
        """Waits for a Deployment/StatefulSet rollout or a Pod's Ready condition."""
        if kind_name.startswith(("pod/", "pods/")):
            self.kubectl(
                "-n",
                namespace,
                "wait",
                "--for=condition=Ready",
                kind_name,
                f"--timeout={int(timeout)}s",
                timeout=timeout + 10,
            )
        else:
            self.kubectl(
                "-n",
                namespace,
                "rollout",
                "status",
                kind_name,
                f"--timeout={int(timeout)}s",
                timeout=timeout + 10,
            )

    def save_pod_logs(self, namespace: str, dest: Path) -> int:
        """Write the logs of every container of every pod in `namespace` (and of the previous
        instance of restarted ones) to `dest`/<pod>.log; returns how many pods. Called before a
        release is removed, so the brokers' and the operator's logs outlive the namespace."""
        dest.mkdir(parents=True, exist_ok=True)
        pods = self.kubectl_json("-n", namespace, "get", "pods").get("items", [])
        names = [pod["metadata"]["name"] for pod in pods]

        def logs(name: str, previous: bool) -> str:
            args = [
                self.kubectl_bin,
                "-n",
                namespace,
                "logs",
                name,
                "--all-containers",
                "--timestamps",
                *(["--previous"] if previous else []),
            ]
            proc = run(args, env=self.env, check=False, timeout=60)
            if proc.returncode != 0 or not proc.stdout:
                return ""
            return f"=== {'previous instance' if previous else 'current'} ===\n{proc.stdout}"

        # every kubectl at once: after each test, one after the other they took seconds
        with ThreadPoolExecutor(max_workers=8) as pool:
            texts = {
                (name, previous): pool.submit(logs, name, previous)
                for name in names
                for previous in (True, False)
            }
            for name in names:
                parts = [texts[(name, previous)].result() for previous in (True, False)]
                (dest / f"{name}.log").write_text("\n".join(p for p in parts if p) or "(no logs)\n")
        return len(pods)

    def describe(self, namespace: str) -> str:
        """What a person would look at when a test fails: objects, pods and recent events."""
        commands = (
            ("get", "all", "-o", "wide"),
            ("describe", "pods"),
            ("get", "events", "--sort-by=.lastTimestamp"),
        )

        def show(args: tuple[str, ...]) -> str:
            proc = run([self.kubectl_bin, "-n", namespace, *args], env=self.env, check=False)
            return f"$ kubectl -n {namespace} {' '.join(args)}\n{proc.stdout}{proc.stderr}"

        with ThreadPoolExecutor(max_workers=len(commands)) as pool:
            parts = list(pool.map(show, commands))
        return "\n".join(parts)[-12000:]
