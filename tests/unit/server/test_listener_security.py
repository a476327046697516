"""The Kafka listener's security on real loopback sockets, in-process: nothing but ApiVersions,
SaslHandshake and SaslAuthenticate before a SASL connection authenticated; SaslHandshake v1
(SaslAuthenticate) and v0 (raw tokens); failures answered and closed; the principal of SASL and
of client certificates; PLAINTEXT connections are anonymous."""

from __future__ import annotations

import asyncio
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
from kafka.net.sasl.scram import ScramClient
from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY as METRICS
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.protocol.codec import decode_response, encode_request
from tidalmq_broker.security import certs
from tidalmq_broker.security.principal import PrincipalMapper
from tidalmq_broker.security.sasl import SaslConfig
from tidalmq_broker.security.tls import TlsSettings, server_context
from tidalmq_broker.server.connection import Connection
from tidalmq_broker.server.listener import KafkaListener
from tidalmq_broker.server.listener_config import ListenerEndpoint
from tidalmq_core import scram
from tidalmq_core.metadata import ClusterMetadata

USERS = {("alice", "SCRAM-SHA-256"): scram.new_credential(scram.SCRAM_SHA_256, "alice-secret")}
SASL = SaslConfig(("PLAIN", "SCRAM-SHA-256"), lambda u, m: USERS.get((u, m)))
METADATA = 3
MD_REQUEST = {
    "topics": None,
    "allow_auto_topic_creation": False,
    "include_topic_authorized_operations": False,
}
METADATA_BODY = {
    "throttle_time": 0,
    "brokers": [],
    "cluster_id": "c",
    "controller_id": 0,
    "topics": [],
    "cluster_authorized_operations": -2147483648,
    "error_code": 0,
}

