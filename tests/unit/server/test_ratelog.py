"""Request errors are logged as single lines, at most so many a second, with a count of the rest."""

from __future__ import annotations

import logging

import pytest
from tidalmq_broker.server.ratelog import RateLimitedLog, describe, one_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_is_cut_to_the_rate_and_the_dropped_lines_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    limiter = RateLimitedLog(rate=5, burst=10, clock=clock)
    logger = logging.getLogger("test.ratelog")
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        sent = sum(limiter.warning(logger, "bad request %d", i) for i in range(1000))
        assert sent == 10  # the burst
        clock.now += 2.0  # two seconds: ten more tokens
        sent += sum(limiter.warning(logger, "bad request %d", i) for i in range(1000, 2000))
    assert sent == 20
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 20
    assert lines[10] == "bad request 1000 [990 similar lines suppressed]"
    assert "suppressed" not in lines[11]
    assert limiter.suppressed == 990 and limiter.suppressed_total == 1980


def test_client_text_cannot_break_the_line(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimitedLog()
    logger = logging.getLogger("test.ratelog")
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        limiter.warning(logger, "client %s said %s", "a\nb", "x\r\n2026-01-01 ERROR forged")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\r" not in line
    assert line == "client a\\nb said x\\r\\n2026-01-01 ERROR forged"
    assert one_line("\x00\x1b[31m\x7f") == "\\x00\\x1b[31m\\x7f"
    assert len(one_line("x" * 5000)) == 600


def test_describe_names_the_innermost_frame() -> None:
    def handler() -> None:
        raise TypeError("'NoneType' object is not iterable\nsecond line")

    try:
        handler()
    except TypeError as exc:
        text = describe(exc)
    assert text.startswith("TypeError: 'NoneType' object is not iterable")
    line = handler.__code__.co_firstlineno + 1
    assert text.endswith(f"(at test_ratelog.py:{line} in handler)")


def test_nothing_is_counted_for_a_level_that_is_off(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimitedLog(burst=1)
    logger = logging.getLogger("test.ratelog.quiet")
    with caplog.at_level(logging.ERROR, logger="test.ratelog.quiet"):
        assert not limiter.warning(logger, "not shown")
        assert limiter.error(logger, "shown")
    assert limiter.suppressed_total == 0
