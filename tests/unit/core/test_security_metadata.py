"""Listeners and SCRAM credentials in the metadata: records, snapshots, JSON, and documents
written before either existed."""

from __future__ import annotations

import json

from tidalmq_core import scram, snapshots
from tidalmq_core.metadata import BrokerInfo, ClusterMetadata, Endpoint
from tidalmq_core.records import (
    MetadataDelta,
    apply_batch,
    broker_record,
    scram_record,
    scram_removed_record,
)

LISTENERS = [
    Endpoint("PLAINTEXT", "b0", 9092, "PLAINTEXT"),
    Endpoint("SASL_SSL", "b0", 9093, "SASL_SSL"),
    Endpoint("INTERNAL", "10.0.0.1", 9094, "SSL"),
]


def test_a_broker_with_one_plaintext_listener_is_recorded_as_before() -> None:
    info = BrokerInfo(
        1,
        "h",
        9092,
        listeners=BrokerInfo.normal_listeners(
            "h", 9092, [Endpoint("PLAINTEXT", "h", 9092, "PLAINTEXT")]
        ),
    )
    assert info.listeners == []
    assert "ls" not in broker_record(info)
    assert "listeners" not in info.to_json()
    assert info.endpoints() == [Endpoint("PLAINTEXT", "h", 9092, "PLAINTEXT")]
    assert info.endpoint("SASL_SSL") is None


def test_a_record_written_before_listeners_reads_as_one_plaintext_listener() -> None:
    meta = ClusterMetadata("c")
    old = {
        "t": "broker",
        "id": 3,
        "host": "h3",
        "port": 9095,
        "rack": None,
        "url": "",
        "inc": "x",
        "state": "alive",
    }
    apply_batch(meta, [old], 1)
    assert meta.brokers[3].endpoint("PLAINTEXT") == Endpoint("PLAINTEXT", "h3", 9095, "PLAINTEXT")
    # and a document of that time (no "listeners") as well
    assert BrokerInfo.from_json({"broker_id": 3, "host": "h3", "port": 9095}).endpoints() == [
        Endpoint("PLAINTEXT", "h3", 9095, "PLAINTEXT")
    ]


def test_listeners_survive_record_json_and_snapshot() -> None:
    info = BrokerInfo(0, "b0", 9092, listeners=list(LISTENERS), incarnation="i")
    meta = ClusterMetadata("c")
    apply_batch(meta, [json.loads(json.dumps(broker_record(info)))], 1)
    assert meta.brokers[0].listeners == LISTENERS
    assert meta.brokers[0].endpoint("INTERNAL") == Endpoint("INTERNAL", "10.0.0.1", 9094, "SSL")
    assert BrokerInfo.from_json(json.loads(json.dumps(info.to_json()))) == info
    assert snapshots.decode(snapshots.encode_bytes(meta)).brokers[0].listeners == LISTENERS
    assert ClusterMetadata.from_json(meta.to_json()).brokers[0].listeners == LISTENERS


def test_scram_records_set_and_remove_credentials() -> None:
    meta = ClusterMetadata("c")
    c512 = scram.new_credential(scram.SCRAM_SHA_512, "a", salt=b"1")
    c256 = scram.new_credential(scram.SCRAM_SHA_256, "a", salt=b"2")
    delta = MetadataDelta()
    apply_batch(
        meta,
        [
            json.loads(json.dumps(scram_record("alice", "SCRAM-SHA-512", c512))),
            scram_record("alice", "SCRAM-SHA-256", c256),
            scram_record("bob", "SCRAM-SHA-512", c512),
        ],
        1,
        delta,
    )
    assert delta.other
    assert meta.scram_credentials == {
        "alice": {"SCRAM-SHA-512": c512, "SCRAM-SHA-256": c256},
        "bob": {"SCRAM-SHA-512": c512},
    }
    # applied again (a replay), nothing changes
    apply_batch(meta, [scram_record("bob", "SCRAM-SHA-512", c512)], 2)
    apply_batch(
        meta,
        [
            scram_removed_record("alice", "SCRAM-SHA-256"),
            scram_removed_record("bob", "SCRAM-SHA-512"),
            scram_removed_record("bob", "SCRAM-SHA-512"),
        ],
        3,
    )
    assert meta.scram_credentials == {"alice": {"SCRAM-SHA-512": c512}}  # bob is gone
    # a record keeps the keys, never a password
    rec = scram_record("alice", "SCRAM-SHA-512", c512)
    assert set(rec["cred"]) == {"salt", "stored_key", "server_key", "iterations"}


def test_credentials_in_snapshots_and_documents_and_their_absence() -> None:
    meta = ClusterMetadata("c", version=4)
    plain = snapshots.encode_bytes(meta)
    assert b"scram" not in plain  # no credentials: the snapshot older readers knew
    assert "scram_credentials" not in meta.to_json()
    cred = scram.new_credential(scram.SCRAM_SHA_256, "pw")
    meta.scram_credentials = {"u,=": {"SCRAM-SHA-256": cred}}
    back = snapshots.decode(snapshots.encode_bytes(meta))
    assert back.scram_credentials == meta.scram_credentials
    assert ClusterMetadata.from_json(meta.to_json()).scram_credentials == meta.scram_credentials
    assert snapshots.decode(plain).scram_credentials == {}
    # a snapshot rolled from one without credentials and batches that add some
    rolled = snapshots.roll(plain, [(5, [scram_record("x", "SCRAM-SHA-256", cred)])])
    assert snapshots.decode(rolled).scram_credentials == {"x": {"SCRAM-SHA-256": cred}}
