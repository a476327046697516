"""A small blocking Kafka admin client for the CLI.

It speaks the Kafka protocol to any broker (which forwards to the controller), so the CLI works
against TidalMQ exactly as Kafka's tools do, with no extra port. Given client properties
(`--command-config`, tidalmq_core.client_properties) it connects with TLS and authenticates with
SASL (PLAIN, SCRAM-SHA-256/512: SaslHandshake v1, then SaslAuthenticate v2) as Kafka's clients do.

The requests `tidalmq reassign` makes (and SASL) are encoded by `admin_wire` (stdlib only);
`call()`, for any other API, uses the broker's codec (kio), imported on its first use: a command
that needs only the former starts without importing kio and asyncio (docs/cli.md).
"""

from __future__ import annotations

import socket
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from tidalmq_core.cli_values import split_address
from tidalmq_core.model import TopicPartition

from tidalmq_broker import admin_wire

if TYPE_CHECKING:  # a plaintext client (the CLI's usual) needs no client properties: no
    # dataclasses, no regular expressions compiled at its start (docs/cli.md)
    from tidalmq_core.client_properties import ClientSecurity

CLIENT_ID = "tidalmq-cli"


class AdminError(Exception):
    pass


def _host(name: str) -> str:
    """An ASCII host name as bytes: getaddrinfo encodes a str with the IDNA codec, whose import
    (encodings.idna, stringprep, unicodedata) an address or a plain name does not need. (Typed
    str: typeshed types create_connection's host so, though getaddrinfo takes bytes too.)"""
    return cast(str, name.encode()) if name.isascii() else name


def _is_tls_error(exc: OSError) -> bool:
    """ssl.SSLError, without importing ssl: a connection without TLS never raises it (and the
    CLI's start does not pay for the module: docs/cli.md)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(exc, ssl.SSLError)


def assignment_of(md: Any) -> dict[TopicPartition, list[int]]:
    """Each partition's replicas in a Metadata answer; a topic answered with an error raises."""
    out: dict[TopicPartition, list[int]] = {}
    for t in md.topics:
        if t.error_code != 0:
            raise AdminError(f"topic {t.name}: {t.error_code.name}")
        for p in t.partitions:
            out[TopicPartition(t.name, p.partition_index)] = list(p.replica_nodes)
    return out


def leaders_of(md: Any) -> dict[TopicPartition, int]:
    """Each partition's leader in a Metadata answer."""
    return {
        TopicPartition(t.name, p.partition_index): p.leader_id
        for t in md.topics
        for p in t.partitions
    }


