"""Mutated requests against a real broker process, watching what the issue measured.

`Fuzzer` sends cases (tests/support/request_fuzz.py) over real sockets, each on a connection of
its own (a mutated frame may leave a connection unusable, and one case's answer must not be taken
for another's), several at a time. While it runs it samples the broker's RSS; afterwards it reads
the broker's log from where the run began: every line must be one line (no traceback, nothing
asyncio reports as "never retrieved"), and the lines about bad requests must stay within the
rate limit. Log lines name the client's address, so each is traced back to the case whose
connection used that port.

The broker runs under an address-space cap (`cap_address_space`, prlimit on its pid), as in the
issue: an allocation the frame's bytes cannot back then fails inside the broker (kio aborts the
process) instead of eating the machine's memory.
"""

from __future__ import annotations

import asyncio
import re
import struct
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tidalmq_broker.admin_client import AdminClient

from tests.support.attacks import load_average, proc_status_kb
from tests.support.request_fuzz import GROUP, TOPICS, Case

_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\w+)\s+(\S+): (.*)$")
_PEER = re.compile(r"from 127\.0\.0\.1:(\d+)")
_DEATH = re.compile(r"memory allocation of|panicked|Fatal Python error|Segmentation|MemoryError")

REQUEST_ERROR_LOGGERS = ("tidalmq_broker.server.listener", "tidalmq_broker.apis.errors")


def rss_kb(pid: int) -> int:
    return proc_status_kb(pid, "VmRSS")


def vm_size_kb(pid: int) -> int:
    return proc_status_kb(pid, "VmSize")


def cap_address_space(pid: int, limit_bytes: int) -> None:
    """RLIMIT_AS of a running process (prlimit(1) uses prlimit(2) on the pid)."""
    subprocess.run(
        ["prlimit", f"--pid={pid}", f"--as={limit_bytes}:{limit_bytes}"], check=True, timeout=10
    )


