"""S3 object PUTs and GETs sent straight over HTTP, signed with botocore's SigV4 signer.

Why not botocore's client for these two: its request pipeline (parameter validation, the
endpoint ruleset, event hooks, serialisation, response parsing) costs ~1.7 ms of CPU per PUT on
these machines, most of it holding the GIL the event loop needs, against ~0.3 ms for the same
request signed and sent from here (docs/performance.md, "PUTs to an S3 store"). Every WAL
flush is a PUT, so on an S3 store that cost is paid by every produce request's round trip.

What this keeps from botocore: the credentials (the session's provider chain, refreshed as
botocore refreshes them) and the signature (`S3SigV4Auth`). What it does itself: the object's
URL (`ObjectAddress`), one keep-alive connection per store thread, retries of connection
failures and of 429 / 5xx answers with backoff, and the mapping of answers to the store's
errors (412 / 409 lost the race, 404 not found, anything else unavailable). An answer it does
not handle (a redirect to another region) raises `NotHandledHere`, and the store sends that
request, and every later one, through botocore's client instead.
"""

from __future__ import annotations

import http.client
import os
import random
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tidalmq_broker.storage.objectstore.base import (
    ObjectNotFound,
    ObjectStoreUnavailable,
    PreconditionFailed,
)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_LOST_RACE_STATUS = frozenset({409, 412})
_ERROR_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_DNS_LABEL = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class NotHandledHere(Exception):
    """An answer this module does not follow (a redirect, a region the request was not signed
    for): the caller sends the request through botocore's client instead."""


@dataclass(frozen=True, slots=True)
class ObjectAddress:
    """Where a bucket's objects are: `https://bucket.s3.region.amazonaws.com/key` on AWS (or
    path style when the bucket name is not a DNS label), `endpoint/bucket/key` on any other
    endpoint, as botocore addresses them (path style for a custom endpoint)."""

    scheme: str
    netloc: str  # host[:port] as signed and sent in Host (no default port)
    path_prefix: str  # "/" or "/bucket/" (with a path the endpoint itself carries)

    @classmethod
    def of(cls, bucket: str, endpoint_url: str | None, region: str) -> ObjectAddress:
        if endpoint_url:
            parts = urlsplit(endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"S3 endpoint must be an http(s) URL, got {endpoint_url!r}")
            base = parts.path.rstrip("/")
            return cls(parts.scheme, _netloc(parts.scheme, parts.netloc), f"{base}/{bucket}/")
        if _DNS_LABEL.match(bucket):
            return cls("https", f"{bucket}.s3.{region}.amazonaws.com", "/")
        return cls("https", f"s3.{region}.amazonaws.com", f"/{bucket}/")

    def path(self, key: str) -> str:
        return f"{self.path_prefix}{quote(key, safe='/~')}"

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.netloc}{self.path(key)}"


def _netloc(scheme: str, netloc: str) -> str:
    netloc = netloc.rsplit("@", 1)[-1].lower()
    default = ":443" if scheme == "https" else ":80"
    return netloc[: -len(default)] if netloc.endswith(default) else netloc


