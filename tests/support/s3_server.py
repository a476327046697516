"""A real S3-compatible server for tests, started once per session.

Which server (decided once, deterministically, never silently skipped):

* `TIDALMQ_TEST_S3=minio` or `=moto` chooses explicitly;
* otherwise MinIO when a Go toolchain is on PATH (or MinIO is already built), else moto's
  server mode.

MinIO is built from its Go module at a pinned version into
`${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}/bin/minio-<version>` by `e2e/cluster/build-tools.sh minio`
(module and build caches under the same directory, shared with the other Go tools; the build
holds a file lock, so a session waits for a build already running, e.g. the background prebuild
of `make test`, instead of starting another). If the chosen server cannot be built or started,
the session fails with the reason.

Tests use the `s3_server` fixture: `.make_store(prefix)`, `.url(prefix)` (an s3:// URL for
`open_object_store` / a broker's settings) and `.env()` (AWS_* variables for subprocesses).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from bench.cache import cache_dir

MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"  # last published commit (Feb 2026)
ACCESS_KEY = "tidalmq-test"
SECRET_KEY = "tidalmq-test-secret"
REGION = "us-east-1"
BUCKET = "tidalmq-test"
_REPO = Path(__file__).resolve().parents[2]


class S3ServerError(RuntimeError):
    pass


def minio_binary() -> Path:
    return cache_dir() / "bin" / f"minio-{MINIO_VERSION}"


def build_minio(log: Path | None = None) -> Path:
    """Build MinIO from its Go module once per cache directory (or wait for the build that is
    running); returns the binary."""
    target = minio_binary()
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise S3ServerError("no Go toolchain on PATH to build MinIO (set TIDALMQ_TEST_S3=moto)")
    cache = cache_dir()
    log = log or cache / "logs" / "minio-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "ab") as out:
        result = subprocess.run(
            ["bash", str(_REPO / "e2e" / "cluster" / "build-tools.sh"), "minio"],
            env={**os.environ, "TIDALMQ_CACHE_DIR": str(cache)},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        )
    if result.returncode != 0 or not target.exists():
        tail = log.read_text()[-2000:]
        raise S3ServerError(f"building MinIO failed (exit {result.returncode}):\n{tail}")
    print(f"MinIO {MINIO_VERSION} ready after {time.monotonic() - started:.0f}s", file=sys.stderr)
    return target


def choose_backend() -> str:
    wanted = os.environ.get("TIDALMQ_TEST_S3", "").strip().lower()
    if wanted in ("minio", "moto"):
        return wanted
    if wanted:
        raise S3ServerError(f"TIDALMQ_TEST_S3={wanted!r}: use minio or moto")
    return "minio" if (minio_binary().exists() or shutil.which("go")) else "moto"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class S3Server:
    kind: str
    endpoint_url: str
    bucket: str = BUCKET
    process: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    _prefix_counter: list[int] = field(default_factory=lambda: [0])

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint_url={self.endpoint_url}&region={REGION}"

    def unique_prefix(self, name: str = "t") -> str:
        self._prefix_counter[0] += 1
        return f"{name}-{os.getpid()}-{self._prefix_counter[0]}-{os.urandom(3).hex()}"

    def client(self):  # type: ignore[no-untyped-def]
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def make_store(self, prefix: str | None = None):  # type: ignore[no-untyped-def]
        from tidalmq_broker.storage.objectstore.s3 import S3ObjectStore

        return S3ObjectStore(
            self.bucket,
            prefix if prefix is not None else self.unique_prefix(),
            endpoint_url=self.endpoint_url,
            region=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _wait_ready(server: S3Server, health_url: str, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        assert server.process is not None
        if server.process.poll() is not None:
            raise S3ServerError(
                f"{server.kind} exited with {server.process.returncode}:\n{log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status < 500:
                    return
        except Exception as exc:  # not listening yet
            last = exc
        time.sleep(0.2)
    raise S3ServerError(f"{server.kind} did not become ready in {timeout_s}s: {last}")


def _create_bucket(server: S3Server, timeout_s: float = 60.0) -> None:
    """CreateBucket, retried while the server says it is still initialising (MinIO can answer
    its health check before its object layer is up on a loaded machine)."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            server.client().create_bucket(Bucket=server.bucket)
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code != "XMinioServerNotInitialized" or time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def start_s3_server(kind: str | None = None) -> S3Server:
    kind = kind or choose_backend()
    workdir = Path(tempfile.mkdtemp(prefix=f"tidalmq-{kind}-"))
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = workdir / "server.log"
    env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY}
    if kind == "minio":
        binary = build_minio()
        cmd = [
            str(binary),
            "server",
            str(workdir / "data"),
            "--address",
            f"127.0.0.1:{port}",
            "--console-address",
            f"127.0.0.1:{_free_port()}",
            "--quiet",
        ]
        env["MINIO_BROWSER"] = "off"
        # "live" answers as soon as the process listens; "ready" once it serves requests (a
        # busy machine showed CreateBucket refused with XMinioServerNotInitialized after "live")
        health = f"{endpoint}/minio/health/ready"
    elif kind == "moto":
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        health = f"{endpoint}/moto-api/"
    else:
        raise S3ServerError(f"unknown S3 server kind {kind!r}")
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    server = S3Server(kind, endpoint, process=process, workdir=workdir)
    try:
        _wait_ready(server, health, log)
        _create_bucket(server)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server on a free loopback port, bucket created."""
    try:
        server = start_s3_server()
    except S3ServerError as exc:
        pytest.fail(f"cannot start an S3-compatible server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()


S3_FIXTURES: set[str] = {"s3_server"}
"""Fixture names whose tests need the server; conftests add theirs (e.g. a backend fixture that
asks for `s3_server` dynamically), so MinIO is built before the first such test starts and the
build never counts against a test's timeout."""


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any(S3_FIXTURES & set(getattr(item, "fixturenames", ())) for item in session.items):
        return
    try:
        if choose_backend() == "minio" and not minio_binary().exists():
            print(f"\nbuilding MinIO {MINIO_VERSION} into {cache_dir()} (once)...", file=sys.stderr)
            build_minio()
    except S3ServerError:
        pass  # the s3_server fixture reports it, failing the tests that need it


def pytest_report_header(config: pytest.Config) -> str:
    try:
        return f"tidalmq S3 test server: {choose_backend()}"
    except S3ServerError as exc:
        return f"tidalmq S3 test server: misconfigured ({exc})"
