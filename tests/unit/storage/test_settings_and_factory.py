from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from tidalmq_broker.settings import add_arguments, from_sources
from tidalmq_broker.storage.api import StorageConfig
from tidalmq_broker.storage.keys import parse_partition_key, parse_wal_key, segment_key, wal_key
from tidalmq_broker.storage.objectstore import LocalDirObjectStore, S3ObjectStore, open_object_store
from tidalmq_core.model import TopicPartition


def test_every_storage_setting_is_a_broker_flag_and_environment_variable() -> None:
    """The broker builds its StorageConfig from its settings: each field, by its own name."""
    fields = dataclasses.fields(StorageConfig)
    env = {f"TIDALMQ_{f.name.upper()}": str(7 + i) for i, f in enumerate(fields)}
    cfg = from_sources(None, env).storage_config()
    assert {f.name: getattr(cfg, f.name) for f in fields} == {
        f.name: 7 + i for i, f in enumerate(fields)
    }
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--read-ahead-bytes", "1024", "--compaction-idle-s", "0.5"])
    cfg = from_sources(args, {"TIDALMQ_READ_AHEAD_BYTES": "99"}).storage_config()
    assert (cfg.read_ahead_bytes, cfg.compaction_idle_s) == (1024, 0.5)  # the flag wins
    # what is not set keeps the engine's default (the broker's own flush window aside)
    default = from_sources(None, {}).storage_config()
    assert default.garbage_grace_s == StorageConfig().garbage_grace_s
    with pytest.raises(SystemExit, match="TIDALMQ_FLUSH_BYTES"):
        from_sources(None, {"TIDALMQ_FLUSH_BYTES": "lots"})


def test_factory_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    local = open_object_store(f"file://{tmp_path}/objects")
    assert isinstance(local, LocalDirObjectStore) and local.root == tmp_path / "objects"
    s3 = open_object_store(
        "s3://bucket/some/prefix?endpoint_url=http://127.0.0.1:9&region=eu-west-1"
    )
    assert isinstance(s3, S3ObjectStore)
    assert (s3.bucket, s3.prefix, s3.endpoint_url) == (
        "bucket",
        "some/prefix",
        "http://127.0.0.1:9",
    )
    assert s3._http is not None and s3._http.address.url("k") == "http://127.0.0.1:9/bucket/k"
    assert open_object_store("s3://bucket/p?region=r&direct=false")._http is None  # type: ignore[attr-defined]
    for bad in (
        "ftp://x",
        "file://host/x",
        "s3:///nobucket",
        "s3://b/p?colour=red",
        "s3://b?direct=2",
    ):
        with pytest.raises(ValueError):
            open_object_store(bad)


def test_key_layout_parses_back() -> None:
    key = wal_key("3", "0001700000000000-abcdef", 42)
    parsed = parse_wal_key(key)
    assert parsed is not None and (parsed.broker, parsed.seq) == ("3", 42)
    assert wal_key("3", "i", 9) < wal_key("3", "i", 10)  # listing order is write order
    seg = segment_key(TopicPartition("t.x", 2), "tid", 5)
    pk = parse_partition_key(seg)
    assert pk is not None and (pk.topic, pk.topic_id, pk.partition, pk.kind) == (
        "t.x",
        "tid",
        2,
        "segment",
    )
    assert parse_partition_key("partitions/t/tid/2/checkpoint").kind == "checkpoint"  # type: ignore[union-attr]
    assert parse_wal_key("wal/x") is None and parse_partition_key("other/t") is None
