"""What a failed-then-rerun test said the first time, in the session's summary.

`make integration` and `make e2e` run with pytest-rerunfailures' `--reruns 1`, the policy of
Apache Kafka's own CI (Gradle's test-retry plugin, one retry per test): a test that fails and
then passes on its rerun does not fail the suite, and one that fails twice does. A rerun must
never hide what happened, so this plugin keeps the first attempt's report (its assertion,
traceback and captured output) and prints it in a "tests that needed a rerun" section at the
end of the session, with the test's name and how long the failed attempt took: the flake is in
the CI log, to be fixed, not forgotten. The same reports go to <build cache>/logs/reruns.log.
Without --reruns (a developer's run) nothing changes.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest

# the failed attempts pytest-rerunfailures reran, in order (one session per process)
_RERUNS: list[pytest.TestReport] = []


def _log_path() -> Path:
    cache = os.environ.get("TIDALMQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tidalmq"
    )
    return Path(cache) / "logs" / "reruns.log"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # pytest-rerunfailures reports the failed attempt it is about to rerun as outcome "rerun"
    if str(report.outcome) == "rerun":
        _RERUNS.append(report)


def _describe(report: pytest.TestReport) -> str:
    lines = [f"{report.nodeid} ({report.when}, failed after {report.duration:.1f} s):"]
    lines.append(str(report.longrepr))
    for name, content in report.sections:
        if content.strip():
            lines.append(f"--- {name} ---")
            lines.append(content.rstrip())
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reruns = list(_RERUNS)
    if not reruns:
        return
    terminalreporter.section(f"tests that needed a rerun: {len(reruns)} (first attempts below)")
    text = "\n\n".join(_describe(r) for r in reruns)
    terminalreporter.write_line(text)
    path = _log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        with path.open("a") as log:
            log.write(f"=== {stamp}: {len(reruns)} rerun(s)\n{text}\n\n")
        terminalreporter.write_line(f"(appended to {path})")
    except OSError as exc:
        terminalreporter.write_line(f"(could not write {path}: {exc})")
