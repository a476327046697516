"""FrameProtocol cuts a byte stream into Kafka frames however the socket splits it."""

from __future__ import annotations

import asyncio
import random
import struct
import tracemalloc

import pytest
from tidalmq_broker.server.framing import FrameProtocol, FrameSizeError


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
