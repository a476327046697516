"""Does a librdkafka producer go back to bootstrap.servers when the only broker it knows stops?

The client-side half of the e2e node-drain failure of 2026-11-28 (docs/testing.md, "Known
failing"), in-process and without Kubernetes: listener A (this tree's KafkaListener) is the
one broker the producer learned; listener B is bootstrap.servers and stays up. Every Metadata
answer names broker 0 at A's port until A has closed its connection, then at listener C's: the
new address is known only from the bootstrap servers, as when every broker pod got a new IP.
A trial recovers when the producer connects to B again within 8 s of A's drain (librdkafka's
re-bootstrap). `--debug` prints librdkafka's broker and metadata debug log on stderr.

    PYTHONPATH=broker_image/src .venv/bin/python bench/rebootstrap_after_stop.py 20

With confluent-kafka 2.16.1 (librdkafka 2.16.0), 2026-11-28: A draining as before (each
connection took one more request, here the 200 ms periodic Metadata refresh, answered it and
closed right behind it) recovered in 14 of 20 and 6 of 12 trials: in each failed one the
client logged the disconnect before the Metadata answer that came with it, and then never
"Starting re-bootstrap sequence" (the answer stopped the re-bootstrap timer the loss had just
started). A closing waiting connections at once: 19 of 20 and 30 of 30.
"""

import asyncio
import datetime
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tidalmq_broker.apis  # noqa: F401
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.server.listener import KafkaListener
from tidalmq_broker.server.listener_config import ListenerLimits
from tidalmq_core.metadata import ClusterMetadata

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import procstat

NO_BROKER = SimpleNamespace(metadata=ClusterMetadata("", version=-1))
TOPIC_ID = uuid.uuid4()


class Fake:
    def __init__(self) -> None:
        self.port = 0
        self.api_versions = 0

    def dispatch(self, api_key: int) -> Any:
        if api_key == 3:

            async def metadata(request: Any, conn: Any) -> Any:
                body = {
                    "throttle_time": datetime.timedelta(0),
                    "brokers": [
                        {"node_id": 0, "host": "127.0.0.1", "port": self.port, "rack": None}
                    ],
                    "cluster_id": "repro",
                    "controller_id": 0,
                    "topics": [
                        {
                            "error_code": ErrorCode.none,
                            "name": "t",
                            "topic_id": TOPIC_ID,
                            "is_internal": False,
                            "partitions": [
                                {
                                    "error_code": ErrorCode.none,
                                    "partition_index": 0,
                                    "leader_id": 0,
                                    "leader_epoch": 0,
                                    "replica_nodes": [0],
                                    "isr_nodes": [0],
                                    "offline_replicas": [],
                                }
                            ],
                            "topic_authorized_operations": -2147483648,
                        }
                    ],
                }
                if request.api_version >= 13:
                    body["error_code"] = ErrorCode.none
                return body

            return metadata
        spec = REGISTRY.get(api_key)
        if spec is None:
            return None

        def handler(r: Any, c: Any) -> Any:
            if api_key == 18:
                self.api_versions += 1
            return spec.handler(NO_BROKER, r, c)

        return handler


async def listener(fake: Fake) -> KafkaListener:
    made = KafkaListener(
        fake.dispatch, supported_versions, api_versions_body, limits=ListenerLimits()
    )
    await made.start("127.0.0.1", 0)
    return made


async def until(done: Callable[[], bool], timeout_s: float, step_s: float = 0.01) -> None:
    """Polls `done` every `step_s` until it holds or `timeout_s` passed."""
    for _ in range(int(timeout_s / step_s)):
        if done():
            return
        await asyncio.sleep(step_s)


async def trial() -> bool:
    fake_a, fake_b, fake_c = Fake(), Fake(), Fake()
    a, b, c = await listener(fake_a), await listener(fake_b), await listener(fake_c)
    for f in (fake_a, fake_b, fake_c):
        f.port = a.port
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{b.port}",
            "topic.metadata.refresh.interval.ms": 200,
            "metadata.recovery.rebootstrap.trigger.ms": 300000,
            **({"debug": "broker,metadata"} if "--debug" in sys.argv else {}),
        }
    )
    try:
        await asyncio.to_thread(producer.list_topics, "t", 5)
        deadline = time.monotonic() + 5
        while a.connection_count == 0 or b.connection_count:
            assert time.monotonic() < deadline, (a.connection_count, b.connection_count)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        before = fake_b.api_versions
        await a.drain(5)
        await until(lambda: a.connection_count == 0, 3)  # A's last answers: A's port
        assert a.connection_count == 0, "A did not close its connection"
        for f in (fake_a, fake_b, fake_c):
            f.port = c.port  # the new address is known only from the bootstrap servers
        await until(lambda: fake_b.api_versions > before, 8)
        return fake_b.api_versions > before
    finally:
        for x in (a, b, c):
            await x.close()
        await asyncio.to_thread(producer.flush, 1)


async def main(n: int) -> None:
    load_before = procstat.load_triple()
    results = [await trial() for _ in range(n)]
    print(
        f"recovered {sum(results)} of {n}: {''.join('.' if r else 'X' for r in results)} "
        f"(load {load_before} -> {procstat.load_triple()})"
    )


asyncio.run(main(int(sys.argv[1])))
