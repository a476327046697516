"""The README's Quick start, run as written ([U1] item 5): every shell and Python block of the
section, in order, against a fresh `local up` (what its first block, `make run`, starts), so
the README cannot drift from what the cluster does. Its Python snippet once failed as written
(the create_topics future never waited on, `flush()` without a timeout hanging).

The blocks run from a directory that is not the repository, with the cluster's data dir in
TIDALMQ_DATA_DIR (as a user's shell would have it), `.venv/bin/tidalmq` as the `tidalmq` of
this interpreter and 127.0.0.1:9092 as the port this test's cluster was given (`--port`)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600, func_only=True)]

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
# commands of the Quick start that fail on a healthy cluster, by design, and how they say so
EXPECTED_FAILURES = {
    "recover --accept-data-loss orders": "nothing to recover",  # nothing was lost
}


def quick_start_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the README's "Quick start" section."""
    text = README.read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [(lang, code) for lang, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S)]


def commands(block: str) -> list[str]:
    """The shell commands of a block, one per logical line (continuations joined)."""
    out: list[str] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
    return out


def free_port_run(count: int) -> int:
    for base in range(23000, 40000, 7):
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def test_the_blocks_cover_the_quick_start() -> None:
    blocks = quick_start_blocks()
    assert [lang for lang, _ in blocks].count("python") >= 1
    assert "make run" in blocks[0][1]
    makefile = (ROOT / "Makefile").read_text()
    assert "\t.venv/bin/tidalmq local up --brokers 3\n" in makefile, "make run changed"


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    blocks = quick_start_blocks()
    assert "make run" in blocks[0][1]  # `make run`: the cluster below (`make test`: not here)
    port = free_port_run(5)
    data_dir = tmp_path / "cluster"
    cluster = LocalClusterProcess(data_dir, brokers=3, port=port)
    workdir = tmp_path / "user"
    workdir.mkdir()
    tidalmq = Path(sys.executable).parent / "tidalmq"
    exe = (
        shlex.quote(str(tidalmq)) if tidalmq.exists() else f"{sys.executable} -m tidalmq_broker.cli"
    )
    env = {**os.environ, "TIDALMQ_DATA_DIR": str(data_dir)}

    def adapt(code: str) -> str:
        return code.replace(".venv/bin/tidalmq", exe).replace("127.0.0.1:9092", f"127.0.0.1:{port}")

    ran: list[str] = []
    with cluster:
        assert cluster.bootstrap.split(",")[0] == f"127.0.0.1:{port}"
        for i, (lang, code) in enumerate(blocks[1:], start=1):
            if lang == "python":
                script = workdir / f"block{i}.py"
                script.write_text(adapt(code))
                started = time.monotonic()
                out = subprocess.run(
                    [sys.executable, str(script)],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=180,
                    check=False,
                )
                took = time.monotonic() - started
                assert out.returncode == 0, f"README block {i} (python):\n{code}\n{out.stderr}"
                assert "orders" in out.stdout and "b'hello'" in out.stdout, out.stdout
                ran.append(f"python block {i} ({took:.1f}s)")
                continue
            assert lang == "sh", lang
            for command in commands(code):
                out = subprocess.run(
                    ["bash", "-c", adapt(command)],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=240,
                    check=False,
                )
                expected = next((m for c, m in EXPECTED_FAILURES.items() if c in command), None)
                if expected is None:
                    assert out.returncode == 0, (
                        f"README: {command}\nexit {out.returncode}\n{out.stdout}\n{out.stderr}"
                    )
                else:
                    assert out.returncode != 0 and expected in out.stderr, (command, out.stderr)
                assert "Traceback" not in out.stdout + out.stderr, (command, out.stderr)
                ran.append(command.split("#")[0].strip())
        status = cluster.status()
    print("\n".join(ran))
    assert any("reassign" in c for c in ran) and any("static-topic" in c for c in ran)
    assert status["lost"] == [], status
