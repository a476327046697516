"""Hostile and ordinary clients on real sockets, for the bounds tests and
bench/connection_bounds.py ([R1] item 2).

Every attacker opens its connections from a loopback address of its choice (127.0.0.0/8 is all
loopback on Linux), so the per-address cap can be exercised and avoided at will. `Rss` samples a
process's resident memory; `ProduceProbe` is the ordinary producer that must be served
throughout (one small acks=all batch every 100 ms on its own connection, each answer timed).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import resource
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field

from tidalmq_broker.protocol.codec import decode_response, encode_request
from tidalmq_broker.protocol.records import build_batch

API_VERSIONS = encode_request(
    18, 3, 1, {"client_software_name": "t", "client_software_version": "1"}
)


def raise_fd_limit(wanted: int) -> int:
    """The soft RLIMIT_NOFILE of this process (and the processes it starts) raised towards
    `wanted` (at most the hard limit); returns what it is now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def proc_status_kb(pid: int, field: str) -> int:
    """A size line of /proc/<pid>/status in KiB: "VmRSS" (resident), "VmSize" (address space)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def rss_mib(pid: int) -> float:
    return proc_status_kb(pid, "VmRSS") / 1024


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Rss:
    """Samples a process's RSS every 50 ms while running: `peak` since the last reset."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mib(pid)
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        return rss_mib(self.pid)

    def reset(self) -> float:
        self.peak = self.now()
        return self.peak

    async def __aenter__(self) -> Rss:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, self.now())
            await asyncio.sleep(0.05)

    async def settle(self, target: float, within_s: float) -> tuple[float, float]:
        """Waits until RSS is at most `target` MiB or `within_s` passed: (RSS, seconds)."""
        started = time.monotonic()
        while True:
            rss = self.now()
            took = time.monotonic() - started
            if rss <= target or took >= within_s:
                return rss, took
            await asyncio.sleep(0.25)


