"""The rerun report: a test that fails once and passes on its rerun does not fail the session,
and what its first attempt said (the assertion and its captured output) is printed in the
session's summary and appended to the reruns log; a test that fails twice fails the session."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

FLAKY = textwrap.dedent(
    """
    from pathlib import Path

    def test_fails_once(tmp_path_factory):
        marker = Path(__file__).with_name("attempted")
        first = not marker.exists()
        marker.touch()
        print("captured on the first attempt" if first else "second attempt")
        assert not first, "the first attempt's own words"

    def test_always_fails():
        assert 1 == 2, "fails every time"
    """
)


def run_session(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_flaky.py").write_text(FLAKY)
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"),
            *("-p", "tests.support.reruns", *args, "test_flaky.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "TIDALMQ_CACHE_DIR": str(tmp_path)},
    )


def test_first_attempts_are_reported_and_only_a_double_failure_fails(tmp_path: Path) -> None:
    done = run_session(tmp_path, "--reruns", "1")
    out = done.stdout
    assert done.returncode == 1, out  # test_always_fails failed twice
    assert "1 failed, 1 passed, 2 rerun" in out, out
    section = out.split("tests that needed a rerun: 2 (first attempts below)", 1)[1]
    assert "test_flaky.py::test_fails_once (call, failed after" in section
    assert "the first attempt's own words" in section
    assert "captured on the first attempt" in section
    assert "test_flaky.py::test_always_fails (call" in section
    log = (tmp_path / "logs" / "reruns.log").read_text()
    assert "2 rerun(s)" in log and "the first attempt's own words" in log


def test_without_reruns_nothing_is_added(tmp_path: Path) -> None:
    done = run_session(tmp_path)
    assert done.returncode == 1
    assert "2 failed" in done.stdout, done.stdout
    assert "needed a rerun" not in done.stdout
    assert not (tmp_path / "logs" / "reruns.log").exists()
