"""The helm binary the chart tests run: the version pinned in e2e/versions.env, built from the Go
module proxy by `e2e/cluster/build-tools.sh helm` into `${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}` on
first use (a few minutes; the script's lock makes a test wait for a build already running, e.g.
the background prebuild of `make test`), or the one named by TIDALMQ_HELM.

There is no fallback to whatever `helm` is on PATH: the tests check the chart with the version
the project pins. If it cannot be built (no Go toolchain), the tests fail and say why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.cache import cache_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tidalmq"


def pinned_version() -> str:
    for line in (REPO / "e2e" / "versions.env").read_text().splitlines():
        if line.startswith("HELM_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("HELM_VERSION missing from e2e/versions.env")


class HelmUnavailable(RuntimeError):
    pass


def helm_binary() -> Path:
    """The pinned helm, building it if needed."""
    explicit = os.environ.get("TIDALMQ_HELM")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise HelmUnavailable(f"TIDALMQ_HELM={explicit} is not a file")
        return path
    version = pinned_version()
    target = cache_dir() / "bin" / f"helm-{version}" / "helm"
    if (target.parent / ".done").is_file():  # the stamp build-tools.sh writes last
        return target
    if shutil.which("go") is None:
        raise HelmUnavailable(
            f"helm {version} is not built in {target.parent} and there is no Go toolchain to "
            "build it (install Go, or set TIDALMQ_HELM to a helm binary)"
        )
    log = cache_dir() / "logs" / "helm-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        result = subprocess.run(
            ["bash", str(REPO / "e2e" / "cluster" / "build-tools.sh"), "helm"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TIDALMQ_CACHE_DIR": str(cache_dir())},
            check=False,
        )
    if result.returncode != 0 or not target.is_file():
        raise HelmUnavailable(f"building helm {version} failed; see {log}")
    return target


def run_helm(
    *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Runs the pinned helm; with check, a failure raises AssertionError with its output."""
    proc = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


# ---------------------------------------------------------------------------- chart rendering
CHART_TESTS = CHART / "tests"
VALUES_DIR = CHART_TESTS / "values"
RELEASE = "rel"
NAMESPACE = "streaming"
# the names the chart gives the release's objects
FULL = f"{RELEASE}-tidalmq"
STS = f"{FULL}-broker"
OPERATOR = f"{FULL}-operator"


def write_values(values: dict[str, Any]) -> Path:
    """A values file with these values (in the temp directory; left for inspection)."""
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, kept on disk)
        "w", suffix=".yaml", prefix="tidalmq-values-", delete=False
    )
    with handle:
        yaml.safe_dump(values, handle)
    return Path(handle.name)


def template_args(
    values: dict[str, Any] | None = None, files: tuple[str, ...] = (), release: str = RELEASE
) -> list[str]:
    """`helm template` of the chart with values files from VALUES_DIR, then these values."""
    args = ["template", release, str(CHART), "--namespace", NAMESPACE]
    for name in files:
        args += ["-f", str(VALUES_DIR / name)]
    if values:
        args += ["-f", str(write_values(values))]
    return args


def render(values: dict[str, Any] | None = None, *files: str) -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them, parsed."""
    out = run_helm(*template_args(values, files)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of this kind (and name)."""
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    names = [d["metadata"]["name"] for d in matches]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {names}"
    return matches[0]


def find_all(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec(obj)["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """A container's env as name -> value (a string) or valueFrom (a dict)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
