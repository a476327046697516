"""Fixtures of the chart tests (helpers live in tests/support/helm.py): the pinned helm binary,
built on first use. Every test runs the real helm against charts/tidalmq; nothing is mocked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helm import HelmUnavailable, helm_binary


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm; the session fails (it does not skip) when it cannot be had."""
    try:
        return helm_binary()
    except HelmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