# the handlers ApiVersions reaches read only the metadata (no cluster yet: no features)
NO_BROKER = SimpleNamespace(metadata=ClusterMetadata("", version=-1))


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Both event loops the broker runs on (their TLS layers are different code)."""
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


class Served:
    """Metadata requests that reached a handler, with the principal they came with."""

    def __init__(self) -> None:
        self.principals: list[str] = []

    def dispatch(self, api_key: int) -> Any:
        if api_key == METADATA:

            async def metadata(request: Any, conn: Connection) -> Any:
                self.principals.append(conn.principal)
                return METADATA_BODY

            return metadata
        spec = REGISTRY.get(api_key)
        if spec is None:
            return None
        return lambda request, conn: spec.handler(NO_BROKER, request, conn)  # type: ignore[arg-type]


@pytest.fixture
async def served() -> Served:
    return Served()


async def start(served: Served, endpoints: list[ListenerEndpoint]) -> KafkaListener:
    listener = KafkaListener(served.dispatch, supported_versions, api_versions_body)
    await listener.start_endpoints(endpoints)
    return listener


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.correlation = reader, writer, 0

    @classmethod
    async def connect(cls, port: int, ctx: ssl.SSLContext | None = None) -> Client:
        r, w = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="localhost" if ctx else None
        )
        return cls(r, w)

    async def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation += 1
        self.writer.write(encode_request(key, version, self.correlation, body))
        frame = await self.raw_frame()
        correlation, response = decode_response(key, version, frame)
        assert correlation == self.correlation
        return response

    async def raw(self, token: bytes) -> bytes:
        self.writer.write(struct.pack(">i", len(token)) + token)
        return await self.raw_frame()

    async def raw_frame(self) -> bytes:
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), 5))[0]
        return await asyncio.wait_for(self.reader.readexactly(size), 5)

    async def closed(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1), 5) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def sasl_listener(served: Served) -> AsyncIterator[KafkaListener]:
    listener = await start(
        served,
        [
            ListenerEndpoint("SASL_PLAINTEXT", "127.0.0.1", 0, "SASL_PLAINTEXT", sasl=SASL),
            ListenerEndpoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"),
        ],
    )
    yield listener
    await listener.close()


async def test_nothing_but_the_handshake_before_authentication(
    sasl_listener: KafkaListener, served: Served
) -> None:
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    versions = await c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert {17, 36, 50, 51} <= {k.api_key for k in versions.api_keys}
    c.writer.write(encode_request(METADATA, 12, 9, MD_REQUEST))
    assert await c.closed()
    assert served.principals == []  # never reached a handler


async def test_handshake_v1_then_authenticate(sasl_listener: KafkaListener, served: Served) -> None:
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    hs = await c.call(17, 1, {"mechanism": "PLAIN"})
    assert hs.error_code == ErrorCode.none and set(hs.mechanisms) == {"PLAIN", "SCRAM-SHA-256"}
    auth = await c.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
    assert auth.error_code == ErrorCode.none
    assert auth.session_lifetime.total_seconds() == 0  # no re-authentication
    await c.call(METADATA, 12, MD_REQUEST)
    assert served.principals == ["User:alice"]
    # after authentication SASL requests are illegal, as on any KafkaApis
    again = await c.call(36, 2, {"auth_bytes": b"x"})
    assert again.error_code == ErrorCode.illegal_sasl_state
    c.close()


async def test_wrong_password_is_answered_then_closed(sasl_listener: KafkaListener) -> None:
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    await c.call(17, 1, {"mechanism": "PLAIN"})
    auth = await c.call(36, 1, {"auth_bytes": b"\0alice\0guess"})
    answered = time.monotonic()
    assert auth.error_code == ErrorCode.sasl_authentication_failed
    assert auth.error_message == "Authentication failed: Invalid username or password"
    assert await c.closed()
    # closed after Kafka's connection.failed.authentication.delay.ms (100 ms), not at once:
    # some clients drop an answer that arrives together with the close
    assert time.monotonic() - answered >= 0.09


async def test_handshake_v0_then_raw_scram_tokens(
    sasl_listener: KafkaListener, served: Served
) -> None:
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    assert (await c.call(17, 0, {"mechanism": "SCRAM-SHA-256"})).error_code == ErrorCode.none
    client = ScramClient("alice", "alice-secret", "SCRAM-SHA-256")
    client.process_server_first_message(await c.raw(client.first_message()))
    client.process_server_final_message(await c.raw(client.final_message()))
    await c.call(METADATA, 12, MD_REQUEST)
    assert served.principals == ["User:alice"]
    c.close()
    # a wrong password in raw mode: v0 cannot carry an error, the connection just closes
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    await c.call(17, 0, {"mechanism": "SCRAM-SHA-256"})
    client = ScramClient("alice", "guess", "SCRAM-SHA-256")
    client.process_server_first_message(await c.raw(client.first_message()))
    c.writer.write(struct.pack(">i", len(final := client.final_message())) + final)
    assert await c.closed()


async def test_unsupported_mechanism_and_oversized_frames(sasl_listener: KafkaListener) -> None:
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    hs = await c.call(17, 1, {"mechanism": "GSSAPI"})
    assert hs.error_code == ErrorCode.unsupported_sasl_mechanism
    assert set(hs.mechanisms) == {"PLAIN", "SCRAM-SHA-256"}
    assert await c.closed()
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    c.writer.write(struct.pack(">i", 600 * 1024) + b"\0" * 1024)  # > sasl.server.max.receive.size
    assert await c.closed()
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    c.writer.write(encode_request(36, 1, 1, {"auth_bytes": b"\0alice\0alice-secret"}))
    assert await c.closed()  # SaslAuthenticate before SaslHandshake


async def test_each_listener_exports_its_kinds_of_failure_at_0_from_its_start(
    sasl_listener: KafkaListener,
) -> None:
    """The first failure is then an increase a rate sees; PLAINTEXT can have none."""

    def failures(listener: str, kind: str) -> float | None:
        labels = {"listener": listener, "kind": kind}
        return METRICS.get_sample_value("tidalmq_authentication_failures_total", labels)

    for kind in ("sasl", "unauthenticated_request"):
        assert failures("SASL_PLAINTEXT", kind) is not None
    for kind in ("tls", "principal"):
        assert failures("SASL_PLAINTEXT", kind) is None
    for kind in ("tls", "principal", "sasl", "unauthenticated_request"):
        assert failures("PLAINTEXT", kind) is None
    before = failures("SASL_PLAINTEXT", "sasl") or 0.0
    c = await Client.connect(sasl_listener.ports["SASL_PLAINTEXT"])
    await c.call(17, 1, {"mechanism": "PLAIN"})
    await c.call(36, 1, {"auth_bytes": b"\0alice\0guess"})
    assert await c.closed()
    assert failures("SASL_PLAINTEXT", "sasl") == before + 1


async def test_plaintext_is_anonymous(sasl_listener: KafkaListener, served: Served) -> None:
    c = await Client.connect(sasl_listener.ports["PLAINTEXT"])
    hs = await c.call(17, 1, {"mechanism": "PLAIN"})
    assert hs.error_code == ErrorCode.illegal_sasl_state
    await c.call(METADATA, 12, MD_REQUEST)
    assert served.principals == ["User:ANONYMOUS"]
    c.close()


async def test_ssl_principal_from_the_client_certificate(tmp_path: Path, served: Served) -> None:
    ca, other = certs.new_ca(), certs.new_ca("someone else")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    certs.write_keystore(
        tmp_path / "broker.pem", certs.issue(ca, "broker", hosts=["localhost"]), ca
    )
    tls = TlsSettings(
        str(tmp_path / "broker.pem"),
        truststore_location=str(tmp_path / "ca.pem"),
        client_auth="requested",
    )
    listener = await start(
        served,
        [
            ListenerEndpoint(
                "SSL",
                "127.0.0.1",
                0,
                "SSL",
                ssl_context=server_context(tls),
                principal_mapper=PrincipalMapper("RULE:^CN=(.*?),OU=Apps,.*$/$1/L,DEFAULT"),
            )
        ],
    )
    port = listener.ports["SSL"]

    def client_ctx(issued: certs.Issued | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        if issued is not None:
            (tmp_path / "c.crt").write_bytes(issued.cert_pem())
            (tmp_path / "c.key").write_bytes(issued.key_pem())
            ctx.load_cert_chain(str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
        return ctx

    try:
        for issued in (
            certs.issue(
                ca, {"O": "Acme", "OU": "Apps", "CN": "Billing"}, server=False, client=True
            ),
            certs.issue(ca, {"O": "Acme", "CN": "ops"}, server=False, client=True),
            None,  # requested, not required: no certificate is anonymous
        ):
            c = await Client.connect(port, client_ctx(issued))
            await c.call(METADATA, 12, MD_REQUEST)
            c.close()
        assert served.principals == ["User:billing", "User:CN=ops,O=Acme", "User:ANONYMOUS"]
        untrusted = certs.issue(other, "mallory", server=False, client=True)
        c = await Client.connect(port, client_ctx(untrusted))  # TLS 1.3: refused after
        c.writer.write(encode_request(METADATA, 12, 1, MD_REQUEST))
        # the client learns why, from the TLS alert, as from Kafka
        with pytest.raises(ssl.SSLError, match="ALERT_UNKNOWN_CA"):
            await asyncio.wait_for(c.reader.read(1), 5)
        assert len(served.principals) == 3
        # a client speaking no TLS at all is dropped at once (OpenSSL has no alert for it), not
        # after the listener's handshake timeout (10 s), which its waiting for an answer would
        # otherwise take
        c = await Client.connect(port)
        c.writer.write(encode_request(METADATA, 12, 1, MD_REQUEST))
        assert await c.closed()
        c.close()
        assert len(served.principals) == 3
    finally:
        await listener.close()
