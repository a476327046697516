"""The kind cluster's pod network (kindnetd is not on the Go module proxy): one process per node.

Every few seconds it reads the nodes from the API server and
- writes this node's CNI configuration: a point-to-point veth per pod (the `ptp` plugin) with
  addresses from the node's podCIDR (`host-local`), and `portmap` for hostPorts;
- routes every other node's podCIDR via that node's InternalIP (all nodes share one Docker
  network, so one hop reaches them).

It runs in the host network namespace of its node (hostNetwork, NET_ADMIN) and needs only the
standard library, `ip` (iproute2) and the pod's service account (get/list nodes).
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CNI_CONFIG = Path(os.environ.get("CNI_CONFIG", "/etc/cni/net.d/10-tidalmq-kind.conflist"))
INTERVAL_S = float(os.environ.get("SYNC_INTERVAL_S", "5"))
# A node list larger than this is not a kind cluster's: refuse it rather than read without bound.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


def log(message: str) -> None:
    print(f"[tidalmq-kind-cni {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def list_nodes() -> list[dict[str, Any]]:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    context = ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt"))
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/nodes",
        headers={"Authorization": f"Bearer {(ACCOUNT / 'token').read_text().strip()}"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        body = response.read(MAX_RESPONSE_BYTES + 1)
    if len(body) > MAX_RESPONSE_BYTES:
        raise ValueError(f"node list larger than {MAX_RESPONSE_BYTES} bytes")
    items = json.loads(body).get("items", [])
    return items if isinstance(items, list) else []


def internal_ip(node: dict[str, Any]) -> str | None:
    for address in node.get("status", {}).get("addresses", []):
        if address.get("type") == "InternalIP":
            value = str(address.get("address", ""))
            return value if ipaddress.ip_address(value).version == 4 else None
    return None


def pod_cidr(node: dict[str, Any]) -> str | None:
    value = node.get("spec", {}).get("podCIDR")
    if not value:
        return None
    return str(ipaddress.ip_network(value))


def cni_config(subnet: str) -> str:
    """ptp + host-local for this node's podCIDR, portmap for hostPorts (CNI 0.4.0)."""
    config = {
        "cniVersion": "0.4.0",
        "name": "tidalmq-kind",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=1) + "\n"


def write_config(subnet: str) -> None:
    text = cni_config(subnet)
    if CNI_CONFIG.exists() and CNI_CONFIG.read_text() == text:
        return
    CNI_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    staged = CNI_CONFIG.with_suffix(".tmp")
    staged.write_text(text)
    staged.replace(CNI_CONFIG)  # the kubelet never reads half a file
    log(f"wrote {CNI_CONFIG} for podCIDR {subnet}")


def route(subnet: str, via: str) -> None:
    """Replaced on every sync: a node container restarted has a fresh network namespace."""
    result = subprocess.run(
        ["ip", "route", "replace", subnet, "via", via],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        log(f"ip route replace {subnet} via {via}: {result.stderr.strip()}")


def sync(node_name: str, routed: dict[str, str]) -> None:
    for node in list_nodes():
        subnet, address = pod_cidr(node), internal_ip(node)
        if subnet is None:
            continue
        if node.get("metadata", {}).get("name") == node_name:
            write_config(subnet)
        elif address is not None:
            route(subnet, address)
            if routed.get(subnet) != address:
                routed[subnet] = address
                log(f"route {subnet} via {address}")


def main() -> None:
    node_name = os.environ["NODE_NAME"]
    routed: dict[str, str] = {}
    while True:
        try:
            sync(node_name, routed)
        except (OSError, ValueError) as exc:  # the API server may be restarting: retry
            log(f"sync failed: {exc}")
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    main()
