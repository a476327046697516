"""The roles a control-plane certificate names, and what each may present (tidalmq_core.control_tls)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_broker.security import certs
from tidalmq_core.control_tls import (
    ControlTls,
    ControlTlsError,
    Role,
    common_name,
    may_call_broker,
    permits,
    role_of,
    role_of_name,
    server_is_admin,
)
from tidalmq_core.tls_reload import FollowingContext


@pytest.mark.parametrize(
    ("cn", "role"),
    [
        ("controller", Role("controller", admin=True)),
        ("operator", Role("operator", admin=True)),
        ("admin", Role("admin", admin=True)),
        ("broker-0", Role("broker-0", broker_id=0)),
        ("broker-17", Role("broker-17", broker_id=17)),
        ("broker", Role("broker")),  # the chart's: any broker
        ("broker-", None),
        ("broker-x", None),
        ("broker-1234567890", None),  # ten digits: no broker id is that long
        ("Broker-1", None),
        ("admin ", None),
        ("alice", None),  # a Kafka client's certificate names no role
        ("", None),
    ],
)
def test_the_common_name_names_the_role(cn: str, role: Role | None) -> None:
    assert role_of_name(cn) == role


# (role, token of: None = the cluster token, N = broker N's) -> allowed
@pytest.mark.parametrize(
    ("cn", "token_of", "allowed"),
    [
        ("controller", None, True),
        ("operator", None, True),
        ("admin", None, True),
        ("admin", 3, False),  # an administrator's certificate presents the cluster token only
        ("broker-3", 3, True),
        ("broker-3", 4, False),  # never another broker's token
        ("broker-3", None, False),  # a broker that took the admin token still cannot use it
        ("broker", 3, True),  # the chart's shared broker certificate: the token binds the id
        ("broker", None, False),
    ],
)
def test_a_certificate_allows_the_tokens_of_its_role_only(
    cn: str, token_of: int | None, allowed: bool
) -> None:
    role = role_of_name(cn)
    assert role is not None
    why = permits(role, token_of)
    assert (why == "") is allowed, why
    if not allowed:
        assert f"CN={cn}" in why


@pytest.mark.parametrize(
    ("cn", "allowed"),
    [("controller", True), ("operator", True), ("broker-2", True), ("broker", True),
     ("broker-1", False)],
)  # fmt: skip
def test_a_brokers_control_endpoint_lets_in_the_controller_and_itself(
    cn: str, allowed: bool
) -> None:
    role = role_of_name(cn)
    assert role is not None
    assert (may_call_broker(role, 2) == "") is allowed


def test_the_role_of_a_peer_certificate() -> None:
    assert role_of(None) == (None, "no client certificate")
    assert role_of({}) == (None, "no client certificate")
    peer = {"subject": ((("organizationName", "Acme"),), (("commonName", "broker-4"),))}
    assert common_name(peer) == "broker-4"
    assert role_of(peer) == (Role("broker-4", broker_id=4), "")
    role, why = role_of({"subject": ((("commonName", "alice"),),)})
    assert role is None and why == "the certificate CN=alice names no control-plane role"
    assert role_of({"subject": ((("organizationName", "Acme"),),)})[0] is None


def test_the_setting_is_all_three_files_or_none(tmp_path: Path) -> None:
    assert ControlTls.from_files() is None
    assert ControlTls.from_env({}) is None
    with pytest.raises(ControlTlsError, match="--control-tls-key-file, --control-tls-ca-file"):
        ControlTls.from_files(cert_file="x.pem")
    with pytest.raises(ControlTlsError, match="cannot load the certificate"):
        ControlTls.from_files(str(tmp_path / "no.pem"), str(tmp_path / "no.pem"), "ca.pem")
    ca = certs.new_ca("control CA")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    certs.write_keystore(tmp_path / "b.pem", certs.issue(ca, "broker-1", client=True))
    tls = ControlTls.from_env({
        "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "b.pem"),
        "TIDALMQ_CONTROL_TLS_KEY_FILE": str(tmp_path / "b.pem"),
        "TIDALMQ_CONTROL_TLS_CA_FILE": str(tmp_path / "ca.pem"),
    })  # fmt: skip
    assert tls is not None and tls.env()["TIDALMQ_CONTROL_TLS_CA_FILE"] == str(tmp_path / "ca.pem")
    with pytest.raises(ControlTlsError, match="cannot load the CA certificate"):
        ControlTls.from_files(str(tmp_path / "b.pem"), str(tmp_path / "b.pem"), str(tmp_path / "b"))


# ---------------------------------------------------------------- renewed certificates, no restart
def _renew(path: Path, ca: certs.Issued, cn: str) -> int:
    """Write a new certificate for `cn` into `path` as a Secret volume update does (a new file
    put in place at once); its serial number."""
    issued = certs.issue(ca, cn, hosts=["127.0.0.1"], client=True)
    staged = path.with_suffix(".new")
    certs.write_keystore(staged, issued)
    os.replace(staged, path)
    return int(issued.cert.serial_number)


async def test_renewed_certificates_are_used_by_new_connections_without_a_restart(
    tmp_path: Path,
) -> None:
    """Server and client contexts follow their files: after a renewal the next connection
    presents the new certificate (each side sees the other's), the open one keeps its session;
    a half-written file keeps the previous certificate until it can be loaded."""
    ca = certs.new_ca("control CA")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem())
    server_file, client_file = tmp_path / "controller.pem", tmp_path / "broker-1.pem"
    serials = {"server": _renew(server_file, ca, "controller"),
               "client": _renew(client_file, ca, "broker-1")}  # fmt: skip
    server_tls = ControlTls(str(server_file), str(server_file), str(ca_file))
    client_tls = ControlTls(str(client_file), str(client_file), str(ca_file))
    server_ctx = server_tls.server_context()
    client_ctx = client_tls.client_context(server_is_admin)
    assert isinstance(server_ctx, FollowingContext) and isinstance(client_ctx, FollowingContext)
    seen_by_server: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen_by_server.append(x509.load_der_x509_certificate(der).serial_number)
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]

    async def connect() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert await reader.read() == b"ok"
        writer.close()
        return int(x509.load_der_x509_certificate(der).serial_number)

    def blocking_connect() -> int:  # http.client's way: wrap_socket
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return int(x509.load_der_x509_certificate(der).serial_number)

    try:
        assert await connect() == serials["server"]
        assert seen_by_server[-1] == serials["client"]
        renewed = {"server": _renew(server_file, ca, "controller"),
                   "client": _renew(client_file, ca, "broker-1")}  # fmt: skip
        assert renewed != serials
        assert server_ctx.check() and client_ctx.check()  # (else at the next connection 10 s on)
        assert not server_ctx.check()  # unchanged since
        assert await connect() == renewed["server"]
        assert seen_by_server[-1] == renewed["client"]
        assert await asyncio.to_thread(blocking_connect) == renewed["server"]

        # half written: the previous certificate stays until the file can be loaded
        server_file.write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
        assert not server_ctx.check() and server_ctx.failures == 1
        assert await connect() == renewed["server"]
        last = _renew(server_file, ca, "controller")
        assert server_ctx.check() and server_ctx.reloads == 2
        assert await connect() == last
    finally:
        server.close()
        await server.wait_closed()
