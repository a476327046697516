"""A TidalMQ broker as a real child process, for integration tests.

The broker keeps its Kafka port across restarts (clients reconnect to the same address), can be
stopped with SIGTERM (clean drain) or SIGKILL (crash), and logs to a file the test prints on
failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import log_tail
from tests.support.started import StartedInWith

_SERVING = re.compile(r"serving on (\S+):(\d+)")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now that this test process has not handed out before: the kernel can give a
    just-closed port to the next bind (about 1 pair in 5000 here), and a test takes several
    ports (a broker's Kafka and HTTP ports, three brokers) before any process binds them."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port that was not handed out before")


class BrokerProcess(StartedInWith):
    def __init__(
        self,
        storage_url: str,
        log_dir: Path,
        *,
        broker_id: int = 0,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.storage_url = storage_url
        self.log_dir = log_dir
        self.broker_id = broker_id
        self.port = free_port()
        self.http_port = free_port()
        self.env = env or {}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"broker-{self.broker_id}.log"

    def start(self, timeout_s: float = 60.0) -> None:
        self.spawn()
        self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the process and return at once (start() also waits until it is ready)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        env = {
            **os.environ,
            "TIDALMQ_GROUP_INITIAL_REBALANCE_DELAY_MS": "200",
            "TIDALMQ_LOG_LEVEL": "INFO",
            **self.env,
        }
        cmd = [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "broker",
            "--broker-id",
            str(self.broker_id),
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--storage-url",
            self.storage_url,
            *self.args,
        ]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts}: {' '.join(cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def wait_ready(self, timeout_s: float = 60.0, *, settled: bool = True) -> None:
        """Until /readyz answers 200 and, with `settled`, says plain "serving": every partition
        open and every consumer group shard loaded (a broker is ready before that, while it
        serves what is open; tests that go on at once want it all)."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.tail_log()}")
            try:
                with urllib.request.urlopen(self.http_url + "/readyz", timeout=1) as resp:
                    body = json.loads(resp.read() or b"{}")
                    if resp.status == 200 and (not settled or body.get("reason") == "serving"):
                        return
                    last = str(body)
            except OSError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise TimeoutError(f"broker not ready after {timeout_s}s ({last}):\n{self.tail_log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the broker drains and closes partitions cleanly."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no flush, no checkpoint, nothing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, *, crash: bool = False) -> None:
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def readyz(self) -> tuple[int, str]:
        """/readyz's status and reason (0 while nothing answers)."""
        try:
            with urllib.request.urlopen(self.http_url + "/readyz", timeout=2) as resp:
                return resp.status, json.loads(resp.read()).get("reason", "")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}").get("reason", "")
        except OSError:
            return 0, ""

    def metrics(self) -> str:
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=5) as resp:
            return resp.read().decode()

    def tail_log(self, lines: int = 80) -> str:
        return log_tail(self.log_path, lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@contextmanager
def running_broker(storage_url: str, log_dir: Path, **kwargs: object) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(storage_url, log_dir, **kwargs)  # type: ignore[arg-type]
    broker.start()
    try:
        yield broker
    finally:
        code = broker.stop()
        if code not in (0, None, -signal.SIGKILL):
            print(broker.tail_log())
