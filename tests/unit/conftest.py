"""Unit tests are pure logic with fast clocks: each gets 120 s at most, so a hang (a task that
never finishes, a stop() that waits forever) fails one test instead of the whole CI run."""

from __future__ import annotations

import pytest

UNIT_TIMEOUT_S = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None and "tests/unit/" in item.nodeid:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
