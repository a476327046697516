"""Kafka framing on a buffered protocol: size-prefixed frames read with as few copies as possible.

asyncio's StreamReader appends every chunk the socket yields to one bytearray, and readexactly()
then copies the frame out twice (a bytearray slice, then bytes) and shifts the rest of the buffer
to the front: four copies of every produced byte before the request is even decoded, which was a
third of the event loop's time under a produce load. Here small frames are parsed out of a
scratch buffer (one copy each), and a large frame gets a buffer of its own that the socket reads
into directly.

The scratch buffer is shared by every connection of a listener (`SharedScratch`): the event loop
reads one connection at a time, and get_buffer() and buffer_updated() of one read follow each
other without anything in between. A connection owns the scratch while its unparsed bytes (at
most the start of one frame smaller than 32 KiB) sit at its front; when another connection reads,
those bytes are moved into a small buffer of the connection's own and moved back at its next
read. A connection that is not in the middle of a frame therefore holds no read buffer at all:
4,000 idle clients used to hold 256 KiB each (1 GB) for as long as they stayed connected.

A frame's own buffer grows with the bytes that arrive, never from the size the client announced:
it starts at 4 KiB (or four times what is already there) and, each time it fills, is replaced by
one four times larger, or by one of the announced size once that is at most twice as large. A
12-byte header announcing 100 MiB used to take 100 MiB at once (eight such connections: +878
MiB); now it takes 4 KiB until the bytes come. A frame that fits its first buffer is not copied
again; a larger one copies about a third of its bytes on the way up (a 1 MiB frame: 64 + 256
KiB). The buffer is replaced, not resized: asyncio's transport still holds the view get_buffer
returned while buffer_updated runs.

Reading pauses (the transport stops reading the socket) for any of these reasons, and resumes
once none is left:
* more than `max_queued_bytes` of complete frames wait for the listener;
* the listener muted the connection (`mute`: its client is not reading its responses);
* the broker's request budget (server/budget.py) is exhausted: every frame buffer and every
  request not yet answered is charged to it, and a connection whose read took the total past the
  limit waits for room;
* a frame of an impossible size arrived (for good: nothing after it can be framed).
Writes go to the transport; drain() waits while the transport asks us to pause.
`write_buffer_size()` is what a response's bytes are released against, so it must count every
byte the broker still holds for the client. A plain transport's does. The event loop's TLS layer
counts only what it holds itself: whatever it has passed to the socket transport underneath,
which buffers it until the socket takes it, is out of its count, and it hands over everything it
holds at once, whenever that transport has room (even a 16 MiB answer). A client that does not
read thus had 16 MiB held for it that no bound saw, one more 16 MiB answer counted, and as many
such connections as it opened. So a TLS connection writes in pieces of 64 KiB, each only while
its transport is not paused (`write_tls`): what the socket transport holds uncounted stays within
its own high water (64 KiB) and one piece, ~128 KiB.
The largest frame accepted can be lowered and raised (`set_max_frame`): a connection that has
not authenticated yet gets Kafka's sasl.server.max.receive.size.

`last_active` is when the connection last moved bytes (a read, or the transport's write buffer
draining): the listener closes connections idle for longer than connections.max.idle.ms.

Nothing here is kept alive by a reference cycle once the connection is lost: the transport, the
buffers and the callbacks are dropped, and no exception object is stored (an exception's
traceback holds the frames that raised it, which hold whoever raised it), so a closed connection
is freed by reference counting alone, not at the next full run of the cyclic collector.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence

from tidalmq_broker.server.budget import MemoryBudget

_SIZE = struct.Struct(">i")
_SCRATCH_BYTES = 256 * 1024
_OWN_BUFFER_FROM = 32 * 1024  # frames this large are read into a buffer of their own
_OWN_BUFFER_FIRST = 4 * 1024  # an own buffer starts this large (or 4x what has arrived)
_OWN_BUFFER_GROWTH = 4  # and grows this many times over whenever it fills
# a TLS connection's answers go to its transport in pieces this large at most, each only while
# the transport is not paused (write_tls)
_TLS_WRITE_CHUNK = 64 * 1024
_EMPTY = b""

# why reading is paused (bits)
_QUEUED = 1
_MUTED = 2
_BUDGET = 4
_BROKEN = 8
_STOPPED = 16  # the server takes no more requests (stop_requests)


class FrameSizeError(Exception):
    """A frame announced a size outside 1..max (the connection must be closed)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"request size {size}")
        self.size = size


