"""The listener's bounds on real loopback sockets, in-process ([R1] item 2): connection caps (total,
per client address, per-address overrides) refuse at accept; idle connections are closed; a
client that does not read its responses is muted and resumes when it reads; a closed connection
gives every byte back to the budgets; no connection leaves reference cycles behind; a draining
listener takes no more requests (a waiting connection is closed at once, one with a request in
flight once its answer is out)."""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
import uvloop
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.broker import listener_limits
from tidalmq_broker.protocol.codec import encode_request
from tidalmq_broker.protocol.fastpath import EncodedBody, encode_fetch_response
from tidalmq_broker.security import certs
from tidalmq_broker.security.tls import TlsSettings, server_context
from tidalmq_broker.server.connection import Connection
from tidalmq_broker.server.framing import FrameProtocol
from tidalmq_broker.server.listener import REQUEST_FLOOR_BYTES, KafkaListener
from tidalmq_broker.server.listener_config import ListenerEndpoint, ListenerLimits
from tidalmq_broker.settings import BrokerSettings
from tidalmq_core.metadata import ClusterMetadata

API_VERSIONS = encode_request(
    18, 3, 1, {"client_software_name": "t", "client_software_version": "1"}
)
RESPONSE_BYTES = 2 << 20

# the handlers ApiVersions reaches read only the metadata (no cluster yet: no features)
NO_BROKER = SimpleNamespace(metadata=ClusterMetadata("", version=-1))


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Both event loops the broker runs on (their transports are different code)."""
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


class Served:
    """ApiVersions as the broker answers it; "Fetch" answers `records` bytes of records (at most
    what the connection has room for), charged the way apis/fetch.py charges them."""

    def __init__(self, records: int = RESPONSE_BYTES) -> None:
        self.fetches = 0
        self.records = records
        self.handed = 0  # record bytes answered in all

    def dispatch(self, api_key: int) -> Any:
        if api_key == 1:

            async def fetch(request: Any, conn: Connection) -> Any:
                self.fetches += 1
                records = b"r" * min(self.records, conn.response_room())
                self.handed += len(records)
                conn.charge_response(len(records))
                return encode_fetch_response(
                    request.api_version, [("t", [(0, 0, 0, 0, 0, (), records)])]
                )

            return fetch
        spec = REGISTRY.get(api_key)
        return None if spec is None else (lambda r, c: spec.handler(NO_BROKER, r, c))  # type: ignore[arg-type]


class Gated(Served):
    """Served, with every Fetch held in its handler until `gate` is set (by the test, or by the
    `open_at`-th Fetch to enter); `entered` counts those that entered."""

    def __init__(self, records: int = 10, open_at: int | None = None) -> None:
        super().__init__(records)
        self.gate = asyncio.Event()
        self.entered = 0
        self.open_at = open_at

    def dispatch(self, api_key: int) -> Any:
        handler = super().dispatch(api_key)
        if api_key != 1:
            return handler

        async def fetch(request: Any, conn: Connection) -> Any:
            self.entered += 1
            if self.entered == self.open_at:
                self.gate.set()
            await self.gate.wait()
            return await handler(request, conn)

        return fetch


FETCH = encode_request(
    1,
    12,
    7,
    {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 50 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": [],
        "rack_id": "",
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 50 << 20,
                    }
                ],
            }
        ],
    },
)


async def started(limits: ListenerLimits, served: Served | None = None) -> KafkaListener:
    served = served or Served()
    listener = KafkaListener(served.dispatch, supported_versions, api_versions_body, limits=limits)
    await listener.start("127.0.0.1", 0)
    return listener


class Tls:
    """A broker certificate and a client context that trusts it."""

    def __init__(self, root: Path) -> None:
        ca = certs.new_ca()
        (root / "ca.pem").write_bytes(ca.cert_pem())
        certs.write_keystore(
            root / "broker.pem", certs.issue(ca, "broker", hosts=["localhost"]), ca
        )
        self.settings = TlsSettings(str(root / "broker.pem"))
        self.client = ssl.create_default_context(cafile=str(root / "ca.pem"))

    def server(self) -> ssl.SSLContext:
        return server_context(self.settings)  # a new one per listener (it is given a hook)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return Tls(tmp_path_factory.mktemp("tls"))


async def tls_connect(
    port: int, tls: Tls, rcvbuf: int = 0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, ssl=tls.client, server_hostname="localhost")


async def read_answer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bytes:
    head = await asyncio.wait_for(reader.readexactly(4), timeout_s)
    return await asyncio.wait_for(reader.readexactly(struct.unpack(">i", head)[0]), timeout_s)


@pytest.fixture
async def listeners() -> AsyncIterator[list[KafkaListener]]:
    made: list[KafkaListener] = []
    yield made
    for listener in made:
        await listener.close()


async def connect(port: int, source: str = "127.0.0.1", rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def recv_answer(sock: socket.socket, timeout_s: float = 5) -> bytes:
    """One answer's frame (after its size) from `sock` (read_answer's, for a raw socket)."""
    head = await asyncio.wait_for(recv_exactly(sock, 4), timeout_s)
    return await asyncio.wait_for(recv_exactly(sock, struct.unpack(">i", head)[0]), timeout_s)


async def answered(sock: socket.socket, request: bytes = API_VERSIONS) -> bool:
    """Sends `request` and reads its answer: True, or False when the broker closed."""
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(sock, request)
        await recv_answer(sock)
        return True
    except (ConnectionError, EOFError):
        return False


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await asyncio.get_running_loop().sock_recv(sock, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


async def eventually(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_connections_over_the_per_address_cap_are_refused_at_accept(
    listeners: list[KafkaListener],
) -> None:
    limits = ListenerLimits(
        max_connections_per_ip=3, max_connections_per_ip_overrides={"127.0.0.2": 5}
    )
    listener = await started(limits)
    listeners.append(listener)
    ones = [await connect(listener.port) for _ in range(4)]
    twos = [await connect(listener.port, "127.0.0.2") for _ in range(6)]
    assert [await answered(s) for s in ones] == [True, True, True, False]
    assert [await answered(s) for s in twos] == [True] * 5 + [False]
    assert listener.refused == {"max_connections_per_ip": 2}
    assert listener.connection_count == 8
    for s in ones[:1]:
        s.close()
    await eventually(lambda: listener.connection_count == 7)
    again = await connect(listener.port)  # room again for 127.0.0.1
    assert await answered(again)
    for s in [*ones, *twos, again]:
        s.close()


async def test_connections_over_the_total_cap_are_refused(listeners: list[KafkaListener]) -> None:
    listener = await started(ListenerLimits(max_connections=4))
    listeners.append(listener)
    socks = [await connect(listener.port, f"127.0.0.{i % 3 + 1}") for i in range(6)]
    results = [await answered(s) for s in socks]
    assert results == [True] * 4 + [False] * 2
    assert listener.refused == {"max_connections": 2}
    for s in socks:
        s.close()


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not(
    listeners: list[KafkaListener],
) -> None:
    # The busy connection stays busy only while the gaps between its requests (0.1 s apart)
    # are shorter than the idle timeout: with 0.4 s, a 0.3 s stall of the event loop (a
    # loaded machine, a garbage collection of the suite's heap) could close it too. 1 s, and
    # the test keeps it busy until the idle one is closed, not for a fixed time.
    listener = await started(ListenerLimits(idle_timeout_s=1.0))
    listeners.append(listener)
    idle, busy = await connect(listener.port), await connect(listener.port)
    assert await answered(idle)
    deadline = time.monotonic() + 10
    while listener.idle_closed == 0:
        assert time.monotonic() < deadline, "the idle connection was not closed"
        assert await answered(busy)
        await asyncio.sleep(0.1)
    assert not await answered(idle)  # closed by the broker
    assert listener.idle_closed == 1
    assert await answered(busy)
    idle.close()
    busy.close()


async def test_a_client_that_does_not_read_is_muted_and_resumes_when_it_reads(
    listeners: list[KafkaListener],
) -> None:
    """Kafka mutes a channel while its response is unsent. Here: responses stop at the 16 MiB
    cap, and at 12 MiB not taken the connection's requests are no longer read; the fetches it
    pipelined wait, and go on once the client reads."""
    served = Served()
    limits = ListenerLimits(
        max_response_bytes_per_connection=16 << 20,
        queued_max_response_bytes=64 << 20,
        max_inflight_per_connection=32,  # fewer than the 40 pipelined: the rest wait to be read
    )
    listener = await started(limits, served)
    listeners.append(listener)
    sock = await connect(listener.port, rcvbuf=32 * 1024)
    await asyncio.get_running_loop().sock_sendall(sock, FETCH * 40)
    await eventually(lambda: listener.muted == 1)
    await asyncio.sleep(0.3)
    handled = served.fetches
    assert handled < 40, handled  # requests are not read while muted
    budget = listener.response_budget
    assert budget is not None and 12 << 20 <= budget.used <= (16 << 20) + 40 * 256  # + headers
    for _ in range(40):  # the client reads: every fetch is answered after all
        await recv_answer(sock, 10)
    assert served.fetches == 40
    await eventually(lambda: listener.muted == 0 and budget.used == 0)
    sock.close()


async def test_a_closed_connection_gives_every_byte_back(listeners: list[KafkaListener]) -> None:
    limits = ListenerLimits(
        max_response_bytes_per_connection=16 << 20,
        queued_max_response_bytes=128 << 20,
        queued_max_request_bytes=64 << 20,
    )
    listener = await started(limits)
    listeners.append(listener)
    socks = []
    for _ in range(5):
        sock = await connect(listener.port, rcvbuf=32 * 1024)
        await asyncio.get_running_loop().sock_sendall(sock, FETCH * 20 + b"\x00\x10\x00\x00partial")
        socks.append(sock)
    responses, requests = listener.response_budget, listener.request_budget
    assert responses is not None and requests is not None
    await eventually(lambda: listener.muted == 5)
    assert responses.used > 5 * (12 << 20)
    for sock in socks:
        sock.close()
    await eventually(lambda: listener.connection_count == 0)
    await eventually(lambda: responses.used == 0 and requests.used == 0 and requests.complete == 0)


async def test_connections_leave_no_reference_cycles(listeners: list[KafkaListener]) -> None:
    """A closed connection is freed by reference counting: with the cyclic collector off,
    nothing of 30 connections (answered, refused, cut mid-frame, or dropped with answers
    unread) is left for it to find."""
    listener = await started(
        ListenerLimits(
            max_connections_per_ip=25,
            queued_max_request_bytes=64 << 20,
            queued_max_response_bytes=64 << 20,
        )
    )
    listeners.append(listener)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        socks = [await connect(listener.port) for _ in range(30)]
        for i, sock in enumerate(socks):
            request = [API_VERSIONS, FETCH * 3, struct.pack(">i", 100_000) + b"x" * 50][i % 3]
            await asyncio.get_running_loop().sock_sendall(sock, request)
        await asyncio.sleep(0.3)
        for sock in socks:
            sock.close()
        await eventually(lambda: listener.connection_count == 0)
        await asyncio.sleep(0.3)
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
        assert not kinds & {"FrameProtocol", "Connection", "_Pipeline", "Task"}, kinds
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert FrameProtocol  # the protocol is what the assertion names


class InTwoParts:
    """Every request is answered with a frame written in two parts (a header, then a body kept
    encoded, as Metadata's and Fetch's answers are), by a handler that does not wait."""

    def dispatch(self, api_key: int) -> Any:
        async def answer(request: Any, conn: Connection) -> Any:
            return EncodedBody([b"x" * 100], flexible=False)

        return answer


async def test_tls_answers_a_request_read_before_the_previous_answer_was_sent(
    listeners: list[KafkaListener], tls: Tls
) -> None:
    """Once the sender has sent every answer it has, it waits for the transport's buffer to
    empty (drain), told by resume_writing; on plain transports pause_writing comes only while
    bytes are buffered. The TLS transports (asyncio's and uvloop's sslproto) compare their
    buffer with the high water by >=, not >: at a high water of 0 (set to be told the moment
    the buffer is empty) they called pause_writing with nothing buffered, and resume_writing
    only at their next read or write, flipping between the two at each. Here the second of two
    pipelined requests reaches the sender only after it sent the first answer (one request in
    flight per connection): the sender then waited, paused with nothing to send, for a read
    that a client waiting for that answer never causes (the SASL_SSL clients of
    tests/integration/security/test_acls.py timed out that way)."""
    limits = ListenerLimits(max_inflight_per_connection=1)
    listener = KafkaListener(
        InTwoParts().dispatch, supported_versions, api_versions_body, limits=limits
    )
    await listener.start_endpoints([ListenerEndpoint("SSL", "127.0.0.1", 0, "SSL", tls.server())])
    listeners.append(listener)
    reader, writer = await tls_connect(listener.ports["SSL"], tls)
    try:
        for _ in range(4):
            writer.write(API_VERSIONS)
            await read_answer(reader)
            writer.write(API_VERSIONS * 2)
            await read_answer(reader)
            await read_answer(reader)
            # never paused for writing with nothing to write (nothing would resume it)
            (proto,) = listener._protocols
            assert not proto.writing_paused or proto.write_buffer_size() > 0
    finally:
        writer.close()


async def test_tls_clients_that_do_not_read_get_no_more_than_the_budget(
    listeners: list[KafkaListener], tls: Tls
) -> None:
    """Four TLS clients pipeline fetches answered with 16 MiB each and read nothing: what they
    are handed stays within the response budget (32 MiB) and the kernel's socket buffers, as
    on plain connections. The TLS layer counts only the bytes it holds itself and passes all of
    them to the socket transport underneath whenever that has room: an answer written whole
    went there at once, left the budget's count, and the clients were handed 64 MiB (each
    such connection could hold 16 MiB more than its cap, so connections together any amount
    past the budget). Once they close, every byte is given back."""
    served = Served(records=16 << 20)
    limits = ListenerLimits(
        max_response_bytes_per_connection=16 << 20, queued_max_response_bytes=32 << 20
    )
    listener = KafkaListener(served.dispatch, supported_versions, api_versions_body, limits=limits)
    await listener.start_endpoints([ListenerEndpoint("SSL", "127.0.0.1", 0, "SSL", tls.server())])
    listeners.append(listener)
    clients = [await tls_connect(listener.ports["SSL"], tls, rcvbuf=32 * 1024) for _ in range(4)]
    for _, writer in clients:
        writer.write(FETCH * 8)
    await eventually(lambda: served.fetches == 32)  # answered (those without room: no records)
    await asyncio.sleep(0.3)
    budget = listener.response_budget
    assert budget is not None and budget.used <= (32 << 20) + 32 * 256  # + headers
    # the budget, and per connection what the kernel's socket buffers may take on loopback (a
    # plain connection's client is handed its cap and 3.6 MiB more; these were handed 32 MiB)
    assert served.handed <= (32 << 20) + 4 * (4 << 20), served.handed / 2**20
    for _, writer in clients:
        writer.close()
    await eventually(lambda: listener.connection_count == 0)
    await eventually(lambda: budget.used == 0)


async def test_a_stopping_listener_closes_a_waiting_connection_without_taking_a_request(
    listeners: list[KafkaListener],
) -> None:
    """drain() closes a connection waiting for its next request at once. It used to take that
    next request, answer it and close right behind the answer: librdkafka lost the re-bootstrap
    of a client whose last broker went that way when the answer was Metadata (drain's
    docstring)."""
    listener = await started(ListenerLimits())
    listeners.append(listener)
    sock = await connect(listener.port)
    assert await answered(sock)
    await listener.drain(5)
    loop = asyncio.get_running_loop()
    assert await asyncio.wait_for(loop.sock_recv(sock, 1), 2) == b"", "no close at drain"
    assert not await answered(sock)
    sock.close()


async def test_a_request_in_flight_when_the_listener_stops_is_answered_then_closed(
    listeners: list[KafkaListener],
) -> None:
    served = Gated()
    listener = await started(ListenerLimits(), served)
    listeners.append(listener)
    sock = await connect(listener.port)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, FETCH)
    await asyncio.sleep(0.2)  # the fetch is in its handler, waiting for the gate
    draining = asyncio.create_task(listener.drain(5))
    await asyncio.sleep(0.2)
    assert not draining.done()  # drain waits for the request in flight
    served.gate.set()
    await recv_answer(sock)
    await draining
    assert served.fetches == 1
    assert await asyncio.wait_for(loop.sock_recv(sock, 1), 2) == b""
    sock.close()


async def test_hundreds_of_requests_pipelined_on_one_connection_are_handled_at_once(
    listeners: list[KafkaListener],
) -> None:
    """librdkafka sends one Produce request per partition and pipelines them all on the
    connection: 683 records to 683 partitions of a broker are 683 requests at once, each
    waiting for its WAL flush (and a partition's first write for its first checkpoint too).
    With 32 of a connection in flight, they went through in ~21 rounds of a flush each, 0.4 s
    for partitions just moved to a new broker; the broker's default lets 256 in at once (their
    bytes stay within max_inflight_request_bytes_per_connection)."""
    pipelined = 200
    served = Gated(open_at=pipelined)
    listener = await started(listener_limits(BrokerSettings()), served)
    listeners.append(listener)
    sock = await connect(listener.port)
    await asyncio.get_running_loop().sock_sendall(sock, FETCH * pipelined)
    try:
        await asyncio.wait_for(served.gate.wait(), 5)
    except TimeoutError:
        pytest.fail(f"only {served.entered} of {pipelined} pipelined requests were handled at once")
    for _ in range(pipelined):
        await recv_answer(sock)
    assert served.fetches == pipelined
    sock.close()


async def test_tiny_requests_in_flight_count_at_least_the_floor_against_both_byte_bounds(
    listeners: list[KafkaListener],
) -> None:
    """Each request in flight holds ~4.7 KB of objects whatever its frame's size: charged
    REQUEST_FLOOR_BYTES, an 88-byte Fetch counts as that much against the connection's bytes
    in flight (so 16 KiB of them lets 4 in, not 186) and against the broker's request budget,
    and all of it comes back when they are answered."""
    served = Gated()
    limits = ListenerLimits(
        max_inflight_bytes_per_connection=4 * REQUEST_FLOOR_BYTES,
        queued_max_request_bytes=1 << 20,
    )
    listener = await started(limits, served)
    listeners.append(listener)
    assert listener.request_budget is not None
    sock = await connect(listener.port)
    pipelined = 40
    assert len(FETCH) * pipelined < 4 * REQUEST_FLOOR_BYTES  # the frames alone would all fit
    await asyncio.get_running_loop().sock_sendall(sock, FETCH * pipelined)
    await asyncio.sleep(0.5)
    assert served.entered == 4, f"{served.entered} tiny requests in flight within 4 floors"
    assert listener.request_budget.used >= 4 * REQUEST_FLOOR_BYTES
    served.gate.set()
    for _ in range(pipelined):
        await recv_answer(sock)
    assert served.fetches == pipelined
    await asyncio.sleep(0.05)
    assert listener.request_budget.used == 0
    sock.close()
