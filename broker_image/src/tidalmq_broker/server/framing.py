"""Kafka framing on a buffered protocol: size-prefixed frames read with as few copies as possible.

asyncio's StreamReader appends every chunk the socket yields to one bytearray, and readexactly()
then copies the frame out twice (a bytearray slice, then bytes) and shifts the rest of the buffer
to the front: four copies of every produced byte before the request is even decoded, which was a
third of the event loop's time under a produce load. Here small frames are parsed out of a
fixed scratch buffer (one copy each), and a large frame gets a buffer of its own that the
socket reads into directly.

A frame's own buffer grows with the bytes that arrive, never from the size the client announced:
it starts at 64 KiB (or four times what is already there) and, each time it fills, is replaced by
one four times larger, or by one of the announced size once that is at most twice as large. A 12-byte header announcing 100 MiB used to take
100 MiB at once (eight such connections: +878 MiB); now it takes 64 KiB until the bytes come.
A frame that fits its first buffer is not copied again; a larger one copies about a third of its
bytes on the way up (a 1 MiB frame: 64 + 256 KiB). The buffer is replaced, not resized: asyncio's
transport still holds the view get_buffer returned while buffer_updated runs.

Reading pauses while more than `max_queued_bytes` of complete frames wait for the listener (which
stops taking requests while too many are in flight), so a client cannot make the broker buffer
without bound. Writes go to the transport; drain() waits while the transport asks us to pause.
The largest frame accepted can be lowered and raised (`set_max_frame`): a connection that has
not authenticated yet gets Kafka's sasl.server.max.receive.size.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable

_SIZE = struct.Struct(">i")
_SCRATCH_BYTES = 256 * 1024
_OWN_BUFFER_FROM = 32 * 1024  # frames this large are read into a buffer of their own
_OWN_BUFFER_FIRST = 64 * 1024  # an own buffer starts this large (or twice what has arrived)
_OWN_BUFFER_GROWTH = 4  # and grows this many times over whenever it fills
_NO_SCRATCH = bytearray()  # before the first read and after the last


class FrameSizeError(Exception):
    """A frame announced a size outside 1..max (the connection must be closed)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"request size {size}")
        self.size = size


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(
        self,
        max_frame_bytes: int,
        max_queued_bytes: int = 8 * 1024 * 1024,
        on_connected: Callable[[FrameProtocol], object] | None = None,
        *,
        tls: bool = False,
    ) -> None:
        self._on_connected = on_connected
        self._tls = tls  # under the event loop's TLS layer: no half-closed connections
        self._max_frame = max_frame_bytes
        self._max_queued = max_queued_bytes
        # allocated at the first read, dropped once the peer stops sending
        self._scratch = _NO_SCRATCH
        self._scratch_view = memoryview(_NO_SCRATCH)
        self._filled = 0  # bytes of the scratch buffer holding data not yet parsed
        self._frame: bytearray | None = None  # a large frame being read into its own buffer
        self._frame_filled = 0
        self._frame_size = 0  # the size the frame announced; the buffer grows towards it
        self._frames: deque[bytes | memoryview | FrameSizeError] = deque()
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed: BaseException | None = None  # no more frames: the peer stopped sending
        self._lost = False  # the transport is gone
        self._reading_paused = False
        self._broken = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.transport: asyncio.Transport | None = None

    # ---------------------------------------------------------------- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = transport  # type: ignore[assignment]
        if self._on_connected is not None:
            self._on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_filled :]
        if not self._scratch:
            self._scratch = bytearray(_SCRATCH_BYTES)
            self._scratch_view = memoryview(self._scratch)
        return self._scratch_view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        frame = self._frame
        if frame is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                # writable: a produce request's records get their offsets patched in place
                self._push(memoryview(frame))
                self._frame = None
            elif self._frame_filled == len(frame):
                self._frame = self._own_buffer(frame, self._frame_filled)
            return
        self._filled += nbytes
        self._parse_scratch()

    def eof_received(self) -> bool:
        # half-closed: no more requests, but the answers to those already read still go out
        # (TLS cannot half-close: its layer closes the connection whatever we answer)
        self._drop_buffers()
        self._close(ConnectionResetError("the client closed the connection"))
        return not self._tls

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._drop_buffers()
        self._close(exc or ConnectionResetError("connection closed"))
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def _drop_buffers(self) -> None:
        """Nothing more will arrive: free the read buffers now. The protocol, its transport and
        the listener's tasks form reference cycles that only the cyclic GC collects, and until it
        ran every closed connection held its 256 KiB (fuzzing at ~1,000 connections a second
        kept 250 MiB that way)."""
        self._scratch = _NO_SCRATCH
        self._scratch_view = memoryview(_NO_SCRATCH)
        self._filled = 0
        self._frame = None  # a frame that will never be complete

    # ---------------------------------------------------------------- parsing
    def _parse_scratch(self) -> None:
        buf, view = self._scratch, self._scratch_view
        pos, end = 0, self._filled
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size <= 0 or size > self._max_frame:
                self._push(FrameSizeError(size))
                self._filled = 0
                self._broken = True  # nothing after it can be framed: never read again
                self._pause_reading()
                return
            start = pos + 4
            if end - start >= size:
                self._push(bytes(view[start : start + size]))
                pos = start + size
                continue
            if size >= _OWN_BUFFER_FROM:
                have = end - start
                self._frame_size = size
                self._frame = self._own_buffer(view[start:end], have)
                self._frame_filled = have
                pos = end
            break
        rest = end - pos
        if pos and rest:
            buf[:rest] = view[pos:end]  # same length: the buffer is never resized
        self._filled = rest

    def _own_buffer(self, data: bytes | bytearray | memoryview, have: int) -> bytearray:
        """A buffer for the frame being read, starting with the `have` bytes of it that `data`
        holds: room for more, but never more than the frame or than a few times what came."""
        capacity = max(_OWN_BUFFER_FIRST, have * _OWN_BUFFER_GROWTH)
        if 2 * capacity >= self._frame_size:
            capacity = self._frame_size  # at most 8x what came; saves a last copy of it all
        buffer = bytearray(capacity)
        buffer[:have] = data[:have]
        return buffer

    def _push(self, frame: bytes | memoryview | FrameSizeError) -> None:
        self._frames.append(frame)
        if not isinstance(frame, FrameSizeError):
            self._queued += len(frame)
            if self._queued >= self._max_queued:
                self._pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _close(self, exc: BaseException) -> None:
        if self._closed is None:
            self._closed = exc
        self._wake()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    # ---------------------------------------------------------------- for the listener
    def set_max_frame(self, max_frame_bytes: int) -> None:
        """The largest frame accepted from now on (frames already cut are not looked at)."""
        self._max_frame = max_frame_bytes

    def frame_nowait(self) -> bytes | memoryview | None:
        """The next complete frame if one is buffered (no waiting, no timer), else None."""
        if not self._frames:
            return None
        return self._pop()

    async def next_frame(self) -> bytes | memoryview:
        """The next complete frame (without its size). Raises FrameSizeError for a frame of an
        impossible size and ConnectionError once the peer is gone."""
        while not self._frames:
            if self._closed is not None:
                raise ConnectionResetError(str(self._closed))
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pop()

    def _pop(self) -> bytes | memoryview:
        frame = self._frames.popleft()
        if isinstance(frame, FrameSizeError):
            raise frame
        self._queued -= len(frame)
        if self._reading_paused and not self._broken and self._queued < self._max_queued // 2:
            self._reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        return frame

    def write(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("connection closed")
        if not self._writing_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"
