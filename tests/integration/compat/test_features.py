"""`kafka-features` (Kafka 4.3.1's FeatureCommand: ApiVersions v4 and UpdateFeatures) against
the 3-broker local cluster: `transaction.version` switched at runtime as on Kafka
(docs/transactions-v2.md).

describe shows the level at 1; `upgrade --feature transaction.version=2` finalizes 2 and every
broker's ApiVersions answers it; Kafka's Java transactional producer then runs transaction
version 2 (the coordinator bumped its epoch at every commit and abort, as kafka-transactions
describe shows); every broker registered the levels it supports (0-2), which the upgrade is
checked against; an unknown feature and an unsupported level are refused with Kafka's errors as
the tool prints them; `upgrade` cannot lower the level, `downgrade` does. The cluster is shared
with the package's other tests, which run at level 1: the test leaves it there."""

from __future__ import annotations

import re
import socket
import struct
import time
from typing import Any

import pytest
from tidalmq_broker.protocol.codec import decode_response, encode_request

from bench.kafka.harness import HERE, run_java_client, run_tool
from tests.integration.compat.conftest import create_topic, name, tool
from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TV = "transaction.version"
TRANSACTIONS = 3  # transaction 2 is aborted
ALL_FAILED = "The update failed for all features since the following feature had an error: "


def describe(bootstrap: str) -> dict[str, dict[str, str]]:
    """kafka-features describe: feature -> its fields (SupportedMinVersion, ...)."""
    out = tool("kafka-features", "describe", bootstrap=bootstrap)
    rows = [dict(re.findall(r"(\w+):\s*(\S+)", line)) for line in out.splitlines()]
    return {row["Feature"]: row for row in rows if "Feature" in row}


def finalized_level(address: str) -> tuple[int, int]:
    """(transaction.version's finalized level, the features epoch) as one broker's ApiVersions
    v4 answers them (0: not finalized)."""
    host, port = address.rsplit(":", 1)
    body = {"client_software_name": "features-test", "client_software_version": "1"}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_request(18, 4, 1, body, client_id="features-test"))
        size = struct.unpack(">i", _read(s, 4))[0]
        _, r = decode_response(18, 4, _read(s, size))
    levels = {f.name: f.max_version_level for f in r.finalized_features}
    return levels.get(TV, 0), r.finalized_features_epoch


def _read(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return buf


def every_broker_at(addresses: list[str], level: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = {a: finalized_level(a)[0] for a in addresses}
        if all(v == level for v in seen.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not every broker finalized {TV}={level}: {seen}")
        time.sleep(0.2)


def features(*args: str, bootstrap: str) -> Any:
    return run_tool("kafka-features", *args, bootstrap=bootstrap, check=False)


def test_kafka_features_switches_transaction_version_at_runtime(
    tidalmq_cluster: LocalClusterProcess,
) -> None:
    b = tidalmq_cluster.bootstrap
    addresses = b.split(",")
    assert len(addresses) == 3
    every_broker_at(addresses, 1)
    # every broker registered the levels it serves, which the upgrade below is checked against
    meta = tidalmq_cluster.metadata()
    assert meta["broker_features"] == {k: {TV: [0, 2]} for k in meta["brokers"]}, meta
    row = describe(b)[TV]
    assert (row["SupportedMinVersion"], row["SupportedMaxVersion"]) == ("0", "2"), row
    assert row["FinalizedVersionLevel"] == "1", row
    try:
        up = features("upgrade", "--feature", f"{TV}=2", bootstrap=b)
        assert up.returncode == 0 and f"{TV} was upgraded to 2." in up.stdout, up
        every_broker_at(addresses, 2)  # through the metadata, as every change
        assert describe(b)[TV]["FinalizedVersionLevel"] == "2"

        # Kafka's Java transactional producer now runs transaction version 2: the coordinator
        # bumped its epoch at every commit and abort (InitProducerId gave epoch 0)
        topic, tid, group = name("features"), name("features-tx"), name("features-group")
        create_topic(b, topic, partitions=2)
        report = run_java_client(
            b,
            topic,
            tid,
            str(TRANSACTIONS),
            group,
            source=HERE / "java" / "TransactionsCheck.java",
            timeout=90,
        )
        assert report["read"]["0"] == ["0:0", "1:0"], report  # committed, in order; 2 aborted
        described = tool("kafka-transactions", "describe", "--transactional-id", tid, bootstrap=b)
        header, row_cells = (
            [cell.strip() for cell in line.split("\t")] for line in described.splitlines()[:2]
        )
        assert dict(zip(header, row_cells, strict=False))["ProducerEpoch"] == str(TRANSACTIONS)

        # refusals, printed as against Kafka (one top-level INVALID_UPDATE_VERSION)
        unknown = features("upgrade", "--feature", "no.such.feature=1", bootstrap=b)
        assert unknown.returncode == 1, unknown
        assert (
            "Could not upgrade no.such.feature to 1. "
            + ALL_FAILED
            + "Invalid update version 1 for feature no.such.feature. "
            "The controller does not support this feature."
        ) in unknown.stdout, unknown
        assert "1 out of 1 operation(s) failed." in unknown.stderr, unknown
        too_high = features("upgrade", "--feature", f"{TV}=3", bootstrap=b)
        assert too_high.returncode == 1, too_high
        assert (
            f"Could not upgrade {TV} to 3. " + ALL_FAILED + f"Invalid update version 3 for "
            f"feature {TV}. The controller only supports versions 0-2"
        ) in too_high.stdout, too_high
        lowered = features("upgrade", "--feature", f"{TV}=1", bootstrap=b)
        assert lowered.returncode == 1, lowered
        assert "Can't downgrade the version of this feature without setting" in lowered.stdout
        every_broker_at(addresses, 2)  # nothing refused was written
    finally:
        down = features("downgrade", "--feature", f"{TV}=1", bootstrap=b)
    assert down.returncode == 0 and f"{TV} was downgraded to 1." in down.stdout, down
    every_broker_at(addresses, 1)