class AdminClient:
    def __init__(
        self, bootstrap: str, *, timeout_s: float = 30.0, security: ClientSecurity | None = None
    ) -> None:
        self._servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
        if not self._servers:
            raise AdminError("no bootstrap server given")
        self._timeout = timeout_s
        self._security = security  # None: PLAINTEXT
        self._ssl = None
        if security is not None and security.tls:
            from tidalmq_core.client_properties import ClientConfigError

            try:
                self._ssl = security.ssl_context()
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
                sock = socket.create_connection((_host(name), port), self._timeout)
                if self._ssl is not None:
                    sock = self._ssl.wrap_socket(sock, server_hostname=name)
                if self._security is not None and self._security.sasl:
                    self._authenticate(sock, self._security)
                self._sock = sock
                return sock
            except AdminError:  # refused by SASL: another broker would refuse it too
                if sock is not None:
                    sock.close()
                raise
            except OSError as exc:
                if _is_tls_error(exc):
                    errors.append(
                        f"{server}: TLS handshake failed ({getattr(exc, 'reason', None) or exc})"
                    )
                else:
                    errors.append(f"{server}: {exc}")
            if sock is not None:
                sock.close()
        raise AdminError("cannot reach any bootstrap server: " + "; ".join(errors))

    def _roundtrip(self, sock: socket.socket, api_key: int, version: int, body: Any) -> Any:
        """One request of any API, encoded and decoded by the broker's codec (kio)."""
        from tidalmq_broker.protocol.codec import decode_response, encode_request

        return self._exchange(
            sock,
            lambda corr: encode_request(api_key, version, corr, body, CLIENT_ID)[4:],  # no size
            lambda frame: decode_response(api_key, version, frame),
        )

    def _exchange(
        self,
        sock: socket.socket,
        encode: Callable[[int], bytes],
        decode: Callable[[bytes], tuple[int, Any]],
    ) -> Any:
        """Send the request `encode` makes (without its size) for the next correlation id, read
        its response."""
        self._correlation += 1
        request = encode(self._correlation)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", self._recv(sock, 4))
        corr, resp = decode(self._recv(sock, size))
        if corr != self._correlation:
            raise AdminError("response out of order")
        return resp

    def _wire(
        self, sock: socket.socket, api: tuple[int, int], encode: Callable[[int], bytes]
    ) -> Any:
        """One of admin_wire's requests."""
        try:
            return self._exchange(sock, encode, lambda frame: admin_wire.read_response(api, frame))
        except ValueError as exc:  # a frame that does not decode as the schema says
            raise AdminError(f"malformed response to api {api[0]} v{api[1]}: {exc}") from exc

    def _authenticate(self, sock: socket.socket, s: ClientSecurity) -> None:
        """SASL on a new connection: SaslHandshake v1 naming the mechanism, then its tokens in
        SaslAuthenticate v2 requests (KIP-152)."""
        resp = self._wire(
            sock,
            admin_wire.SASL_HANDSHAKE,
            lambda corr: admin_wire.sasl_handshake_request(s.mechanism, corr, CLIENT_ID),
        )
        if int(resp.error_code):
            raise AdminError(
                f"SASL mechanism {s.mechanism} refused by the broker "
                f"(it offers {', '.join(resp.mechanisms)})"
            )

        def step(token: bytes) -> bytes:
            resp = self._wire(
                sock,
                admin_wire.SASL_AUTHENTICATE,
                lambda corr: admin_wire.sasl_authenticate_request(token, corr, CLIENT_ID),
            )
            if int(resp.error_code):
                raise AdminError(
                    f"SASL/{s.mechanism} authentication of {s.username!r} failed: "
                    f"{resp.error_message or int(resp.error_code)}"
                )
            return bytes(resp.auth_bytes or b"")

        if s.mechanism == "PLAIN":
            step(f"\0{s.username}\0{s.password}".encode())
            return
        from tidalmq_core.scram import MECHANISMS, ScramClient

        scram = ScramClient(MECHANISMS[s.mechanism], s.username, s.password)
        server_first = step(scram.first())
        try:
            scram.verify(step(scram.final(server_first)))
        except ValueError as exc:
            raise AdminError(f"SASL/{s.mechanism}: {exc}") from exc

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """Any request, as the broker's codec (kio) has it: `body` a dict of its fields."""
        return self._retrying(lambda sock: self._roundtrip(sock, api_key, version, body))

    def _call_wire(self, api: tuple[int, int], encode: Callable[[int], bytes]) -> Any:
        return self._retrying(lambda sock: self._wire(sock, api, encode))

    def _retrying(self, exchange: Callable[[socket.socket], Any]) -> Any:
        """`exchange` on the connection, once more on a new one if the first has gone."""
        for attempt in range(2):
            sock = self._connect()
            try:
                return exchange(sock)
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
        """Metadata v12 of `topics` (None: all), without creating any."""
        return self._call_wire(
            admin_wire.METADATA,
            lambda corr: admin_wire.metadata_request(topics, corr, CLIENT_ID),
        )

    def assignment(self, topics: list[str] | None = None) -> dict[TopicPartition, list[int]]:
        return assignment_of(self.metadata(topics))

    def leaders(self, topics: list[str] | None = None) -> dict[TopicPartition, int]:
        return leaders_of(self.metadata(topics))

    def brokers(self) -> list[int]:
        return sorted(b.node_id for b in self.metadata([]).brokers)

    def alter_reassignments(
        self, targets: dict[TopicPartition, int | None], *, timeout_ms: int = 60000
    ) -> dict[TopicPartition, tuple[int, str | None]]:
        by_topic: dict[str, list[tuple[int, list[int] | None]]] = {}
        for tp, target in targets.items():
            by_topic.setdefault(tp.topic, []).append(
                (tp.partition, None if target is None else [target])
            )
        resp = self._call_wire(
            admin_wire.ALTER_PARTITION_REASSIGNMENTS,
            lambda corr: admin_wire.alter_reassignments_request(
                timeout_ms, by_topic, corr, CLIENT_ID
            ),
        )
        if resp.error_code != 0:
            raise AdminError(f"{resp.error_code.name}: {resp.error_message}")
        return {
            TopicPartition(t.name, p.partition_index): (int(p.error_code), p.error_message)
            for t in resp.responses
            for p in t.partitions
        }

    def list_reassignments(self) -> dict[TopicPartition, tuple[list[int], list[int], list[int]]]:
        resp = self._call_wire(
            admin_wire.LIST_PARTITION_REASSIGNMENTS,
            lambda corr: admin_wire.list_reassignments_request(60000, corr, CLIENT_ID),
        )
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
