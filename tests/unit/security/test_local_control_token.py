"""The local cluster's control token (local/control.py): made once, owner-only, and found by the
commands that call the controller."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from tidalmq_broker.local.control import ControlError, ensure_token, find_controller, token_path


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
    assert find_controller(None, data) == ("http://127.0.0.1:9690", token)
    # --controller-url: the explicit file, else the environment, else the data dir's
    other = tmp_path / "other-token"
    other.write_text("o" * 40)
    assert find_controller("http://c:1", data, str(other)) == ("http://c:1", "o" * 40)
    monkeypatch.setenv("TIDALMQ_CONTROL_TOKEN", "e" * 40)
    assert find_controller("http://c:1", data) == ("http://c:1", "e" * 40)
    assert find_controller(None, data) == ("http://127.0.0.1:9690", token), "its own cluster's"
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN")
    assert find_controller("http://c:1", data) == ("http://c:1", token)
    with pytest.raises(ControlError, match="no control token"):
        find_controller("http://c:1", tmp_path / "nowhere")
