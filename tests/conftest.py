"""Shared fixtures. Real servers (S3, brokers) are started once per session behind a lock."""

from __future__ import annotations

import pytest

# scenarios shared by the TidalMQ and the Apache Kafka tests: their failed asserts show the values
pytest.register_assert_rewrite("tests.support.compacted_topic", "tests.support.streams_wordcount")

pytest_plugins: list[str] = [
    "tests.support.s3_server",
    "tests.support.apache_kafka",
    "tests.support.kube_apiserver",
    "tests.support.exit_guard",
    "tests.support.reruns",
]
# tests.support.kafka_client_leaks (which tests leave a Kafka client alive) is opt-in:
# `pytest -p tests.support.kafka_client_leaks ...`. Registered here it once ended a whole CI
# session with INTERNALERROR (a fenced transactional producer of another test raised in its scan).


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test on the real kube-apiserver run last: on a cold machine its build (the
    longest Go build, started in the background by .ci/prebuild) then overlaps the other
    integration tests instead of holding the session up at the first such test. The order is
    otherwise kept, and whole modules move together (their module-scoped fixtures stay shared).
    With pytest-xdist (`make integration`: whole files per worker, in this order thanks to
    --no-loadscope-reorder) both workers reach them last."""
    late = {
        item.module.__name__
        for item in items
        if item.module is not None and "kube_apiserver" in getattr(item, "fixturenames", ())
    }
    items.sort(key=lambda item: item.module is not None and item.module.__name__ in late)
