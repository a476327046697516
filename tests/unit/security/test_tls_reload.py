"""Renewed certificates without a restart (security/tls.py, listener_context: a
tidalmq_core.tls_reload.FollowingContext): a TLS server on loopback bound to the listener's
context serves the new certificate to new connections once its files changed, keeps open
connections as they are, keeps the old certificate while the new files cannot be loaded, and
follows a new truststore for client certificates."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_broker.security import certs
from tidalmq_broker.security.tls import TlsSettings, listener_context
from tidalmq_core.tls_reload import FollowingContext

from tests.support.revocation import crl_pem


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(100):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


class Server:
    def __init__(self, reloader: FollowingContext) -> None:
        self.reloader = reloader
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=self.reloader)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def connect(
        self, client: ssl.SSLContext
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """A connection and the serial number of the certificate the server presented."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=client, server_hostname="localhost"
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(b"ping")
        # with TLS 1.3 a refused client certificate shows only here: the server closes
        if await asyncio.wait_for(reader.read(4), 5) != b"ping":
            raise ConnectionError("the server closed the connection")
        return reader, writer, x509.load_der_x509_certificate(der).serial_number


def client_context(
    ca: certs.Issued, tmp_path: Path, me: certs.Issued | None = None
) -> ssl.SSLContext:
    ca_file = tmp_path / f"client-trust-{ca.cert.serial_number}.pem"
    ca_file.write_bytes(ca.cert_pem())
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if me is not None:
        keystore = tmp_path / f"client-{me.cert.serial_number}.pem"
        certs.write_keystore(keystore, me)
        ctx.load_cert_chain(str(keystore))
    return ctx


@pytest.fixture
def ca() -> certs.Issued:
    return certs.new_ca("reload test CA")


@pytest.fixture
async def served(ca: certs.Issued, tmp_path: Path) -> AsyncIterator[tuple[Server, Path]]:
    keystore = tmp_path / "broker.pem"
    certs.write_keystore(keystore, certs.issue(ca, "broker", hosts=["localhost"]), ca)
    reloader = listener_context("SSL", TlsSettings(keystore_location=str(keystore)))
    async with Server(reloader) as server:
        yield server, keystore


async def test_a_renewed_certificate_is_served_to_new_connections(
    served: tuple[Server, Path], ca: certs.Issued, tmp_path: Path
) -> None:
    server, keystore = served
    client = client_context(ca, tmp_path)
    old_reader, old_writer, first = await server.connect(client)
    assert not server.reloader.check()  # nothing changed: nothing rebuilt
    renewed = certs.issue(ca, "broker", hosts=["localhost"], days=90)
    # a Secret update under a Kubernetes mount: a new file put in place of the old one
    staged = tmp_path / "broker.pem.new"
    certs.write_keystore(staged, renewed, ca)
    staged.replace(keystore)
    assert server.reloader.check() and server.reloader.reloads == 1
    assert server.reloader.not_after == pytest.approx(renewed.cert.not_valid_after_utc.timestamp())
    _, writer, second = await server.connect(client)
    assert second == renewed.cert.serial_number != first
    # the connection opened before the renewal goes on as it was
    old_writer.write(b"more")
    assert await asyncio.wait_for(old_reader.read(4), 5) == b"more"
    for w in (writer, old_writer):
        w.close()


async def test_unloadable_files_keep_the_old_certificate_until_fixed(
    served: tuple[Server, Path], ca: certs.Issued, tmp_path: Path
) -> None:
    server, keystore = served
    client = client_context(ca, tmp_path)
    _, w1, first = await server.connect(client)
    # half-written: the certificate of a renewal without its key
    keystore.write_bytes(certs.issue(ca, "broker", hosts=["localhost"]).cert_pem())
    assert not server.reloader.check()
    assert server.reloader.failures == 1 and "cannot load" in server.reloader.last_error
    _, w2, still = await server.connect(client)
    assert still == first
    fixed = certs.issue(ca, "broker", hosts=["localhost"])
    certs.write_keystore(keystore, fixed, ca)
    assert server.reloader.check() and server.reloader.last_error == ""
    _, w3, now = await server.connect(client)
    assert now == fixed.cert.serial_number
    for w in (w1, w2, w3):
        w.close()


async def test_a_new_truststore_decides_client_certificates(
    ca: certs.Issued, tmp_path: Path
) -> None:
    keystore, truststore = tmp_path / "broker.pem", tmp_path / "clients-ca.pem"
    certs.write_keystore(keystore, certs.issue(ca, "broker", hosts=["localhost"]), ca)
    old_clients, new_clients = certs.new_ca("old clients CA"), certs.new_ca("new clients CA")
    truststore.write_bytes(old_clients.cert_pem())
    settings = TlsSettings(
        keystore_location=str(keystore),
        truststore_location=str(truststore),
        client_auth="required",
    )
    alice = certs.issue(new_clients, "alice", server=False, client=True)
    async with Server(listener_context("SSL", settings)) as server:
        client = client_context(ca, tmp_path, me=alice)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await server.connect(client)  # signed by a CA the broker does not trust yet
        truststore.write_bytes(new_clients.cert_pem())
        assert server.reloader.check()
        _, writer, _ = await server.connect(client)
        writer.close()