# ------------------------------------------------------------------------------ connections
async def connect(port: int, source: str = "127.0.0.1", *, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    buf = bytearray()
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            raise ConnectionResetError("closed by the broker")
        buf += chunk
    return bytes(buf)


async def call(sock: socket.socket, request: bytes, timeout_s: float = 10.0) -> bytes:
    """Sends one request frame, returns its response frame (without the size)."""
    await asyncio.get_running_loop().sock_sendall(sock, request)
    head = await asyncio.wait_for(recv_exactly(sock, 4), timeout_s)
    return await asyncio.wait_for(recv_exactly(sock, struct.unpack(">i", head)[0]), timeout_s)


@dataclass
class Opened:
    sockets: list[socket.socket] = field(default_factory=list)
    refused: int = 0
    # connects not established within CONNECT_WAIT_S and tried again on a new socket (a CI
    # run once waited ~170 s for a few of 5,000 loopback connects on an idle machine: the
    # kernel's SYN retransmission backoff)
    connect_retries: int = 0
    tls: list[asyncio.StreamWriter] = field(default_factory=list)  # TLS connections

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()
        for writer in self.tls:
            writer.transport.abort()  # no TLS goodbye: the client just goes
        self.tls.clear()


CONNECT_WAIT_S = 10.0


async def connect_retrying(
    port: int, source: str, opened: Opened, *, rcvbuf: int = 0
) -> socket.socket:
    """connect(), tried again on a new socket if not established within CONNECT_WAIT_S (counted
    in `opened.connect_retries`), as a Kafka client reconnects. Every attack that opens many
    connections uses it: a connect left to the kernel's SYN backoff can wait minutes."""
    for attempt in range(3):
        try:
            return await asyncio.wait_for(connect(port, source, rcvbuf=rcvbuf), CONNECT_WAIT_S)
        except TimeoutError:
            if attempt == 2:
                raise
            opened.connect_retries += 1
    raise AssertionError("unreachable")


async def idle_clients(port: int, n: int, sources: list[str], *, concurrency: int = 200) -> Opened:
    """`n` connections that each send ApiVersions (as every Kafka client does first), read the
    answer and then stay idle; spread over `sources`. One the broker closes is `refused`."""
    opened = Opened()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            sock = await connect_retrying(port, sources[i % len(sources)], opened)
            try:
                await call(sock, API_VERSIONS)
            except (ConnectionError, EOFError):
                sock.close()
                opened.refused += 1
                return
            opened.sockets.append(sock)

    await asyncio.gather(*(one(i) for i in range(n)))
    return opened


async def tls_idle_clients(
    port: int, n: int, context: ssl.SSLContext, sources: list[str], *, concurrency: int = 100
) -> Opened:
    """idle_clients over TLS (`context` trusts the broker's certificate for "localhost"): each
    connection does its handshake, asks ApiVersions, reads the answer and stays idle.

    The whole setup (connect, handshake, ApiVersions) gets CONNECT_WAIT_S and is tried again on a
    new socket after it, as a Kafka client does (`socket.connection.setup.timeout.ms`, 10 s) and
    counted in `opened.connect_retries`. A CI run on an idle machine once spent 180 s opening
    2,000 of them with every connect established at once and none refused: a connect whose last
    ACK the listen queue dropped looks established to the client, and its ClientHello then waits
    for the server's SYN-ACK retransmissions (1, 2, 4, ... s), which the broker never sees."""
    opened = Opened()
    gate = asyncio.Semaphore(concurrency)

    async def setup(source: str) -> asyncio.StreamWriter:
        sock = await connect(port, source)
        try:
            reader, writer = await asyncio.open_connection(
                sock=sock, ssl=context, server_hostname="localhost"
            )
            writer.write(API_VERSIONS)
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
        except BaseException:
            sock.close()
            raise
        return writer

    async def one(i: int) -> None:
        async with gate:
            for attempt in range(3):
                try:
                    writer = await asyncio.wait_for(
                        setup(sources[i % len(sources)]), CONNECT_WAIT_S
                    )
                except TimeoutError:
                    if attempt == 2:
                        raise
                    opened.connect_retries += 1
                    continue
                except (ConnectionError, EOFError, ssl.SSLError):
                    opened.refused += 1
                    return
                opened.tls.append(writer)
                return

    await asyncio.gather(*(one(i) for i in range(n)))
    return opened


async def announcers(port: int, n: int, announced: int, sources: list[str]) -> Opened:
    """`n` connections that each send a 12-byte header announcing `announced` bytes and
    nothing more (the issue: 8 of them announcing 100 MiB took 878 MiB)."""
    opened = Opened()
    header = struct.pack(">ihhi", announced, 0, 9, 1)
    loop = asyncio.get_running_loop()
    for i in range(n):
        sock = await connect_retrying(port, sources[i % len(sources)], opened)
        await loop.sock_sendall(sock, header)
        opened.sockets.append(sock)
    return opened


async def slowloris(port: int, n: int, seconds: float, sources: list[str]) -> Opened:
    """`n` connections sending one byte a second of a frame announcing 1 MiB, for `seconds`."""
    opened = Opened()
    for i in range(n):
        opened.sockets.append(await connect_retrying(port, sources[i % len(sources)], opened))
    frame = struct.pack(">ihhi", 1 << 20, 0, 9, 7) + b"\x00" * 64
    loop = asyncio.get_running_loop()
    for second in range(int(seconds)):
        started = time.monotonic()
        byte = frame[second : second + 1]
        for sock in list(opened.sockets):
            try:
                await loop.sock_sendall(sock, byte)
            except OSError:
                opened.sockets.remove(sock)
                sock.close()
                opened.refused += 1
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return opened


def fetch_request(topic: str, max_bytes: int, correlation: int = 1) -> bytes:
    return encode_request(
        1,
        12,
        correlation,
        {
            "replica_id": -1,
            "max_wait": datetime.timedelta(milliseconds=500),
            "min_bytes": 1,
            "max_bytes": max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "forgotten_topics_data": [],
            "rack_id": "",
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": max_bytes,
                        }
                    ],
                }
            ],
        },
    )


