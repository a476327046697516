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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
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
    peek_header,
)
from tidalmq_broker.security import failures
from tidalmq_broker.security.authorizer import canonical_host
from tidalmq_broker.security.listeners import PLAINTEXT
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.security.sasl import (
    ANONYMOUS,
    SaslAuthenticator,
    SaslConfig,
    SaslFailure,
    SaslStateError,
    log_failure,
)
from tidalmq_broker.security.tls import handshake_reporting, subject_dn
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


SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
# what a connection that must authenticate may send before it has (Kafka's
# SaslServerAuthenticator: anything else closes the connection)
PRE_AUTHENTICATION_APIS = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})
SASL_MAX_RECEIVE_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size
_SIZE = struct.Struct(">i")


@dataclass(slots=True)
class Connection:
    peer: str
    client_id: str | None = None
    requests: int = 0
    inflight_bytes: int = 0  # request bytes read and not yet answered
    _room: asyncio.Event = field(default_factory=asyncio.Event)
    listener: str = PLAINTEXT  # the listener name the client connected to
    security_protocol: str = PLAINTEXT
    principal: str = ANONYMOUS  # who the client is (Kafka's KafkaPrincipal, as a string)
    host: str = ""  # the client's IP address, as ACLs name hosts (security/authorizer.py)
    authenticated: bool = True  # False on a SASL listener until the exchange succeeded
    sasl: SaslAuthenticator | None = None  # the exchange, on SASL listeners
    close_after_response: bool = False  # a handler's verdict: answer, then close


@dataclass(frozen=True, slots=True)
class ListenerEndpoint:
    """One server socket of the Kafka listener."""

    name: str = PLAINTEXT
    host: str = "127.0.0.1"
    port: int = 9092
    security_protocol: str = PLAINTEXT
    ssl_context: ssl.SSLContext | None = None  # SSL and SASL_SSL
    sasl: SaslConfig | None = None  # SASL_PLAINTEXT and SASL_SSL
    principal_mapper: PrincipalMapper | None = None  # SSL: a certificate's DN -> principal


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
    tls_handshake_timeout_s: float = 10.0  # a client that has not finished it is dropped
    # connection.failed.authentication.delay.ms: a connection that failed to authenticate is
    # closed this long after its answer (which then reaches the client before the close, and
    # a password guesser waits)
    failed_authentication_delay_s: float = 0.1


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
        self._servers: list[tuple[ListenerEndpoint, asyncio.Server]] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._accepting = True

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
        return len(self._connections)

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
                    lambda e=endpoint: self._new_protocol(e),  # type: ignore[misc]
                    endpoint.host or None, endpoint.port, reuse_address=True, ssl=tls,
                    ssl_handshake_timeout=self._limits.tls_handshake_timeout_s if tls else None,
                )  # fmt: skip
                self._servers.append((endpoint, server))
        except BaseException:
            for _, server in self._servers:
                server.close()
            self._servers.clear()
            raise

    def _new_protocol(self, endpoint: ListenerEndpoint) -> FrameProtocol:
        return FrameProtocol(
            self._limits.max_request_bytes,
            max_queued_bytes=self._limits.max_inflight_bytes_per_connection // 2,
            on_connected=lambda proto: self._connected(proto, endpoint),
            tls=endpoint.ssl_context is not None,
        )

    def _connected(self, proto: FrameProtocol, endpoint: ListenerEndpoint) -> None:
        task = asyncio.get_running_loop().create_task(self._on_connection(proto, endpoint))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def _close_servers(self) -> None:
        for _, server in self._servers:
            server.close()

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting connections and requests, and wait for in-flight requests."""
        self._accepting = False
        self._close_servers()
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=timeout_s)

    async def close(self) -> None:
        self._accepting = False
        self._close_servers()
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
            peer=peer, listener=endpoint.name, security_protocol=endpoint.security_protocol,
            host=canonical_host(peer.rsplit(":", 1)[0]),
        )  # fmt: skip
        tls_only = endpoint.ssl_context is not None and endpoint.sasl is None
        if tls_only and not self._tls_principal(proto, endpoint, conn):
            proto.close()
            return
        if endpoint.sasl is not None:
            conn.sasl = SaslAuthenticator(endpoint.sasl)
            conn.authenticated = False
            proto.set_max_frame(min(SASL_MAX_RECEIVE_BYTES, self._limits.max_request_bytes))
        responses: asyncio.Queue[asyncio.Future[_Response] | None] = asyncio.Queue(
            maxsize=self._limits.max_inflight_per_connection
        )
        sender = asyncio.create_task(self._send_loop(proto, responses, conn))
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
                msg = ("closing connection from %s on listener %s: a frame of %d bytes before "
                       "authentication (at most %d: sasl.server.max.receive.size)")  # fmt: skip
                failures.record(conn.listener, "unauthenticated_request", msg, conn.peer,
                                conn.listener, exc.size, SASL_MAX_RECEIVE_BYTES)  # fmt: skip
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
        responses: asyncio.Queue[asyncio.Future[_Response] | None],
    ) -> Request | bool:
        """The request in `frame`; True when it was answered already (an ApiVersions version
        we do not serve), False when the connection must close (logged)."""
        try:
            return decode_request(frame, self._supported_versions())
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                # KIP-511: answer in v0 so the client learns what we support
                body = self._api_versions_error_body()
                fut: asyncio.Future[_Response] = asyncio.get_running_loop().create_future()
                fut.set_result(encode_response(API_VERSIONS_KEY, 0, exc.correlation_id, body))
                await responses.put(fut)
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
        responses: asyncio.Queue[asyncio.Future[_Response] | None],
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
            await responses.put(_answered_with(_SIZE.pack(len(token)) + token))
            return self._after_request(proto, conn) or await self._refused()
        try:
            api_key, _version, _correlation_id = peek_header(frame)
        except MalformedRequest as exc:
            msg = "closing connection from %s: malformed request: %s"
            REQUEST_ERRORS.warning(log, msg, conn.peer, exc)
            return False
        if api_key not in PRE_AUTHENTICATION_APIS:
            msg = ("closing connection from %s on listener %s: unexpected Kafka request of api "
                   "key %d during SASL handshake (not authenticated)")  # fmt: skip
            failures.record(conn.listener, "unauthenticated_request", msg, conn.peer,
                            conn.listener, api_key)  # fmt: skip
            return False
        request = await self._decode(frame, conn, responses)
        if isinstance(request, bool):
            return request
        conn.client_id = request.client_id
        conn.requests += 1
        handler = self._dispatch(request.api_key)
        assert handler is not None
        response = await self._handle(handler, request, conn)
        await responses.put(_answered_with(response))
        if isinstance(response, _Close):
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
            if not conn.authenticated:
                if not await self._before_authentication(proto, conn, frame, responses):
                    return
                continue
            size = len(frame)
            request = await self._decode(frame, conn, responses)
            if isinstance(request, bool):
                if request:
                    continue
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


def _answered_with(response: _Response) -> asyncio.Future[_Response]:
    fut: asyncio.Future[_Response] = asyncio.get_running_loop().create_future()
    fut.set_result(response)
    return fut


def _tls_failed(listener: str, exc: ssl.SSLError) -> None:
    # the TLS layer does not know the peer's address: the listener and OpenSSL's reason
    reason = f"{exc.reason} ({exc.library})" if exc.reason else str(exc)
    failures.record(listener, "tls", "TLS handshake on listener %s failed: %s", listener, reason)
