"""FrameProtocol cuts a byte stream into Kafka frames however the socket splits it."""

from __future__ import annotations

import asyncio
import gc
import random
import struct
import tracemalloc
import weakref

import pytest
from tidalmq_broker.server.budget import MemoryBudget
from tidalmq_broker.server.framing import FrameProtocol, FrameSizeError, SharedScratch


class FakeTransport:
    def __init__(self) -> None:
        self.paused = False
        self.closed = False
        self.written: list[bytes] = []

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 9) if name == "peername" else None


def feed(proto: FrameProtocol, data: bytes, rng: random.Random) -> None:
    """Deliver `data` the way a socket might: in chunks no larger than what get_buffer offers."""
    pos = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        n = min(len(buf), len(data) - pos, rng.choice([1, 3, 7, 100, 4096, 70_000, 1 << 20]))
        buf[:n] = data[pos : pos + n]
        proto.buffer_updated(n)
        pos += n


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("seed", range(5))
async def test_frames_come_out_whole_and_in_order(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [1, 5, 100, 31_000, 32 * 1024, 40_000, 300_000, 2_000_000, 7, 250_000]
    payloads = [bytes(rng.getrandbits(8) for _ in range(min(s, 64))) * (s // 64 + 1) for s in sizes]
    payloads = [p[:s] for p, s in zip(payloads, sizes, strict=True)]
    proto = FrameProtocol(max_frame_bytes=10_000_000, max_queued_bytes=1 << 30)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    feed(proto, b"".join(frame(p) for p in payloads), rng)
    for expected in payloads:
        got = await proto.next_frame()
        assert bytes(got) == expected
        assert isinstance(got, bytes) or not got.readonly  # large frames: a buffer of their own


async def test_bad_sizes_are_reported_and_reading_stops() -> None:
    for size in (0, -5, 1001):
        proto = FrameProtocol(max_frame_bytes=1000)
        transport = FakeTransport()
        proto.connection_made(transport)  # type: ignore[arg-type]
        feed(proto, frame(b"ok") + struct.pack(">i", size) + b"xx", random.Random(1))
        assert await proto.next_frame() == b"ok"
        with pytest.raises(FrameSizeError):
            await proto.next_frame()
        assert transport.paused


async def test_reading_pauses_while_frames_pile_up_and_resumes() -> None:
    proto = FrameProtocol(max_frame_bytes=1 << 20, max_queued_bytes=100_000)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    feed(proto, b"".join(frame(b"x" * 40_000) for _ in range(3)), random.Random(2))
    assert transport.paused
    for _ in range(3):
        await proto.next_frame()
    assert not transport.paused


async def test_end_of_stream_after_queued_frames() -> None:
    proto = FrameProtocol(max_frame_bytes=1000)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    feed(proto, frame(b"last") + b"\x00\x00", random.Random(3))
    waiter = asyncio.ensure_future(proto.next_frame())
    assert await waiter == b"last"
    pending = asyncio.ensure_future(proto.next_frame())
    await asyncio.sleep(0)
    assert not pending.done()
    assert proto.eof_received() is True  # half-close: answers still go out
    with pytest.raises(ConnectionError):
        await pending
    proto.connection_lost(None)
    with pytest.raises(ConnectionError):
        await proto.drain()


async def test_buffered_frames_are_taken_without_waiting() -> None:
    proto = FrameProtocol(max_frame_bytes=1000)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    assert proto.frame_nowait() is None
    feed(proto, frame(b"a") + frame(b"b") + b"\x00", random.Random(4))
    assert proto.frame_nowait() == b"a"
    assert await proto.next_frame() == b"b"
    assert proto.frame_nowait() is None


def test_an_announced_size_takes_memory_only_as_its_bytes_arrive() -> None:
    """The issue's 12-byte header announcing 100 MiB took 100 MiB at once; eight of them idle
    now hold a scratch and a first buffer each, and nothing once their peers are gone."""
    tracemalloc.start()
    try:
        protos = []
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(8):
            proto = FrameProtocol(max_frame_bytes=200 << 20)
            proto.connection_made(FakeTransport())  # type: ignore[arg-type]
            feed(proto, struct.pack(">ihhi", 100 << 20, 0, 9, 1), random.Random(5))
            assert len(proto.get_buffer(-1)) <= 64 * 1024
            protos.append(proto)
        held = tracemalloc.get_traced_memory()[0] - before
        for proto in protos:
            proto.connection_lost(None)  # the protocols themselves stay referenced here
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 8 * (256 + 64 + 16) * 1024  # scratch buffers, first buffers, bookkeeping
    assert left < 8 * 16 * 1024


async def test_a_connection_that_sends_nothing_holds_no_buffer() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        protos = [FrameProtocol(max_frame_bytes=1 << 20) for _ in range(100)]
        for proto in protos:
            proto.connection_made(FakeTransport())  # type: ignore[arg-type]
        idle = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert idle < 100 * 16 * 1024
    feed(protos[0], frame(b"after all"), random.Random(6))
    assert await protos[0].next_frame() == b"after all"


@pytest.mark.parametrize("seed", range(3))
async def test_a_large_frame_buffer_stays_within_eight_times_what_arrived(seed: int) -> None:
    rng = random.Random(seed)
    size = 3_000_000 + seed
    payload = rng.randbytes(size)
    proto = FrameProtocol(max_frame_bytes=10_000_000)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    data = frame(payload)
    pos = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        n = min(len(buf), len(data) - pos, rng.choice([1, 100, 4096, 65_536, 300_000]))
        buf[:n] = data[pos : pos + n]
        proto.buffer_updated(n)
        pos += n
        if 4 < pos < len(data):
            received = pos - 4
            room = len(proto.get_buffer(-1))
            assert received + room <= max(64 * 1024, 8 * received), (received, room)
    got = await proto.next_frame()
    assert bytes(got) == payload
    assert isinstance(got, memoryview) and not got.readonly  # still a buffer of its own


@pytest.mark.parametrize("seed", range(4))
async def test_connections_sharing_one_scratch_buffer_get_their_own_frames(seed: int) -> None:
    """Reads of several connections interleave on the one shared scratch buffer: each gets its
    own frames whole and in order, whatever is left half-parsed when another one reads."""
    rng = random.Random(seed)
    scratch = SharedScratch()
    protos, streams, expected = [], [], []
    for i in range(5):
        proto = FrameProtocol(max_frame_bytes=10_000_000, max_queued_bytes=1 << 30, scratch=scratch)
        proto.connection_made(FakeTransport())  # type: ignore[arg-type]
        payloads = [
            bytes([i]) * rng.choice([1, 7, 300, 20_000, 31_999, 40_000, 100_000]) for _ in range(20)
        ]
        protos.append(proto)
        streams.append(bytearray(b"".join(frame(p) for p in payloads)))
        expected.append(payloads)
    while any(streams):
        i = rng.choice([k for k, s in enumerate(streams) if s])
        buf = protos[i].get_buffer(-1)
        n = min(len(buf), len(streams[i]), rng.choice([1, 3, 50, 4096, 70_000]))
        buf[:n] = streams[i][:n]
        del streams[i][:n]
        protos[i].buffer_updated(n)
    for proto, payloads in zip(protos, expected, strict=True):
        for want in payloads:
            assert bytes(await proto.next_frame()) == want


def test_idle_connections_on_a_shared_scratch_hold_no_read_buffer() -> None:
    """4,000 idle clients held 256 KiB each (1 GB): with the scratch shared, a connection that
    has read a whole request holds no buffer at all, and a half-read small one only its bytes."""
    scratch = SharedScratch()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        protos = []
        for i in range(200):
            proto = FrameProtocol(max_frame_bytes=1 << 20, scratch=scratch)
            proto.connection_made(FakeTransport())  # type: ignore[arg-type]
            tail = b"\x00\x00\x00\x10abc" if i % 2 else b""  # half of a 16-byte frame
            feed(proto, frame(b"x" * 40) + tail, random.Random(i))
            assert proto.frame_nowait() == b"x" * 40
            protos.append(proto)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 256 * 1024 + 200 * 2 * 1024, held  # one scratch, ~1 KiB of state each


async def test_the_request_budget_pauses_reading_and_resumes_when_requests_are_done() -> None:
    budget = MemoryBudget("request", 100_000, slack=1 << 20)
    a, b = FrameProtocol(1 << 20, budget=budget), FrameProtocol(1 << 20, budget=budget)
    ta, tb = FakeTransport(), FakeTransport()
    a.connection_made(ta)  # type: ignore[arg-type]
    b.connection_made(tb)  # type: ignore[arg-type]
    feed(a, frame(b"a" * 60_000), random.Random(1))
    got = await a.next_frame()  # handed out: still charged until released
    assert budget.used == 60_000 and not ta.paused
    feed(b, frame(b"b" * 50_000), random.Random(2))  # past the limit: b stops reading
    assert budget.used == 110_000 and tb.paused and budget.waiting == 1
    budget.release(len(got), complete=True)  # a's request was answered
    assert not tb.paused and budget.waiting == 0
    assert bytes(await b.next_frame()) == b"b" * 50_000


def test_a_lost_connection_gives_back_its_budget() -> None:
    budget = MemoryBudget("request", 1 << 30)
    proto = FrameProtocol(1 << 30, budget=budget)
    proto.connection_made(FakeTransport())  # type: ignore[arg-type]
    feed(
        proto,
        frame(b"q" * 100) + frame(b"r" * 50_000) + struct.pack(">i", 10_000_000) + b"x" * 5000,
        random.Random(3),
    )
    assert budget.used > 50_100  # two queued frames and a partial one's buffer
    proto.connection_lost(None)
    assert budget.used == 0 and budget.complete == 0


async def test_muting_stops_reading_until_unmuted() -> None:
    proto = FrameProtocol(1 << 20)
    transport = FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    proto.mute()
    assert transport.paused and proto.muted
    feed(proto, frame(b"x" * 40_000) * 300, random.Random(4))  # queued-bytes pause too
    proto.unmute()
    assert transport.paused  # still: too many frames queued
    while proto.frame_nowait() is not None:
        pass
    assert not transport.paused


def test_a_lost_connection_is_freed_without_the_cyclic_collector() -> None:
    gc.collect()
    gc.disable()
    try:
        ref = None
        for _ in range(3):
            proto = FrameProtocol(1 << 20, on_drained=lambda: None)
            proto.connection_made(FakeTransport())  # type: ignore[arg-type]
            feed(proto, struct.pack(">i", 0) + b"xx", random.Random(5))  # an impossible size
            with pytest.raises(FrameSizeError):
                proto.frame_nowait()
            proto.eof_received()
            proto.connection_lost(ConnectionResetError("gone"))
            ref = weakref.ref(proto)
            del proto
            assert ref() is None, gc.get_referrers(ref())
    finally:
        gc.enable()
