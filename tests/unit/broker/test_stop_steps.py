"""A broker's stop times its steps: a slow one is logged with its duration when it ends, and a
stop cut short by the deadline names the step it was in (the forced exit's message), so a stop
that took too long says where (a CI run once saw two brokers pass 6 s in Broker.stop without a
line telling why)."""

from __future__ import annotations

import logging
import re
import time

import pytest
from tidalmq_broker import lifecycle
from tidalmq_broker.lifecycle import StopSteps


def test_slow_steps_are_logged_and_the_running_one_is_named(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lifecycle, "SLOW_STOP_STEP_S", 0.05)
    steps = StopSteps("broker 7")
    caplog.set_level(logging.INFO, logger=lifecycle.__name__)
    with steps.step("waiting for in-flight requests"):
        pass
    with steps.step("sending the last partition reports"):
        time.sleep(0.1)
    assert [r.getMessage() for r in caplog.records] == [
        f"broker 7 stop: sending the last partition reports took {steps.slow[0][1]:.2f}s"
    ]
    assert re.fullmatch(
        r"slow steps before: sending the last partition reports \d+\.\d\ds", steps.describe()
    )
    with steps.step("closing the partitions (storage engine)"):
        time.sleep(0.06)
        running = steps.describe()
    assert re.fullmatch(
        r"still in closing the partitions \(storage engine\) after \d+\.\d\ds; "
        r"slow steps before: sending the last partition reports \d+\.\d\ds",
        running,
    )
    assert StopSteps("broker 8").describe() == "no stop step running"
