"""`helm lint --strict` of the chart, and values.schema.json / the template checks refusing bad
values (helm itself is run with each bad values file and must fail, saying why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.helm import CHART, RELEASE, VALUES_DIR, run_helm, template_args, write_values

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


@pytest.mark.parametrize("values_file", [None, "full.yaml", "aws.yaml"])
def test_helm_lint_strict(helm: Path, values_file: str | None) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", "streaming"]
    if values_file:
        args += ["-f", str(VALUES_DIR / values_file)]
    out = run_helm(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over the defaults (maps merge, the rest replaces)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_values_files_follow_the_schema() -> None:
    """The schema is valid draft-07 and accepts the defaults and the test values files (checked
    here with python-jsonschema too, so a schema that helm would wave through still fails)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(defaults, SCHEMA)
    for name in ("full.yaml", "aws.yaml"):
        override = yaml.safe_load((VALUES_DIR / name).read_text())
        jsonschema.validate(merged(defaults, override), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged(defaults, {"image": {"tag": "latest"}}), SCHEMA)


def test_schema_is_strict_everywhere() -> None:
    """Every object in the schema with named properties refuses unknown keys (a typo in a value
    name must fail instead of being ignored)."""
    open_objects = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            closed = node.get("additionalProperties") is False
            if node.get("type") == "object" and "properties" in node and not closed:
                open_objects.append(path)
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}/{i}")

    walk(SCHEMA, "")
    assert not open_objects, f"objects accepting unknown keys: {open_objects}"


# (values, a fragment of helm's error message)
BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "replicas-not-a-number": ({"broker": {"replicas": "x"}}, "replicas"),
    "unknown-top-level-key": ({"brokers": {"replicas": 3}}, "brokers"),
    "unknown-nested-key": ({"broker": {"replica": 3}}, "replica"),
    "latest-image-tag": ({"image": {"tag": "latest"}}, "tag"),
    "latest-minio-tag": ({"inClusterObjectStore": {"image": {"tag": "latest"}}}, "tag"),
    "bad-pull-policy": ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    "three-operators": ({"operator": {"replicas": 3}}, "replicas"),
    "zero-brokers": ({"broker": {"replicas": 0}}, "replicas"),
    "endpoint-with-query": ({"objectStore": {"endpoint": "http://minio:9000?x=1"}}, "endpoint"),
    "endpoint-without-scheme": ({"objectStore": {"endpoint": "minio:9000"}}, "endpoint"),
    "bucket-uppercase": ({"objectStore": {"bucket": "My_Bucket"}}, "bucket"),
    "cpu-target-over-100": ({"autoscaling": {"targetCPUUtilizationPercentage": 150}}, "target"),
    "port-out-of-range": ({"broker": {"ports": {"kafka": 70000}}}, "kafka"),
    "extra-env-without-name": ({"broker": {"extraEnv": [{"value": "1"}]}}, "name"),
    "extra-env-number-value": ({"broker": {"extraEnv": [{"name": "A", "value": 1}]}}, "value"),
    # an empty `from` would let everyone reach the metrics ports (NetworkPolicy's meaning of [])
    "metrics-from-no-one": ({"networkPolicy": {"metricsFrom": []}}, "metricsFrom"),
    "control-port-out-of-range": ({"broker": {"ports": {"control": 0}}}, "control"),
    "bytes-in-sometimes": ({"autoscaling": {"bytesIn": {"enabled": "sometimes"}}}, "enabled"),
    "adapter-url-without-scheme": (
        {"metricsAdapter": {"prometheusUrl": "prometheus:9090"}},
        "prometheusUrl",
    ),
    "rate-window-not-a-duration": ({"metricsAdapter": {"rateWindow": "1 minute"}}, "rateWindow"),
    "series-label-not-a-label": (
        {"metricsAdapter": {"seriesLabels": {"namespace": "namespace", "pod": "pod-name"}}},
        "pod",
    ),
    "latest-adapter-tag": ({"metricsAdapter": {"image": {"tag": "latest"}}}, "tag"),
    "transaction-version-3": (
        {"controlPlane": {"features": {"transactionVersion": 3}}},
        "transactionVersion",
    ),
    "transaction-version-text": (
        {"controlPlane": {"features": {"transactionVersion": "2"}}},
        "transactionVersion",
    ),
}

# Checks in templates/_helpers.tpl (tidalmq.validate): `fail` stops helm template and install;
# helm lint only reports them.
TEMPLATE_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "drain-longer-than-grace": (
        {"broker": {"drainTimeoutSeconds": 60, "terminationGracePeriodSeconds": 60}},
        "drainTimeoutSeconds must be below broker.terminationGracePeriodSeconds",
    ),
    "min-above-max": (
        {"autoscaling": {"minReplicas": 9, "maxReplicas": 8}},
        "minReplicas must not exceed",
    ),
    "access-key-without-secret": (
        {"objectStore": {"accessKey": "AKIA"}},
        "objectStore.secretKey is empty",
    ),
    "secret-and-keys": (
        {"objectStore": {"existingSecret": "s3", "accessKey": "a", "secretKey": "b"}},
        "not both",
    ),
    "metadata-in-the-data-bucket-by-name": (
        {"objectStore": {"bucket": "data"}, "metadataStore": {"bucket": "data"}},
        "metadataStore.bucket must differ",
    ),
}


def assert_refused(args: list[str], fragment: str) -> None:
    proc = run_helm(*args, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"helm {args[0]} accepted the values:\n{output[-2000:]}"
    assert fragment in output, f"helm {args[0]} did not say why ({fragment!r}):\n{output}"


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_values_schema_refuses_bad_values(helm: Path, case: str) -> None:
    values, fragment = BAD_VALUES[case]
    assert_refused(template_args(values), fragment)
    assert_refused(["lint", "--strict", str(CHART), "-f", str(write_values(values))], fragment)


@pytest.mark.parametrize("case", sorted(TEMPLATE_REFUSALS))
def test_templates_refuse_inconsistent_values(helm: Path, case: str) -> None:
    values, fragment = TEMPLATE_REFUSALS[case]
    assert_refused(template_args(values), fragment)
    lint = run_helm("lint", str(CHART), "-f", str(write_values(values)), check=False)
    assert f"Fail: {fragment}" in lint.stdout + lint.stderr or fragment in lint.stderr


def test_good_values_file_is_accepted_by_helm(helm: Path) -> None:
    """The counterpart of the refusals above: a values file changing many knobs is fine."""
    values = {
        "broker": {"replicas": 5, "drainTimeoutSeconds": 20, "terminationGracePeriodSeconds": 30},
        "autoscaling": {"enabled": False},
        "objectStore": {
            "endpoint": "http://minio.storage.svc:9000",
            "accessKey": "a",
            "secretKey": "b",
        },
        "operator": {"replicas": 2},
        "podDisruptionBudget": {"maxUnavailable": "25%"},
    }
    out = run_helm(*template_args(values)).stdout
    assert f"name: {RELEASE}-tidalmq-broker" in out
