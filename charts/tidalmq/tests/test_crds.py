"""The CRDs: crds/ is the source, the chart's crds/ holds identical copies; each CRD is a valid
structural schema with sensible names, versions, status subresource and printer columns, and
its schema accepts good resources and refuses bad ones (offline; CEL rules and the real
admission are checked against a real API server in tests/integration/chart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.crd_schema import printer_column_problems, structural_problems, to_json_schema
from tests.support.helm import CHART, REPO

SOURCE = REPO / "crds"
COPIES = CHART / "crds"
OURS = {
    "topics.tidalmq.io": ("Topic", "tmt"),
    "partitionreassignments.tidalmq.io": ("PartitionReassignment", "tpr"),
    "statictopics.tidalmq.io": ("StaticTopic", "tst"),
    "clusterstates.tidalmq.io": ("ClusterState", None),
    "users.tidalmq.io": ("User", "tmu"),
}
ALL = [*OURS, "kopfpeerings.kopf.dev"]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((SOURCE / f"{name}.yaml").read_text())


def schema_of(name: str) -> dict[str, Any]:
    return load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_chart_copies_are_identical_to_the_source() -> None:
    """charts/tidalmq/crds/ is derived from crds/ (`make crds` copies it)."""
    source = {p.name: p.read_bytes() for p in SOURCE.glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in COPIES.glob("*.yaml")}
    assert sorted(source) == sorted(f"{name}.yaml" for name in ALL)
    assert sorted(copies) == sorted(source), "run `make crds`"
    for name, content in source.items():
        assert copies[name] == content, f"charts/tidalmq/crds/{name} differs: run `make crds`"


@pytest.mark.parametrize("name", ALL)
def test_crd_is_structural_and_well_formed(name: str) -> None:
    crd = load(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == spec["names"]["plural"].lower()
    assert spec["names"]["singular"] == spec["names"]["kind"].lower()
    storage = [v for v in spec["versions"] if v["storage"]]
    assert len(storage) == 1 and storage[0]["served"]
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert structural_problems(schema) == []
        jsonschema.Draft7Validator.check_schema(to_json_schema(schema))
    assert printer_column_problems(crd) == []


@pytest.mark.parametrize("name", sorted(OURS))
def test_our_crds(name: str) -> None:
    crd = load(name)
    kind, short = OURS[name]
    spec = crd["spec"]
    assert spec["group"] == "tidalmq.io"
    assert spec["names"]["kind"] == kind
    assert spec["names"].get("shortNames", [None])[0] == short
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns[-1] == "Age"
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    status = schema["properties"]["status"]["properties"]
    assert "observedGeneration" in status and "conditions" in status


def test_printer_columns_are_the_promised_ones() -> None:
    def columns(name: str) -> list[str]:
        version = load(name)["spec"]["versions"][0]
        return [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]

    assert columns("topics.tidalmq.io") == ["Partitions", "Ready", "Reason", "Age"]
    assert columns("partitionreassignments.tidalmq.io") == ["Phase", "Progress", "Message", "Age"]
    assert columns("statictopics.tidalmq.io") == ["Queues", "Epoch", "Ready", "Reason", "Age"]
    assert columns("users.tidalmq.io") == ["Authentication", "Ready", "Reason", "Age"]
    assert columns("clusterstates.tidalmq.io")[1:4] == ["Version", "Epoch", "Brokers"]


def test_kopf_peering_crd_matches_kopf() -> None:
    """Kopf patches status through the main endpoint: no status subresource, status kept whole."""
    crd = load("kopfpeerings.kopf.dev")
    assert crd["spec"]["group"] == "kopf.dev"
    assert crd["spec"]["names"]["kind"] == "KopfPeering"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1"
    assert "subresources" not in version
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_shared_sub_schemas_are_the_same_everywhere() -> None:
    topic = schema_of("topics.tidalmq.io")["properties"]
    static = schema_of("statictopics.tidalmq.io")["properties"]
    topic_configs = topic["spec"]["properties"]["configs"]["properties"]
    assert topic_configs == static["spec"]["properties"]["configs"]["properties"]
    assert set(topic_configs) == {
        "retention.ms", "retention.bytes", "max.message.bytes", "segment.bytes",
        "cleanup.policy", "message.timestamp.type", "compression.type",
    }  # fmt: skip

    def conditions(name: str) -> dict[str, Any]:
        node = dict(schema_of(name)["properties"]["status"]["properties"]["conditions"])
        node.pop("description", None)
        return node

    for name in OURS:
        assert conditions(name) == conditions("topics.tidalmq.io"), name


# ---------------------------------------------------------------------------- the checker
BAD_SCHEMAS = {
    "missing type": {"type": "object", "properties": {"a": {"description": "x"}}},
    "properties and additionalProperties": {
        "type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False,
    },
    "type in a junctor": {"type": "object", "anyOf": [{"type": "object"}]},
    "junctor field not outside": {
        "type": "object", "properties": {"a": {"type": "string"}},
        "oneOf": [{"properties": {"b": {"minLength": 1}}}],
    },
    "preserve false": {"type": "object", "x-kubernetes-preserve-unknown-fields": False},
    "metadata restricted": {
        "type": "object",
        "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}},
    },
    "array without items": {"type": "object", "properties": {"a": {"type": "array"}}},
    "unique items": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "ref": {"type": "object", "properties": {"a": {"$ref": "#/x"}}},
    "bad default": {"type": "object", "properties": {"a": {"type": "integer", "default": "x"}}},
    "map list key not required": {
        "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
        "items": {"type": "object", "properties": {"k": {"type": "string"}}},
    },
    "oldSelf under an atomic list": {
        "type": "array",
        "items": {"type": "object", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]},
    },
    "multi-line rule without message": {
        "type": "object", "x-kubernetes-validations": [{"rule": "true &&\ntrue"}],
    },
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_SCHEMAS))
def test_structural_checker_finds_problems(case: str) -> None:
    assert structural_problems(BAD_SCHEMAS[case]), f"{case} went unnoticed"


def test_printer_column_checker_finds_problems() -> None:
    crd = load("topics.tidalmq.io")
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    columns.append({"name": "Typo", "type": "integer", "jsonPath": ".spec.partition"})
    columns.append({"name": "Wrong", "type": "integer", "jsonPath": ".spec.topicName"})
    problems = printer_column_problems(crd)
    assert len(problems) == 2, problems


# ---------------------------------------------------------------------------- sample resources
def resource(kind: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "tidalmq.io/v1alpha1", "kind": kind, "metadata": {"name": "x"},
            "spec": spec, **extra}  # fmt: skip


GOOD = {
    "user scram generated": ("users.tidalmq.io", resource("User", {"authentication": {"type": "scram-sha-512"}})),
    "user full": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "scram-sha-256",
                           "password": {"valueFrom": {"secretKeyRef": {"name": "pw", "key": "password"}}}},
        "authorization": {"type": "simple", "acls": [
            {"resource": {"type": "topic", "name": "orders", "patternType": "prefixed"},
             "operations": ["Read", "Describe"], "host": "*", "type": "allow"},
            {"resource": {"type": "group", "name": "app"}, "operations": ["Read"]},
            {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"], "type": "deny"},
            {"resource": {"type": "transactionalId", "name": "tx"}, "operations": ["Write"]},
        ]},
    }, status={"observedGeneration": 1, "secret": "x", "username": "x", "principal": "User:x",
               "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                               "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]})),
    "user tls": ("users.tidalmq.io", resource("User", {"authentication": {"type": "tls"}})),
    "topic minimal": ("topics.tidalmq.io", resource("Topic", {"partitions": 1})),
    "topic full": ("topics.tidalmq.io", resource("Topic", {
        "topicName": "orders.v2_eu-1", "partitions": 24,
        "configs": {"retention.ms": 604800000, "retention.bytes": "-1", "max.message.bytes": "1048588",
                    "segment.bytes": 1073741824, "cleanup.policy": "delete",
                    "message.timestamp.type": "LogAppendTime", "compression.type": "producer"},
    }, status={
        "observedGeneration": 2, "topicId": "q1w2e3", "partitionCount": 2,
        "partitions": [{"partition": 0, "broker": 1, "epoch": 3, "moving": False},
                       {"partition": 1, "epoch": 0, "moving": True}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}],
    })),
    "kafka reassignment json": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": [2], "log_dirs": ["any"]}],
    }, status={
        "phase": "Running", "progress": "0/1", "startTime": "2026-01-01T00:00:00Z",
        "partitions": [{"topic": "orders", "partition": 0, "source": 1, "target": 2, "phase": "Closing",
                        "startTime": "2026-01-01T00:00:00Z", "unavailableMs": 120, "message": "closing"}],
    })),
    "planner request": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "generate": {"window": "7d", "step": "1m", "maxMoves": 10, "threshold": 1.2, "topics": ["orders"]},
        "approved": False, "autoApprove": False,
    }, status={"phase": "AwaitingApproval", "plan": {
        "partitions": [{"topic": "orders", "partition": 3, "replicas": [0]}],
        "report": {"movesCount": 1, "imbalanceBefore": 1.8, "imbalanceAfter": 1.1, "chart": "#", "extra": 1},
    }})),
    "static topic": ("statictopics.tidalmq.io", resource("StaticTopic", {
        "totalQueues": 8, "brokers": [0, 1], "remap": [{"queue": 3, "broker": 1, "mode": "strict"}],
        "configs": {"retention.ms": "86400000"},
    }, status={
        "epoch": 4, "queues": [{"queue": 3, "broker": 1, "gen": 1, "items": 2, "logicOffset": 1000}],
        "mapping": {"3": [
            {"queue": 0, "broker": 0, "gen": 0, "logicOffset": 0, "startOffset": 0, "endOffset": 1000,
             "timeOfStart": 1561018349243, "timeOfEnd": 1561018349243, "updateTime": 1561018349243},
            {"queue": 0, "broker": 1, "gen": 1, "logicOffset": 1000, "startOffset": 0, "endOffset": -1},
        ]},
    })),
    "cluster state": ("clusterstates.tidalmq.io", resource("ClusterState", {
        "clusterId": "MkU3OEVBNTcwNTJENDM2Qk", "document": {"version": 3, "topics": {"a": {}}},
    }, status={"version": 3, "controllerEpoch": 2, "brokers": 2, "brokerIds": [0, 1], "topics": 1,
               "controller": "tidalmq-operator-5d8f7-abcde"})),
}  # fmt: skip

BAD = {
    "user without authentication": ("users.tidalmq.io", resource("User", {}), "authentication"),
    "user unknown authentication": ("users.tidalmq.io", resource("User", {"authentication": {"type": "plain"}}), "is not one of"),
    "user acl unknown operation": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "tls"},
        "authorization": {"acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}]}}), "is not one of"),
    "user acl unknown resource type": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "tls"},
        "authorization": {"acls": [{"resource": {"type": "user", "name": "t"}, "operations": ["Read"]}]}}), "is not one of"),
    "user acl without operations": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "tls"},
        "authorization": {"acls": [{"resource": {"type": "topic", "name": "t"}, "operations": []}]}}), "non-empty"),
    "user acl bad permission": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "tls"},
        "authorization": {"acls": [{"resource": {"type": "topic", "name": "t"}, "operations": ["Read"], "type": "maybe"}]}}), "is not one of"),
    "user password without key": ("users.tidalmq.io", resource("User", {
        "authentication": {"type": "scram-sha-512", "password": {"valueFrom": {"secretKeyRef": {"name": "pw"}}}}}), "key"),
    "topic without partitions": ("topics.tidalmq.io", resource("Topic", {}), "partitions"),
    "topic zero partitions": ("topics.tidalmq.io", resource("Topic", {"partitions": 0}), "minimum"),
    "topic too many partitions": ("topics.tidalmq.io", resource("Topic", {"partitions": 10001}), "maximum"),
    "topic partitions as text": ("topics.tidalmq.io", resource("Topic", {"partitions": "3"}), "type"),
    "topic name with space": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "topicName": "a b"}), "match"),
    "topic name too long": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "topicName": "a" * 250}), "long"),
    "unknown config": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"foo": "1"}}), "foo"),
    "compaction": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"cleanup.policy": "compact"}}), "compact"),
    "retention not numeric": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"retention.ms": "7d"}}), "match"),
    "retention below -1": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"retention.ms": -2}}), "minimum"),
    "bad compression": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"compression.type": "brotli"}}), "brotli"),
    "topic codec (never applied)": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"compression.type": "zstd"}}), "zstd"),
    "no spec": ("topics.tidalmq.io", {"apiVersion": "tidalmq.io/v1alpha1", "kind": "Topic", "metadata": {}}, "spec"),
    "two replicas": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "partitions": [{"topic": "a", "partition": 0, "replicas": [1, 2]}]}), "long"),
    "no replicas": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "partitions": [{"topic": "a", "partition": 0, "replicas": []}]}), "non-empty"),
    "negative broker": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "partitions": [{"topic": "a", "partition": 0, "replicas": [-1]}]}), "minimum"),
    "reassignment version 2": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "version": 2, "partitions": [{"topic": "a", "partition": 0, "replicas": [1]}]}), "2"),
    "bad window": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "generate": {"window": "seven days"}}), "match"),
    "threshold below 1": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "generate": {"threshold": 0.5}}), "minimum"),
    "unknown phase": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "generate": {}}, status={"phase": "Halfway"}), "Halfway"),
    "bad progress": ("partitionreassignments.tidalmq.io", resource("PartitionReassignment", {
        "generate": {}}, status={"progress": "half"}), "match"),
    "too many queues": ("statictopics.tidalmq.io", resource("StaticTopic", {"totalQueues": 1025}), "maximum"),
    "bad remap mode": ("statictopics.tidalmq.io", resource("StaticTopic", {
        "totalQueues": 2, "remap": [{"queue": 0, "broker": 1, "mode": "fast"}]}), "fast"),
    "remap without broker": ("statictopics.tidalmq.io", resource("StaticTopic", {
        "totalQueues": 2, "remap": [{"queue": 0}]}), "broker"),
    "cluster state without id": ("clusterstates.tidalmq.io", resource("ClusterState", {"document": {}}), "clusterId"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(GOOD))
def test_schema_accepts_good_resources(case: str) -> None:
    name, obj = GOOD[case]
    jsonschema.validate(obj, to_json_schema(schema_of(name)))


@pytest.mark.parametrize("case", sorted(BAD))
def test_schema_refuses_bad_resources(case: str) -> None:
    name, obj, fragment = BAD[case]
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(obj, to_json_schema(schema_of(name)))
    assert fragment in str(info.value.message), info.value.message


def test_crd_files_parse_as_single_documents() -> None:
    for path in Path(SOURCE).glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert len(docs) == 1, path
