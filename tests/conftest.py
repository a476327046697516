"""Shared fixtures. Real servers (S3, brokers) are started once per session behind a lock."""

pytest_plugins: list[str] = [
    "tests.support.s3_server",
    "tests.support.apache_kafka",
    "tests.support.kube_apiserver",
]
