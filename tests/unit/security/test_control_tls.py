"""The roles a control-plane certificate names, and what each may present (tidalmq_core.control_tls)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
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
    server_is_broker,
)
from tidalmq_core.tls_reload import FollowingContext

from tests.support.revocation import crl_pem


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
    [
        ("controller", True),
        ("operator", True),
        ("broker-2", True),
        ("broker", True),
        ("broker-1", False),
    ],
)
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
    tls = ControlTls.from_env(
        {
            "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "b.pem"),
            "TIDALMQ_CONTROL_TLS_KEY_FILE": str(tmp_path / "b.pem"),
            "TIDALMQ_CONTROL_TLS_CA_FILE": str(tmp_path / "ca.pem"),
        }
    )
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
    serials = {
        "server": _renew(server_file, ca, "controller"),
        "client": _renew(client_file, ca, "broker-1"),
    }
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
        renewed = {
            "server": _renew(server_file, ca, "controller"),
            "client": _renew(client_file, ca, "broker-1"),
        }
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


# ----------------------------------------------------- revoked certificates (--control-tls-crl-file)
def test_the_crl_setting_goes_with_the_three_files_and_must_load_at_start(tmp_path: Path) -> None:
    """The CRL file is a fourth, optional file: from the flag or TIDALMQ_CONTROL_TLS_CRL_FILE,
    in the broker's and the operator's settings, handed on to child processes; alone, missing
    or unloadable it stops the process at start with one line."""
    from tidalmq_broker.settings import from_sources
    from tidalmq_operator.settings import OperatorSettings

    ca = certs.new_ca("control CA")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    broker = certs.issue(ca, "broker-1", client=True)
    certs.write_keystore(tmp_path / "b.pem", broker)
    (tmp_path / "crl.pem").write_bytes(crl_pem(ca, []))
    files = [str(tmp_path / n) for n in ("b.pem", "b.pem", "ca.pem", "crl.pem")]
    with pytest.raises(ControlTlsError, match="--control-tls-crl-file is given but"):
        ControlTls.from_files(crl_file=files[3])
    for bad, why in (("missing.pem", "No such file"), ("half.pem", "PEM lib")):
        (tmp_path / "half.pem").write_bytes(crl_pem(ca, [])[:100])
        with pytest.raises(ControlTlsError) as info:
            ControlTls.from_files(*files[:3], str(tmp_path / bad))
        message = str(info.value)
        assert message.startswith("control-plane TLS: --control-tls-crl-file ") and why in message
        assert "cannot load revocation lists from it" in message and "\n" not in message
    env = dict(
        zip(
            (
                "TIDALMQ_CONTROL_TLS_CERT_FILE",
                "TIDALMQ_CONTROL_TLS_KEY_FILE",
                "TIDALMQ_CONTROL_TLS_CA_FILE",
                "TIDALMQ_CONTROL_TLS_CRL_FILE",
            ),
            files,
            strict=True,
        )
    )
    tls = ControlTls.from_env(env)
    assert tls == ControlTls(*files) and tls.env() == env
    assert ControlTls(*files[:3]).env()["TIDALMQ_CONTROL_TLS_CRL_FILE"] == ""  # never inherited
    from_broker = from_sources(env={**env, "TIDALMQ_CONTROLLER_URL": "https://x:1"}).control_tls()
    assert from_broker == tls
    assert OperatorSettings.from_env(env).control_tls() == tls
    # the broker's flag
    import argparse

    flags = argparse.Namespace(control_tls_crl_file=files[3])
    env.pop("TIDALMQ_CONTROL_TLS_CRL_FILE")
    assert (
        from_sources(flags, env={**env, "TIDALMQ_CONTROLLER_URL": "https://x:1"}).control_tls()
        == tls
    )


async def test_a_revoked_certificate_is_refused_on_either_side_without_a_restart(
    tmp_path: Path,
) -> None:
    """A CRL of the cluster CA: the server refuses a client certificate it revokes (a broker's
    calls), the client refuses a server certificate it revokes (the controller's pushes to that
    broker), each from the next look at the files on; the others go on working. A CRL file cut
    short keeps the last one that loaded (the revocation stays)."""
    ca = certs.new_ca("control CA")
    ca_file, crl_file = tmp_path / "ca.pem", tmp_path / "crl.pem"
    ca_file.write_bytes(ca.cert_pem())
    crl_file.write_bytes(crl_pem(ca, []))
    issued: dict[str, certs.Issued] = {}
    for cn in ("controller", "broker-1", "broker-2"):
        issued[cn] = certs.issue(ca, cn, hosts=["127.0.0.1"], client=True)
        certs.write_keystore(tmp_path / f"{cn}.pem", issued[cn])

    def tls(cn: str) -> ControlTls:
        path = str(tmp_path / f"{cn}.pem")
        return ControlTls(path, path, str(ca_file), str(crl_file))

    controller_server = tls("controller").server_context()
    pushes = tls("controller").client_context(server_is_broker)
    broker_calls = {cn: tls(cn).client_context(server_is_admin) for cn in ("broker-1", "broker-2")}
    contexts = [controller_server, pushes, *broker_calls.values()]

    async def serve(ctx: ssl.SSLContext) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)

    async def works(port: int, ctx: ssl.SSLContext) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
            ok = await reader.read() == b"ok"
            writer.close()
            return ok
        except (ssl.SSLError, ConnectionError):
            return False

    servers = {
        "controller": await serve(controller_server),
        "broker-1": await serve(tls("broker-1").server_context()),
        "broker-2": await serve(tls("broker-2").server_context()),
    }
    port = {name: s.sockets[0].getsockname()[1] for name, s in servers.items()}
    try:
        for cn, ctx in broker_calls.items():
            assert await works(port["controller"], ctx), cn
            assert await works(port[cn], pushes), cn
        staged = crl_file.with_suffix(".new")  # as a Secret volume update puts it in place
        staged.write_bytes(crl_pem(ca, [issued["broker-1"]]))
        os.replace(staged, crl_file)
        assert all(ctx.check() for ctx in contexts)  # (else at a connection 10 s on)
        assert not await works(port["controller"], broker_calls["broker-1"])  # its calls
        assert not await works(port["broker-1"], pushes)  # its endpoint, as the server
        assert await works(port["controller"], broker_calls["broker-2"])
        assert await works(port["broker-2"], pushes)
        # a CRL cut short: the last that loaded stays in force
        crl_file.write_bytes(crl_pem(ca, [])[:120])
        assert not controller_server.check() and controller_server.failures == 1
        assert "--control-tls-crl-file" in controller_server.last_error
        assert not await works(port["controller"], broker_calls["broker-1"])
        assert await works(port["controller"], broker_calls["broker-2"])
    finally:
        for server in servers.values():
            server.close()
            await server.wait_closed()
