"""The Kafka listener: framing, per-connection pipelining and ordered responses.

Kafka clients pipeline requests on one connection (up to max.in.flight) and expect responses in
request order. Each request is handled in its own task, started in arrival order; a writer task
sends the responses in the same order. Handlers that must observe arrival order (Produce appends)
do their ordering-sensitive work before their first suspension point, which asyncio runs in the
order the tasks were created.

Bad input never takes the broker down: an oversize or negative frame size, an undecodable frame
or an unknown API key closes that one connection (as Kafka does); an unsupported ApiVersions
version is answered with UNSUPPORTED_VERSION and the versions we serve. Each such error, and a
handler that fails on what it was sent, is one log line, rate-limited (server/ratelog.py); the
handler's traceback is logged at DEBUG only. A handler's task never ends in an exception (the
sender closes the connection at its turn), so nothing is left for asyncio to report as
"never retrieved".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tidalmq_broker.protocol.codec import (
    API_VERSIONS_KEY,
    MalformedRequest,
    Request,
    UnsupportedApi,
    UnsupportedVersion,
    decode_request,
    encode_response,
    encode_response_parts,
)
from tidalmq_broker.server.framing import FrameProtocol, FrameSizeError
from tidalmq_broker.server.ratelog import REQUEST_ERRORS, describe

log = logging.getLogger(__name__)


Handler = Callable[[Request, "Connection"], Awaitable[Any]]
"""Returns the response body (dict, kio entity or fastpath.EncodedBody), or None to send no
response (acks=0)."""


class _Close:
    """What a failed handler answers: the sender closes the connection instead of writing."""


_CLOSE = _Close()

_Response = bytes | list[bytes | memoryview] | _Close | None
"""An encoded response frame (one buffer, or several to write in order), None for none, or
_CLOSE."""


@dataclass(slots=True)
class Connection:
    peer: str
    client_id: str | None = None
    requests: int = 0
    inflight_bytes: int = 0  # request bytes read and not yet answered
    _room: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    max_request_bytes: int = 100 * 1024 * 1024  # socket.request.max.bytes
    max_inflight_per_connection: int = 32
    # Requests pipelined on one connection are read only while those in flight add up to less
    # than this (one larger request is still read when nothing else is in flight): a produce
    # request stays in memory until its WAL object is durable, so with 32 in flight of 1 MiB
    # each, two producers alone held ~130 MB in the broker.
    max_inflight_bytes_per_connection: int = 16 * 1024 * 1024
    idle_timeout_s: float = 600.0  # connections.max.idle.ms


class RequestObserver:
    """Hook for metrics: called once per handled request."""

    def observe(self, api_key: int, seconds: float, request_bytes: int, error: bool) -> None:
        pass


class KafkaListener:
    def __init__(
        self,
        dispatch: Callable[[int], Handler | None],
        supported_versions: Callable[[], dict[int, tuple[int, int]]],
        api_versions_error_body: Callable[[], dict[str, Any]],
        *,
        limits: ListenerLimits | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._supported_versions = supported_versions
        self._api_versions_error_body = api_versions_error_body
        self._limits = limits or ListenerLimits()
        self._observer = observer or RequestObserver()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._accepting = True

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_protocol, host, port, reuse_address=True)

    def _new_protocol(self) -> FrameProtocol:
        return FrameProtocol(
            self._limits.max_request_bytes,
            max_queued_bytes=self._limits.max_inflight_bytes_per_connection // 2,
            on_connected=self._connected,
        )

    def _connected(self, proto: FrameProtocol) -> None:
        task = asyncio.get_running_loop().create_task(self._on_connection(proto))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting connections and requests, and wait for in-flight requests."""
        self._accepting = False
        if self._server is not None:
            self._server.close()
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=timeout_s)

    async def close(self) -> None:
        self._accepting = False
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # ------------------------------------------------------------------ connection
    async def _on_connection(self, proto: FrameProtocol) -> None:
        conn = Connection(peer=proto.peer())
        responses: asyncio.Queue[asyncio.Future[_Response] | None] = asyncio.Queue(
            maxsize=self._limits.max_inflight_per_connection
        )
        sender = asyncio.create_task(self._send_loop(proto, responses, conn))
        try:
            await self._receive_loop(proto, conn, responses)
        except ConnectionError:
            pass
        except FrameSizeError as exc:
            limit = self._limits.max_request_bytes
            msg = "closing connection from %s: request size %d outside 1..%d"
            REQUEST_ERRORS.warning(log, msg, conn.peer, exc.size, limit)
        except TimeoutError:
            log.debug("closing idle connection from %s", conn.peer)
        except asyncio.CancelledError:
            sender.cancel()
            raise
        except Exception as exc:  # a bug on this connection's path: this connection only
            msg = "closing connection from %s (%r): %s"
            REQUEST_ERRORS.error(log, msg, conn.peer, conn.client_id, describe(exc))
            log.debug("connection from %s failed", conn.peer, exc_info=True)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                responses.put_nowait(None)
            if not sender.done():
                # let queued responses go out, unless the peer is gone
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(sender), timeout=30)
            sender.cancel()
            with contextlib.suppress(Exception):
                proto.close()

    async def _receive_loop(
        self,
        proto: FrameProtocol,
        conn: Connection,
        responses: asyncio.Queue[asyncio.Future[_Response] | None],
    ) -> None:
        limits = self._limits
        max_bytes = limits.max_inflight_bytes_per_connection
        while self._accepting:
            while conn.inflight_bytes >= max_bytes:
                conn._room.clear()
                await conn._room.wait()
            # pipelined requests are usually buffered already: take them without the task and
            # timer that wait_for costs
            frame = proto.frame_nowait()
            if frame is None:
                frame = await asyncio.wait_for(proto.next_frame(), limits.idle_timeout_s)
            size = len(frame)
            try:
                request = decode_request(frame, self._supported_versions())
            except UnsupportedVersion as exc:
                if exc.api_key == API_VERSIONS_KEY:
                    # KIP-511: answer in v0 so the client learns what we support
                    body = self._api_versions_error_body()
                    fut: asyncio.Future[_Response] = asyncio.get_running_loop().create_future()
                    fut.set_result(encode_response(API_VERSIONS_KEY, 0, exc.correlation_id, body))
                    await responses.put(fut)
                    continue
                REQUEST_ERRORS.warning(log, "closing connection from %s: %s", conn.peer, exc)
                return
            except UnsupportedApi as exc:
                REQUEST_ERRORS.warning(log, "closing connection from %s: %s", conn.peer, exc)
                return
            except MalformedRequest as exc:
                msg = "closing connection from %s: malformed request: %s (first bytes %s)"
                REQUEST_ERRORS.warning(log, msg, conn.peer, exc, bytes(frame[:48]).hex())
                return
            conn.client_id = request.client_id
            conn.requests += 1
            handler = self._dispatch(request.api_key)
            assert handler is not None  # decode_request checked the key
            task = asyncio.create_task(self._handle(handler, request, conn))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            conn.inflight_bytes += size
            task.add_done_callback(lambda _t, n=size: _answered(conn, n))
            await responses.put(task)

    async def _handle(self, handler: Handler, request: Request, conn: Connection) -> _Response:
        started = time.perf_counter()
        error = False
        try:
            body = await handler(request, conn)
            if body is None:
                return None
            return encode_response_parts(
                request.api_key, request.api_version, request.correlation_id, body
            )
        except Exception as exc:
            error = True
            msg = "api %d v%d from %s (%r) failed; closing the connection: %s"
            api = (request.api_key, request.api_version)
            REQUEST_ERRORS.error(log, msg, *api, conn.peer, conn.client_id, describe(exc))
            log.debug("api %d v%d from %s failed", *api, conn.peer, exc_info=True)
            return _CLOSE
        finally:
            self._observer.observe(
                request.api_key, time.perf_counter() - started, request.size, error
            )

    async def _send_loop(
        self,
        proto: FrameProtocol,
        responses: asyncio.Queue[asyncio.Future[_Response] | None],
        conn: Connection,
    ) -> None:
        while True:
            fut = await responses.get()
            if fut is None:
                return
            data = await fut
            if isinstance(data, _Close):
                # the handler failed unexpectedly (logged there): close, as Kafka would
                proto.close()
                return
            if data is None:
                continue
            if isinstance(data, list):
                # one write per buffer: the transport sends what the socket takes at once and
                # copies only the rest, instead of joining megabytes of records first
                for part in data:
                    proto.write(part)
            else:
                proto.write(data)
            if proto.write_buffer_size() > 1 << 20 or responses.empty():
                await proto.drain()


def _answered(conn: Connection, size: int) -> None:
    conn.inflight_bytes -= size
    conn._room.set()
