"""The local cluster's rules ([U1]): which data dir, which brokers a start runs, how the status
table tells a dead broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tidalmq_broker.local.client import format_table
from tidalmq_broker.local.cluster import start_ids
from tidalmq_broker.local.control import ensure_token, find_controller
from tidalmq_broker.local.processes import default_data_dir, resolve_data_dir


def test_the_data_dir_is_the_flag_then_the_environment_then_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIDALMQ_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / "home" / ".tidalmq" / "local"
    assert resolve_data_dir("") == (tmp_path / "home" / ".tidalmq" / "local").resolve()
    monkeypatch.setenv("TIDALMQ_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(None) == (tmp_path / "env").resolve()
    assert resolve_data_dir("rel") == (tmp_path / "rel").resolve(), "the flag wins"


def test_commands_find_the_cluster_of_the_default_data_dir_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "cluster"
    token = ensure_token(data)
    (data / "cluster.json").write_text(json.dumps({"controller_url": "http://127.0.0.1:1/"}))
    monkeypatch.setenv("TIDALMQ_DATA_DIR", str(data))
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN", raising=False)
    monkeypatch.delenv("TIDALMQ_CONTROL_TOKEN_FILE", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert find_controller(None, "") == ("http://127.0.0.1:1", token, None)


@pytest.mark.parametrize(
    ("known", "brokers", "started"),
    [
        ([], 3, [0, 1, 2]),  # a new cluster
        ([0, 1, 2], 3, [0, 1, 2]),  # as it was
        ([1, 2], 3, [1, 2]),  # broker 0 removed: no new broker 0, nothing moves
        ([0, 1, 2, 3], 3, [0, 1, 2, 3]),  # one added: all come back (none declared dead)
        ([2, 0], 5, [0, 2]),  # --brokers sizes a new cluster only
    ],
)
def test_a_start_runs_the_brokers_the_cluster_has(
    known: list[int], brokers: int, started: list[int]
) -> None:
    assert start_ids(known, brokers) == started


def _status(dead_since: float | None) -> dict[str, object]:
    row = {
        "broker": 2,
        "state": "dead",
        "process": "killed",
        "address": "127.0.0.1:9094",
        "partitions": 0,
        "dead_since": dead_since,
    }
    return {
        "brokers": [row],
        "moves_in_flight": 0,
        "moves_done": 3,
        "leaderless": 0,
        "failovers_opening": 2,
    }


def test_a_dead_broker_says_how_long_ago_it_died_and_what_replaces_it() -> None:
    table = format_table(_status(1000.0), now=1065.0)
    assert "dead for 1m05s" in table and "add-broker` replaces it" in table
    assert "failed-over partitions opening: 2" in table
    assert "dead since before this start" in format_table(_status(None), now=1065.0)
    live = format_table(_status(1000.0))  # local up's table: printed when it changes only
    assert "dead since " in live and format_table(_status(1000.0)) == live


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost:", "127.0.0.1:port"])
def test_an_address_without_a_port_is_a_clean_error(address: str) -> None:
    """[U1]: `--bootstrap-server 127.0.0.1` printed a raw int() error."""
    from tidalmq_broker.admin_client import AdminClient, AdminError

    with pytest.raises(AdminError) as raised, AdminClient(address) as admin:
        admin.brokers()
    assert str(raised.value) == (
        f"cannot reach any bootstrap server: {address}: not HOST:PORT (e.g. 127.0.0.1:9092)"
    )
