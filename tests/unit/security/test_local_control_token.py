"""The local cluster's control token (local/control.py): made once, owner-only, and found by the
commands that call the controller."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography import x509
from tidalmq_broker.local import control_tls
from tidalmq_broker.local.control import ControlError, ensure_token, find_controller, token_path
from tidalmq_core.control_tls import ENV_CRL_FILE as ENV_CRL

from tests.support.revocation import crl_pem


def test_the_token_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = ensure_token(data)
    path = token_path(data)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 43 and path.read_text() == token + "\n"
    path.chmod(0o644)
    assert ensure_token(data) == token, "kept across restarts"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    with pytest.raises(ControlError, match="too short"):
        ensure_token(data)


def test_commands_find_the_controller_and_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN_FILE", raising=False)
    data = tmp_path / "local"
    with pytest.raises(ControlError, match="no local cluster is running"):
        find_controller(None, data)
    token = ensure_token(data)
    (data / "cluster.json").write_text(json.dumps({"controller_url": "http://127.0.0.1:9690/"}))
    assert find_controller(None, data)[:2] == ("http://127.0.0.1:9690", token)
    # --controller-url: the explicit file, else the environment, else the data dir's
    other = tmp_path / "other-token"
    other.write_text("o" * 40)
    assert find_controller("http://c:1", data, str(other))[:2] == ("http://c:1", "o" * 40)
    monkeypatch.setenv("TIDALMQ_CONTROL_TOKEN", "e" * 40)
    assert find_controller("http://c:1", data)[:2] == ("http://c:1", "e" * 40)
    assert find_controller(None, data)[:2] == ("http://127.0.0.1:9690", token), "its own cluster's"
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN")
    assert find_controller("http://c:1", data)[:2] == ("http://c:1", token)
    with pytest.raises(ControlError, match="no control token"):
        find_controller("http://c:1", tmp_path / "nowhere")


def test_the_commands_present_the_data_dirs_admin_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`local up` makes the control plane's CA and certificates in the data dir; the commands
    that find the controller through the data dir present its admin certificate (CN=admin), and
    given --controller-url the TIDALMQ_CONTROL_TLS_* files first."""
    for name in (
        "TIDALMQ_CONTROL_TOKEN",
        "TIDALMQ_CONTROL_TOKEN_FILE",
        "TIDALMQ_CONTROL_TLS_CERT_FILE",
        "TIDALMQ_CONTROL_TLS_KEY_FILE",
        "TIDALMQ_CONTROL_TLS_CA_FILE",
        "TIDALMQ_CONTROL_TLS_CRL_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "local"
    ensure_token(data)
    (data / "cluster.json").write_text(json.dumps({"controller_url": "https://127.0.0.1:9690"}))
    assert find_controller(None, data).tls is None  # no CA made yet (`--control-tls off`)
    local = control_tls.prepare(data, "0.0.0.0")
    tls = find_controller(None, data).tls
    assert tls is not None and tls.cert_file == str(data / "control-tls" / "admin.pem")
    assert oct((data / "control-tls" / "ca-key.pem").stat().st_mode & 0o777) == "0o600"
    ca = (data / "control-tls" / "ca.pem").read_bytes()
    broker = local.broker(3)
    cert = x509.load_pem_x509_certificate(Path(broker.cert_file).read_bytes())
    assert cert.subject.rfc4514_string() == "CN=broker-3"
    assert control_tls.prepare(data, "").ca_file.read_bytes() == ca, "the CA is kept"
    # a CRL of the data dir's CA, when there is one, is checked by every process and the CLI
    assert broker.crl_file == "" and tls.crl_file == ""
    crl = data / "control-tls" / "crl.pem"
    crl.write_bytes(crl_pem(local.ca, []))
    assert local.broker(3).crl_file == str(crl) and local.broker(3).env()[ENV_CRL] == str(crl)
    assert (admin := find_controller(None, data).tls) is not None and admin.crl_file == str(crl)
    other = control_tls.prepare(tmp_path / "elsewhere", "").admin()
    for name, value in other.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIDALMQ_CONTROL_TOKEN", "e" * 40)
    assert find_controller("https://c:1", data).tls == other
