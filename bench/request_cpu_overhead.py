"""What measuring tidalmq_request_cpu_seconds costs: requests through the broker's real listener,
in one process, with the measurement and without it.

One event loop runs the broker's KafkaListener (its real receive loop, decoding, task per
request, encoding and writes) with the broker's metrics observer, and a client on the same loop
that sends pipelined ApiVersions requests and reads the answers. The handler awaits once (two
steps of its task, as a produce request's handler does) and answers with one API listed (a
request costing ~40 us, so the measurement's share is not hidden). The loop's thread CPU per request is
read with the measurement on (as the broker runs) and with it off: the listener's `Metered`
wrapper replaced by the bare coroutine, its two clock reads around the decoding by a function
returning 0, and the observer's `cpu` by a no-op. The rounds alternate (on, off, on, ...) so a
change in the machine's load falls on both; the difference of the medians is the measurement's
cost per request (the client's share, the same in both, is one write and one read per
50 requests).

    .venv/bin/python bench/request_cpu_overhead.py --requests 20000 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
from collections.abc import Coroutine
from pathlib import Path
from time import thread_time
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidalmq_broker.apis import KAFKA_APIS
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import supported_versions
from tidalmq_broker.metrics import BrokerMetrics
from tidalmq_broker.protocol.codec import encode_request
from tidalmq_broker.server import listener as listener_module
from tidalmq_broker.server.connection import Connection
from tidalmq_broker.server.cpu import Metered, RequestCpu

from bench import procstat

API_VERSIONS_KEY = 18
PIPELINED = 50  # requests in flight on the connection at once
FULL_BODY = api_versions_body()


async def two_steps(request: Any, conn: Connection) -> Any:
    await asyncio.sleep(0)  # one suspension, as a produce request waiting for its flush
    # one API listed: the whole table takes ~300 us to encode, which would hide the figure
    return {**FULL_BODY, "api_keys": FULL_BODY["api_keys"][:1]}


class Unmetered(BrokerMetrics):
    def cpu(self, api_key: int, seconds: float) -> None:
        pass


def bare(coro: Coroutine[Any, Any, Any], _cpu: RequestCpu) -> Coroutine[Any, Any, Any]:
    return coro


def no_clock() -> float:
    return 0.0


def metering(on: bool) -> None:
    """The listener's measurement on (as shipped) or off."""
    names = vars(listener_module)  # the module's globals, which its receive loop reads
    names["Metered"] = Metered if on else bare
    names["thread_time"] = thread_time if on else no_clock


async def one_round(requests: int, on: bool) -> float:
    """Thread CPU seconds per request for `requests` ApiVersions requests."""
    metering(on)
    names = {k: s.name for k, s in KAFKA_APIS.specs.items()}
    observer = BrokerMetrics(990, names) if on else Unmetered(991, names)
    server = listener_module.KafkaListener(
        lambda key: two_steps if key == API_VERSIONS_KEY else None,
        supported_versions,
        api_versions_body,
        observer=observer,
    )
    await server.start("127.0.0.1", 0)
    request = encode_request(
        API_VERSIONS_KEY, 3, 1, {"client_software_name": "b", "client_software_version": "1"}
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request)  # every answer is the same size: learn it once
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        await reader.readexactly(size)
        start = thread_time()
        sent = 0
        while sent < requests:
            batch = min(PIPELINED, requests - sent)
            writer.write(request * batch)
            await reader.readexactly(batch * (4 + size))  # the client's share: one read
            sent += batch
        spent = thread_time() - start
        writer.close()
        await writer.wait_closed()
    finally:
        await server.close()
        metering(True)
    return spent / requests


async def run(requests: int, rounds: int) -> tuple[list[float], list[float]]:
    await one_round(requests // 4, True)  # warm-up: imports, caches, the allocator
    await one_round(requests // 4, False)
    on: list[float] = []
    off: list[float] = []
    for _ in range(rounds):
        on.append(await one_round(requests, True))
        off.append(await one_round(requests, False))
    return on, off


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of each (alternating)")
    args = ap.parse_args(argv)
    load_before = procstat.loadavg()[0]
    on, off = asyncio.run(run(args.requests, args.rounds))
    load_after = procstat.loadavg()[0]
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(f"load average (1 min) before/after: {load_before:.2f} / {load_after:.2f}")
    print(f"{args.rounds} rounds of {args.requests} ApiVersions requests, {PIPELINED} pipelined")
    print("with the measurement,    us/request: " + " ".join(f"{x * 1e6:.1f}" for x in on))
    print("without the measurement, us/request: " + " ".join(f"{x * 1e6:.1f}" for x in off))
    print(
        f"median {med_on * 1e6:.1f} against {med_off * 1e6:.1f} us per request: the measurement "
        f"costs {(med_on - med_off) * 1e6:.2f} us ({(med_on - med_off) / med_off:+.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
