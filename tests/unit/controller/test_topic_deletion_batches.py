"""[M1] 4: a DeleteTopics of many partitions goes in batches of bounded size.

Applying a deletion frees its partitions' objects by reference counting in one go, the GIL
held: one batch for 50,000 partitions held the controller's event loop 142-185 ms and its
liveness thread (heartbeats 57-59 ms) on a quiet machine, 0.3-1.1 s on a loaded one
(bench/controller_gc_pauses.py --delete-per-call 0). The records are committed in batches of at
most DELETE_PARTITIONS_PER_BATCH partitions, one topic at least, one after the other.
"""

from __future__ import annotations

import asyncio

from tidalmq_controller import Controller, NewTopic
from tidalmq_controller._controller import DELETE_PARTITIONS_PER_BATCH, deletion_batches
from tidalmq_controller._errors import UnknownTopic
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_core.records import Record

from tests.support.controllers import FAST
from tests.support.fake_broker import FakeBroker


def topic(name: str, partitions: int) -> tuple[int, list[Record]]:
    return partitions, [{"t": "tgone", "name": name}, {"t": "deletion", "name": name}]


def names(batch: list[Record]) -> list[str]:
    return [str(r["name"]) for r in batch if r["t"] == "tgone"]


def test_topics_are_batched_up_to_the_limit_and_kept_whole() -> None:
    groups = [topic("a", 3000), topic("b", 2000), topic("c", 4000), topic("big", 9000)]
    groups += [topic("d", 10), topic("e", 10)]
    batches = deletion_batches(groups, 5000)
    assert [names(b) for b in batches] == [["a", "b"], ["c"], ["big"], ["d", "e"]]
    # every record once, in order, a topic's records together
    assert [r for b in batches for r in b] == [r for _, recs in groups for r in recs]


def test_nothing_to_delete_is_no_batch() -> None:
    assert deletion_batches([], 5000) == []


async def test_a_big_delete_is_committed_in_several_batches_and_answered_once() -> None:
    c = Controller(MemoryMetadataLog(), FAST)
    await c.start()
    broker = FakeBroker(c, 0, reconcile=True)
    try:
        await broker.register()
        per_topic = DELETE_PARTITIONS_PER_BATCH // 2 + 1  # two never fit in one batch
        doomed = [f"doomed-{i}" for i in range(3)]
        await c.create_topics([NewTopic(n, per_topic) for n in doomed] + [NewTopic("kept", 2)])
        before = c.journal.committed_version

        started = asyncio.Event()
        real_commit = c.commit
        commits: list[list[str]] = []

        async def commit(records: list[Record]) -> int:
            commits.append(names(records))
            started.set()
            return await real_commit(records)

        c.commit = commit  # type: ignore[method-assign]
        deleting = asyncio.create_task(c.delete_topics(doomed))
        await started.wait()
        # while its batches go in, the same topics deleted again are already gone
        again = await c.delete_topics(["doomed-2"])
        assert isinstance(again[0].error, UnknownTopic)
        results = await deleting
        assert [r.error for r in results] == [None, None, None]
        assert commits == [["doomed-0"], ["doomed-1"], ["doomed-2"]]
        assert c.journal.committed_version >= before + 3
        assert set(c.image.topics) & set(doomed) == set()
        assert "kept" in c.image.topics
    finally:
        broker.silence()
        await c.stop()