async def never_reading_fetchers(
    port: int,
    n: int,
    topic: str,
    *,
    max_bytes: int = 50 << 20,
    pipelined: int = 16,
    sources: list[str],
) -> Opened:
    """`n` consumers that each pipeline `pipelined` Fetch(max_bytes) from offset 0 and never
    read an answer (a small receive buffer, so the kernel holds little of them)."""
    opened = Opened()
    loop = asyncio.get_running_loop()
    requests = b"".join(fetch_request(topic, max_bytes, c) for c in range(pipelined))
    for i in range(n):
        sock = await connect_retrying(port, sources[i % len(sources)], opened, rcvbuf=16 * 1024)
        await loop.sock_sendall(sock, requests)
        opened.sockets.append(sock)
    return opened


async def tls_never_reading_fetchers(
    port: int,
    n: int,
    topic: str,
    context: ssl.SSLContext,
    *,
    max_bytes: int = 50 << 20,
    pipelined: int = 16,
    sources: list[str],
) -> Opened:
    """never_reading_fetchers over TLS (`context` trusts the broker's certificate for
    "localhost"): the client's TLS layer reads a little (its stream's 64 KiB limit) and then
    nothing more."""
    opened = Opened()
    requests = b"".join(fetch_request(topic, max_bytes, c) for c in range(pipelined))
    for i in range(n):
        sock = await connect_retrying(port, sources[i % len(sources)], opened, rcvbuf=16 * 1024)
        _, writer = await asyncio.open_connection(
            sock=sock, ssl=context, server_hostname="localhost"
        )
        writer.write(requests)
        opened.tls.append(writer)
    return opened


# ------------------------------------------------------------------------------ producing
def produce_request(
    topic: str, records: bytes, correlation: int, *, timeout_ms: int = 30_000
) -> bytes:
    return encode_request(
        0,
        9,
        correlation,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": datetime.timedelta(milliseconds=timeout_ms),
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
        },
    )


def produce_error(frame: bytes) -> str:
    _, response = decode_response(0, 9, frame)
    return str(response.responses[0].partition_responses[0].error_code.name)


async def fill_partition(
    port: int, topic: str, total_bytes: int, batch_bytes: int = 1 << 20
) -> None:
    """Appends about `total_bytes` of records to partition 0 of `topic`, in batches of a
    little under `batch_bytes` (a whole 1 MiB of values plus headers passes max.message.bytes)."""
    value = b"v" * 16 * 1024
    batch = build_batch([(None, value)] * max(1, batch_bytes // len(value) - 1))
    sock = await connect(port)
    try:
        for i in range(max(1, total_bytes // len(batch))):
            error = produce_error(await call(sock, produce_request(topic, batch, i), 30))
            assert error == "none", error
    finally:
        sock.close()


@dataclass
class ProduceProbe:
    """The ordinary producer: one small acks=all batch every `interval_s` on its own
    connection (reconnecting if it must); every answer's latency and error code is kept."""

    port: int
    topic: str
    interval_s: float = 0.1
    timeout_ms: int = 30_000
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ProduceProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def mark(self) -> int:
        return len(self.latencies) + len(self.errors)

    def summary(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return f"no acknowledged produce, errors {self.errors[-5:]}"
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return (
            f"{len(lat)} acknowledged, p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 "
            f"{p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms, {len(self.errors)} errors "
            f"{sorted(set(self.errors))[:5]}"
        )

    async def _run(self) -> None:
        records = build_batch([(b"k", b"probe" * 20)])
        sock: socket.socket | None = None
        correlation = 0
        while True:
            started = time.monotonic()
            try:
                if sock is None:
                    sock = await connect(self.port)
                correlation += 1
                request = produce_request(
                    self.topic, records, correlation, timeout_ms=self.timeout_ms
                )
                error = produce_error(await call(sock, request, self.timeout_ms / 1000 + 5))
                if error == "none":
                    self.latencies.append(time.monotonic() - started)
                else:
                    self.errors.append(error)
            except (OSError, TimeoutError, EOFError) as exc:
                self.errors.append(type(exc).__name__)
                if sock is not None:
                    sock.close()
                sock = None
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