class SharedScratch:
    """The read buffer the connections of one listener share (see the module's docstring),
    allocated at the first read."""

    __slots__ = ("buffer", "owner", "size", "view")

    def __init__(self, size: int = _SCRATCH_BYTES) -> None:
        self.size = size
        self.buffer = bytearray()
        self.view = memoryview(self.buffer)
        self.owner: FrameProtocol | None = None  # whose unparsed bytes are at the front

    def allocate(self) -> None:
        if not self.buffer:
            self.buffer = bytearray(self.size)
            self.view = memoryview(self.buffer)

    def free(self) -> None:
        self.owner = None
        self.buffer = bytearray()
        self.view = memoryview(self.buffer)


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(
        self,
        max_frame_bytes: int,
        max_queued_bytes: int = 8 * 1024 * 1024,
        on_connected: Callable[[FrameProtocol], object] | None = None,
        *,
        tls: bool = False,
        scratch: SharedScratch | None = None,
        budget: MemoryBudget | None = None,
        on_drained: Callable[[], object] | None = None,
    ) -> None:
        self._on_connected = on_connected
        self._tls = tls  # under the event loop's TLS layer: no half-closed connections
        self._max_frame = max_frame_bytes
        self._max_queued = max_queued_bytes
        self._own_scratch = scratch is None  # a protocol on its own (tests, tools)
        self._scratch = scratch or SharedScratch()
        self._filled = 0  # bytes of this connection's not yet parsed at the scratch's front
        self._leftover = _EMPTY  # ... or here while another connection uses the scratch
        self._frame: bytearray | None = None  # a large frame being read into its own buffer
        self._frame_filled = 0
        self._frame_size = 0  # the size the frame announced; the buffer grows towards it
        self._frames: deque[bytes | memoryview | FrameSizeError] = deque()
        self._queued = 0  # bytes of complete frames in _frames
        self._budget = budget
        self._budget_waiting = False
        self._waiter: asyncio.Future[None] | None = None
        self._closed: str | None = None  # no more frames: why (the peer stopped sending)
        self._lost = False  # the transport is gone
        self._paused = 0  # reasons reading is paused (bits)
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._on_drained = on_drained
        self.last_active = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self._peer = "?"

    # ---------------------------------------------------------------- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = transport  # type: ignore[assignment]
        if transport.get_extra_info("ssl_object") is not None:
            self._tls = True
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        on_connected, self._on_connected = self._on_connected, None
        if on_connected is not None:
            on_connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_filled :]
        scratch = self._scratch
        if scratch.owner is not self:
            scratch.allocate()
            owner = scratch.owner
            if owner is not None:
                owner._evict()
            scratch.owner = self
            if self._leftover:
                n = len(self._leftover)
                scratch.buffer[:n] = self._leftover
                self._filled = n
                self._leftover = _EMPTY
        return scratch.view[self._filled :]

    def _evict(self) -> None:
        """Another connection reads into the scratch: keep our unparsed bytes aside."""
        scratch = self._scratch
        if self._filled:
            self._leftover = bytes(scratch.view[: self._filled])
            self._filled = 0
        scratch.owner = None

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        frame = self._frame
        if frame is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                # writable: a produce request's records get their offsets patched in place
                self._frame = None
                if self._budget is not None:
                    self._budget.completed(len(frame))
                self._push(memoryview(frame))
            elif self._frame_filled == len(frame):
                bigger = self._own_buffer(frame, self._frame_filled)
                self._frame = bigger
                self._charge(len(bigger) - len(frame))
            return
        self._filled += nbytes
        self._parse_scratch()

    def eof_received(self) -> bool:
        # half-closed: no more requests, but the answers to those already read still go out
        # (TLS cannot half-close: its layer closes the connection whatever we answer)
        self._drop_buffers()
        self._close("the client closed the connection")
        return not self._tls

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._drop_buffers()
        self._close(f"connection lost: {exc}" if exc is not None else "connection closed")
        self._release_queued()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        # nothing of the connection is needed any more: no reference cycle through us
        self.transport = None
        self._on_drained = None

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.last_active = time.monotonic()  # the client is reading
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if self._on_drained is not None:
            self._on_drained()

    def _drop_buffers(self) -> None:
        """Nothing more will arrive: free the read buffers now (and their budget)."""
        if self._own_scratch:
            self._scratch.free()
        elif self._scratch.owner is self:
            self._scratch.owner = None
        self._filled = 0
        self._leftover = _EMPTY
        frame, self._frame = self._frame, None  # a frame that will never be complete
        if frame is not None and self._budget is not None:
            self._budget.release(len(frame))
        if self._budget_waiting and self._budget is not None:
            self._budget.forget(self._budget_room)
            self._budget_waiting = False

    def _release_queued(self) -> None:
        """The connection is gone: frames nobody will take give their budget back."""
        if self._budget is not None and self._queued:
            self._budget.release(self._queued, complete=True)
        self._frames.clear()
        self._queued = 0

    # ---------------------------------------------------------------- parsing
    def _parse_scratch(self) -> None:
        scratch = self._scratch
        buf, view = scratch.buffer, scratch.view
        pos, end = 0, self._filled
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size <= 0 or size > self._max_frame:
                self._push(FrameSizeError(size))
                self._filled = 0
                self._pause(_BROKEN)  # nothing after it can be framed: never read again
                return
            start = pos + 4
            if end - start >= size:
                frame = bytes(view[start : start + size])
                if self._budget is not None:
                    self._budget.charge(size, complete=True)
                self._push(frame)
                pos = start + size
                continue
            if size >= _OWN_BUFFER_FROM:
                have = end - start
                self._frame_size = size
                self._frame = self._own_buffer(view[start:end], have)
                self._frame_filled = have
                self._charge(len(self._frame))
                pos = end
            break
        rest = end - pos
        if pos and rest:
            buf[:rest] = view[pos:end]  # same length: the buffer is never resized
        self._filled = rest
        self._check_budget()

    def _own_buffer(self, data: bytes | bytearray | memoryview, have: int) -> bytearray:
        """A buffer for the frame being read, starting with the `have` bytes of it that `data`
        holds: room for more, but never more than the frame or than a few times what came."""
        capacity = max(_OWN_BUFFER_FIRST, have * _OWN_BUFFER_GROWTH)
        if 2 * capacity >= self._frame_size:
            capacity = self._frame_size  # at most 8x what came; saves a last copy of it all
        buffer = bytearray(capacity)
        buffer[:have] = data[:have]
        return buffer

    def _charge(self, n: int) -> None:
        if self._budget is not None and n:
            self._budget.charge(n)
            self._check_budget()

    def _check_budget(self) -> None:
        budget = self._budget
        if budget is None or self._budget_waiting or not budget.exhausted or self._lost:
            return
        if budget.wait(self._budget_room):
            self._budget_waiting = True
            self._pause(_BUDGET)

    def _budget_room(self) -> None:
        self._budget_waiting = False
        self._resume(_BUDGET)

    def _push(self, frame: bytes | memoryview | FrameSizeError) -> None:
        if self._paused & _STOPPED:
            # read before the pause took effect: never taken, its budget goes back now
            if not isinstance(frame, FrameSizeError) and self._budget is not None:
                self._budget.release(len(frame), complete=True)
            return
        self._frames.append(frame)
        if not isinstance(frame, FrameSizeError):
            self._queued += len(frame)
            if self._queued >= self._max_queued:
                self._pause(_QUEUED)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _close(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        self._wake()

    def _pause(self, reason: int) -> None:
        paused = self._paused
        self._paused = paused | reason
        if not paused and self.transport is not None:
            self.transport.pause_reading()

    def _resume(self, reason: int) -> None:
        if not self._paused & reason:
            return
        self._paused &= ~reason
        transport = self.transport
        if not self._paused and transport is not None and not transport.is_closing():
            transport.resume_reading()

    # ---------------------------------------------------------------- for the listener
    @property
    def muted(self) -> bool:
        return bool(self._paused & _MUTED)

    @property
    def reading_paused(self) -> bool:
        return bool(self._paused)

    @property
    def writing_paused(self) -> bool:
        """The transport asked us to stop writing (its buffer is above its high water)."""
        return self._writing_paused

    @property
    def lost(self) -> bool:
        return self._lost

    def mute(self) -> None:
        """Stop reading the socket until unmute() (the client is not reading its answers)."""
        self._pause(_MUTED)

    def unmute(self) -> None:
        self._resume(_MUTED)

    def stop_requests(self, reason: str) -> None:
        """The server takes no more requests from this connection (it is stopping): nothing
        more is read, frames not yet taken are dropped, and next_frame raises at once. The
        answers to requests already taken still go out; the listener then closes the
        connection. So a connection waiting for its next request is closed now, instead of
        taking one more and closing right behind its answer."""
        self._pause(_STOPPED)
        self._release_queued()
        self._close(reason)

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
        impossible size and ConnectionError once the peer is gone.

        A frame handed out stays charged to the request budget: whoever takes it releases it
        (MemoryBudget.release(len(frame), complete=True)) once the request is answered."""
        while not self._frames:
            if self._closed is not None:
                raise ConnectionResetError(self._closed)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._pop()

    def _pop(self) -> bytes | memoryview:
        frame = self._frames.popleft()
        if isinstance(frame, FrameSizeError):
            raise FrameSizeError(frame.size)  # a new one each time: no traceback kept here
        self._queued -= len(frame)
        if self._paused & _QUEUED and self._queued < self._max_queued // 2:
            self._resume(_QUEUED)
        return frame

    def write(self, data: bytes | memoryview) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def report_every_flush(self) -> None:
        """Have the transport call pause_writing whenever its buffer holds bytes and
        resume_writing each time it is empty again (not only below asyncio's 16 KiB low water).

        Plain transports pause while size > high water, the TLS ones (asyncio's and uvloop's
        sslproto) while size >= high water: a high water of 0 there pauses with an empty buffer,
        and the resume then comes only at the TLS layer's next read or write (it flips between
        the two at each), so drain() waited for a client that was itself waiting for an answer
        (a SASL_SSL connection stopped being answered). 1 on TLS means what 0 means on plain."""
        transport = self.transport
        if transport is not None:
            transport.set_write_buffer_limits(high=1 if self._tls else 0, low=0)

    @property
    def tls(self) -> bool:
        """The connection is under the event loop's TLS layer (write with write_tls)."""
        return self._tls

    async def write_tls(self, parts: Sequence[bytes | memoryview]) -> None:
        """Write the buffers of one answer to a TLS connection: in pieces of at most 64 KiB,
        each once the transport is not paused (see the module's docstring). Raises
        ConnectionError once the connection is lost (the rest is dropped)."""
        for part in parts:
            view = memoryview(part)
            for start in range(0, len(view), _TLS_WRITE_CHUNK):
                if self._writing_paused or self._lost:
                    await self.drain()
                self.write(view[start : start + _TLS_WRITE_CHUNK])

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

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def peer(self) -> str:
        return self._peer
