"""The operator's controller takes its control tokens from its environment and never serves
without one."""

from __future__ import annotations

from pathlib import Path

import pytest
from tidalmq_core.control_auth import ADMIN, Principal, TokenError, broker_token
from tidalmq_operator.main import main
from tidalmq_operator.settings import OperatorSettings

TOKEN = "operator-unit-cluster-token-" + "t" * 30
SECRET = "operator-unit-brokers-secret-" + "s" * 30


def test_tokens_and_bind_addresses_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    (tmp_path / "broker-secret").write_text(SECRET + "\n")
    s = OperatorSettings.from_env(
        {
            "TIDALMQ_CONTROL_TOKEN_FILE": str(tmp_path / "admin-token"),
            "TIDALMQ_CONTROL_BROKER_SECRET_FILE": str(tmp_path / "broker-secret"),
            "TIDALMQ_CONTROLLER_HOST": "10.0.0.9",
            "TIDALMQ_OPERATOR_HTTP_HOST": "10.0.0.9",
        }
    )
    assert (s.controller_host, s.http_host) == ("10.0.0.9", "10.0.0.9")
    auth = s.control_auth()
    assert auth.authenticate(f"Bearer {TOKEN}")[0] == ADMIN
    assert auth.authenticate(f"Bearer {broker_token(SECRET, 3)}")[0] == Principal(3)
    assert auth.authenticate(f"Bearer {SECRET}")[0] is None, "the brokers' secret is not admin"
    inline = OperatorSettings.from_env({"TIDALMQ_CONTROL_TOKEN": TOKEN})
    assert TOKEN not in repr(inline)
    assert inline.control_auth().broker_token(1) == broker_token(TOKEN, 1)
    defaults = OperatorSettings.from_env({})
    assert (defaults.controller_host, defaults.http_host) == ("0.0.0.0", "0.0.0.0")


def test_no_token_no_controller(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TokenError, match="needs the cluster's control token"):
        OperatorSettings.from_env({}).control_auth()
    assert main(OperatorSettings.from_env({})) == 2
    assert "cannot start" in capsys.readouterr().err


def test_control_plane_tls_is_all_three_files_or_the_operator_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert OperatorSettings.from_env({"TIDALMQ_CONTROL_TOKEN": TOKEN}).control_tls() is None
    partial = OperatorSettings.from_env(
        {
            "TIDALMQ_CONTROL_TOKEN": TOKEN,
            "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
        }
    )
    assert main(partial) == 2
    err = capsys.readouterr().err
    assert "cannot start: control-plane TLS needs" in err and "--control-tls-key-file" in err
    unreadable = OperatorSettings.from_env(
        {
            "TIDALMQ_CONTROL_TOKEN": TOKEN,
            "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
            "TIDALMQ_CONTROL_TLS_KEY_FILE": str(tmp_path / "tls.key"),
            "TIDALMQ_CONTROL_TLS_CA_FILE": str(tmp_path / "ca.crt"),
        }
    )
    assert main(unreadable) == 2
    assert "cannot load the certificate" in capsys.readouterr().err


def test_a_missing_control_plane_crl_stops_the_operator_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TIDALMQ_CONTROL_TLS_CRL_FILE given but missing: one line and exit 2, as the broker's
    listener with a missing ssl.crl.location (it never serves without the CRL it was told to
    check)."""
    from tidalmq_broker.security import certs

    ca = certs.new_ca("control CA")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem())
    certs.write_keystore(tmp_path / "tls.crt", certs.issue(ca, "operator", client=True))
    env = {
        "TIDALMQ_CONTROL_TOKEN": TOKEN,
        "TIDALMQ_CONTROL_TLS_CERT_FILE": str(tmp_path / "tls.crt"),
        "TIDALMQ_CONTROL_TLS_KEY_FILE": str(tmp_path / "tls.crt"),
        "TIDALMQ_CONTROL_TLS_CA_FILE": str(tmp_path / "ca.crt"),
        "TIDALMQ_CONTROL_TLS_CRL_FILE": str(tmp_path / "crl.pem"),
    }
    assert main(OperatorSettings.from_env(env)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot start: control-plane TLS: --control-tls-crl-file" in err
