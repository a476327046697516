"""What the helpers that run a server as a child process (Prometheus, kube-state-metrics, the
metrics adapter, the local cluster, a broker) share: stopping it, and the end of its log for a
failure's message."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def stop_process(
    proc: subprocess.Popen[bytes] | None, timeout_s: float, sig: int = signal.SIGTERM
) -> None:
    """Ask a child still running to stop (`sig`), wait up to `timeout_s` for it, and kill it
    if it has not exited by then."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def log_tail(path: Path, lines: int) -> str:
    """The log's last `lines` lines ("(no log)" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
