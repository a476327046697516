"""Fixtures for broker integration tests: a real broker process on a real object store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker_process import BrokerProcess


@dataclass(frozen=True)
class Storage:
    url: str
    env: dict[str, str]


@pytest.fixture(params=["localdir", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """Every broker scenario runs on the local-directory store and on the real S3 server."""
    if request.param == "localdir":
        return Storage(f"file://{tmp_path / 'objects'}", {})
    s3 = request.getfixturevalue("s3_server")
    return Storage(s3.url(prefix=f"it-{uuid.uuid4().hex[:8]}"), s3.env())


@pytest.fixture
def broker(storage: Storage, tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage.url, tmp_path / "logs", env=storage.env) as proc:
        yield proc


@pytest.fixture
def local_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on the local-directory store only (protocol-level tests)."""
    with BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs") as proc:
        yield proc


@pytest.fixture
def strict_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker on the local-directory store with auto.create.topics.enable off (the default
    is on, as in Kafka): for what clients are told of topics that do not exist."""
    with BrokerProcess(
        f"file://{tmp_path / 'objects'}", tmp_path / "logs", args=["--auto-create-topics", "false"]
    ) as proc:
        yield proc


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
