"""The kind cluster's pod network daemon (e2e/images/kind-cni): what it reads from a node and the
CNI configuration it writes for the node's podCIDR."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "e2e" / "images" / "kind-cni" / "cni_daemon.py"


@pytest.fixture(scope="module")
def daemon() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kind_cni_daemon", SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node(name: str, cidr: str | None, ip: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr} if cidr else {},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": ip},
            ]
        },
    }


def test_reads_the_pod_cidr_and_the_internal_ipv4(daemon: ModuleType) -> None:
    worker = node("kind-worker", "10.244.1.0/24", "172.18.0.3")
    assert daemon.pod_cidr(worker) == "10.244.1.0/24"
    assert daemon.internal_ip(worker) == "172.18.0.3"
    assert daemon.pod_cidr(node("new", None, "172.18.0.4")) is None
    assert daemon.internal_ip(node("v6", "10.244.2.0/24", "fc00::3")) is None


def test_a_malformed_pod_cidr_is_refused(daemon: ModuleType) -> None:
    with pytest.raises(ValueError):
        daemon.pod_cidr(node("bad", "10.244.1.0/33", "172.18.0.3"))


def test_cni_config_is_ptp_with_host_local_addresses_from_the_pod_cidr(daemon: ModuleType) -> None:
    config = json.loads(daemon.cni_config("10.244.2.0/24"))
    ptp, portmap = config["plugins"]
    assert ptp["type"] == "ptp" and portmap["type"] == "portmap"
    assert ptp["ipam"]["type"] == "host-local"
    assert ptp["ipam"]["ranges"] == [[{"subnet": "10.244.2.0/24"}]]
    assert ptp["ipam"]["routes"] == [{"dst": "0.0.0.0/0"}]


def test_sync_writes_this_nodes_config_and_routes_the_others(
    daemon: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [
        node("cp", "10.244.0.0/24", "172.18.0.2"),
        node("w1", "10.244.1.0/24", "172.18.0.3"),
        node("w2", None, "172.18.0.4"),
    ]
    routes: list[tuple[str, str]] = []
    monkeypatch.setattr(daemon, "CNI_CONFIG", tmp_path / "net.d" / "10-tidalmq-kind.conflist")
    monkeypatch.setattr(daemon, "list_nodes", lambda: nodes)
    monkeypatch.setattr(daemon, "route", lambda subnet, via: routes.append((subnet, via)))
    routed: dict[str, str] = {}
    daemon.sync("w1", routed)
    written = json.loads((tmp_path / "net.d" / "10-tidalmq-kind.conflist").read_text())
    assert written["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}]]
    assert routes == [("10.244.0.0/24", "172.18.0.2")]  # not itself, not a node without podCIDR
    daemon.sync("w1", routed)  # routes are replaced on every pass (a restarted node lost them)
    assert routes == [("10.244.0.0/24", "172.18.0.2")] * 2
