"""confluent-kafka, kafka-python and aiokafka over SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256,
PLAIN), SASL_PLAINTEXT (with the v0 handshake of old clients) and mTLS against a real broker
process: produce and consume; each listener describes the brokers by its own endpoint; wrong
passwords, unknown users and untrusted certificates are refused; a request before
authentication closes the connection."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import struct
import time
from typing import Any

import aiokafka
import aiokafka.errors
import kafka
import kafka.errors
import pytest
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.net.sasl.scram import ScramClient
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import decode_response, encode_request

from tests.integration.security.conftest import ADMIN, ADMIN_PASSWORD, SecureBroker, new_topic
from tests.support.kafka_python_reads import read_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCRAM_FAILED = (
    "Authentication failed during authentication due to invalid credentials with "
    "SASL mechanism SCRAM-SHA-512"
)


def confluent_round_trip(conf: dict[str, Any], topic: str, count: int = 20) -> list[bytes]:
    p = Producer({**conf, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    for i in range(count):
        p.produce(topic, f"v{i}".encode(), on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and not errors, errors
    c = Consumer(
        {**conf, "group.id": f"g-{topic}-{time.time_ns()}", "auto.offset.reset": "earliest"}
    )
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.commit(asynchronous=False)
    c.close()
    return got


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL", "SASL_PLAINTEXT", "PLAINTEXT"])
def test_confluent_kafka_on_every_listener(secure_broker: SecureBroker, listener: str) -> None:
    conf = secure_broker.confluent(listener)
    # each listener tells of the broker at its own endpoint (Kafka's per-listener metadata)
    brokers = AdminClient(conf).list_topics(timeout=30).brokers
    assert {(b.host, b.port) for b in brokers.values()} == {
        ("127.0.0.1", secure_broker.ports[listener])
    }
    topic = new_topic(secure_broker)
    got = confluent_round_trip(conf, topic)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(20))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_other_mechanisms(secure_broker: SecureBroker, mechanism: str) -> None:
    # a SCRAM-SHA-256 credential for admin, made with Kafka's API over the admin's SCRAM-SHA-512
    admin = AdminClient(secure_broker.confluent("SASL_SSL"))

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(ADMIN, info, ADMIN_PASSWORD.encode())]
    )[ADMIN].result(30)
    conf = secure_broker.confluent("SASL_SSL", **{"sasl.mechanism": mechanism})
    topic = new_topic(secure_broker, 1)
    assert len(confluent_round_trip(conf, topic, 5)) == 5


def test_kafka_python(secure_broker: SecureBroker, caplog: pytest.LogCaptureFixture) -> None:
    ctx = ssl.create_default_context(cafile=str(secure_broker.pki.ca))
    sasl = dict(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        ssl_context=ctx,
        sasl_plain_username=ADMIN,
        sasl_plain_password=ADMIN_PASSWORD,
        bootstrap_servers=secure_broker.bootstrap("SASL_SSL"),
    )
    mtls_ctx = ssl.create_default_context(cafile=str(secure_broker.pki.ca))
    mtls_ctx.load_cert_chain(str(secure_broker.pki.client_cert), str(secure_broker.pki.client_key))
    mtls = dict(
        security_protocol="SSL",
        ssl_context=mtls_ctx,
        bootstrap_servers=secure_broker.bootstrap("SSL"),
    )
    for settings in (sasl, mtls):
        topic = new_topic(secure_broker, 1)
        producer = kafka.KafkaProducer(**settings)  # type: ignore[arg-type]
        for i in range(10):
            producer.send(topic, f"k{i}".encode())
        producer.flush(30)
        producer.close()
        consumer = kafka.KafkaConsumer(
            topic, auto_offset_reset="earliest", consumer_timeout_ms=15000, **settings
        )  # type: ignore[arg-type]
        got = [m.value for m in read_to_end(consumer, 10)]
        consumer.close()
        assert got == [f"k{i}".encode() for i in range(10)], settings["security_protocol"]
    # a wrong password: the client gives up bootstrapping, having logged Kafka's error (its
    # first attempt is refused at once; the default bootstrap timeout, 30 s, only adds retries)
    with pytest.raises(kafka.errors.KafkaError):
        kafka.KafkaProducer(
            **{
                **sasl,
                "sasl_plain_password": "wrong",  # type: ignore[arg-type]
                "bootstrap_timeout_ms": 10_000,
            }
        )
    assert f"SaslAuthenticationFailedError: {SCRAM_FAILED}" in caplog.text


def _requests(broker: SecureBroker, api: str) -> float:
    pattern = re.compile(rf'^tidalmq_requests_total{{[^}}]*api="{api}"[^}}]*}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(broker.process.metrics()))


def test_an_old_client_with_the_v0_handshake(secure_broker: SecureBroker) -> None:
    """kafka-python as a Kafka 0.10.2 client: SaslHandshake v0, then the PLAIN and SCRAM
    tokens as raw frames (SaslAuthenticate came with Kafka 1.0). Produce v2 is older than
    TidalMQ serves, so the check is what such a client can do: authenticate and read metadata.
    (A wrong password in this mode just closes the connection, which such a client retries
    forever: the unit tests check that close.)"""
    topic = new_topic(secure_broker, 1)
    handshakes = _requests(secure_broker, "SaslHandshake")
    authenticates = _requests(secure_broker, "SaslAuthenticate")
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        consumer = kafka.KafkaConsumer(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_plain_username=ADMIN,
            sasl_plain_password=ADMIN_PASSWORD,
            api_version=(0, 10, 2),
            bootstrap_servers=secure_broker.bootstrap("SASL_PLAINTEXT"),
        )
        assert topic in consumer.topics()
        consumer.close()
    assert _requests(secure_broker, "SaslHandshake") > handshakes
    assert _requests(secure_broker, "SaslAuthenticate") == authenticates  # raw tokens only


def test_aiokafka(secure_broker: SecureBroker, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        sasl = dict(
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=ADMIN,
            sasl_plain_password=ADMIN_PASSWORD,
            ssl_context=create_ssl_context(cafile=str(secure_broker.pki.ca)),
            bootstrap_servers=secure_broker.bootstrap("SASL_SSL"),
        )
        mtls = dict(
            security_protocol="SSL",
            ssl_context=create_ssl_context(
                cafile=str(secure_broker.pki.ca),
                certfile=str(secure_broker.pki.client_cert),
                keyfile=str(secure_broker.pki.client_key),
            ),
            bootstrap_servers=secure_broker.bootstrap("SSL"),
        )
        for settings in (sasl, mtls):
            topic = new_topic(secure_broker, 1)
            producer = aiokafka.AIOKafkaProducer(**settings)  # type: ignore[arg-type]
            await producer.start()
            for i in range(10):
                await producer.send_and_wait(topic, f"a{i}".encode())
            await producer.stop()
            consumer = aiokafka.AIOKafkaConsumer(
                topic, group_id=f"ag-{topic}", auto_offset_reset="earliest", **settings
            )  # type: ignore[arg-type]
            await consumer.start()
            try:
                got = [(await asyncio.wait_for(consumer.getone(), 30)).value for _ in range(10)]
            finally:
                await consumer.stop()
            assert got == [f"a{i}".encode() for i in range(10)]
        bad = aiokafka.AIOKafkaProducer(**{**sasl, "sasl_plain_password": "wrong"})  # type: ignore[arg-type]
        with pytest.raises(aiokafka.errors.KafkaConnectionError):
            await bad.start()
        await bad.stop()
        assert f"[Error 58] SaslAuthenticationFailed: {SCRAM_FAILED}" in caplog.text

    asyncio.run(run())


def _sasl_ssl_socket(secure_broker: SecureBroker) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(secure_broker.pki.ca))
    sock = socket.create_connection(("127.0.0.1", secure_broker.ports["SASL_SSL"]), timeout=10)
    return ctx.wrap_socket(sock, server_hostname="127.0.0.1")


def _call(sock: socket.socket, key: int, version: int, body: dict[str, Any]) -> Any:
    sock.sendall(encode_request(key, version, 7, body))
    size = struct.unpack(">i", _read(sock, 4))[0]
    return decode_response(key, version, _read(sock, size))[1]


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


def test_wrong_password_is_sasl_authentication_failed(secure_broker: SecureBroker) -> None:
    errors: list[KafkaError] = []
    conf = secure_broker.confluent(
        "SASL_SSL", **{"sasl.password": "wrong", "error_cb": errors.append}
    )
    admin = AdminClient(conf)

    def refused() -> bool:
        return any(
            e.code() == KafkaError._AUTHENTICATION and SCRAM_FAILED in e.str() for e in errors
        )

    # no metadata, until the error callback told Kafka's reason (librdkafka retries the login
    # until list_topics' timeout: one 10 s call took the whole 10 s)
    deadline = time.monotonic() + 10
    while True:
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=1)
        admin.poll(0.1)  # serves the error callbacks
        if refused() or time.monotonic() > deadline:
            break
    del admin  # destroyed: no more retries with the wrong password
    assert refused(), errors
    # on the wire: Kafka's error code and message, then the connection is closed
    before = _failures(secure_broker, "SASL_SSL", "sasl")
    with _sasl_ssl_socket(secure_broker) as sock:
        assert _call(sock, 17, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == ErrorCode.none
        client = ScramClient(ADMIN, "wrong", "SCRAM-SHA-512")
        first = _call(sock, 36, 2, {"auth_bytes": client.first_message()})
        client.process_server_first_message(first.auth_bytes)
        final = _call(sock, 36, 2, {"auth_bytes": client.final_message()})
        assert final.error_code == ErrorCode.sasl_authentication_failed
        assert final.error_message == SCRAM_FAILED
        assert _closed(sock)
    # an unknown user fails the same way, and the broker logged one line per failure
    with _sasl_ssl_socket(secure_broker) as sock:
        _call(sock, 17, 1, {"mechanism": "SCRAM-SHA-512"})
        nobody = _call(sock, 36, 2, {"auth_bytes": b"n,,n=nobody,r=abcdef"})
        assert (nobody.error_code, nobody.error_message) == (
            ErrorCode.sasl_authentication_failed,
            SCRAM_FAILED,
        )
    # each failure counted; logged as one line unless over the rate (librdkafka retried fast)
    assert _failures(secure_broker, "SASL_SSL", "sasl") == before + 2
    log = secure_broker.process.log_path.read_text()
    assert "SASL/SCRAM-SHA-512 authentication of 'admin' from 127.0.0.1:" in log
    assert "on listener SASL_SSL failed: invalid client proof (wrong password)" in log


def _failures(broker: SecureBroker, listener: str, kind: str) -> float:
    pattern = re.compile(
        rf'^tidalmq_authentication_failures_total{{(?=[^}}]*listener="{listener}")'
        rf'(?=[^}}]*kind="{kind}")[^}}]*}} (\S+)$',
        re.M,
    )
    return sum(float(v) for v in pattern.findall(broker.process.metrics()))


def test_request_before_authentication_closes_the_connection(secure_broker: SecureBroker) -> None:
    topic = new_topic(secure_broker, 1)
    before = _failures(secure_broker, "SASL_SSL", "unauthenticated_request")
    # the log lines of failures are rate-limited (5 a second, bursts of 20): let the earlier
    # tests' ones drain, so this test's line is written, not counted as suppressed
    time.sleep(4.5)
    metadata = {
        "topics": [{"name": topic, "topic_id": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    with _sasl_ssl_socket(secure_broker) as sock:
        versions = _call(sock, 18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == ErrorCode.none  # ApiVersions is served before auth
        sock.sendall(encode_request(3, 12, 8, metadata))
        assert _closed(sock)
    raw = socket.create_connection(("127.0.0.1", secure_broker.ports["SASL_PLAINTEXT"]), timeout=10)
    with raw:
        raw.sendall(
            encode_request(
                0, 9, 1, {"transactional_id": None, "acks": 1, "timeout": 1000, "topic_data": []}
            )
        )
        assert _closed(raw)
    # the same request on the PLAINTEXT listener is served
    plain = socket.create_connection(("127.0.0.1", secure_broker.ports["PLAINTEXT"]), timeout=10)
    with plain:
        assert _call(plain, 3, 12, metadata).topics[0].name == topic
    assert "unexpected Kafka request of api key 3 during SASL handshake" in (
        secure_broker.process.log_path.read_text()
    )
    assert _failures(secure_broker, "SASL_SSL", "unauthenticated_request") == before + 1
    assert _failures(secure_broker, "SASL_PLAINTEXT", "unauthenticated_request") >= 1


def _refused_over_tls(broker: SecureBroker, conf: dict[str, object], timeout_s: float = 10) -> None:
    """An AdminClient of `conf` gets no metadata, until the broker counted a refused TLS
    handshake (a 10 s list_topics spent 10 s: librdkafka retries a refused handshake until its
    timeout)."""
    before = _failures(broker, "SSL", "tls")
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    while True:
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=1)
        if _failures(broker, "SSL", "tls") > before:
            return
        assert time.monotonic() < deadline, f"no refused TLS handshake counted in {timeout_s} s"


def test_untrusted_client_certificate_is_refused(secure_broker: SecureBroker) -> None:
    pki = secure_broker.pki
    before = _failures(secure_broker, "SSL", "tls")
    conf = secure_broker.confluent(
        "SSL",
        **{
            "ssl.certificate.location": str(pki.untrusted_cert),
            "ssl.key.location": str(pki.untrusted_key),
        },
    )
    _refused_over_tls(secure_broker, conf)
    # without a certificate at all (ssl.client.auth=required) as well
    conf_none = {
        k: v
        for k, v in secure_broker.confluent("SSL").items()
        if k not in ("ssl.certificate.location", "ssl.key.location")
    }
    _refused_over_tls(secure_broker, conf_none)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.untrusted_cert), str(pki.untrusted_key))
    sock = socket.create_connection(("127.0.0.1", secure_broker.ports["SSL"]), timeout=10)
    # TLS 1.3: the server checks the client's certificate after the client's handshake is done
    with (
        pytest.raises((ssl.SSLError, ConnectionError)),
        ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        _call(tls, 18, 0, {})
    assert _failures(secure_broker, "SSL", "tls") >= before + 3
    log = secure_broker.process.log_path.read_text()
    assert "TLS handshake on listener SSL failed: CERTIFICATE_VERIFY_FAILED" in log
    assert "TLS handshake on listener SSL failed: PEER_DID_NOT_RETURN_A_CERTIFICATE" in log
