"""A connection's responses, in request order: the pipeline of answers and its writer.

Kafka clients pipeline requests and expect responses in request order. Each request is handled
in its own task; the listener puts each task (or an answer it made itself) in the connection's
`ResponsePipeline` in arrival order, and `send_responses` writes them in that order as each is
ready. An answer is an encoded response (one buffer, or several written in order), None for none
(acks=0), or `CLOSE` (the handler failed: the connection is closed at its turn), with the bytes
charged for it; the writer gives those bytes back once the transport has passed them on to the
socket (`settle_written`), or at once when nothing is sent.

Must not touch: reading or decoding requests, the bounds on them (server/listener.py), or what
a response says (the handlers).
"""

from __future__ import annotations

import asyncio
import contextlib

from tidalmq_broker.server.connection import Connection, resolve_waiter
from tidalmq_broker.server.framing import FrameProtocol


class CloseConnection:
    """What a failed handler answers: the sender closes the connection instead of writing."""


CLOSE = CloseConnection()

EncodedResponse = bytes | list[bytes | memoryview] | CloseConnection | None
"""An encoded response frame (one buffer, or several to write in order), None for none, or
CLOSE."""

Answer = tuple[EncodedResponse, int]
"""A response and the bytes charged for it to the connection and the response budget."""


async def send_responses(
    proto: FrameProtocol,
    responses: ResponsePipeline,
    conn: Connection,
) -> None:
    """The connection's writer: sends the answers in request order as each is ready, and
    counts what the transport passed on to the socket as taken by the client."""
    while True:
        fut = await responses.get()
        if fut is None:
            return
        data, charged = await fut
        if isinstance(data, CloseConnection):
            # the handler failed unexpectedly (logged there): close, as Kafka would
            conn.release_response(charged)
            proto.close()
            return
        if data is None or proto.lost:
            conn.release_response(charged)  # nothing to send, or nobody to send it to
            continue
        if proto.tls:
            # in pieces, each while the transport is not paused: the TLS layer's buffer
            # size leaves out what it passed on (server/framing.py)
            try:
                await proto.write_tls(data if isinstance(data, list) else (data,))
            except ConnectionError:
                pass  # lost: the rest is dropped, its bytes released just below
            except BaseException:
                conn.release_response(charged)  # cancelled halfway: not in _written yet
                raise
        elif isinstance(data, list):
            # one write per buffer: the transport sends what the socket takes at once and
            # copies only the rest, instead of joining megabytes of records first
            for part in data:
                proto.write(part)
        else:
            proto.write(data)
        del data
        conn._written += charged
        settle_written(conn, proto)
        if proto.write_buffer_size() > 1 << 20 or responses.empty():
            with contextlib.suppress(ConnectionError):  # lost: the next ones are dropped
                await proto.drain()
            settle_written(conn, proto)


class ResponsePipeline:
    """The answers of one connection in request order, for its one writer (the receive loop)
    and one reader (the sender): the part of asyncio.Queue the listener uses, without its
    three deques and its event (with those, an idle connection held 4 KiB more). put_nowait
    never refuses (the None that ends the sender)."""

    __slots__ = ("_getter", "_items", "_max", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._items: list[asyncio.Future[Answer] | None] = []
        self._max = maxsize
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: asyncio.Future[Answer] | None) -> None:
        self._items.append(item)
        if self._getter is not None:
            resolve_waiter(self._getter)
            self._getter = None

    async def put(self, item: asyncio.Future[Answer] | None) -> None:
        while len(self._items) >= self._max:
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None
        self.put_nowait(item)

    def get_nowait(self) -> asyncio.Future[Answer] | None:
        item = self._items.pop(0)
        if self._putter is not None:
            resolve_waiter(self._putter)
        return item

    async def get(self) -> asyncio.Future[Answer] | None:
        while not self._items:
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        return self.get_nowait()


def settle_written(conn: Connection, proto: FrameProtocol) -> None:
    """Response bytes the transport has passed on to the socket leave the connection's count
    and the budget (what is still in its buffer stays counted)."""
    written = conn._written
    if not written:
        return
    sent = written - min(written, proto.write_buffer_size())
    if sent:
        conn._written = written - sent
        conn.release_response(sent)


def response_size(response: EncodedResponse) -> int:
    if isinstance(response, list):
        return sum(len(part) for part in response)
    if isinstance(response, bytes | bytearray | memoryview):
        return len(response)
    return 0


def answered_with(response: EncodedResponse) -> asyncio.Future[Answer]:
    fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
    fut.set_result((response, 0))
    return fut
