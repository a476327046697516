"""When the WAL writer flushes: by age of the oldest append, by size, within the in-flight cap,
and completions strictly in sequence order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.storage.wal import decode_wal_index
from tidalmq_broker.storage.wal_writer import Flush, PendingAppend, WalWriter

from tests.support.storage_helpers import FaultyStore


class FakePartition:
    """Only what the writer reads of a partition when it encodes a flush."""

    def __init__(self, n: int) -> None:
        from tidalmq_core.model import TopicPartition

        self.tp = TopicPartition("t", n)
        self.topic_id = "id"
        self.leader_epoch = 0


def append(p: FakePartition, size: int, offset: int) -> PendingAppend:
    fut = asyncio.get_running_loop().create_future()
    return PendingAppend(p, bytearray(size), offset, offset, 0, [], fut)  # type: ignore[arg-type]


async def make(tmp_path: Path, **cfg: float) -> tuple[WalWriter, FaultyStore, list[Flush]]:
    store = FaultyStore(LocalDirObjectStore(tmp_path))
    done: list[Flush] = []
    config = StorageConfig(**cfg)  # type: ignore[arg-type]

    def complete(flush: Flush) -> None:
        done.append(flush)
        for a in flush.appends:
            if a.future and not a.future.done():
                a.future.set_result(None)

    return WalWriter(store, "1", "inc", config, complete), store, done


async def test_flush_starts_are_at_least_the_interval_apart(tmp_path: Path) -> None:
    writer, store, done = await make(tmp_path, flush_interval_ms=200, flush_bytes=1 << 20)
    p = FakePartition(0)
    first = append(p, 10, 0)
    writer.enqueue(first)  # an idle writer flushes on the next loop turn
    await asyncio.wait_for(first.future, 5)
    assert store.wal_puts() == 1
    a, b = append(p, 10, 1), append(p, 10, 2)
    writer.enqueue(a)
    writer.enqueue(b)
    await asyncio.wait_for(b.future, 5)
    # within W of the previous flush: wait, and gather both into one flush that starts W after
    # the first. The flushes' own start stamps, not a sleep and a sample of the PUT count, which
    # a loaded machine stretches past W (the sample then failed, with the writer right)
    assert store.wal_puts() == 2 and len(done[1].appends) == 2
    assert done[1].started - done[0].started >= 0.2 - 0.001  # the event loop's timer resolution


async def test_a_completion_does_not_start_the_next_flush_before_the_interval(
    tmp_path: Path,
) -> None:
    """Appends that arrive while a flush is in flight wait for W after that flush started,
    even when it completes sooner: a completion starts only what is due. (It used to start
    them at once, so with PUTs faster than W the flushes followed each other at the store's
    pace, past the 1000/W a second the window promises.)"""
    writer, store, done = await make(tmp_path, flush_interval_ms=300, flush_bytes=1 << 20)
    store.gate = asyncio.Event()
    p = FakePartition(0)
    first = append(p, 10, 0)
    writer.enqueue(first)  # idle: flushes on the next loop turn, and waits at the gate
    await asyncio.sleep(0)  # the loop turn on which it starts
    assert len(writer._inflight) == 1
    second = append(p, 10, 1)
    writer.enqueue(second)  # within W of the first flush's start: waits for the timer
    store.gate.set()  # the first PUT completes well before W
    await asyncio.wait_for(first.future, 5)
    await asyncio.wait_for(second.future, 5)
    assert store.wal_puts() == 2
    assert done[1].started - done[0].started >= 0.3 - 0.001  # the event loop's timer resolution


async def test_appends_that_waited_for_a_slot_go_out_when_one_frees_after_the_interval(
    tmp_path: Path,
) -> None:
    """Every slot busy past W: the pending appends go out together as soon as a flush
    completes (they are due), not a timer later."""
    writer, store, done = await make(
        tmp_path, flush_interval_ms=20, flush_bytes=1 << 20, max_inflight_flushes=1
    )
    store.gate = asyncio.Event()
    p = FakePartition(0)
    first = append(p, 10, 0)
    writer.enqueue(first)
    await asyncio.sleep(0)  # the loop turn on which it starts
    assert len(writer._inflight) == 1
    waiting = [append(p, 10, i) for i in range(1, 4)]
    for a in waiting:
        writer.enqueue(a)
    await asyncio.sleep(0.1)  # well past W: their timer fired while the one slot was busy
    assert store.wal_puts() == 0 and len(writer._inflight) == 1
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*(a.future for a in waiting)), 5)
    assert [len(f.appends) for f in done] == [1, 3]  # started by the completion: no timer was left


async def test_flushes_at_once_when_enough_bytes_are_pending(tmp_path: Path) -> None:
    writer, store, _done = await make(tmp_path, flush_interval_ms=10_000, flush_bytes=1000)
    p = FakePartition(0)
    warmup = append(p, 10, 0)
    writer.enqueue(warmup)
    await asyncio.wait_for(warmup.future, 5)
    a = append(p, 600, 1)
    writer.enqueue(a)
    await asyncio.sleep(0.05)
    assert store.wal_puts() == 1
    b = append(p, 600, 2)
    writer.enqueue(b)
    await asyncio.wait_for(b.future, 5)
    assert store.wal_puts() == 2


async def test_inflight_cap_and_completion_order(tmp_path: Path) -> None:
    writer, store, done = await make(
        tmp_path, flush_interval_ms=1, flush_bytes=100, max_inflight_flushes=2
    )
    store.gate = asyncio.Event()
    p = FakePartition(0)
    appends = [append(p, 150, i) for i in range(5)]
    for a in appends:
        writer.enqueue(a)
    await asyncio.sleep(0.05)
    assert len(writer._inflight) == 2  # the rest waits for a slot, gathered into one flush
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*(a.future for a in appends)), 5)
    assert [f.seq for f in done] == sorted(f.seq for f in done)
    assert len(done) == 3 and [len(f.appends) for f in done] == [1, 1, 3]
    assert writer.completed_seq == 2


async def test_a_flush_stores_the_appends_own_buffers_and_keeps_views_of_them(
    tmp_path: Path,
) -> None:
    """The WAL object is PUT from the appends' buffers (no blob): what lands is header, index
    and the appends' bytes in order, and each append's view is of its own buffer (a request
    frame or its own bytearray), read-only, the append itself no longer holding the bytes."""
    writer, _, done = await make(tmp_path, flush_interval_ms=50, flush_bytes=1 << 20)
    p0, p1 = FakePartition(0), FakePartition(1)
    frame = bytearray(b"request header|" + b"A" * 300 + b"B" * 200)
    own = bytearray(b"C" * 123)
    appends = [
        PendingAppend(p0, memoryview(frame)[15:315], 0, 0, 0, [], None),  # type: ignore[arg-type]
        PendingAppend(p1, memoryview(frame)[315:], 0, 0, 0, [], None),  # type: ignore[arg-type]
        PendingAppend(p0, own, 1, 1, 0, [], None),  # type: ignore[arg-type]
    ]
    for a in appends:
        writer.enqueue(a)
    await writer.wait_idle()
    (flush,) = done
    assert flush.parts == []  # dropped once complete: the cache keeps what it needs
    data = (tmp_path / flush.key).read_bytes()
    assert len(data) == flush.size
    head = data[: len(data) - 623]
    assert data == head + b"A" * 300 + b"C" * 123 + b"B" * 200  # grouped by partition
    assert decode_wal_index(head) == flush.entries
    views = {id(a): v for _, _, vs in flush.groups for a, v in vs}
    assert [bytes(views[id(a)]) for a in appends] == [b"A" * 300, b"B" * 200, b"C" * 123]
    assert views[id(appends[0])].obj is frame and views[id(appends[1])].obj is frame
    assert views[id(appends[2])].obj is own
    assert all(v.readonly for v in views.values())
    assert all(len(a.data) == 0 for a in appends)
    for (_, entry, vs), want in zip(
        flush.groups, [b"A" * 300 + b"C" * 123, b"B" * 200], strict=True
    ):
        assert entry is not None and data[entry.position : entry.position + entry.size] == want
        assert sum(len(v) for _, v in vs) == entry.size
