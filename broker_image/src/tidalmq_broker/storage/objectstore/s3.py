"""An object store on any S3-compatible endpoint, through boto3 (PUTs and GETs signed by botocore
and sent directly: s3_http.py).

boto3 is synchronous, so every call runs in a thread pool of this store. botocore's "standard"
retry mode retries transient failures (5xx, throttling, connection errors) with exponential
backoff and jitter; what still fails afterwards becomes ObjectStoreUnavailable. Conditional PUTs
use IfNoneMatch="*" and IfMatch=<etag>; the answers 412 PreconditionFailed and 409
ConditionalRequestConflict both mean "lost the race", and so does 404 to an If-Match PUT.
A PUT of several buffers (or of a memoryview) is copied into one body in the store's thread, not
on the event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from tidalmq_broker.storage.objectstore.base import (
    Content,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    PreconditionFailed,
    content_parts,
    validate_key,
)
from tidalmq_broker.storage.objectstore.s3_http import NotHandledHere, S3Http, for_client

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


def _body(data: Content) -> bytes | bytearray:
    """The request body, built in the store's thread: bytes and bytearray as they are (botocore
    takes them without a copy; not memoryview), several parts copied one by one into a
    bytearray. Each copy holds the GIL only for its part (a WAL append, a cached chunk, a WAL
    range), where one b"".join of a 64 MiB segment's views would hold up the event loop for the
    whole segment."""
    if isinstance(data, bytes | bytearray):
        return data
    parts = content_parts(data)
    whole = parts[0].obj if len(parts) == 1 else None
    if isinstance(whole, bytes | bytearray) and len(whole) == len(parts[0]):
        return whole  # one view of all of a bytes or bytearray
    out = bytearray(sum(len(part) for part in parts))
    view = memoryview(out)
    pos = 0
    for part in parts:
        view[pos : pos + len(part)] = part
        pos += len(part)
    view.release()
    return out


class S3ObjectStore(ObjectStore):
    kind = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_threads: int = 16,
        max_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        client: Any = None,
        direct: bool = True,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        config = botocore.config.Config(
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=max_threads,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(
            aws_access_key_id=aws_access_key_id, aws_secret_access_key=aws_secret_access_key
        )
        self._client = client or session.client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        # PUT and GET, the data path, skip botocore's client (s3_http.py); None: all through it
        self._http: S3Http | None = None
        self._retired_http: S3Http | None = None
        if client is None and direct:
            self._http = for_client(
                self._client,
                session.get_credentials(),
                bucket,
                endpoint_url,
                connect_timeout_s=connect_timeout_s,
                read_timeout_s=read_timeout_s,
                max_attempts=max_attempts,
            )
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="s3")

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}{where})"

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _strip(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    async def _call(self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))
        except botocore.exceptions.ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _PRECONDITION or status in ("412", "409"):
                raise PreconditionFailed(f"{what}: {code or status}") from exc
            if code in _NOT_FOUND or status == "404":
                raise ObjectNotFound(what) from exc
            raise ObjectStoreUnavailable(f"{what} on {self!r}: {code} {status}") from exc
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise ObjectStoreUnavailable(f"{what} on {self!r}: {exc}") from exc

    async def put(
        self,
        key: str,
        data: Content,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        conditions: dict[str, str] = {}
        if if_none_match:
            params["IfNoneMatch"] = conditions["If-None-Match"] = "*"
        if if_match is not None:
            params["IfMatch"] = conditions["If-Match"] = if_match

        def call() -> str:
            body = _body(data)
            direct = self._http
            if direct is not None:
                try:
                    return direct.put(params["Key"], body, conditions)
                except NotHandledHere as exc:
                    self._not_handled_directly(exc)
            # botocore takes a bytearray as it takes bytes (see _body); the stubs list bytes only
            return str(self._client.put_object(Body=body, **params)["ETag"])  # type: ignore[arg-type]

        try:
            return await self._call(f"PUT {key}", call)
        except ObjectNotFound as exc:  # If-Match on a key that no longer exists
            raise PreconditionFailed(f"PUT {key}: object is gone") from exc

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if start is not None or end is not None:
            first = start or 0
            if end is not None and end <= first:
                return b""
            params["Range"] = f"bytes={first}-{'' if end is None else end - 1}"

        def call() -> bytes:
            direct = self._http
            if direct is not None:
                try:
                    return direct.get(params["Key"], params.get("Range"))
                except NotHandledHere as exc:
                    self._not_handled_directly(exc)
            response = self._client.get_object(**params)
            return response["Body"].read()

        return await self._call(f"GET {key}", call)

    def _not_handled_directly(self, exc: NotHandledHere) -> None:
        """An answer the direct path does not follow (a redirect to the bucket's region): this
        request and every later one go through botocore's client, which follows it."""
        if self._http is not None:
            log.warning(
                "%r: S3 answered %s; PUTs and GETs go through botocore's client from now on",
                self,
                exc,
            )
            # closed with the store, not now: other threads may be using its connections
            self._retired_http, self._http = self._http, None

    async def get_with_etag(self, key: str) -> tuple[bytes, str]:
        def call() -> tuple[bytes, str]:
            response = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            return response["Body"].read(), str(response["ETag"])

        return await self._call(f"GET {key}", call)

    async def head(self, key: str) -> ObjectInfo:
        response = await self._call(
            f"HEAD {key}", self._client.head_object, Bucket=self.bucket, Key=self._full(key)
        )
        return ObjectInfo(
            key,
            int(response["ContentLength"]),
            str(response["ETag"]),
            response["LastModified"].timestamp(),
        )

    async def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix

        def call() -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if start_after is not None:
                params["StartAfter"] = (
                    f"{self.prefix}/{start_after}" if self.prefix else start_after
                )
            while True:
                response = self._client.list_objects_v2(**params)
                for item in response.get("Contents", []):
                    out.append(
                        ObjectInfo(
                            self._strip(item["Key"]),
                            int(item["Size"]),
                            str(item.get("ETag", "")),
                            item["LastModified"].timestamp(),
                        )
                    )
                if not response.get("IsTruncated"):
                    return out
                params["ContinuationToken"] = response["NextContinuationToken"]
                params.pop("StartAfter", None)

        return await self._call(f"LIST {prefix}", call)

    async def delete(self, keys: builtins.list[str]) -> None:
        full = [self._full(k) for k in keys]
        for i in range(0, len(full), 1000):
            chunk = full[i : i + 1000]

            def call(chunk: list[str] = chunk) -> list[Any]:
                response = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
                return [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]

            errors = await self._call(f"DELETE {len(chunk)} keys", call)
            if errors:
                raise ObjectStoreUnavailable(f"DELETE on {self!r} failed for {errors[:3]}")

    async def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests and the local cluster use this)."""
        try:
            await self._call(
                f"CREATE BUCKET {self.bucket}", self._client.create_bucket, Bucket=self.bucket
            )
        except ObjectStoreUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, botocore.exceptions.ClientError) and cause.response.get(
                "Error", {}
            ).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            raise

    async def close(self) -> None:
        self._pool.shutdown(wait=False)
        for direct in (self._http, self._retired_http):
            if direct is not None:
                direct.close()