def address_space_limit(pid: int) -> int:
    out = subprocess.run(
        ["prlimit", f"--pid={pid}", "--as", "--raw", "--noheadings", "--output=SOFT"],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return -1 if out == "unlimited" else int(out)


# ------------------------------------------------------------------------------ raw requests
def call(bootstrap: str, api_key: int, version: int, body: dict[str, object]) -> object:
    """One request on a fresh connection, its decoded response."""
    with AdminClient(bootstrap) as admin:
        return admin.call(api_key, version, body)


def prepare_topics(bootstrap: str) -> None:
    """The topics and the group the generated requests name, so some of them reach real data."""
    topics = [
        {
            "name": name,
            "num_partitions": 3,
            "replication_factor": 1,
            "assignments": [],
            "configs": [],
        }
        for name in TOPICS
    ]
    call(bootstrap, 19, 5, {"topics": topics, "timeout": 30_000, "validate_only": False})
    call(bootstrap, 10, 2, {"key": GROUP, "key_type": 0})


def serves(bootstrap: str) -> bool:
    """The broker answers ApiVersions and Metadata for the fuzz topics."""
    versions = call(bootstrap, 18, 3, {"client_software_name": "f", "client_software_version": "1"})
    metadata = call(
        bootstrap,
        3,
        12,
        {
            "topics": None,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    return getattr(versions, "error_code", None) == 0 and bool(getattr(metadata, "brokers", ()))


# ------------------------------------------------------------------------------ the run
@dataclass
class Outcome:
    case: Case
    port: int = 0
    result: str = ""  # answered, closed, silent, refused


@dataclass
class Report:
    cases: int = 0
    seconds: float = 0.0
    results: Counter[str] = field(default_factory=Counter)
    rss_start_kb: int = 0
    rss_max_kb: int = 0
    rss_end_kb: int = 0
    alive: bool = True
    log_lines: int = 0
    request_error_lines: int = 0
    not_one_line: list[str] = field(default_factory=list)
    handler_failures: list[tuple[str, str]] = field(default_factory=list)  # (case, log line)
    decode_closes: Counter[str] = field(default_factory=Counter)  # what the listener said
    suspects: list[Case] = field(default_factory=list)  # in flight when the broker died
    failed_requests: Counter[str] = field(default_factory=Counter)  # per API, from /metrics
    last_words: list[str] = field(default_factory=list)  # an abort's message, if the broker died

    def summary(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        return (
            f"{self.cases} cases in {self.seconds:.1f} s ({rate:.0f}/s), load {load_average()}; "
            f"results {dict(self.results)}; RSS {self.rss_start_kb // 1024} MiB at start, "
            f"max {self.rss_max_kb // 1024}, end {self.rss_end_kb // 1024}; "
            f"{self.log_lines} log lines ({self.request_error_lines} about bad requests), "
            f"{len(self.not_one_line)} not one line; handler failures "
            f"{dict(self.failed_requests)}; broker {'alive' if self.alive else 'DEAD'}"
        )


class Fuzzer:
    def __init__(
        self,
        bootstrap: str,
        pid: int,
        log_path: Path,
        *,
        concurrency: int = 16,
        answer_timeout_s: float = 0.5,
        metrics_url: str | None = None,
    ) -> None:
        self.host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)
        self.pid = pid
        self.log_path = log_path
        self.concurrency = concurrency
        self.answer_timeout_s = answer_timeout_s
        self.metrics_url = metrics_url

    def run(self, cases: Iterable[Case]) -> Report:
        log_from = self.log_path.stat().st_size
        failed_before = self._failed_requests()
        report = Report(rss_start_kb=rss_kb(self.pid))
        report.rss_max_kb = report.rss_start_kb
        started = time.monotonic()
        outcomes = asyncio.run(self._send_all(cases, report))
        report.seconds = time.monotonic() - started
        report.cases = len(outcomes)
        report.results = Counter(o.result for o in outcomes)
        report.alive = self._alive()
        if report.alive:
            try:
                report.rss_end_kb = rss_kb(self.pid)
                report.failed_requests = self._failed_requests() - failed_before
            except (OSError, RuntimeError):  # it died just now
                report.alive = False
        self._read_log(log_from, {o.port: o.case for o in outcomes if o.port}, report)
        return report

    def _failed_requests(self) -> Counter[str]:
        """tidalmq_request_failures_total per API: handlers that raised (their log lines may be
        suppressed by the rate limit, the count is not)."""
        if self.metrics_url is None:
            return Counter()
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        failed: Counter[str] = Counter()
        for match in re.finditer(r"^tidalmq_request_failures_total\{([^}]*)\} (\S+)$", text, re.M):
            api = re.search(r'api="([^"]*)"', match.group(1))
            failed[api.group(1) if api else "?"] += int(float(match.group(2)))
        return failed

    def _alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().split(") ", 1)[1][0] not in "ZX"
        except FileNotFoundError:
            return False

    async def _send_all(self, cases: Iterable[Case], report: Report) -> list[Outcome]:
        outcomes: list[Outcome] = []
        in_flight: set[asyncio.Task[Outcome]] = set()
        flying: dict[asyncio.Task[Outcome], Case] = {}
        sampler = asyncio.create_task(self._sample_rss(report))
        try:
            for case in cases:
                if len(in_flight) >= self.concurrency:
                    done, in_flight = await asyncio.wait(
                        in_flight, return_when=asyncio.FIRST_COMPLETED
                    )
                    if not self._collect(done, flying, outcomes, report):
                        break
                task = asyncio.create_task(self._one(case))
                in_flight.add(task)
                flying[task] = case
            if in_flight:
                done, _ = await asyncio.wait(in_flight)
                self._collect(done, flying, outcomes, report)
        finally:
            sampler.cancel()
        return outcomes

    def _collect(
        self,
        done: set[asyncio.Task[Outcome]],
        flying: dict[asyncio.Task[Outcome], Case],
        outcomes: list[Outcome],
        report: Report,
    ) -> bool:
        for task in done:
            del flying[task]
            outcomes.append(task.result())
        if any(o.result == "refused" for o in outcomes[-len(done) :]) or not self._alive():
            report.suspects = [o.case for o in outcomes[-len(done) :]] + list(flying.values())
            return False
        return True

    async def _sample_rss(self, report: Report) -> None:
        while True:
            try:
                report.rss_max_kb = max(report.rss_max_kb, rss_kb(self.pid))
            except (FileNotFoundError, RuntimeError, ProcessLookupError):
                return
            await asyncio.sleep(0.02)

    async def _one(self, case: Case) -> Outcome:
        outcome = Outcome(case)
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            outcome.result = "refused"
            return outcome
        outcome.port = writer.get_extra_info("sockname")[1]
        try:
            writer.write(case.wire())
            await writer.drain()
            head = await asyncio.wait_for(reader.readexactly(4), self.answer_timeout_s)
            (size,) = struct.unpack(">i", head)
            await asyncio.wait_for(reader.readexactly(size), self.answer_timeout_s)
            outcome.result = "answered"
        except TimeoutError:
            outcome.result = "silent"  # acks=0, a long wait in a handler: not an error
        except (asyncio.IncompleteReadError, ConnectionError):
            outcome.result = "closed"
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        return outcome

    def _read_log(self, offset: int, by_port: dict[int, Case], report: Report) -> None:
        with self.log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            report.log_lines += 1
            match = _LINE.match(line)
            if match is None:
                if _DEATH.search(line):
                    report.last_words.append(line)
                elif not report.last_words:  # what follows an abort's message is its dump
                    report.not_one_line.append(line)
                continue
            level, logger, message = match.groups()
            if "never retrieved" in message or "Traceback" in message:
                report.not_one_line.append(line)
            if logger in REQUEST_ERROR_LOGGERS and level in ("WARNING", "ERROR"):
                report.request_error_lines += 1
            peer = _PEER.search(message)
            case = by_port.get(int(peer.group(1))) if peer else None
            described = case.describe() if case else "?"
            if "failed; closing the connection" in message or "UNKNOWN_SERVER_ERROR" in message:
                report.handler_failures.append((described, line))
            elif "closing connection from" in message:
                # "closing connection from 127.0.0.1:1234: malformed request: api 1 v12: ..."
                reason = message.split(": ", 1)[-1]
                report.decode_closes[re.sub(r"\d+", "N", reason)[:80]] += 1
