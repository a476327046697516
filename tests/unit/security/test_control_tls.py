"""The roles a control-plane certificate names, and what each may present (tidalmq_core.control_tls)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_broker.security import certs
from tidalmq_core.control_tls import (
    ControlTls,
    ControlTlsError,
    Role,
    common_name,
    may_call_broker,
    permits,
    role_of,
    role_of_name,
)


@pytest.mark.parametrize(
    ("cn", "role"),
    [
        ("controller", Role("controller", admin=True)),
        ("operator", Role("operator", admin=True)),
        ("admin", Role("admin", admin=True)),
        ("broker-0", Role("broker-0", broker_id=0)),
        ("broker-17", Role("broker-17", broker_id=17)),
        ("broker", Role("broker")),  # the chart's: any broker
        ("broker-", None),
        ("broker-x", None),
        ("broker-1234567890", None),  # ten digits: no broker id is that long
        ("Broker-1", None),
        ("admin ", None),
        ("alice", None),  # a Kafka client's certificate names no role
        ("", None),
    ],
)
def test_the_common_name_names_the_role(cn: str, role: Role | None) -> None:
    assert role_of_name(cn) == role


# (role, token of: None = the cluster token, N = broker N's) -> allowed
@pytest.mark.parametrize(
    ("cn", "token_of", "allowed"),
    [
        ("controller", None, True),
        ("operator", None, True),
        ("admin", None, True),
        ("admin", 3, False),  # an administrator's certificate presents the cluster token only
        ("broker-3", 3, True),
        ("broker-3", 4, False),  # never another broker's token
        ("broker-3", None, False),  # a broker that took the admin token still cannot use it
        ("broker", 3, True),  # the chart's shared broker certificate: the token binds the id
        ("broker", None, False),
    ],
)
def test_a_certificate_allows_the_tokens_of_its_role_only(
    cn: str, token_of: int | None, allowed: bool
) -> None:
    role = role_of_name(cn)
    assert role is not None
    why = permits(role, token_of)
    assert (why == "") is allowed, why
    if not allowed:
        assert f"CN={cn}" in why


@pytest.mark.parametrize(
    ("cn", "allowed"),
    [("controller", True), ("operator", True), ("broker-2", True), ("broker", True),
     ("broker-1", False)],
)  # fmt: skip
def test_a_brokers_control_endpoint_lets_in_the_controller_and_itself(
    cn: str, allowed: bool
) -> None:
    role = role_of_name(cn)
    assert role is not None
    assert (may_call_broker(role, 2) == "") is allowed


def test_the_role_of_a_peer_certificate() -> None:
    assert role_of(None) == (None, "no client certificate")
    assert role_of({}) == (None, "no client certificate")
    peer = {"subject": ((("organizationName", "Acme"),), (("commonName", "broker-4"),))}
    assert common_name(peer) == "broker-4"
    assert role_of(peer) == (Role("broker-4", broker_id=4), "")
    role, why = role_of({"subject": ((("commonName", "alice"),),)})
    assert role is None and why == "the certificate CN=alice names no control-plane role"
    assert role_of({"subject": ((("organizationName", "Acme"),),)})[0] is None


def test_the_setting_is_all_three_files_or_none(tmp_path: Path) -> None:
    assert ControlTls.from_files() is None
    assert ControlTls.from_env({}) is None
    with pytest.raises(ControlTlsError, match="--control-tls-key-file, --control-tls-ca-file"):
        ControlTls.from_files(cert_file="x.pem")
    with pytest.raises(ControlTlsError, match="cannot load the certificate"):
        ControlTls.from_files(str(tmp_path / "no.pem"), str(tmp_path / "no.pem"), "ca.pem")
    ca = certs.new_ca("control CA")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())
    certs.write_keystore(tmp_path / "b.pem", certs.issue(ca, "broker-1", client=True))
    tls = ControlTls.from_env({
        "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "b.pem"),
        "TIDALMQ_CONTROL_TLS_KEY_FILE": str(tmp_path / "b.pem"),
        "TIDALMQ_CONTROL_TLS_CA_FILE": str(tmp_path / "ca.pem"),
    })  # fmt: skip
    assert tls is not None and tls.env()["TIDALMQ_CONTROL_TLS_CA_FILE"] == str(tmp_path / "ca.pem")
    with pytest.raises(ControlTlsError, match="cannot load the CA certificate"):
        ControlTls.from_files(str(tmp_path / "b.pem"), str(tmp_path / "b.pem"), str(tmp_path / "b"))
