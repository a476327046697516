"""PUTs and GETs on an S3 store go out signed but without botocore's client (s3_http.py):
against a real S3 server they are what botocore reads and writes, conditional writes lose
races as they do through botocore, a connection the server dropped is replaced, transient
answers are retried, and an answer the direct path does not follow (a redirect) hands that
request and the later ones to botocore's client."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tidalmq_broker.storage.objectstore import ObjectNotFound, PreconditionFailed
from tidalmq_broker.storage.objectstore.base import ObjectStoreUnavailable
from tidalmq_broker.storage.objectstore.s3 import S3ObjectStore
from tidalmq_broker.storage.objectstore.s3_http import ObjectAddress

from tests.support.s3_server import S3Server

pytestmark = pytest.mark.usefixtures("s3_server")


def _no_botocore(store: S3ObjectStore) -> None:
    """Make any PUT or GET through botocore's client fail the test."""

    def refuse(**_: Any) -> None:
        raise AssertionError("went through botocore's client")

    store._client.put_object = refuse
    store._client.get_object = refuse


async def test_puts_and_gets_are_what_botocore_writes_and_reads(s3_server: S3Server) -> None:
    direct = s3_server.make_store()
    through_botocore = s3_server.make_store(direct.prefix)
    through_botocore._http = None
    _no_botocore(direct)
    try:
        etag = await direct.put("wal/1", [b"head", bytearray(b"-" * 70_000), b"tail"])
        info = await through_botocore.head("wal/1")
        assert (info.size, info.etag) == (70_008, etag)
        assert await through_botocore.get("wal/1") == b"head" + b"-" * 70_000 + b"tail"
        await through_botocore.put("seg/a b=1", b"0123456789")
        assert await direct.get("seg/a b=1") == b"0123456789"
        assert await direct.get("seg/a b=1", 2, 5) == b"234"
        assert await direct.get("seg/a b=1", 7) == b"789"
        with pytest.raises(ObjectNotFound):
            await direct.get("seg/missing")
    finally:
        await direct.close()
        await through_botocore.close()


async def test_conditional_puts_lose_races_as_through_botocore(s3_server: S3Server) -> None:
    store = s3_server.make_store()
    _no_botocore(store)
    try:
        first = await store.put("cp", b"1", if_none_match=True)
        with pytest.raises(PreconditionFailed):
            await store.put("cp", b"2", if_none_match=True)
        second = await store.put("cp", b"2", if_match=first)
        with pytest.raises(PreconditionFailed):
            await store.put("cp", b"3", if_match=first)  # stale
        with pytest.raises(PreconditionFailed):
            await store.put("gone", b"3", if_match=second)  # the key does not exist
        assert await store.get("cp") == b"2"
    finally:
        await store.close()


async def test_a_connection_the_server_dropped_is_replaced(s3_server: S3Server) -> None:
    """Even with a single attempt allowed: replacing a connection the server closed while it
    was idle is not a retry."""
    from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    store = S3ObjectStore(
        s3_server.bucket,
        s3_server.unique_prefix(),
        endpoint_url=s3_server.endpoint_url,
        region=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        max_attempts=1,
    )
    _no_botocore(store)
    try:
        await store.put("k", b"x")
        assert store._http is not None
        connections = list(store._http._connections)
        assert connections
        for conn in connections:
            assert conn.sock is not None
            conn.sock.shutdown(socket.SHUT_RDWR)  # as a server closing an idle keep-alive
        assert await store.get("k") == b"x"
        await store.put("k2", b"y", if_none_match=True)
        assert await store.get("k2") == b"y"
    finally:
        await store.close()


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, body) of the server's script."""

    protocol_version = "HTTP/1.1"

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        server: Any = self.server
        server.seen.append(self.headers.get("Authorization", ""))
        status, body = server.script.pop(0) if server.script else (200, b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"scripted"')
        if status in (301, 307):
            self.send_header("Location", "http://elsewhere.invalid/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.script = []  # type: ignore[attr-defined]
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _aim(store: S3ObjectStore, server: http.server.ThreadingHTTPServer) -> None:
    assert store._http is not None
    store._http.close()
    host, port = server.server_address[:2]
    store._http.address = ObjectAddress.of("b", f"http://{host}:{port}", "r")


SLOW_DOWN = (
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


async def test_transient_answers_are_retried_then_reported(
    s3_server: S3Server, scripted: Any
) -> None:
    store = s3_server.make_store()
    _no_botocore(store)
    _aim(store, scripted)
    try:
        scripted.script[:] = [(503, SLOW_DOWN), (500, b"")]
        assert await store.put("k", b"x") == '"scripted"'
        assert len(scripted.seen) == 3
        assert all(a.startswith("AWS4-HMAC-SHA256 Credential=") for a in scripted.seen)
        scripted.script[:] = [(503, SLOW_DOWN)] * 5  # the store's max_attempts
        with pytest.raises(ObjectStoreUnavailable, match="SlowDown 503"):
            await store.put("k", b"x")
        scripted.script[:] = [(403, b"<Error><Code>AccessDenied</Code></Error>")]
        with pytest.raises(ObjectStoreUnavailable, match="AccessDenied 403"):
            await store.put("k", b"x")
        assert len(scripted.seen) == 3 + 5 + 1  # a refusal is not retried
    finally:
        await store.close()


async def test_a_redirect_hands_requests_to_botocore(s3_server: S3Server, scripted: Any) -> None:
    store = s3_server.make_store()
    _aim(store, scripted)
    try:
        scripted.script[:] = [(301, b"<Error><Code>PermanentRedirect</Code></Error>")]
        await store.put("k", b"through botocore")  # to the real server, through its client
        assert store._http is None
        assert len(scripted.seen) == 1
        assert await store.get("k") == b"through botocore"
    finally:
        await store.close()
