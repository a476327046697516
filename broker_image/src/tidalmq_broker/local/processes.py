"""What `tidalmq local up` settles before it starts anything: one cluster per data dir, broker
processes an earlier run left behind, ports that something else holds.

One cluster per data dir: `local up` holds an exclusive flock on `<data dir>/cluster.lock` for
its whole life (the kernel releases it however the process ends, SIGKILL included), taken before
it reads or writes anything else there. A second `local up` refuses at once: starting its
controller would bump the controller epoch and fence the running one.

Leftovers: the brokers are linked to `local up` (they stop when it exits, see
tidalmq_broker.lifecycle.exit_with_parent), but a broker that could not run then (stopped,
frozen) or a platform without that link can leave some behind, holding their ports.
`<data dir>/cluster.json` records each broker's pid and command line; the next `local up` (which
holds the lock, so no live cluster owns them) stops those still running.

Which data dir: `--data-dir`, else $TIDALMQ_DATA_DIR, else `~/.tidalmq/local` (not a path
relative to where the command runs: `local status`, `recover`, `static-topic` find the running
cluster from any directory).

Stdlib only: a refusal costs no more than the interpreter's start.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOCK_NAME = "cluster.lock"
STATE_NAME = "cluster.json"
LEFTOVER_STOP_S = 8.0  # leftovers get SIGTERM (clean close), then SIGKILL after this
DATA_DIR_ENV = "TIDALMQ_DATA_DIR"
DATA_DIR_HELP = (
    "the local cluster's data directory (default: $TIDALMQ_DATA_DIR, else ~/.tidalmq/local)"
)


def default_data_dir() -> Path:
    """$TIDALMQ_DATA_DIR, else ~/.tidalmq/local: the same cluster from any directory."""
    given = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(given).expanduser() if given else Path.home() / ".tidalmq" / "local"


def resolve_data_dir(given: str | Path | None) -> Path:
    """The absolute data dir of `--data-dir` (empty: the default)."""
    if given is None or str(given) == "":
        return default_data_dir().resolve()
    return Path(given).expanduser().resolve()


class LocalUpError(Exception):
    """A one-line message for the user: `local up` prints it and exits 1."""


class DataDirLock:
    """The exclusive flock that makes a data dir belong to one running `local up`."""

    def __init__(self, data_dir: Path, shown_as: str = "") -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self.shown_as = shown_as  # the --data-dir the user gave, for the message
        self._fd: int | None = None

    def acquire(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LocalUpError(self._held_message()) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid()}).encode())
        self._fd = fd

    def release(self) -> None:
        """The file stays: unlinking a lock file lets two processes lock two different files."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _held_message(self) -> str:
        pid: int | None = None
        for _ in range(20):  # the holder writes its pid just after locking
            with contextlib.suppress(OSError, ValueError):
                pid = int(json.loads(self.path.read_text())["pid"])
                break
            time.sleep(0.05)
        where = "starting"
        state = read_state(self.data_dir)
        if pid is not None and state.get("pid") == pid and state.get("bootstrap"):
            where = f"bootstrap {state['bootstrap']}"
        status = "tidalmq local status" + (f" --data-dir {self.shown_as}" if self.shown_as else "")
        return (
            f"a local cluster is already running on this data dir (pid {pid or '?'}, {where}); "
            f"use `{status}`"
        )


def read_state(data_dir: Path) -> dict[str, Any]:
    """`<data dir>/cluster.json` as the running (or last, if it did not stop) cluster wrote it."""
    try:
        state = json.loads((data_dir / STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def command_line(pid: int) -> str | None:
    """The command line of a running process, or None (gone, or a zombie)."""
    if sys.platform.startswith("linux"):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return " ".join(raw.decode(errors="replace").split("\0")[:-1]) or None
    try:  # macOS and other BSDs
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def leftover_brokers(data_dir: Path) -> list[int]:
    """Pids of brokers an earlier `local up` on this data dir recorded that still run (the
    recorded command line tells them from a process that reused the pid)."""
    found = []
    for rec in read_state(data_dir).get("brokers", []):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            pid = int(rec["pid"])
            if pid != os.getpid() and command_line(pid) == " ".join(rec["cmd"]):
                found.append(pid)
    return found


def stop_leftover_brokers(data_dir: Path, shown_as: str = "") -> list[int]:
    """Stop the brokers an earlier `local up` left running: SIGTERM (they close their partitions
    cleanly) and SIGCONT (in case they were stopped), then SIGKILL those still there after
    LEFTOVER_STOP_S. Their controller is gone, so they serve nobody. Returns their pids."""
    pids = leftover_brokers(data_dir)
    if not pids:
        return []
    for pid in pids:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                where = f" --data-dir {shown_as}" if shown_as else ""
                raise LocalUpError(
                    f"broker processes of an earlier `local up{where}` still run and hold its "
                    f"ports, and this user cannot stop them (pids {_pids(pids)}): stop them, then "
                    "start again"
                ) from None
    left = _wait_gone(pids, LEFTOVER_STOP_S)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(left, 5.0)
    return pids


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = list(pids)
    while left:
        left = [pid for pid in left if command_line(pid) is not None]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return left


def _pids(pids: list[int]) -> str:
    return ", ".join(str(p) for p in pids)


def check_port_free(host: str, port: int, what: str, flag: str) -> None:
    """Raise LocalUpError when something holds `port` (0: any port, nothing to check). Bound
    as the servers bind (SO_REUSEADDR), so a port in TIME_WAIT counts as free."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise LocalUpError(f"cannot use --host {host}: {exc}") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as exc:
                raise LocalUpError(
                    f"port {port} on {host} ({what}) is not free ({exc.strerror}): another process "
                    f"holds it; stop that process or choose another port with {flag}"
                ) from None
