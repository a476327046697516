"""The one mechanism TLS contexts reload their files by (tidalmq_core.tls_reload.FollowingContext),
which the Kafka listeners (tests/unit/security/test_tls_reload.py) and the control plane
(tests/unit/security/test_control_tls.py) are built on: when the files are looked at, what a
failed reload leaves, and that the TLS object class set on the context (a listener's handshake
reporting) or by its build (the control plane's check of the server's role) makes every
connection's TLS object, before and after a reload."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_core import certs
from tidalmq_core.tls_reload import FollowingContext, file_stamp


def _write(path: Path, issued: certs.Issued) -> int:
    """Key and certificate into `path` as a Secret volume update does (a new file put in place
    at once); the certificate's serial number."""
    staged = path.with_suffix(".new")
    staged.write_bytes(issued.key_pem() + issued.cert_pem())
    os.replace(staged, path)
    return int(issued.cert.serial_number)


def _following(
    path: Path, look_every_s: float | None = None, tls_object: type[ssl.SSLObject] | None = None
) -> FollowingContext:
    def build() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(path))
        if tls_object is not None:
            ctx.sslobject_class = tls_object
        return ctx

    return FollowingContext(
        ssl.PROTOCOL_TLS_SERVER,
        "test TLS",
        (str(path),),
        build,
        certificate_file=str(path),
        look_every_s=look_every_s,
    )


@pytest.fixture
def ca() -> certs.Issued:
    return certs.new_ca("following CA")


def test_the_files_are_looked_at_when_told_or_on_a_connection_when_it_is_time(
    ca: certs.Issued, tmp_path: Path
) -> None:
    path = tmp_path / "server.pem"
    _write(path, certs.issue(ca, "server", hosts=["localhost"]))
    told_only, hourly, always = (_following(path, s) for s in (None, 3600.0, 0.0))
    before = {c: c.current for c in (told_only, hourly, always)}
    renewed = certs.issue(ca, "server", hosts=["localhost"], days=90)
    _write(path, renewed)
    # a connection: only the context whose time to look has come sees the change
    assert told_only.current is before[told_only] and told_only.reloads == 0
    assert hourly.current is before[hourly] and hourly.reloads == 0
    assert always.current is not before[always] and always.reloads == 1
    # told to look (the broker's period, an AlterConfigs): the change is taken, once
    assert told_only.check() and not told_only.check() and told_only.reloads == 1
    assert told_only.current is not before[told_only]
    assert told_only.not_after == pytest.approx(renewed.cert.not_valid_after_utc.timestamp())


def test_files_that_cannot_be_loaded_keep_the_context_are_logged_once_and_retried(
    ca: certs.Issued, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "server.pem"
    first = certs.issue(ca, "server", hosts=["localhost"])
    _write(path, first)
    ctx = _following(path)
    serving = ctx.current
    path.write_bytes(first.cert_pem())  # half written: the certificate, not yet its key
    with caplog.at_level(logging.WARNING, logger="tidalmq_core.tls_reload"):
        assert not ctx.check() and not ctx.check()  # retried at each look (the stamp is kept)
    assert ctx.failures == 2 and ctx.last_error and ctx.current is serving
    assert [r.getMessage() for r in caplog.records] == [
        f"test TLS: TLS files changed but cannot be loaded: {ctx.last_error}"
    ]
    path.unlink()  # gone for a moment (a Secret's link swapped): still the same context
    assert file_stamp(str(path)) == (-1, -1, -1, -1)
    assert not ctx.check() and ctx.failures == 3 and ctx.current is serving
    _write(path, certs.issue(ca, "server", hosts=["localhost"]))
    assert ctx.check() and ctx.last_error == "" and ctx.current is not serving


def test_unusable_files_at_the_start_raise(ca: certs.Issued, tmp_path: Path) -> None:
    path = tmp_path / "server.pem"
    path.write_bytes(ca.cert_pem())  # no key
    with pytest.raises(ssl.SSLError):
        _following(path)


@pytest.mark.parametrize("set_by", ["the following context", "the build"])
async def test_the_tls_object_class_makes_every_connection_before_and_after_a_reload(
    ca: certs.Issued, tmp_path: Path, set_by: str
) -> None:
    """A listener sets its handshake reporting as the following context's sslobject_class; the
    control plane's build sets its check of the server's role on each context it builds. Either
    way, connections made from a context built later (a reload) must be made with it."""
    made: list[ssl.SSLObject] = []

    class Recorded(ssl.SSLObject):
        def do_handshake(self) -> None:
            # first called on the ClientHello: before the client can see the server's answer
            if self not in made:
                made.append(self)
            super().do_handshake()

    path = tmp_path / "server.pem"
    first = _write(path, certs.issue(ca, "server", hosts=["localhost"]))
    if set_by == "the build":
        ctx = _following(path, tls_object=Recorded)
    else:
        ctx = _following(path)
        ctx.sslobject_class = Recorded
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]

    async def served() -> int:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="localhost"
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return int(x509.load_der_x509_certificate(der).serial_number)

    try:
        assert await served() == first
        renewed = _write(path, certs.issue(ca, "server", hosts=["localhost"]))
        assert ctx.check()
        assert await served() == renewed
        assert len(made) == 2 and made[0].context is not made[1].context
    finally:
        server.close()
        await server.wait_closed()
