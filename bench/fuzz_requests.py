"""Long fuzz run against a real broker process: how many hostile requests a second it survives,
and what it finds ([R1]).

    .venv/bin/python bench/fuzz_requests.py                       # 50,000 cases, seed 1
    .venv/bin/python bench/fuzz_requests.py --cases 200000 --seed 7 --concurrency 32
    .venv/bin/python bench/fuzz_requests.py --debug-log           # tracebacks of handler failures

The cases are those of the suite's fuzz test (tests/integration/broker/test_fuzz_requests.py,
mutations in tests/support/request_fuzz.py), more of them and from any seed: valid requests of
every served API and version, each mutated once (huge and negative counts and lengths, padded
varints, truncation, bit flips, unknown tagged fields, struct markers, byte edits), led by the
issue's killer frames unless --no-killers. They go out in chunks over real sockets, each case on
a connection of its own, `--concurrency` at a time, to a broker on the local-directory store
whose address space is capped with prlimit (its size at start + `--headroom-mib`).

A finding is any of:
- the broker died: a fresh broker replays the cases that were in flight one at a time, and the
  first that kills it again is named (with the broker's last words, e.g. kio's "memory
  allocation of ... bytes failed"); the rest of that chunk is skipped and the run goes on with
  a fresh broker;
- a handler failed (tidalmq_request_failures_total grew; with --debug-log the log names the
  case and its traceback);
- a log line that is not one line (not with --debug-log, whose tracebacks are wanted);
- more lines about bad requests than the rate limit lets out;
- RSS more than `--rss-growth-mib` above where the chunk started.

Every chunk's figures are printed with the machine's load average beside them (the machine is
shared: read the rates with it), and the totals at the end; --json writes them too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))

from tests.support.attacks import load_average  # noqa: E402
from tests.support.broker_process import BrokerProcess  # noqa: E402
from tests.support.fuzz_broker import (  # noqa: E402
    Fuzzer,
    Report,
    cap_address_space,
    prepare_topics,
    serves,
    vm_size_kb,
)
from tests.support.request_fuzz import Case, cases, known_killers, served_pairs  # noqa: E402

LOG_RATE, LOG_BURST = 5, 20  # server/ratelog.py's REQUEST_ERRORS


def attack_kind(attack: str) -> str:
    """'array-count-varint-4294967295' -> 'array-count-varint', 'truncate-69-of-104' ->
    'truncate', 'struct-marker-0x80' -> 'struct-marker'."""
    return re.sub(r"-(-?\d+|0x[0-9a-f]+)(-.*)?$", "", attack)


@dataclass
class Finding:
    kind: str  # died, handler, log, rate, rss
    detail: str
    case: str = ""

    def line(self) -> str:
        return f"[{self.kind}] {self.detail}" + (f"\n    case: {self.case}" if self.case else "")


@dataclass
class Totals:
    cases: int = 0
    seconds: float = 0.0
    results: Counter[str] = field(default_factory=Counter)
    attacks: Counter[str] = field(default_factory=Counter)
    rss_start_mib: float = 0.0
    rss_max_mib: float = 0.0
    broker_starts: int = 0
    serves_at_end: bool = False
    findings: list[Finding] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.totals = Totals()
        self.broker: BrokerProcess | None = None

    # ------------------------------------------------------------------ the broker
    def start_broker(self) -> BrokerProcess:
        self.totals.broker_starts += 1
        n = self.totals.broker_starts
        env = {"TIDALMQ_LOG_LEVEL": "DEBUG"} if self.args.debug_log else {}
        broker = BrokerProcess(
            f"file://{self.work / f'objects-{n}'}", self.work / f"logs-{n}", env=env
        )
        broker.start()
        assert broker.proc is not None
        pid = broker.proc.pid
        cap_address_space(pid, vm_size_kb(pid) * 1024 + (self.args.headroom_mib << 20))
        prepare_topics(broker.bootstrap)
        return broker

    def fuzzer(self, broker: BrokerProcess, concurrency: int | None = None) -> Fuzzer:
        assert broker.proc is not None
        return Fuzzer(
            broker.bootstrap,
            broker.proc.pid,
            broker.log_path,
            concurrency=concurrency or self.args.concurrency,
            answer_timeout_s=self.args.answer_timeout,
            metrics_url=f"{broker.http_url}/metrics",
        )

    def stop_broker(self) -> None:
        if self.broker is not None:
            if self.broker.alive():
                self.broker.stop()
            else:
                self.broker.kill()
            self.broker = None

    # ------------------------------------------------------------------ the run
    def run(self) -> Totals:
        args = self.args
        stream: list[Case] = [] if args.no_killers else known_killers()
        stream += cases(args.seed, args.cases)
        self.broker = self.start_broker()
        started = time.monotonic()
        try:
            for first in range(0, len(stream), args.chunk):
                chunk = stream[first : first + args.chunk]
                self.totals.attacks.update(attack_kind(c.attack) for c in chunk)
                self.run_chunk(first, chunk)
            assert self.broker is not None
            self.totals.serves_at_end = serves(self.broker.bootstrap)
        finally:
            self.totals.seconds = time.monotonic() - started
            self.stop_broker()
        return self.totals

    def run_chunk(self, first: int, chunk: list[Case]) -> None:
        assert self.broker is not None
        load = load_average()
        report = self.fuzzer(self.broker).run(chunk)
        totals = self.totals
        totals.cases += report.cases
        totals.results.update(report.results)
        if not totals.rss_start_mib:
            totals.rss_start_mib = report.rss_start_kb / 1024
        totals.rss_max_mib = max(totals.rss_max_mib, report.rss_max_kb / 1024)
        found = self.judge(report)
        figures = {
            "first_case": first,
            "cases": report.cases,
            "seconds": round(report.seconds, 2),
            "cases_per_s": round(report.cases / report.seconds, 1) if report.seconds else 0,
            "load_before": load,
            "load_after": load_average(),
            "rss_mib": [report.rss_start_kb // 1024, report.rss_max_kb // 1024],
            "results": dict(report.results),
            "findings": len(found),
        }
        totals.chunks.append(figures)
        print(
            f"cases {first:>7}-{first + report.cases - 1:<7} {figures['cases_per_s']:>7.1f}/s "
            f"(load {load} -> {figures['load_after']})  RSS {figures['rss_mib'][0]}->"
            f"{figures['rss_mib'][1]} MiB  {dict(report.results)}  findings {len(found)}",
            flush=True,
        )
        for finding in found:
            print("  " + finding.line().replace("\n", "\n  "), flush=True)
        totals.findings += found
        if not report.alive:
            self.stop_broker()
            totals.findings += self.replay(report.suspects)
            self.broker = self.start_broker()

    def judge(self, report: Report) -> list[Finding]:
        args = self.args
        found: list[Finding] = []
        if not report.alive:
            words = "; ".join(report.last_words[:3]) or "no message"
            found.append(Finding("died", f"broker died ({words})"))
        for api, count in sorted(report.failed_requests.items()):
            found.append(Finding("handler", f"{count} failed {api} requests"))
        for case, line in report.handler_failures[:20]:
            found.append(Finding("handler", line.split(": ", 1)[-1][:300], case))
        if not args.debug_log:
            for line in report.not_one_line[:20]:
                if line not in report.last_words:
                    found.append(Finding("log", f"not one line: {line[:200]}"))
        allowed = LOG_BURST + LOG_RATE * report.seconds + 5
        if report.request_error_lines > allowed:
            detail = f"{report.request_error_lines} lines about bad requests, limit {allowed:.0f}"
            found.append(Finding("rate", detail))
        growth = (report.rss_max_kb - report.rss_start_kb) / 1024
        if report.alive and growth > args.rss_growth_mib:
            found.append(Finding("rss", f"RSS grew {growth:.0f} MiB in one chunk"))
        return found

    def replay(self, suspects: list[Case]) -> list[Finding]:
        """Send the cases in flight at a death one at a time to fresh brokers: which one kills?"""
        print(f"  replaying {len(suspects)} cases in flight one at a time", flush=True)
        found: list[Finding] = []
        broker = self.start_broker()
        try:
            for case in suspects:
                report = self.fuzzer(broker, concurrency=1).run([case])
                if report.alive:
                    continue
                words = "; ".join(report.last_words[:3]) or "no message"
                found.append(
                    Finding("died", f"this case kills the broker ({words})", case.describe())
                )
                print("  " + found[-1].line().replace("\n", "\n  "), flush=True)
                broker.kill()
                broker = self.start_broker()
        finally:
            if broker.alive():
                broker.stop()
        if not found:
            found.append(Finding("died", "no case in flight kills a fresh broker on its own"))
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=2_000, help="cases between checks")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--answer-timeout", type=float, default=0.5)
    parser.add_argument("--headroom-mib", type=int, default=1024, help="address-space cap")
    parser.add_argument("--rss-growth-mib", type=int, default=100)
    parser.add_argument("--no-killers", action="store_true", help="random mutations only")
    parser.add_argument("--debug-log", action="store_true", help="broker at DEBUG: tracebacks")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    pairs = served_pairs()
    print(
        f"fuzz_requests: {args.cases} cases (seed {args.seed}) over {len(pairs)} served "
        f"API/versions, {args.concurrency} connections at a time; {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average {load_average()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fuzz-requests-") as work:
        totals = Bench(args, Path(work)).run()
    rate = totals.cases / totals.seconds if totals.seconds else 0.0
    print(
        f"\n{totals.cases} cases in {totals.seconds:.0f} s: {rate:.0f} cases/s "
        f"(load average now {load_average()}); results {dict(totals.results)}; "
        f"attacks {dict(totals.attacks)}; broker RSS {totals.rss_start_mib:.0f} MiB at start, "
        f"max {totals.rss_max_mib:.0f}; broker started {totals.broker_starts} times; "
        f"the last one still serves: {totals.serves_at_end}"
    )
    print(f"{len(totals.findings)} findings")
    for finding in totals.findings:
        print("  " + finding.line().replace("\n", "\n  "))
    if args.json:
        doc = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "cases": totals.cases,
            "seconds": round(totals.seconds, 1),
            "cases_per_s": round(rate, 1),
            "load_average_end": load_average(),
            "results": dict(totals.results),
            "attacks": dict(totals.attacks),
            "rss_mib": [round(totals.rss_start_mib), round(totals.rss_max_mib)],
            "broker_starts": totals.broker_starts,
            "serves_at_end": totals.serves_at_end,
            "findings": [vars(f) for f in totals.findings],
            "chunks": totals.chunks,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if totals.findings or not totals.serves_at_end else 0


if __name__ == "__main__":
    sys.exit(main())
