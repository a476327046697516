"""What authorization costs Produce and Fetch: a micro-benchmark of the broker's own code path.

    .venv/bin/python bench/acl_overhead.py                 # prints a Markdown table
    .venv/bin/python bench/acl_overhead.py --acls 10000    # with more bindings loaded

Each request is what a broker does for it in memory: decode the frame (Produce on the hand-
written fast path), run the real handler (apis/produce.py, apis/fetch.py) against partitions
whose log answers at once (no storage, no socket), and encode the response. That is the cost
authorization adds to; the storage write, the network and the client are not in it, so the
percentages are upper bounds of what a real request sees.

Three runs of each: authorization off (a PLAINTEXT-only broker's default), on with the decision
in the cache (every request after the first of a connection's principal and topic), and on
with the cache dropped before every request (the first request after an ACL change: a full
decision over `--acls` bindings, a tenth of them PREFIXED). The decision alone is timed too.
Times are CPU time of this process (time.process_time), the modes interleaved run after run:
on a shared machine wall-clock time mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidalmq_broker.apis.fetch import handle_fetch
from tidalmq_broker.apis.produce import handle_produce
from tidalmq_broker.protocol.codec import decode_request, encode_request, encode_response_parts
from tidalmq_broker.protocol.records import build_batch
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.storage.api import AppendResult, ReadResult
from tidalmq_core.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType

TOPIC = "orders"
PRINCIPAL = "User:alice"


class _Log:
    """A partition that answers at once."""

    leader_epoch = 0
    log_start_offset = 0
    high_watermark = 1

    def __init__(self, batch: bytes) -> None:
        self._read = ReadResult(batch, 1, 0)

    async def append(self, records: Any, *, acks: int, owned: bool) -> AppendResult:
        return AppendResult(0, 0, -1, 0)

    async def read(self, offset: int, max_bytes: int) -> ReadResult:
        return self._read


class _Metrics:
    def produced(self, *args: Any) -> None:
        pass

    def fetched(self, *args: Any) -> None:
        pass

    def produce_errors(self, *args: Any) -> None:
        pass


def bindings(count: int) -> list[AclBinding]:
    """`count` bindings of other principals and topics (a tenth PREFIXED), and the two that
    let alice write and read the benchmark's topic."""
    out = [
        AclBinding(
            ResourceType.TOPIC,
            f"team{i}-" if i % 10 == 0 else f"topic-{i}",
            PatternType.PREFIXED if i % 10 == 0 else PatternType.LITERAL,
            f"User:user{i}",
            "*",
            AclOperation.WRITE,
            PermissionType.ALLOW,
        )
        for i in range(count)
    ]
    for op in (AclOperation.WRITE, AclOperation.READ):
        out.append(
            AclBinding(
                ResourceType.TOPIC,
                TOPIC,
                PatternType.LITERAL,
                PRINCIPAL,
                "*",
                op,
                PermissionType.ALLOW,
            )
        )
    return out


def frames() -> tuple[bytes, bytes]:
    batch = build_batch([(b"key", b"v" * 1000)])
    produce = encode_request(
        0,
        9,
        1,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
        },
        client_id="bench",
    )[4:]
    fetch = encode_request(
        1,
        12,
        2,
        {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
        client_id="bench",
    )[4:]
    return produce, fetch


async def per_request_us(
    broker: Any, frame: bytes, handler: Any, count: int, *, drop_cache: bool
) -> float:
    conn = SimpleNamespace(principal=PRINCIPAL, host="10.0.0.7", client_id="bench")
    supported = {0: (3, 11), 1: (4, 12)}
    authorizer: Authorizer = broker.authorizer
    started = time.process_time()
    for _ in range(count):
        if drop_cache:
            authorizer._cache = {}
        request = decode_request(frame, supported)
        body = await handler(broker, request, conn)
        encode_response_parts(request.api_key, request.api_version, request.correlation_id, body)
    return (time.process_time() - started) / count * 1e6


def decision_ns(authorizer: Authorizer, count: int, *, drop_cache: bool) -> float:
    conn = SimpleNamespace(principal=PRINCIPAL, host="10.0.0.7")
    started = time.process_time()
    for _ in range(count):
        if drop_cache:
            authorizer._cache = {}
        authorizer.allows(conn, AclOperation.WRITE, ResourceType.TOPIC, TOPIC)  # type: ignore[arg-type]
    return (time.process_time() - started) / count * 1e9


async def run(acls: int, count: int, repeats: int) -> str:
    produce, fetch = frames()
    log = _Log(build_batch([(b"key", b"v" * 1000)]))
    partitions = SimpleNamespace(get_log=lambda tp: log)
    modes = [
        ("off", False, False),
        ("on, decision cached", True, False),
        ("on, cache dropped every request", True, True),
    ]
    brokers = {}
    for name, enabled, _ in modes:
        authorizer = Authorizer(enabled=enabled, super_users={"User:admin"})
        authorizer.load(bindings(acls))
        brokers[name] = SimpleNamespace(
            partitions=partitions, authorizer=authorizer, metrics=_Metrics()
        )
    apis = (("Produce", produce, handle_produce), ("Fetch", fetch, handle_fetch))
    samples: dict[tuple[str, str], list[float]] = {}
    for name, _, drop in modes:  # warm up every path first
        for _, frame, handler in apis:
            await per_request_us(brokers[name], frame, handler, count // 5, drop_cache=drop)
    # the modes interleaved, run after run, so that drift (the machine, the allocator) is
    # spread over all of them
    for _ in range(repeats):
        for name, _, drop in modes:
            for api, frame, handler in apis:
                us = await per_request_us(brokers[name], frame, handler, count, drop_cache=drop)
                samples.setdefault((name, api), []).append(us)
            ns = decision_ns(brokers[name].authorizer, count * 10, drop_cache=drop)
            samples.setdefault((name, "decision"), []).append(ns)
    median = {key: statistics.median(values) for key, values in samples.items()}
    rows = []
    for name, _, _ in modes:
        cells = []
        for api, _, _ in apis:
            value, base = median[(name, api)], median[("off", api)]
            extra = value - base
            cells.append(f"{value:.1f} µs ({extra:+.2f} µs, {extra / base:+.1%})")
        rows.append(f"| {name} | {cells[0]} | {cells[1]} | {median[(name, 'decision')]:.0f} ns |")
    header = [
        f"ACL overhead: {acls} bindings loaded, {count} requests x {repeats} interleaved runs "
        f"(medians), Python {sys.version.split()[0]}",
        "",
        "| authorization | Produce (1 partition, 1 KiB) | Fetch (1 partition) | one decision |",
        "|---|---|---|---|",
    ]
    return "\n".join(header + rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acls", type=int, default=1000, help="bindings loaded")
    parser.add_argument("--requests", type=int, default=20000, help="requests per run")
    parser.add_argument("--repeats", type=int, default=9, help="runs per mode")
    args = parser.parse_args()
    print(asyncio.run(run(args.acls, args.requests, args.repeats)))


if __name__ == "__main__":
    main()
