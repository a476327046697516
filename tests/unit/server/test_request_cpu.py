"""CPU time per request ([L1] item 1): each step of a handler's task is counted on the thread's
CPU clock, time spent waiting is not, and the listener hands each request's figure to its
observer by API (what tidalmq_request_cpu_seconds exports)."""

from __future__ import annotations

import asyncio
import socket
import struct
from time import thread_time
from typing import Any

import pytest
import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import supported_versions
from tidalmq_broker.protocol.codec import encode_request
from tidalmq_broker.server.connection import Connection
from tidalmq_broker.server.cpu import Metered, RequestCpu
from tidalmq_broker.server.listener import KafkaListener
from tidalmq_broker.server.listener_config import RequestObserver

API_VERSIONS_KEY = 18
BURN_S = 0.03
WAIT_S = 0.3


def burn(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU."""
    end = thread_time() + seconds
    while thread_time() < end:
        pass


async def busy_then_idle() -> str:
    burn(BURN_S)
    await asyncio.sleep(WAIT_S)  # another task could run here: not this request's CPU
    burn(BURN_S)
    return "done"


async def test_metered_counts_each_step_and_not_the_waiting() -> None:
    cpu = RequestCpu()
    result = await asyncio.create_task(Metered(busy_then_idle(), cpu))
    assert result == "done"
    assert 2 * BURN_S <= cpu.seconds < 2 * BURN_S + WAIT_S / 2, cpu.seconds


async def test_metered_passes_exceptions_and_cancellation_through() -> None:
    async def fails() -> None:
        burn(BURN_S)
        await asyncio.sleep(0)
        raise ValueError("bad request")

    cpu = RequestCpu()
    with pytest.raises(ValueError, match="bad request"):
        await asyncio.create_task(Metered(fails(), cpu))
    assert cpu.seconds >= BURN_S

    waiting = asyncio.create_task(Metered(asyncio.sleep(10), RequestCpu()))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


class Seen(RequestObserver):
    def __init__(self) -> None:
        self.cpu_seconds: list[tuple[int, float]] = []

    def cpu(self, api_key: int, seconds: float) -> None:
        self.cpu_seconds.append((api_key, seconds))


async def test_the_listener_reports_each_requests_cpu_by_api() -> None:
    async def slow_api_versions(request: Any, conn: Connection) -> Any:
        await busy_then_idle()
        return api_versions_body()

    seen = Seen()
    listener = KafkaListener(
        lambda key: slow_api_versions if key == API_VERSIONS_KEY else None,
        supported_versions,
        api_versions_body,
        observer=seen,
    )
    await listener.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", listener.port))
        request = encode_request(
            API_VERSIONS_KEY, 3, 1, {"client_software_name": "t", "client_software_version": "1"}
        )
        await loop.sock_sendall(sock, request + request)  # two pipelined: they overlap
        for _ in range(2):
            head = await asyncio.wait_for(loop.sock_recv(sock, 4), 10)
            (size,) = struct.unpack(">i", head)
            while size:
                size -= len(await asyncio.wait_for(loop.sock_recv(sock, size), 10))
    finally:
        sock.close()
        await listener.close()
    assert [key for key, _ in seen.cpu_seconds] == [API_VERSIONS_KEY] * 2
    for _, seconds in seen.cpu_seconds:
        # its own two bursts (and its decoding and encoding), not the other request's
        # bursts that ran while it waited, nor the waiting
        assert 2 * BURN_S <= seconds < 3 * BURN_S, seen.cpu_seconds
