"""A Kafka client's log lines, kept for a test to read (confluent-kafka's `logger=`, with
`debug=...` in its config): what the client decided, as it says it."""

from __future__ import annotations

import logging


def captured_client_log(name: str) -> tuple[logging.Logger, list[str]]:
    """A DEBUG logger named `name` and the list its messages are appended to."""
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(name)
    logger.addHandler(Lines())
    logger.setLevel(logging.DEBUG)
    return logger, lines
