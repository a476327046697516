"""The CRDs: crds/ is the source, the chart's crds/ holds identical copies; each CRD is a valid
structural schema with sensible names, versions, status subresource and printer columns, and
its schema accepts good resources and refuses bad ones (offline; CEL rules and the real
admission are checked against a real API server in tests/integration/chart)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from tidalmq_core.topics import TOPIC_CONFIG_DEFS, TOPIC_CONFIGS, validate_configs
from tidalmq_operator import crd_configs
from tidalmq_operator.models import TopicSpec, parse

from tests.support.crd_schema import printer_column_problems, structural_problems, to_json_schema
from tests.support.helm import CHART, REPO
from tests.support.topic_config_validation import KAFKA_ACCEPTS, KAFKA_REFUSES, TIDALMQ_NARROWS

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
    static_configs = static["spec"]["properties"]["configs"]["properties"]
    # every config of the broker's table but Kafka's internal ones, in its order; a static
    # topic's cleanup.policy differs (no compact)
    assert list(topic_configs) == [d.name for d in TOPIC_CONFIG_DEFS if not d.internal]
    assert list(static_configs) == list(topic_configs)
    differ = [n for n in topic_configs if topic_configs[n] != static_configs[n]]
    assert differ == ["cleanup.policy"]

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
    "compacted topic": ("topics.tidalmq.io", resource("Topic", {"partitions": 3, "configs": {
        "cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": 0.1, "delete.retention.ms": "3600000",
        "min.compaction.lag.ms": 0, "unclean.leader.election.enable": False, "remote.storage.enable": False,
        "preallocate": True, "leader.replication.throttled.replicas": "*",
        "follower.replication.throttled.replicas": "0:1, 1:2", "compression.gzip.level": -1}})),
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
    "static topic compaction": ("statictopics.tidalmq.io", resource("StaticTopic", {"totalQueues": 1, "configs": {"cleanup.policy": "compact"}}), "match"),
    "unknown cleanup policy": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"cleanup.policy": "compact,shred"}}), "match"),
    "unclean election": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"unclean.leader.election.enable": True}}), "True"),
    "tiered storage": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"remote.storage.enable": True}}), "True"),
    "boolean as text": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"preallocate": "true"}}), "type"),
    "two in-sync replicas": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"min.insync.replicas": 2}}), "maximum"),
    "dirty ratio above 1": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"min.cleanable.dirty.ratio": 1.5}}), "maximum"),
    "segment below 1 MiB": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"segment.bytes": 4096}}), "minimum"),
    "internal config": ("topics.tidalmq.io", resource("Topic", {"partitions": 1, "configs": {"internal.segment.bytes": 4096}}), "internal.segment.bytes"),
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


# ---------------------------------------------------------------------------- the configs schema
def test_configs_schemas_are_generated_from_the_topic_config_table() -> None:
    """Nobody edits spec.configs of the Topic and StaticTopic CRDs by hand, in crds/ or in the
    chart's copies: `make crds` writes them from tidalmq_core.topics.TOPIC_CONFIG_DEFS."""
    assert crd_configs.stale() == [], "run `make crds` and commit the result"


def test_the_check_names_a_hand_edited_configs_schema(tmp_path: Path) -> None:
    dirs = (tmp_path / "crds", tmp_path / "chart")
    for folder in dirs:
        folder.mkdir()
        for name in crd_configs.FILES:
            (folder / name).write_text((SOURCE / name).read_text())
    assert crd_configs.stale(dirs) == []
    edited = dirs[1] / "topics.tidalmq.io.yaml"
    edited.write_text(edited.read_text().replace("minimum: 1048576", "minimum: 1"))
    assert crd_configs.stale(dirs) == [edited]
    # a hand edit of the source's generated block: the source differs from what it renders to
    source = dirs[0] / "statictopics.tidalmq.io.yaml"
    source.write_text(source.read_text().replace("(delete)", "(compact|delete)"))
    assert set(crd_configs.stale(dirs)) == {source, edited}
    broken = dirs[0] / "topics.tidalmq.io.yaml"
    broken.write_text(broken.read_text().replace(crd_configs.END, "# the end"))
    with pytest.raises(ValueError, match="no generated configs block"):
        crd_configs.stale(dirs)


def _typed(name: str, value: str) -> Any:
    """A config value of the validation cases as a Topic's YAML would hold it: INT and LONG
    integers, DOUBLE numbers, BOOLEAN booleans (the schema's types), or the text when it has
    no such form (which the schema must then refuse); None when JSON cannot hold it (NaN)."""
    d = TOPIC_CONFIGS.get(name)
    text = value.strip()
    if d is None or d.type in ("STRING", "LIST"):
        return value
    if d.type in ("INT", "LONG"):
        # an integer Kubernetes holds (int64), else the text
        if re.fullmatch(r"[+-]?[0-9]+", text) and -(2**63) <= int(text) < 2**63:
            return int(text)
        return value
    if d.type == "BOOLEAN":
        return text.lower() == "true" if text.lower() in ("true", "false") else value
    try:
        number = float(text.rstrip("dDfF"))
    except ValueError:
        try:
            number = float.fromhex(text.rstrip("dDfF"))
        except ValueError:
            return value
    return number if math.isfinite(number) else None


