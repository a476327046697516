"""Control-plane mTLS on a real `tidalmq local up` (its default): every control call is forged
against its controller and each broker's control endpoint with the right token but without a
certificate, with a certificate of another CA (as the Kafka clients CA's), and with a broker's
certificate on calls it may not make (the administrator's, another broker's), and is refused;
nothing changes. Then the CLI, which presents the data dir's admin certificate, works."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.security import certs
from tidalmq_controller._control_auth import BROKER_SELF
from tidalmq_core.control_auth import broker_token
from tidalmq_core.control_tls import ControlTls

from tests.integration.cluster.test_control_plane_auth import (
    controller_calls,
    forged_metadata,
    forged_update,
    state_of,
)
from tests.support.local_cluster import LocalClusterProcess

pytestmark = pytest.mark.integration


def call(
    url: str, body: Any, token: str, ctx: ssl.SSLContext, method: str = "POST"
) -> tuple[int, Any]:
    """(status, JSON answer); (0, why) when the TLS handshake or connection fails."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as exc:
        return 0, str(exc)


def presenting(tls: ControlTls | None, ca_file: Path) -> ssl.SSLContext:
    """A client that trusts the cluster CA and presents `tls`'s certificate (None: none)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = False
    if tls is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    env = {"TIDALMQ_OFFSETS_TOPIC_PARTITIONS": "2"}
    with LocalClusterProcess(tmp_path / "cluster", brokers=2, env=env) as c:
        yield c


def test_control_calls_without_the_right_certificate_are_refused(
    cluster: LocalClusterProcess, tmp_path: Path
) -> None:
    started = time.monotonic()
    assert cluster.controller_url.startswith("https://"), "mTLS is local up's default"
    token = cluster.control_token
    tls_dir = cluster.data_dir / "control-tls"
    ca_file = tls_dir / "ca.pem"
    # a certificate of another CA that names the administrator's role
    other_ca = certs.new_ca("Kafka clients CA")
    certs.write_keystore(tmp_path / "other.pem", certs.issue(other_ca, "controller", client=True))
    wrong_ca = presenting(
        ControlTls(str(tmp_path / "other.pem"), str(tmp_path / "other.pem"), str(ca_file)), ca_file
    )
    broker0 = presenting(
        ControlTls(str(tls_dir / "broker-0.pem"), str(tls_dir / "broker-0.pem"), str(ca_file)),
        ca_file,
    )
    status, _ = call(
        f"{cluster.controller_url}/v1/topics/create",
        {"topics": [{"name": "orders", "num_partitions": 4}]},
        token,
        cluster.control_context,
    )
    assert status == 200
    cluster.wait_settled()
    before = state_of(cluster)
    base = cluster.controller_url
    zero = broker_token(token, 0)
    counts = {"no certificate": 0, "wrong CA": 0, "broker certificate": 0}
    for method, path, body in controller_calls(cluster, victim=1):
        status, doc = call(base + path, body, token, presenting(None, ca_file), method)
        assert status == 401 and "client certificate" in doc["error"], (path, status, doc)
        counts["no certificate"] += 1
        status, why = call(base + path, body, token, wrong_ca, method)
        assert status == 0, (path, status, why)  # the TLS handshake fails
        counts["wrong CA"] += 1
        # broker 0's certificate: neither with the cluster token (the administrator's calls)
        # nor with its own token for broker 1
        status, doc = call(base + path, body, token, broker0, method)
        assert status == 403 and "CN=broker-0 may not make" in doc["error"], (path, doc)
        counts["broker certificate"] += 1
        if path in BROKER_SELF:
            status, doc = call(base + path, body, zero, broker0, method)
            assert status == 403 and "may not act for broker 1" in doc["error"], (path, doc)
    # each broker's control endpoint: the controller's certificate and its own only
    for row in cluster.status()["brokers"]:
        url, broker_id = row["control_url"], row["broker"]
        assert url.startswith("https://"), row
        other = broker_token(token, broker_id)
        other_cert = tls_dir / f"broker-{1 - broker_id}.pem"
        other_broker = presenting(
            ControlTls(str(other_cert), str(other_cert), str(ca_file)), ca_file
        )
        for path, body in (
            ("/v1/metadata", forged_metadata(10**9).to_json()),
            ("/v1/metadata/updates", forged_update(10**9)),
            ("/v1/drain", {"timeout_s": 5}),
        ):
            assert call(url + path, body, other, presenting(None, ca_file))[0] == 401, path
            assert call(url + path, body, other, wrong_ca)[0] == 0, path
            status, doc = call(url + path, body, other, other_broker)
            assert status == 403 and f"may not call broker {broker_id}" in doc["error"], doc
    time.sleep(1.0)  # a let-through push or heartbeat would have shown by now
    assert state_of(cluster) == before
    log = (cluster.data_dir / "local-up.log").read_text()
    assert "Traceback" not in log and "control call refused (401)" in log
    print(f"\nrefused: {counts}")
    # the CLI presents the data dir's admin certificate
    cli = [sys.executable, "-m", "tidalmq_broker.cli"]
    for args in (["local", "status"], ["recover"], ["local", "kill-broker", "1"]):
        done = subprocess.run(
            [*cli, *args, "--data-dir", str(cluster.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    print(f"mTLS part: {time.monotonic() - started:.1f}s")
