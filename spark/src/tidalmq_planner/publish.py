"""Handing the result back from a driver pod: a ConfigMap written with the pod's own
ServiceAccount (the chart's Spark role may create, get and delete ConfigMaps).

The ConfigMap NAME in the pod's namespace gets:
    data["plan.json"]     the plan (Kafka's reassignment JSON, the moves only)
    data["summary.json"]  moves, lower bound, imbalance before/after, timings
    data["report.txt"]    the per-broker table
    labels: app.kubernetes.io/component=planner, tidalmq.io/planner-result=true
Plans larger than a ConfigMap can hold (1 MiB) are stored gzip-compressed as
binaryData["plan.json.gz"] instead.
"""

from __future__ import annotations

import base64
import gzip
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tidalmq_core.reassignment import format_plan

from tidalmq_planner.report import PlanResult, format_table, moved_plan

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LIMIT = 900 * 1024


def configmap_body(name: str, result: PlanResult) -> dict[str, Any]:
    plan = format_plan(moved_plan(result.plan))
    data = {
        "summary.json": json.dumps(result.summary(), sort_keys=True),
        "report.txt": format_table(result.report),
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/part-of": "tidalmq",
                "app.kubernetes.io/component": "planner",
                "tidalmq.io/planner-result": "true",
            },
        },
        "data": data,
    }
    if len(plan) < LIMIT:
        data["plan.json"] = plan
    else:
        body["binaryData"] = {
            "plan.json.gz": base64.b64encode(gzip.compress(plan.encode())).decode()
        }
    return body


def publish_configmap(name: str, namespace: str | None, result: PlanResult) -> None:
    """Create (or replace) the ConfigMap through the API server, with in-cluster credentials."""
    import os

    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    if not host or not port or not (SA_DIR / "token").exists():
        raise SystemExit("--configmap needs to run in a pod (no in-cluster API credentials)")
    namespace = namespace or (SA_DIR / "namespace").read_text().strip()
    token = (SA_DIR / "token").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    base = f"https://{host}:{port}/api/v1/namespaces/{namespace}/configmaps"
    body = json.dumps(configmap_body(name, result)).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(method: str, url: str, payload: bytes | None) -> None:
        req = urllib.request.Request(url, data=payload, headers=headers, method=method)
        with urllib.request.urlopen(req, context=ctx, timeout=30):
            pass

    # create; a leftover of an earlier run is deleted first (the chart's Spark role may create
    # and delete ConfigMaps, not update them)
    for attempt in range(2):
        try:
            call("POST", base, body)
            return
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500]
            if exc.code != 409 or attempt:
                raise RuntimeError(
                    f"creating ConfigMap {namespace}/{name}: {exc} {detail!r}"
                ) from exc
        call("DELETE", f"{base}/{name}", None)