def _schema_refusal(kind: str, configs: dict[str, Any]) -> str | None:
    crd = {"Topic": "topics.tidalmq.io", "StaticTopic": "statictopics.tidalmq.io"}[kind]
    spec = {"partitions": 1} if kind == "Topic" else {"totalQueues": 1}
    try:
        jsonschema.validate(
            resource(kind, {**spec, "configs": configs}), to_json_schema(schema_of(crd))
        )
    except jsonschema.ValidationError as exc:
        return exc.message
    return None


def _in_yaml(cases: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The cases a Topic can hold, typed: not those naming Kafka's internal configs (not
    offered) or a number JSON cannot hold (NaN, Infinity)."""
    out = []
    for case in cases:
        typed = {name: _typed(name, value) for name, value in case.items()}
        internal = any(n in TOPIC_CONFIGS and TOPIC_CONFIGS[n].internal for n in typed)
        if not internal and None not in typed.values():
            out.append(typed)
    return out


ACCEPTED = _in_yaml(KAFKA_ACCEPTS)
REFUSED = _in_yaml([c for c, _ in KAFKA_REFUSES + TIDALMQ_NARROWS])
# What the schema cannot see, left to the operator (the broker's validation: an InvalidSpec
# condition): gzip's level 0 (the range is -1 to 9 but 0 is not taken), the cross check of the
# compaction lags, and a string of digits beyond a LONG (a pattern has no range)
OPERATOR_ONLY = [{"compression.gzip.level": 0},
                 {"min.compaction.lag.ms": 200, "max.compaction.lag.ms": 100},
                 {"segment.ms": str(2**63)}]  # fmt: skip


def test_the_cases_cover_every_offered_config() -> None:
    offered = {d.name for d in TOPIC_CONFIG_DEFS if not d.internal}
    assert len(ACCEPTED) > 40 and len(REFUSED) > 40
    assert offered <= {n for case in ACCEPTED for n in case}
    assert offered - {n for case in REFUSED for n in case} <= {
        "retention.bytes", "preallocate", "remote.log.copy.disable",
        "remote.log.delete.on.disable", "follower.replication.throttled.replicas",
    }  # fmt: skip


@pytest.mark.parametrize("configs", ACCEPTED, ids=str)
def test_schema_takes_what_the_broker_takes(configs: dict[str, Any]) -> None:
    """Each value Kafka 4.3.1 takes (and TidalMQ with it) is taken by the Topic's schema too,
    in its YAML form, and the operator hands the broker's validation the values it takes."""
    assert _schema_refusal("Topic", configs) is None
    parse(TopicSpec, {"partitions": 1, "configs": configs}).validated_configs()


@pytest.mark.parametrize("configs", REFUSED, ids=str)
def test_schema_refuses_what_the_broker_refuses(configs: dict[str, Any]) -> None:
    """Each value Kafka or TidalMQ refuses is refused by the Topic's schema, in its YAML form,
    or (the few the schema cannot see) by the operator, whose refusal becomes a condition."""
    refusal = _schema_refusal("Topic", configs)
    if configs in OPERATOR_ONLY:
        assert refusal is None, "the schema refuses it now: take it off OPERATOR_ONLY"
        with pytest.raises(ValueError):
            parse(TopicSpec, {"partitions": 1, "configs": configs}).validated_configs()
    else:
        assert refusal is not None, f"{configs} passes the schema"


def test_static_topic_schema_refuses_compaction_as_the_broker_does() -> None:
    for policy in ("compact", "delete,compact", " compact , delete "):
        assert _schema_refusal("StaticTopic", {"cleanup.policy": policy}) is not None
        with pytest.raises(ValueError, match="not offered for static topics"):
            validate_configs({"cleanup.policy": policy}, static=True)
    for policy in ("delete", " delete ", ""):
        assert _schema_refusal("StaticTopic", {"cleanup.policy": policy}) is None
        validate_configs({"cleanup.policy": policy}, static=True)


def test_every_config_has_a_description_from_the_table() -> None:
    configs = schema_of("topics.tidalmq.io")["properties"]["spec"]["properties"]["configs"]
    for d in TOPIC_CONFIG_DEFS:
        if not d.internal:
            assert d.doc, f"{d.name} has no doc in TOPIC_CONFIG_DEFS"
            assert configs["properties"][d.name]["description"].startswith(d.doc)
