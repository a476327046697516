"""A deleted topic's data is deleted once every live broker applied the deletion and has none
of its partitions open; the controller looks for the topic's own partitions among the brokers'
open ones (O(its partitions)), not through everything each broker has open, every tick."""

from __future__ import annotations

import asyncio
from functools import partial

from tidalmq_controller import Controller, NewTopic
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.model import TopicPartition

from tests.support.controllers import FAST
from tests.support.fake_broker import FakeBroker
from tests.support.waiting import eventually

wait_for = partial(eventually, timeout_s=10.0)  # this module's default wait


async def test_a_deleted_topics_data_waits_for_its_last_open_partition() -> None:
    deleted: list[tuple[str, str]] = []

    async def delete_data(name: str, topic_id: str) -> int:
        deleted.append((name, topic_id))
        return 0

    c = Controller(MemoryMetadataLog(), FAST, topic_data_deleter=delete_data)
    await c.start()
    broker = FakeBroker(c, 0, reconcile=True)
    try:
        await broker.register()
        await c.create_topics([NewTopic("doomed", 8), NewTopic("kept", 2)])
        last = TopicPartition("doomed", 7)
        await wait_for(lambda: c.membership.is_open(0, last))
        topic_id = c.image.topics["doomed"].topic_id
        broker.reconcile = False  # the broker is slow to close: partition 7 stays open
        await c.delete_topics(["doomed"])
        broker.open = {tp: e for tp, e in broker.open.items() if tp.topic != "doomed"}
        broker.open[last] = 0
        await wait_for(lambda: broker.version == c.journal.committed_version)
        await asyncio.sleep(0.5)  # heartbeats and ticks: the cleanup keeps waiting
        assert deleted == [] and c.image.pending_deletions == [("doomed", topic_id)]
        del broker.open[last]
        await wait_for(lambda: deleted == [("doomed", topic_id)])
        await wait_for(lambda: not c.image.pending_deletions)
        assert "kept" in c.image.topics
    finally:
        broker.silence()
        await c.stop()
