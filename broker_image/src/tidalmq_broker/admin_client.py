"""A small blocking Kafka admin client over the broker's own codec, for the CLI.

It speaks the Kafka protocol to any broker (which forwards to the controller), so the CLI works
against TidalMQ exactly as Kafka's tools do, with no extra port.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from tidalmq_core.cli_values import split_address
from tidalmq_core.model import TopicPartition

from tidalmq_broker.protocol.codec import decode_response, encode_request


class AdminError(Exception):
    pass


class AdminClient:
    def __init__(self, bootstrap: str, *, timeout_s: float = 30.0) -> None:
        self._servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
        if not self._servers:
            raise AdminError("no bootstrap server given")
        self._timeout = timeout_s
        self._sock: socket.socket | None = None
        self._correlation = 0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        errors = []
        for server in self._servers:
            try:
                address = split_address(server)
            except ValueError as exc:
                errors.append(str(exc))
                continue
            try:
                self._sock = socket.create_connection(address, self._timeout)
                return self._sock
            except OSError as exc:
                errors.append(f"{server}: {exc}")
        raise AdminError("cannot reach any bootstrap server: " + "; ".join(errors))

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        for attempt in range(2):
            sock = self._connect()
            self._correlation += 1
            try:
                sock.sendall(
                    encode_request(api_key, version, self._correlation, body, "tidalmq-cli")
                )
                (size,) = struct.unpack(">i", self._recv(sock, 4))
                corr, resp = decode_response(api_key, version, self._recv(sock, size))
            except OSError as exc:
                self.close()
                if attempt:
                    raise AdminError(f"connection failed: {exc}") from exc
                continue
            if corr != self._correlation:
                raise AdminError("response out of order")
            return resp
        raise AssertionError("unreachable")

    @staticmethod
    def _recv(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return bytes(buf)

    # ------------------------------------------------------------------ APIs
    def metadata(self, topics: list[str] | None = None) -> Any:
        body = {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        return self.call(3, 12, body)

    def assignment(self, topics: list[str] | None = None) -> dict[TopicPartition, list[int]]:
        md = self.metadata(topics)
        out: dict[TopicPartition, list[int]] = {}
        for t in md.topics:
            if t.error_code != 0:
                raise AdminError(f"topic {t.name}: {t.error_code.name}")
            for p in t.partitions:
                out[TopicPartition(t.name, p.partition_index)] = list(p.replica_nodes)
        return out

    def leaders(self, topics: list[str] | None = None) -> dict[TopicPartition, int]:
        md = self.metadata(topics)
        return {
            TopicPartition(t.name, p.partition_index): p.leader_id
            for t in md.topics
            for p in t.partitions
        }

    def brokers(self) -> list[int]:
        return sorted(b.node_id for b in self.metadata([]).brokers)

    def alter_reassignments(
        self, targets: dict[TopicPartition, int | None], *, timeout_ms: int = 60000
    ) -> dict[TopicPartition, tuple[int, str | None]]:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp, target in targets.items():
            by_topic.setdefault(tp.topic, []).append(
                {"partition_index": tp.partition, "replicas": None if target is None else [target]}
            )
        resp = self.call(45, 0, {
            "timeout": timeout_ms,
            "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
        })  # fmt: skip
        if resp.error_code != 0:
            raise AdminError(f"{resp.error_code.name}: {resp.error_message}")
        return {
            TopicPartition(t.name, p.partition_index): (int(p.error_code), p.error_message)
            for t in resp.responses
            for p in t.partitions
        }

    def list_reassignments(self) -> dict[TopicPartition, tuple[list[int], list[int], list[int]]]:
        resp = self.call(46, 0, {"timeout": 60000, "topics": None})
        if resp.error_code != 0:
            raise AdminError(f"{resp.error_code.name}: {resp.error_message}")
        return {
            TopicPartition(t.name, p.partition_index): (
                list(p.replicas),
                list(p.adding_replicas),
                list(p.removing_replicas),
            )
            for t in resp.topics
            for p in t.partitions
        }
