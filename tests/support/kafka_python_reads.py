"""Reading a topic to its end with kafka-python's KafkaConsumer without waiting out an idle
timeout.

Iterating a KafkaConsumer stops only after `consumer_timeout_ms` without a record, so a test that
read "every record" that way spent that whole timeout idle after the last one (15 s per read in
some tests). `read_to_end` stops as soon as `count` records came, then checks that the consumer's
position is the end offset of every partition it was assigned: a record more than expected (a
duplicate) fails the check just as it would have come out of the idle wait, and so does one fewer
(the iteration ends on the idle timeout with too few records).
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaConsumer


def read_to_end(consumer: KafkaConsumer, count: int) -> list[Any]:
    """The first `count` records the consumer returns (fewer if it goes `consumer_timeout_ms`
    without one); asserts that nothing is left after them in any assigned partition."""
    records: list[Any] = []
    for record in consumer:
        records.append(record)
        if len(records) == count:
            break
    if len(records) == count:
        assigned = consumer.assignment()
        ends = consumer.end_offsets(list(assigned))
        positions = {tp: consumer.position(tp) for tp in assigned}
        assert positions == ends, f"records left after the expected {count}: {positions} < {ends}"
    return records
