"""Where the current assignment (partition -> broker) and the live brokers come from.

In order of authority: a Kafka bootstrap server (Metadata: every partition's leader and every
registered broker), a Kafka-format JSON file (the assignment as `kafka-reassign-partitions
--generate` prints it as "current"), the history file's broker column, Prometheus (the broker
exporting the highest leader epoch of each partition).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tidalmq_core.control_tls import ControlTls, server_is_admin
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.reassignment import parse_plan

Assignment = dict[tuple[str, int], int]


@dataclass(slots=True)
class ClusterView:
    assignment: Assignment
    brokers: list[int] = field(default_factory=list)
    source: str = ""


def from_bootstrap(
    bootstrap: str, timeout_s: float = 30.0, command_config: str | None = None
) -> ClusterView:
    """Leaders and brokers from a Kafka Metadata request (confluent-kafka); `command_config`:
    Kafka client properties for a TLS or SASL listener (tidalmq_core.client_properties)."""
    from confluent_kafka.admin import AdminClient
    from tidalmq_core.client_properties import from_file

    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(timeout_s * 1000),
            **from_file(command_config).librdkafka(),
        }
    )
    meta = admin.list_topics(timeout=timeout_s)
    assignment: Assignment = {}
    for name, topic in meta.topics.items():
        if topic.error is not None:
            raise RuntimeError(f"metadata of topic {name!r}: {topic.error}")
        for index, part in topic.partitions.items():
            if part.leader is not None and part.leader >= 0:
                assignment[(name, int(index))] = int(part.leader)
    return ClusterView(assignment, sorted(int(b) for b in meta.brokers), f"bootstrap {bootstrap}")


def from_file(path: str | Path) -> ClusterView:
    entries = parse_plan(Path(path).read_text())
    assignment = {(e.tp.topic, e.tp.partition): e.target for e in entries if e.target is not None}
    return ClusterView(assignment, sorted(set(assignment.values())), f"file {path}")


def from_controller(
    url: str, timeout_s: float = 30.0, token: str | None = None, tls: ControlTls | None = None
) -> ClusterView:
    """The controller's GET /v1/metadata (the local cluster and the operator serve it), with the
    control token (default: TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN) and, for an
    https URL (control-plane mTLS), an admin's certificate (TIDALMQ_CONTROL_TLS_CERT_FILE,
    _KEY_FILE, _CA_FILE)."""
    import urllib.request

    from tidalmq_core.control_auth import authorization, tokens_from_env

    token = token or next(iter(tokens_from_env()), None)
    if not token:
        raise RuntimeError(
            "reading the controller needs the cluster's control token: set "
            "TIDALMQ_CONTROL_TOKEN_FILE or TIDALMQ_CONTROL_TOKEN"
        )
    req = urllib.request.Request(url.rstrip("/") + "/v1/metadata", headers=authorization(token))
    context = None
    if url.startswith("https:"):
        tls = tls or ControlTls.from_env()
        if tls is None:
            raise RuntimeError(
                f"the controller at {url} speaks mTLS: set TIDALMQ_CONTROL_TLS_CERT_FILE, "
                "TIDALMQ_CONTROL_TLS_KEY_FILE and TIDALMQ_CONTROL_TLS_CA_FILE"
            )
        context = tls.client_context(server_is_admin)
    with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
        meta = ClusterMetadata.from_json(json.loads(resp.read())["metadata"])
    assignment: Assignment = {}
    for topic in meta.topics.values():
        for index, part in enumerate(topic.partitions):
            if part.leader >= 0:
                assignment[(topic.name, index)] = part.leader
    return ClusterView(assignment, meta.live_brokers(), f"controller {url}")
