"""A small blocking Kafka admin client over the broker's own codec, for the CLI.

It speaks the Kafka protocol to any broker (which forwards to the controller), so the CLI works
against TidalMQ exactly as Kafka's tools do, with no extra port. Given client properties
(`--command-config`, tidalmq_core.client_properties) it connects with TLS and authenticates with
SASL (PLAIN, SCRAM-SHA-256/512: SaslHandshake v1, then SaslAuthenticate v2) as Kafka's clients do.
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from tidalmq_core.cli_values import split_address
from tidalmq_core.client_properties import ClientConfigError, ClientSecurity
from tidalmq_core.model import TopicPartition
from tidalmq_core.scram import MECHANISMS, ScramClient

from tidalmq_broker.protocol.codec import decode_response, encode_request


class AdminError(Exception):
    pass


class AdminClient:
    def __init__(
        self, bootstrap: str, *, timeout_s: float = 30.0, security: ClientSecurity | None = None
    ) -> None:
        self._servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
        if not self._servers:
            raise AdminError("no bootstrap server given")
        self._timeout = timeout_s
        self._security = security or ClientSecurity()
        try:
            self._ssl = self._security.ssl_context() if self._security.tls else None
        except ClientConfigError as exc:
            raise AdminError(str(exc)) from exc
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
                name, port = split_address(server)
            except ValueError as exc:
                errors.append(str(exc))
                continue
            sock: socket.socket | None = None
            try:
                sock = socket.create_connection((name, port), self._timeout)
                if self._ssl is not None:
                    sock = self._ssl.wrap_socket(sock, server_hostname=name)
                if self._security.sasl:
                    self._authenticate(sock)
                self._sock = sock
                return sock
            except AdminError:  # refused by SASL: another broker would refuse it too
                if sock is not None:
                    sock.close()
                raise
            except ssl.SSLError as exc:
                errors.append(f"{server}: TLS handshake failed ({exc.reason or exc})")
            except OSError as exc:
                errors.append(f"{server}: {exc}")
            if sock is not None:
                sock.close()
        raise AdminError("cannot reach any bootstrap server: " + "; ".join(errors))

    def _roundtrip(self, sock: socket.socket, api_key: int, version: int, body: Any) -> Any:
        self._correlation += 1
        sock.sendall(encode_request(api_key, version, self._correlation, body, "tidalmq-cli"))
        (size,) = struct.unpack(">i", self._recv(sock, 4))
        corr, resp = decode_response(api_key, version, self._recv(sock, size))
        if corr != self._correlation:
            raise AdminError("response out of order")
        return resp

    def _authenticate(self, sock: socket.socket) -> None:
        """SASL on a new connection: SaslHandshake v1 naming the mechanism, then its tokens in
        SaslAuthenticate v2 requests (KIP-152)."""
        s = self._security
        resp = self._roundtrip(sock, 17, 1, {"mechanism": s.mechanism})
        if int(resp.error_code):
            raise AdminError(
                f"SASL mechanism {s.mechanism} refused by the broker "
                f"(it offers {', '.join(resp.mechanisms)})"
            )

        def step(token: bytes) -> bytes:
            resp = self._roundtrip(sock, 36, 2, {"auth_bytes": token})
            if int(resp.error_code):
                raise AdminError(
                    f"SASL/{s.mechanism} authentication of {s.username!r} failed: "
                    f"{resp.error_message or int(resp.error_code)}"
                )
            return bytes(resp.auth_bytes or b"")

        if s.mechanism == "PLAIN":
            step(f"\0{s.username}\0{s.password}".encode())
            return
        scram = ScramClient(MECHANISMS[s.mechanism], s.username, s.password)
        server_first = step(scram.first())
        try:
            scram.verify(step(scram.final(server_first)))
        except ValueError as exc:
            raise AdminError(f"SASL/{s.mechanism}: {exc}") from exc

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        for attempt in range(2):
            sock = self._connect()
            try:
                return self._roundtrip(sock, api_key, version, body)
            except OSError as exc:
                self.close()
                if attempt:
                    raise AdminError(f"connection failed: {exc}") from exc
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
        resp = self.call(
            45,
            0,
            {
                "timeout": timeout_ms,
                "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
            },
        )
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
