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

Listeners (Kafka's `listeners`): one server socket per endpoint, each with its listener name and
security protocol (security/listeners.py). On SSL and SASL_SSL endpoints the event loop's TLS
layer does the handshake before the connection starts (at most `tls_handshake_timeout_s`; a
failed one is one rate-limited line); an SSL connection's principal is its client certificate's
mapped DN, or User:ANONYMOUS without one. On SASL_PLAINTEXT and SASL_SSL endpoints nothing but ApiVersions,
SaslHandshake and SaslAuthenticate is served until the client has authenticated (anything else
closes the connection, as Kafka does), frames are at most 512 KiB meanwhile (Kafka's
sasl.server.max.receive.size), and those requests are handled one at a time, each before the
next frame is read: the exchange decides how the next frame is read (after a SaslHandshake v0
the tokens come as raw frames, security/sasl.py). `Connection.principal` is who the client is
(User:ANONYMOUS on PLAINTEXT) and `Connection.host` its address: what the handlers authorize
(security/authorizer.py).

Bounds ([R1] item 2; docs/limits.md lists each with its default and why):
- connections: at most `max_connections` in all and `max_connections_per_ip` from one client
  address (Kafka's max.connections, max.connections.per.ip and its overrides); one more is
  closed as soon as it is accepted, with a rate-limited line (server/ratelog.py) and a counter.
  On TLS listeners a connection counts from the end of its handshake (bounded by
  `tls_handshake_timeout_s`).
- idle connections: closed after `idle_timeout_s` without a byte read or sent
  (connections.max.idle.ms), checked by one sweep a second, not a timer per connection.
- requests: at most `max_inflight_per_connection` requests and
  `max_inflight_bytes_per_connection` bytes in flight per connection, and the broker-wide request
  budget (`queued_max_request_bytes`, server/budget.py) over frames being read and requests not
  yet answered: a connection that would take it past its limit stops reading until requests
  finish. A request in flight counts at least `REQUEST_FLOOR_BYTES` (what its objects hold),
  so hundreds of tiny pipelined requests are bounded by bytes too, not only by their count.
- responses: the responses of a connection not yet taken by its client (being built, queued, or
  in the transport's buffer) never pass `max_response_bytes_per_connection`: Fetch asks
  `Connection.response_room()` before it reads and reads no more (apis/fetch.py). Once they reach
  three quarters of it the connection is muted, as Kafka mutes a channel: its requests are not
  read until the client has taken them down to half. Every response byte is also charged to the
  broker-wide response budget (`queued_max_response_bytes`), which Fetch's room includes.
A closed connection gives all of its bytes back at once; nothing of it waits for the cyclic
garbage collector (no exception is stored, no callback keeps the protocol, no timer task).

This module owns: the server sockets, accepting and refusing connections, the idle sweep,
reading and decoding frames with their bounds, authentication before anything else is served,
and running each request's handler. Beside it: server/connection.py (a connection's identity
and response-byte accounting), server/responses.py (the ordered answers and their writer),
server/listener_config.py (endpoints, limits, the metrics hook). Must not touch: what a request
means (the Kafka API handlers, apis/) or the broker's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from time import thread_time
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
    peek_header,
)
from tidalmq_broker.security import failures
from tidalmq_broker.security.authorizer import canonical_host
from tidalmq_broker.security.listeners import PLAINTEXT
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.security.sasl import (
    SaslAuthenticator,
    SaslFailure,
    SaslStateError,
    log_failure,
)
from tidalmq_broker.security.tls import handshake_reporting, subject_dn
from tidalmq_broker.server import heap
from tidalmq_broker.server.budget import MemoryBudget
from tidalmq_broker.server.connection import (
    RESPONSE_CHARGE,
    Connection,
    ResponseCharge,
    resolve_waiter,
)
from tidalmq_broker.server.cpu import Metered, RequestCpu
from tidalmq_broker.server.framing import FrameProtocol, FrameSizeError, SharedScratch
from tidalmq_broker.server.listener_config import (
    ListenerEndpoint,
    ListenerLimits,
    RequestObserver,
    client_address,
)
from tidalmq_broker.server.ratelog import CONNECTION_LIMITS, REQUEST_ERRORS, describe
from tidalmq_broker.server.responses import (
    CLOSE,
    Answer,
    CloseConnection,
    ResponsePipeline,
    answered_with,
    response_size,
    send_responses,
    settle_written,
)

log = logging.getLogger(__name__)


Handler = Callable[[Request, "Connection"], Awaitable[Any]]
"""Returns the response body (dict, kio entity or fastpath.EncodedBody), or None to send no
response (acks=0)."""


SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
# what a connection that must authenticate may send before it has (Kafka's
# SaslServerAuthenticator: anything else closes the connection)
PRE_AUTHENTICATION_APIS = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})
SASL_MAX_RECEIVE_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size
_SIZE = struct.Struct(">i")
# What a request in flight holds at least, whatever the size of its frame: its decoded form,
# its task, its response's place in the pipeline (about 4.7 KB of Python objects for a
# pipelined 88-byte Fetch, tracemalloc, 2026-11-28). Charged to the connection's bytes in
# flight and to the broker's request budget instead of the frame's size when larger, so those
# byte bounds also bound what many tiny requests hold: 256 in flight on each of 4,096
# connections would otherwise hold ~4.9 GB that no budget counts (docs/limits.md).
REQUEST_FLOOR_BYTES = 4096


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
        limits = limits or ListenerLimits()
        self._limits = limits
        self._observer = observer or RequestObserver()
        self._servers: list[tuple[ListenerEndpoint, asyncio.Server]] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._accepting = True
        self._scratch = SharedScratch()  # one read buffer for every connection
        self.request_budget = (
            MemoryBudget("request", limits.queued_max_request_bytes, slack=limits.max_request_bytes)
            if limits.queued_max_request_bytes > 0
            else None
        )
        self.response_budget = (
            MemoryBudget("response", limits.queued_max_response_bytes)
            if limits.queued_max_response_bytes > 0
            else None
        )
        self._per_ip: Counter[str] = Counter()
        self._ip_caps = {
            client_address(k): v for k, v in limits.max_connections_per_ip_overrides.items()
        }
        self._protocols: set[FrameProtocol] = set()  # open connections (the idle sweep)
        self._sweeper: asyncio.Task[None] | None = None
        self.muted = 0  # connections muted now (their clients do not read their responses)
        self.refused: Counter[str] = Counter()  # connections refused at a cap, by reason
        self.idle_closed = 0
        self._trimmer = heap.AfterCloses()  # gives the heap back after a wave of closes

    @property
    def port(self) -> int:
        """The port of the first endpoint (the only one of a broker without `listeners`)."""
        return self.ports[self._servers[0][0].name]

    @property
    def ports(self) -> dict[str, int]:
        """Listener name -> the port its socket is bound to."""
        return {e.name: int(srv.sockets[0].getsockname()[1]) for e, srv in self._servers}

    @property
    def connection_count(self) -> int:
        return len(self._protocols)

    @property
    def limits(self) -> ListenerLimits:
        return self._limits

    def buffered_bytes(self) -> dict[str, int]:
        """Bytes the connections hold now, by kind (the budgets' view; for metrics)."""
        return {
            "request": self.request_budget.used if self.request_budget else 0,
            "response": self.response_budget.used if self.response_budget else 0,
        }

    async def start(self, host: str, port: int) -> None:
        """One PLAINTEXT endpoint (tests, tools)."""
        await self.start_endpoints([ListenerEndpoint(PLAINTEXT, host, port, PLAINTEXT)])

    async def start_endpoints(self, endpoints: list[ListenerEndpoint]) -> None:
        loop = asyncio.get_running_loop()
        try:
            for endpoint in endpoints:
                tls = endpoint.ssl_context
                if tls is not None:  # a failed handshake is one rate-limited line
                    tls.sslobject_class = handshake_reporting(endpoint.name, _tls_failed)
                server = await loop.create_server(
                    lambda e=endpoint: self._new_protocol(e),
                    endpoint.host or None,
                    endpoint.port,
                    reuse_address=True,
                    ssl=tls,
                    ssl_handshake_timeout=self._limits.tls_handshake_timeout_s if tls else None,
                    backlog=1024,
                )
                self._servers.append((endpoint, server))
                failures.expected(
                    endpoint.name, tls=tls is not None, sasl=endpoint.sasl is not None
                )
        except BaseException:
            for _, server in self._servers:
                server.close()
            self._servers.clear()
            raise
        if self._sweeper is None and self._limits.idle_timeout_s > 0:
            self._sweeper = loop.create_task(self._sweep_idle(), name="idle connections")

    def _new_protocol(self, endpoint: ListenerEndpoint) -> FrameProtocol:
        return FrameProtocol(
            self._limits.max_request_bytes,
            max_queued_bytes=self._limits.max_inflight_bytes_per_connection // 2,
            on_connected=lambda proto: self._connected(proto, endpoint),
            tls=endpoint.ssl_context is not None,
            scratch=self._scratch,
            budget=self.request_budget,
        )

    def _connected(self, proto: FrameProtocol, endpoint: ListenerEndpoint) -> None:
        host = proto.peer().rsplit(":", 1)[0].strip("[]")
        address = client_address(host)
        refused = self._admit(address)
        if refused is not None:
            self.refused[refused] += 1
            self._observer.connection_refused(refused)
            msg = "refusing connection from %s on listener %s: %s"
            CONNECTION_LIMITS.warning(
                log, msg, proto.peer(), endpoint.name, self._why(refused, address)
            )
            proto.close()
            return
        self._per_ip[address] += 1
        self._protocols.add(proto)
        task = asyncio.get_running_loop().create_task(self._on_connection(proto, endpoint))
        self._connections.add(task)
        task.add_done_callback(lambda t: self._disconnected(t, proto, address))

    def _admit(self, address: str) -> str | None:
        """None, or why a new connection from `address` is refused."""
        limits = self._limits
        if limits.max_connections and len(self._protocols) >= limits.max_connections:
            return "max_connections"
        cap = self._ip_caps.get(address, limits.max_connections_per_ip)
        if cap and self._per_ip[address] >= cap:
            return "max_connections_per_ip"
        return None

    def _why(self, reason: str, address: str) -> str:
        if reason == "max_connections":
            return f"{len(self._protocols)} connections open (max.connections {self._limits.max_connections})"
        cap = self._ip_caps.get(address, self._limits.max_connections_per_ip)
        return f"{self._per_ip[address]} connections from {address} (max.connections.per.ip {cap})"

    def _disconnected(self, task: asyncio.Task[None], proto: FrameProtocol, address: str) -> None:
        self._trimmer.closed()
        self._connections.discard(task)
        self._protocols.discard(proto)
        left = self._per_ip[address] - 1
        if left > 0:
            self._per_ip[address] = left
        else:
            del self._per_ip[address]

    async def _sweep_idle(self) -> None:
        """Close connections that neither read nor sent a byte for idle_timeout_s; after a
        wave of closes, give the freed heap back (server/heap.py)."""
        timeout = self._limits.idle_timeout_s
        interval = min(1.0, max(timeout / 10, 0.05))
        while True:
            await asyncio.sleep(interval)
            closed = self._trimmer.pending
            released = self._trimmer.tick(time.monotonic())
            if released is not None:
                msg = "%d connections closed: heap released (full collection %.1f ms, trim %.1f ms)"
                log.info(msg, closed, released.collect_s * 1e3, released.trim_s * 1e3)
            deadline = time.monotonic() - timeout
            idle = [p for p in self._protocols if p.last_active < deadline and not p.lost]
            for proto in idle:
                log.debug("closing connection from %s: idle for %.0fs", proto.peer(), timeout)
                self.idle_closed += 1
                self._observer.connection_closed("idle")
                proto.abort()  # close() would wait for a client that does not read

    def _close_servers(self) -> None:
        for _, server in self._servers:
            server.close()

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting connections and requests, and wait for in-flight requests. No
        connection takes a request after this: one waiting for its next request is closed at
        once, one with requests in flight once their answers are out.

        Each receive loop used to wait for its connection's next request, answer it and then
        close the connection right behind that answer. A client's next request is often a
        Metadata request (leader queries follow the errors of a stopping broker), and
        librdkafka (2.16) handles a Metadata answer that arrives together with the loss of its
        last broker after it has scheduled the re-bootstrap that loss calls for: the answer
        cancels it, and the client never goes back to bootstrap.servers. When every broker is
        replaced at once (a node drained, brokers advertising pod IPs), its records then time
        out (docs/testing.md, "Known failing" of 2026-11-28)."""
        self._accepting = False
        self._close_servers()
        for proto in list(self._protocols):
            proto.stop_requests("the broker is stopping")
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=timeout_s)

    async def close(self) -> None:
        self._accepting = False
        self._close_servers()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        for _, server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    # ------------------------------------------------------------------ connection
    async def _on_connection(self, proto: FrameProtocol, endpoint: ListenerEndpoint) -> None:
        peer = proto.peer()
        conn = Connection(
            peer=peer,
            listener=endpoint.name,
            security_protocol=endpoint.security_protocol,
            host=canonical_host(peer.rsplit(":", 1)[0]),
            _responses=self.response_budget,
            _max_response_bytes=self._limits.max_response_bytes_per_connection,
        )
        proto._on_drained = lambda: settle_written(
            conn, proto
        )  # cleared when the connection is lost
        conn._on_mute = lambda muted: self._mute(proto, muted)  # cleared by _closed
        # told (resume_writing) each time the transport's buffer is empty again, not only
        # below 16 KiB: the response bytes it held are then released exactly
        proto.report_every_flush()
        tls_only = endpoint.ssl_context is not None and endpoint.sasl is None
        if tls_only and not self._tls_principal(proto, endpoint, conn):
            proto.close()
            return
        if endpoint.sasl is not None:
            conn.sasl = SaslAuthenticator(endpoint.sasl)
            conn.authenticated = False
            proto.set_max_frame(min(SASL_MAX_RECEIVE_BYTES, self._limits.max_request_bytes))
        responses = ResponsePipeline(self._limits.max_inflight_per_connection)
        sender = asyncio.create_task(send_responses(proto, responses, conn))
        try:
            await self._receive_loop(proto, conn, responses)
        except ConnectionError:
            pass
        except FrameSizeError as exc:
            if conn.authenticated:
                limit = self._limits.max_request_bytes
                msg = "closing connection from %s: request size %d outside 1..%d"
                REQUEST_ERRORS.warning(log, msg, conn.peer, exc.size, limit)
            else:
                msg = (
                    "closing connection from %s on listener %s: a frame of %d bytes before "
                    "authentication (at most %d: sasl.server.max.receive.size)"
                )
                failures.record(
                    conn.listener,
                    "unauthenticated_request",
                    msg,
                    conn.peer,
                    conn.listener,
                    exc.size,
                    SASL_MAX_RECEIVE_BYTES,
                )
        except asyncio.CancelledError:
            sender.cancel()
            self._closed(conn, responses)
            raise
        except Exception as exc:  # a bug on this connection's path: this connection only
            msg = "closing connection from %s (%r): %s"
            REQUEST_ERRORS.error(log, msg, conn.peer, conn.client_id, describe(exc))
            log.debug("connection from %s failed", conn.peer, exc_info=True)
        finally:
            responses.put_nowait(None)
            if not sender.done() and not proto.lost:
                # let queued responses go out, unless the peer is gone
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(sender), timeout=30)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            self._closed(conn, responses)
            if proto.write_buffer_size():
                proto.abort()  # its client does not read: what is left is dropped, as Kafka does
            else:
                proto.close()

    def _mute(self, proto: FrameProtocol, muted: bool) -> None:
        """Kafka's muted channel: the socket of a connection whose client has not taken 3/4 of
        max_response_bytes_per_connection is not read until it has taken them down to half."""
        if muted:
            self.muted += 1
            proto.mute()
        else:
            self.muted -= 1
            proto.unmute()

    def _closed(self, conn: Connection, responses: ResponsePipeline) -> None:
        """The connection is over: every response byte it still holds goes back to the budget
        (answers still being built give theirs back when they finish: conn.closed)."""
        if conn.closed:
            return
        conn.closed = True
        while not responses.empty():
            item = responses.get_nowait()
            if item is not None and item.done() and not item.cancelled():
                conn.release_response(item.result()[1])
        conn.release_response(conn._written)
        conn._written = 0
        if conn.muted:
            conn._set_muted(False)
        conn._on_mute = None
        conn._wake_room()

    def _tls_principal(
        self, proto: FrameProtocol, endpoint: ListenerEndpoint, conn: Connection
    ) -> bool:
        """An SSL connection's principal: its client certificate's DN, mapped (no certificate:
        User:ANONYMOUS). False: no mapping rule applies (the connection is refused)."""
        transport = proto.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return True
        mapper = endpoint.principal_mapper or PrincipalMapper()
        dn = ""
        try:
            dn = subject_dn(der)
            conn.principal = "User:" + mapper.name(dn)
        except ValueError as exc:  # NoMatchingRule, or a certificate we cannot read
            msg = "closing connection from %s on listener %s: no principal for %r: %s"
            failures.record(endpoint.name, "principal", msg, conn.peer, endpoint.name, dn, exc)
            return False
        return True

    async def _decode(
        self,
        frame: bytes | memoryview,
        conn: Connection,
        responses: ResponsePipeline,
    ) -> Request | bool:
        """The request in `frame`; True when it was answered already (an ApiVersions version
        we do not serve), False when the connection must close (logged)."""
        try:
            return decode_request(frame, self._supported_versions())
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                # KIP-511: answer in v0 so the client learns what we support
                body = self._api_versions_error_body()
                answer = encode_response(API_VERSIONS_KEY, 0, exc.correlation_id, body)
                await responses.put(answered_with(answer))
                return True
            REQUEST_ERRORS.warning(log, "closing connection from %s: %s", conn.peer, exc)
            return False
        except UnsupportedApi as exc:
            REQUEST_ERRORS.warning(log, "closing connection from %s: %s", conn.peer, exc)
            return False
        except MalformedRequest as exc:
            msg = "closing connection from %s: malformed request: %s (first bytes %s)"
            REQUEST_ERRORS.warning(log, msg, conn.peer, exc, bytes(frame[:48]).hex())
            return False

    async def _before_authentication(
        self,
        proto: FrameProtocol,
        conn: Connection,
        frame: bytes | memoryview,
        responses: ResponsePipeline,
    ) -> bool:
        """One frame of a connection that has not authenticated yet, handled before the next
        is read. False: close the connection (after what was queued)."""
        sasl = conn.sasl
        assert sasl is not None
        if sasl.state == sasl.RAW:  # after SaslHandshake v0: the frame is a bare token
            try:
                token = await sasl.authenticate(bytes(frame))
            except SaslFailure as exc:
                log_failure(conn.peer, conn.listener, sasl, exc.reason)
                return await self._refused()  # v0 has no way to say why: Kafka closes too
            except SaslStateError as exc:
                log_failure(conn.peer, conn.listener, sasl, str(exc))
                return await self._refused()
            if sasl.state == sasl.DONE:
                assert sasl.principal is not None
                conn.principal = sasl.principal
                conn.authenticated = True
            await responses.put(answered_with(_SIZE.pack(len(token)) + token))
            return self._after_request(proto, conn) or await self._refused()
        try:
            api_key, _version, _correlation_id = peek_header(frame)
        except MalformedRequest as exc:
            msg = "closing connection from %s: malformed request: %s"
            REQUEST_ERRORS.warning(log, msg, conn.peer, exc)
            return False
        if api_key not in PRE_AUTHENTICATION_APIS:
            msg = (
                "closing connection from %s on listener %s: unexpected Kafka request of api "
                "key %d during SASL handshake (not authenticated)"
            )
            failures.record(
                conn.listener, "unauthenticated_request", msg, conn.peer, conn.listener, api_key
            )
            return False
        request = await self._decode(frame, conn, responses)
        if isinstance(request, bool):
            return request
        conn.client_id = request.client_id
        conn.requests += 1
        handler = self._dispatch(request.api_key)
        assert handler is not None
        answer = await self._handle(handler, request, conn)
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        fut.set_result(answer)
        await responses.put(fut)
        if isinstance(answer[0], CloseConnection):
            return False
        return self._after_request(proto, conn) or await self._refused()

    def _after_request(self, proto: FrameProtocol, conn: Connection) -> bool:
        if conn.close_after_response:
            return False
        if conn.authenticated:  # full-size requests from now on
            proto.set_max_frame(self._limits.max_request_bytes)
        return True

    async def _refused(self) -> bool:
        """Close a connection that failed to authenticate, after Kafka's delay."""
        await asyncio.sleep(self._limits.failed_authentication_delay_s)
        return False

    def _release_request(self, size: int) -> None:
        """A request read from a connection is answered (or dropped): its bytes leave the
        request budget."""
        if self.request_budget is not None:
            self.request_budget.release(size, complete=True)

    async def _receive_loop(
        self,
        proto: FrameProtocol,
        conn: Connection,
        responses: ResponsePipeline,
    ) -> None:
        limits = self._limits
        max_bytes = limits.max_inflight_bytes_per_connection
        while self._accepting:
            while conn.inflight_bytes >= max_bytes:
                conn._room = asyncio.get_running_loop().create_future()
                await conn._room
            # pipelined requests are usually buffered already: take them without waiting
            frame = proto.frame_nowait()
            if frame is None:
                frame = await proto.next_frame()
            received = time.perf_counter()
            decoding = thread_time()
            size = len(frame)
            if not conn.authenticated:
                try:
                    if not await self._before_authentication(proto, conn, frame, responses):
                        return
                finally:
                    self._release_request(size)
                continue
            request = await self._decode(frame, conn, responses)
            if isinstance(request, bool):
                self._release_request(size)
                if request:
                    continue
                return
            del frame  # a produce request's records are views of it: they keep it
            conn.client_id = request.client_id
            conn.requests += 1
            handler = self._dispatch(request.api_key)
            assert handler is not None  # decode_request checked the key
            # the request's CPU: its decoding so far, then each step of its handler's task
            cpu = RequestCpu(thread_time() - decoding)
            task = asyncio.create_task(Metered(self._handle(handler, request, conn, received), cpu))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            # a request in flight holds at least REQUEST_FLOOR_BYTES, whatever its frame's size
            charged = max(size, REQUEST_FLOOR_BYTES)
            if charged > size and self.request_budget is not None:
                self.request_budget.charge(charged - size, complete=True)
            conn.inflight_bytes += charged
            task.add_done_callback(
                functools.partial(self._answered, conn, charged, request.api_key, cpu)
            )
            await responses.put(task)
            del task  # an idle connection keeps no answered request

    def _answered(
        self,
        conn: Connection,
        size: int,
        api_key: int,
        cpu: RequestCpu,
        _task: object = None,
    ) -> None:
        """A request charged `size` bytes answered (called as its task's done callback): its
        bytes leave the bounds, its CPU time (every step of its task) goes to the metrics."""
        self._observer.cpu(api_key, cpu.seconds)
        conn.inflight_bytes -= size
        if conn._room is not None:
            resolve_waiter(conn._room)
            conn._room = None
        self._release_request(size)

    async def _handle(
        self, handler: Handler, request: Request, conn: Connection, received: float = 0.0
    ) -> Answer:
        started = time.perf_counter()
        if received:
            self._observer.queued(request.api_key, started - received)
        error = False
        charge = ResponseCharge()
        token = RESPONSE_CHARGE.set(charge)
        answered = False
        try:
            body = await handler(request, conn)
            if body is None:
                answered = True
                return None, charge.bytes
            response = encode_response_parts(
                request.api_key, request.api_version, request.correlation_id, body
            )
            conn.charge_response(response_size(response) - charge.bytes)  # what the handler did not
            answered = True
            return response, charge.bytes
        except Exception as exc:
            error = True
            msg = "api %d v%d from %s (%r) failed; closing the connection: %s"
            api = (request.api_key, request.api_version)
            REQUEST_ERRORS.error(log, msg, *api, conn.peer, conn.client_id, describe(exc))
            log.debug("api %d v%d from %s failed", *api, conn.peer, exc_info=True)
            answered = True
            return CLOSE, charge.bytes
        finally:
            RESPONSE_CHARGE.reset(token)
            if not answered or conn.closed:
                # cancelled, or nobody will send it: its bytes go back now
                conn.release_response(charge.bytes)
                charge.bytes = 0
            self._observer.observe(
                request.api_key, time.perf_counter() - started, request.size, error
            )


def _tls_failed(listener: str, exc: ssl.SSLError) -> None:
    # the TLS layer does not know the peer's address: the listener and OpenSSL's reason
    reason = f"{exc.reason} ({exc.library})" if exc.reason else str(exc)
    failures.record(listener, "tls", "TLS handshake on listener %s failed: %s", listener, reason)
