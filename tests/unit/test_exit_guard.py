"""The exit guard: a session whose test leaves a non-daemon thread blocked still ends, with the
session's status and the thread named; without the guard the same session never exits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LEFT_RUNNING = textwrap.dedent(
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    def test_leaves_a_thread_blocked():
        threading.Thread(target=threading.Event().wait, name="stuck-client").start()
        assert False, "the test fails and gives up on its client thread"

    def test_other():
        # an idle pool worker is not a straggler: the interpreter's exit ends it
        ThreadPoolExecutor(1).submit(lambda: None).result()
    """
)


def run_session(tmp_path: Path, *plugin: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_left.py").write_text(LEFT_RUNNING)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "test_left.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )


def test_a_session_with_a_blocked_thread_ends_with_its_status(tmp_path: Path) -> None:
    done = run_session(tmp_path, "-p", "tests.support.exit_guard", timeout_s=60)
    assert done.returncode == 1, done.stdout + done.stderr  # the session's status: a test failed
    assert "1 failed, 1 passed" in done.stdout
    assert "1 thread(s) left running" in done.stderr
    assert "stuck-client" in done.stderr
    assert "ThreadPoolExecutor" not in done.stderr


def test_without_the_guard_the_session_never_ends(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_session(tmp_path, timeout_s=8)