@dataclass(slots=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class S3Http:
    """Signed S3 requests from the store's threads, each on its own keep-alive connection."""

    def __init__(
        self,
        address: ObjectAddress,
        credentials: Credentials,
        region: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_attempts: int,
    ) -> None:
        self.address = address
        self._credentials = credentials
        self._region = region
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_attempts = max(1, max_attempts)
        self._local = threading.local()
        self._tls: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []

    # ------------------------------------------------------------------ operations
    def put(self, full_key: str, body: bytes | bytearray, headers: dict[str, str]) -> str:
        answer = self._send("PUT", full_key, body, headers)
        if answer.status == 200:
            return str(answer.headers.get("ETag", ""))
        if answer.status == 404 and "If-Match" in headers:
            raise PreconditionFailed(f"PUT {full_key}: object is gone")
        raise self._error("PUT", full_key, answer)

    def get(self, full_key: str, range_header: str | None) -> bytes:
        answer = self._send("GET", full_key, None, {"Range": range_header} if range_header else {})
        if answer.status in (200, 206):
            return answer.body
        raise self._error("GET", full_key, answer)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    # ------------------------------------------------------------------ one request
    def _send(
        self, method: str, full_key: str, body: bytes | bytearray | None, headers: dict[str, str]
    ) -> Answer:
        path = self.address.path(full_key)
        url = f"{self.address.scheme}://{self.address.netloc}{path}"
        what = f"{method} {full_key}"
        attempt = 0
        stale_replaced = False
        while True:
            request = AWSRequest(method, url, data=body, headers=dict(headers))
            S3SigV4Auth(self._credentials.get_frozen_credentials(), "s3", self._region).add_auth(
                request
            )
            send_headers = {"Host": self.address.netloc, **request.headers}
            conn, reused = self._connection()
            try:
                conn.request(method, path, body=body, headers=send_headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if reused and not stale_replaced:
                    # the server closed an idle keep-alive connection: once, at once, on a new
                    # one, not counted as an attempt
                    stale_replaced = True
                    continue
                attempt += 1
                if attempt >= self._max_attempts:
                    raise ObjectStoreUnavailable(f"{what} on {self._where()}: {exc}") from exc
                time.sleep(self._backoff(attempt - 1))
                continue
            if response.will_close:
                self._drop(conn)
            answer = Answer(response.status, response.headers, data)
            attempt += 1
            if answer.status in _RETRY_STATUS and attempt < self._max_attempts:
                time.sleep(self._backoff(attempt - 1))
                continue
            if 300 <= answer.status < 400 or (
                answer.status == 400 and _code(answer) == b"AuthorizationHeaderMalformed"
            ):
                raise NotHandledHere(f"{what}: {answer.status} {_code(answer).decode()}")
            return answer

    def _error(self, method: str, full_key: str, answer: Answer) -> Exception:
        code = _code(answer).decode(errors="replace")
        what = f"{method} {full_key}"
        if answer.status in _LOST_RACE_STATUS:
            return PreconditionFailed(f"{what}: {code or answer.status}")
        if answer.status == 404:
            return ObjectNotFound(what)
        return ObjectStoreUnavailable(f"{what} on {self._where()}: {code} {answer.status}")

    @staticmethod
    def _backoff(attempt: int) -> float:
        # full jitter, as botocore's standard mode, but from 50 ms: the WAL writer's own
        # deadline (flush_timeout_ms) bounds the whole
        return random.uniform(0, min(5.0, 0.05 * 2**attempt))

    def _where(self) -> str:
        return f"{self.address.scheme}://{self.address.netloc}"

    # ------------------------------------------------------------------ connections
    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None:
            return conn, True
        where = urlsplit(f"//{self.address.netloc}")  # host (IPv6 without brackets), port
        assert where.hostname is not None  # ObjectAddress.of refuses an endpoint without one
        if self.address.scheme == "https":
            conn = http.client.HTTPSConnection(
                where.hostname,
                where.port,
                timeout=self._connect_timeout_s,
                context=self._tls_context(),
            )
        else:
            conn = http.client.HTTPConnection(
                where.hostname, where.port, timeout=self._connect_timeout_s
            )
        try:
            conn.connect()
        except OSError as exc:
            raise ObjectStoreUnavailable(f"cannot connect to {self._where()}: {exc}") from exc
        assert conn.sock is not None
        # the headers and a bytearray body go out in two writes: without this, Nagle's
        # algorithm holds the body back until the server's delayed ACK of the headers
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock.settimeout(self._read_timeout_s)
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            # the CA bundle botocore would use: AWS_CA_BUNDLE, else certifi's (botocore's own)
            from botocore.httpsession import get_cert_path

            self._tls = ssl.create_default_context(
                cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
            )
        return self._tls


def _code(answer: Answer) -> bytes:
    match = _ERROR_CODE.search(answer.body[:4096])
    return match.group(1) if match else b""


def for_client(
    client: Any,
    credentials: Credentials | None,
    bucket: str,
    endpoint_url: str | None,
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_attempts: int,
) -> S3Http | None:
    """The direct path for a store whose botocore client is `client`, or None where it does not
    apply (no credentials to sign with: botocore's client reports that itself)."""
    if credentials is None:
        return None
    region = client.meta.region_name or "us-east-1"
    if region == "aws-global":
        region = "us-east-1"
    return S3Http(
        ObjectAddress.of(bucket, endpoint_url, region),
        credentials,
        region,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        max_attempts=max_attempts,
    )
