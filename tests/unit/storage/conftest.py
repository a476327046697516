"""Fixtures of the storage unit tests that run real engines on a local directory."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tidalmq_broker.storage.engine import ObjectStreamEngine


@pytest.fixture
async def engines() -> AsyncIterator[list[ObjectStreamEngine]]:
    """The engines a test started (test_transactions.engine adds them), stopped at its end."""
    made: list[ObjectStreamEngine] = []
    yield made
    for e in made:
        await e.stop()
