"""Where the direct S3 path sends a bucket's objects: as botocore's client addresses them."""

from __future__ import annotations

import pytest
from tidalmq_broker.storage.objectstore.s3_http import ObjectAddress


@pytest.mark.parametrize(
    ("bucket", "endpoint", "region", "url"),
    [
        # a custom endpoint: path style, its port kept, a default port dropped (Host is signed)
        ("tidalmq", "http://127.0.0.1:9000", "us-east-1", "http://127.0.0.1:9000/tidalmq/a/b"),
        ("tidalmq", "http://minio.ns.svc:80", "x", "http://minio.ns.svc/tidalmq/a/b"),
        ("tidalmq", "https://S3.Example.com:443/", "auto", "https://s3.example.com/tidalmq/a/b"),
        ("b", "https://gw.example.com/s3/", "r", "https://gw.example.com/s3/b/a/b"),
        ("b", "http://[::1]:9000", "r", "http://[::1]:9000/b/a/b"),
        # AWS: virtual-hosted in the bucket's region, path style for a name that is not a label
        ("tidalmq", None, "eu-west-1", "https://tidalmq.s3.eu-west-1.amazonaws.com/a/b"),
        ("my.bucket", None, "eu-west-1", "https://s3.eu-west-1.amazonaws.com/my.bucket/a/b"),
    ],
)
def test_object_urls(bucket: str, endpoint: str | None, region: str, url: str) -> None:
    assert ObjectAddress.of(bucket, endpoint, region).url("a/b") == url


def test_keys_are_percent_encoded_but_their_slashes_kept() -> None:
    address = ObjectAddress.of("b", "http://h:1", "r")
    assert address.url("t/p 1/ä+x=~") == "http://h:1/b/t/p%201/%C3%A4%2Bx%3D~"


def test_an_endpoint_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        ObjectAddress.of("b", "ftp://h", "r")
