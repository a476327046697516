"""What Apache Kafka's Java producer tells each record of a batch refused for some of its records
(KIP-467's record_errors, Produce v8+), run on TidalMQ
(tests/integration/compat/test_record_errors.py) and on Apache Kafka 4.3.1
(tests/integration/apache_kafka/test_record_errors.py) with bench/kafka/java/RecordErrorsCheck.java:
in a batch to a compacted topic only the keyless record gets the compacted topic's message, the
others the client's generic one; a keyless record alone, and a record out of a topic's
timestamp bounds, get their own record's message, not the partition's."""

from __future__ import annotations

import re
import uuid
from typing import Any

from bench.kafka.harness import JAVA_RECORD_ERRORS_SOURCE, run_java_client

# the Java client's exception for a batch's records that are not themselves named (Sender.java)
PART_OF_A_BATCH = (
    "Failed to append record because it was part of a batch which had one more more invalid records"
)


def check_record_errors(bootstrap: str) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    report = run_java_client(bootstrap, suffix, source=JAVA_RECORD_ERRORS_SOURCE, timeout=120)
    keyless = (
        f"Compacted topic cannot accept message without key in topic partition keys-{suffix}-0"
    )
    generic = {"error": "KafkaException", "message": PART_OF_A_BATCH}
    assert report["batch"] == [
        generic,
        {"error": "InvalidRecordException", "message": keyless},
        generic,
    ], report
    assert report["alone"] == {"error": "InvalidRecordException", "message": keyless}, report
    late = report["late"]
    assert late["error"] == "InvalidTimestampException", report
    # the record's own message (the broker's clock in its bounds), not the partition's
    assert re.fullmatch(
        r"Timestamp \d+ of message with offset 0 is out of range\. "
        r"The timestamp should be within \[\d+, \d+\]",
        late["message"],
    ), report
    return report
