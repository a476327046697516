"""The clients CRL Secret's compare-and-swap writes against a real kube-apiserver (no operator
process, no broker): two operator replicas revoke certificates, the second one's write landing
between the first one's read and write. The API server refuses the first one's patch (the
resourceVersion it names is stale), it reads again and both revocations are in the Secret; a blind
write (the operator before this) un-revoked the other replica's certificate. The unit tests
(tests/unit/operator_pkg/test_users.py) cover the same against an in-memory API; this checks
the real server's answer to the patch the operator sends (409, mapped to Conflict) and that
the Secret keeps its labels."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from tidalmq_operator import clients_crl, user_handlers, users
from tidalmq_operator.kube import Conflict, Kube
from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import OperatorSettings

from tests.support.kube_apiserver import ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
CRL_SECRET = "test-clients-crl"


@pytest.fixture
def namespace(kube_apiserver: ApiServer) -> Iterator[str]:
    config.load_kube_config(config_file=str(kube_apiserver.kubeconfig))
    ns = f"crl-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api().create_namespace({"metadata": {"name": ns}})
    try:
        yield ns
    finally:
        kube_apiserver.kubectl("delete", "namespace", ns, "--wait=false", check=False)


class InterleavedKube(Kube):
    """A replica's API client that lets another writer run just before its first write of a
    Secret that is there already (a patch)."""

    def __init__(self, namespace: str) -> None:
        super().__init__(namespace)
        self.other_writer: Any = None
        self.writes = 0
        self.conflicts = 0

    async def patch_secret(self, name: str, body: dict[str, Any]) -> None:
        self.writes += 1
        if self.other_writer is not None:
            writer, self.other_writer = self.other_writer, None
            await writer()
        try:
            await super().patch_secret(name, body)
        except Conflict:
            self.conflicts += 1
            raise


def revocation(ca: users.KeyPair, user: str) -> tuple[int, user_handlers.CrlChange]:
    cert = clients_crl.cert_ref(users.issue_client_cert(ca, user).cert_pem.decode())
    assert cert is not None
    return cert.serial, lambda s, now: clients_crl.revoke(s, cert, user, now, now)


async def test_two_replicas_revoking_at_once_both_stay_revoked(
    kube_apiserver: ApiServer, namespace: str
) -> None:
    settings = OperatorSettings(namespace=namespace, clients_crl_secret=CRL_SECRET)
    here_kube = InterleavedKube(namespace)
    here = OperatorRuntime(settings, here_kube)
    there = OperatorRuntime(settings, Kube(namespace))  # its own locks: another process
    ca = users.new_clients_ca()
    await user_handlers._update_crl(here, ca, lambda s, now: False)  # created, empty

    alice, revoke_alice = revocation(ca, "alice")
    bob, revoke_bob = revocation(ca, "bob")

    async def there_revokes_bob() -> None:
        await user_handlers._update_crl(there, ca, revoke_bob)

    here_kube.other_writer = there_revokes_bob
    await user_handlers._update_crl(here, ca, revoke_alice)
    secret = json.loads(
        kube_apiserver.kubectl("-n", namespace, "get", "secret", CRL_SECRET, "-o", "json").stdout
    )
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    state = clients_crl.loads(data[clients_crl.STATE_KEY].decode(), ca.cert_pem)
    signed = clients_crl.crl_serials(data[clients_crl.CRL_KEY], ca.cert_pem)
    assert signed is not None
    assert {alice, bob} <= set(state.revoked) and {alice, bob} <= signed[1]
    # the API server refused the patch naming the version read before bob's revocation
    assert (here_kube.writes, here_kube.conflicts) == (2, 1)
    assert state.number == 3  # empty, bob's, then alice's on top of it
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tidalmq-operator"}
