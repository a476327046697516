"""Revoked control-plane certificates on a real `tidalmq local up` (docs/security.md, "Revoked
control-plane certificates"): its data dir's `control-tls/crl.pem` (a CRL of the cluster CA) is
checked by the controller, every broker process and the CLI. Broker 1's certificate is revoked by
writing a new CRL while the cluster runs: without a restart, the controller and broker 0's
control endpoint refuse it in the TLS handshake, and a client checking the CRL refuses broker 1's
endpoint, which presents it; broker 0's certificate and the admin's (the CLI) still work."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_broker.security import certs
from tidalmq_core.control_auth import broker_token
from tidalmq_core.control_tls import ControlTls, server_is_broker

from tests.integration.cluster.test_control_plane_mtls import call, presenting
from tests.support.local_cluster import LocalClusterProcess
from tests.support.revocation import crl_pem

pytestmark = pytest.mark.integration

# the controller and the brokers look at their TLS files at most every 10 s, at a new connection
REVOKED_WITHIN_S = 40.0
CLI = (sys.executable, "-m", "tidalmq_broker.cli")


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = REVOKED_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.5)


def handshake(url: str, ctx: ssl.SSLContext) -> bool:
    """Whether a TLS handshake with the https `url`'s server completes with `ctx`."""
    host, port = url.removeprefix("https://").rstrip("/").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            ctx.wrap_socket(raw).close()
        return True
    except (ssl.SSLError, ConnectionError):
        return False


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    data = tmp_path / "cluster"
    tls_dir = data / "control-tls"
    tls_dir.mkdir(parents=True)
    # the CA `local up` keeps (made here first so that its CRL exists before the cluster starts)
    ca = certs.ensure_ca(tls_dir / "ca.pem", tls_dir / "ca-key.pem", "TidalMQ control plane")
    (tls_dir / "crl.pem").write_bytes(crl_pem(ca, []))
    with LocalClusterProcess(data, brokers=2, env={"TIDALMQ_OFFSETS_TOPIC_PARTITIONS": "2"}) as c:
        yield c


def test_a_revoked_broker_certificate_is_refused_without_a_restart(
    cluster: LocalClusterProcess,
) -> None:
    started = time.monotonic()
    tls_dir = cluster.data_dir / "control-tls"
    ca_file, crl_file = tls_dir / "ca.pem", tls_dir / "crl.pem"
    ca = certs.ensure_ca(ca_file, tls_dir / "ca-key.pem", "unused: the CA exists")
    token = cluster.control_token
    zero = broker_token(token, 0)  # what broker 0's endpoint takes (with the right certificate)
    status_url = f"{cluster.controller_url}/v1/local/status"
    broker_pem = {n: str(tls_dir / f"broker-{n}.pem") for n in (0, 1)}
    as_broker = {
        n: presenting(ControlTls(pem, pem, str(ca_file)), ca_file) for n, pem in broker_pem.items()
    }
    admin = str(tls_dir / "admin.pem")
    # a client of the product's own that checks the CRL (the controller's pushes do the same)
    checking = ControlTls(admin, admin, str(ca_file), str(crl_file)).client_context(
        server_is_broker
    )
    endpoint = {row["broker"]: row["control_url"] for row in cluster.status()["brokers"]}
    assert sorted(endpoint) == [0, 1] and all(u.startswith("https://") for u in endpoint.values())

    # before: each broker's certificate passes the handshake (the cluster token is not theirs:
    # 403 from the HTTP layer, after the handshake)
    for n in (0, 1):
        status, doc = call(status_url, None, token, as_broker[n], "GET")
        assert status == 403 and f"CN=broker-{n} may not make" in doc["error"], (n, doc)
        assert handshake(endpoint[n], checking), n
    status, doc = call(f"{endpoint[0]}/v1/drain", {"timeout_s": 1}, zero, as_broker[1])
    assert status == 403 and "may not call broker 0" in doc["error"], doc

    # revoke broker 1's certificate: a new CRL put in place, as a Secret volume update does
    revoked = x509.load_pem_x509_certificate(Path(broker_pem[1]).read_bytes())
    staged = crl_file.with_suffix(".new")
    staged.write_bytes(crl_pem(ca, [revoked]))
    os.replace(staged, crl_file)
    revoked_at = time.monotonic()

    wait_until(
        "the controller refuses broker 1's certificate in the handshake",
        lambda: call(status_url, None, token, as_broker[1], "GET")[0] == 0,
    )
    wait_until(
        "broker 0's control endpoint refuses broker 1's certificate in the handshake",
        lambda: call(f"{endpoint[0]}/v1/drain", {"timeout_s": 1}, zero, as_broker[1])[0] == 0,
    )
    wait_until(
        "a client checking the CRL refuses broker 1's endpoint (its server certificate)",
        lambda: not handshake(endpoint[1], checking),
    )
    print(f"\nrevoked certificate refused everywhere {time.monotonic() - revoked_at:.1f}s on")

    # the others go on: broker 0's certificate still passes the handshake, the admin's works
    status, doc = call(status_url, None, token, as_broker[0], "GET")
    assert status == 403 and "CN=broker-0 may not make" in doc["error"], doc
    assert handshake(endpoint[0], checking)
    done = subprocess.run(
        [*CLI, "local", "status", "--data-dir", str(cluster.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert 0 in {row["broker"] for row in cluster.status()["brokers"]}
    log = (cluster.data_dir / "local-up.log").read_text()
    assert "Traceback" not in log
    print(f"revocation part: {time.monotonic() - started:.1f}s")
