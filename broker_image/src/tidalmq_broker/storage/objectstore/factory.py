"""Build an object store from a URL.

    file:///var/lib/tidalmq/objects
    s3://bucket/optional/prefix?endpoint_url=http://127.0.0.1:9000&region=us-east-1
    s3://bucket/prefix?direct=false      PUTs and GETs through botocore's client too (s3_http.py)

S3 credentials come from the usual AWS sources (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
environment variables, profiles, instance roles) as boto3 finds them.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlparse

from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.objectstore.s3 import S3ObjectStore


def open_object_store(url: str) -> ObjectStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URL must be file:///absolute/path, got {url!r}")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"file URL needs an absolute path: {url!r}")
        return LocalDirObjectStore(path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"s3 URL needs a bucket: {url!r}")
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        unknown = set(query) - {"endpoint_url", "region", "max_threads", "direct"}
        if unknown:
            raise ValueError(f"unknown s3 URL parameters {sorted(unknown)} in {url!r}")
        return S3ObjectStore(
            parsed.netloc,
            parsed.path.strip("/"),
            endpoint_url=query.get("endpoint_url"),
            region=query.get("region"),
            max_threads=int(query.get("max_threads", "16")),
            direct=_flag(query.get("direct", "true"), url),
        )
    raise ValueError(f"unsupported object store URL {url!r} (use file:// or s3://)")


def _flag(value: str, url: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"s3 URL parameter direct={value!r} in {url!r}: use true or false")