async def test_revoked_client_certificates_are_refused_and_the_crl_is_reloaded(
    ca: certs.Issued, tmp_path: Path
) -> None:
    """ssl.crl.location: a certificate the CRL revokes fails the handshake, the others pass; a
    reissued CRL (revoking one more) is picked up without a restart."""
    keystore, truststore, crl = (tmp_path / n for n in ("broker.pem", "clients.pem", "crl.pem"))
    certs.write_keystore(keystore, certs.issue(ca, "broker", hosts=["localhost"]), ca)
    clients = certs.new_ca("clients CA")
    truststore.write_bytes(clients.cert_pem())
    alice, mallory = (
        certs.issue(clients, n, server=False, client=True) for n in ("alice", "mallory")
    )
    crl.write_bytes(crl_pem(clients, [mallory]))
    settings = TlsSettings(
        keystore_location=str(keystore),
        truststore_location=str(truststore),
        client_auth="required",
        crl_location=str(crl),
    )
    async with Server(listener_context("SSL", settings)) as server:
        _, writer, _ = await server.connect(client_context(ca, tmp_path, me=alice))
        writer.close()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await server.connect(client_context(ca, tmp_path, me=mallory))
        crl.write_bytes(crl_pem(clients, [mallory, alice]))
        assert server.reloader.check()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await server.connect(client_context(ca, tmp_path, me=alice))


def test_a_crl_needs_client_certificates_and_a_readable_file(tmp_path: Path) -> None:
    from tidalmq_broker.security.tls import TlsConfigError, server_context

    ca = certs.new_ca("broker CA")
    keystore = tmp_path / "broker.pem"
    certs.write_keystore(keystore, certs.issue(ca, "broker", hosts=["localhost"]), ca)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    base = {"keystore_location": str(keystore), "truststore_location": str(tmp_path / "ca.pem")}
    with pytest.raises(TlsConfigError, match=r"needs ssl\.client\.auth"):
        server_context(TlsSettings(**base, crl_location=str(tmp_path / "ca.pem")))
    with pytest.raises(TlsConfigError, match=r"ssl\.crl\.location"):
        server_context(
            TlsSettings(**base, client_auth="required", crl_location=str(tmp_path / "missing.pem"))
        )


def test_an_alter_configs_of_the_keystore_path_is_a_reload_of_this_brokers_listeners() -> None:
    """apis/configs.py: which keystore/truststore entries of a broker's AlterConfigs reload what
    (the whole exchange, with a broker process and librdkafka, is in
    tests/integration/security/test_certificate_reload.py)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from kio.schema.errors import ErrorCode
    from tidalmq_broker.apis.configs import split_tls_reloads

    broker: Any = SimpleNamespace(
        broker_id=3,
        settings=SimpleNamespace(ssl_keystore_location="/tls/tls.crt", ssl_truststore_location=""),
        tls_contexts={"SSL": object(), "SASL_SSL": object()},
    )
    keystore = "/tls/tls.crt"
    # every TLS listener, or the one named (kafka-configs writes listener names lower-case);
    # the rest of the changes go on to the controller; a DELETE is a success that does nothing
    both = split_tls_reloads(broker, "3", {"ssl.keystore.location": keystore, "x.rate": "5"})
    assert both == (frozenset({"SSL", "SASL_SSL"}), {"x.rate": "5"}, None)
    one = split_tls_reloads(
        broker, "3", {"listener.name.sasl_ssl.ssl.keystore.location": "/tls/../tls/tls.crt"}
    )
    assert one == (frozenset({"SASL_SSL"}), {}, None)
    assert split_tls_reloads(broker, "3", {"ssl.truststore.location": None}) == (
        frozenset(),
        {},
        None,
    )

    def refused(scope: str, name: str, value: str) -> tuple[ErrorCode, str]:
        bad = split_tls_reloads(broker, scope, {name: value}).bad
        assert bad is not None
        return cast(tuple[ErrorCode, str], bad)

    assert refused("", "ssl.keystore.location", keystore) == (
        ErrorCode.invalid_request,
        "Cannot update these configs at default cluster level, broker id must be specified: "
        "[ssl.keystore.location]",
    )
    assert refused("4", "ssl.keystore.location", keystore)[0] == ErrorCode.invalid_request
    code, why = refused("3", "ssl.keystore.location", "/elsewhere.pem")
    assert code == ErrorCode.invalid_config and "/tls/tls.crt" in why and "restart" in why
    code, why = refused("3", "ssl.truststore.location", "/ca.pem")  # none set: nothing to reload
    assert code == ErrorCode.invalid_config and "not set" in why
    code, why = refused("3", "listener.name.plaintext.ssl.keystore.location", keystore)
    assert code == ErrorCode.invalid_config and "no TLS listener PLAINTEXT" in why
