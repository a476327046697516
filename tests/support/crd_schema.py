"""Offline checks of CustomResourceDefinitions: the apiextensions.k8s.io/v1 rules for structural
schemas that can be checked without an API server, printer columns that point at real fields,
and a conversion of a CRD schema to JSON Schema so sample resources can be validated.

The real API server applies the same CRDs in tests/integration/chart (and the e2e cluster in
e2e/test_chart_install.py); these checks give the reason in words before that, and run anywhere.
Rules: https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema

TYPES = {"object", "array", "string", "integer", "number", "boolean"}
# Not supported in apiextensions.k8s.io/v1 schemas at all.
UNSUPPORTED = {
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "additionalItems",
    "patternProperties",
}
# Not allowed inside allOf/anyOf/oneOf/not (the structural "logical junctors").
NOT_IN_JUNCTORS = {"description", "type", "default", "additionalProperties", "nullable"}
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """Problems that make an openAPIV3Schema non-structural or invalid, as readable strings."""
    problems: list[str] = []
    _walk(schema, "openAPIV3Schema", problems, root=True)
    return problems


def _walk(
    node: Any,
    path: str,
    problems: list[str],
    *,
    root: bool = False,
    junctor: bool = False,
    uncorrelatable: bool = False,
    outside: dict[str, Any] | None = None,
) -> None:
    if not isinstance(node, dict):
        problems.append(f"{path}: a schema must be an object, got {node!r}")
        return
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    for key in sorted(UNSUPPORTED & node.keys()):
        problems.append(f"{path}: {key} is not supported in CRD schemas")
    if node.get("uniqueItems") is True:
        problems.append(f"{path}: uniqueItems cannot be true")
    if preserve is not None and preserve is not True:
        problems.append(f"{path}: x-kubernetes-preserve-unknown-fields must be true or unset")
    if junctor:
        allowed_int_or_string = (outside or {}).get("x-kubernetes-int-or-string") is True
        for key in sorted(NOT_IN_JUNCTORS & node.keys()):
            if key == "type" and allowed_int_or_string:
                continue
            problems.append(f"{path}: {key} is not allowed inside allOf/anyOf/oneOf/not")
        for name in node.get("properties", {}):
            if name not in (outside or {}).get("properties", {}):
                problems.append(
                    f"{path}: property {name} must also be specified outside the junctor"
                )
        if "items" in node and "items" not in (outside or {}):
            problems.append(f"{path}: items must also be specified outside the junctor")
    else:
        kind = node.get("type")
        if not kind and not (int_or_string or preserve):
            problems.append(f"{path}: type is required (structural schema)")
        if kind and kind not in TYPES:
            problems.append(f"{path}: unknown type {kind!r}")
        if kind == "array" and "items" not in node:
            problems.append(f"{path}: an array needs items")
        if kind not in (None, "object") and (
            "properties" in node or "additionalProperties" in node
        ):
            problems.append(f"{path}: properties on a {kind}")
        if kind not in (None, "array") and "items" in node:
            problems.append(f"{path}: items on a {kind}")
    if int_or_string:
        if node.get("type"):
            problems.append(f"{path}: x-kubernetes-int-or-string must not set type")
        if "anyOf" in node and node["anyOf"] != INT_OR_STRING:
            problems.append(f"{path}: x-kubernetes-int-or-string allows only anyOf integer/string")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: additionalProperties and properties are mutually exclusive")
    if "items" in node and not isinstance(node["items"], dict):
        problems.append(f"{path}: items must be a single schema")
    _check_list_type(node, path, problems)
    _check_validations(node, path, problems, uncorrelatable)
    if "default" in node and not junctor:
        try:
            jsonschema.validate(node["default"], to_json_schema(node))
        except jsonschema.ValidationError as exc:
            problems.append(f"{path}: default {node['default']!r} is invalid: {exc.message}")

    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.properties[{name}]"
        if root and name == "metadata":
            _check_root_metadata(child, child_path, problems)
            continue
        _walk(child, child_path, problems, junctor=False, uncorrelatable=uncorrelatable)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        _walk(extra, f"{path}.additionalProperties", problems, uncorrelatable=uncorrelatable)
    if isinstance(node.get("items"), dict):
        keyed = node.get("x-kubernetes-list-type") == "map"
        _walk(node["items"], f"{path}.items", problems, uncorrelatable=uncorrelatable or not keyed)
    for junction in JUNCTORS:
        children = node.get(junction)
        if children is None:
            continue
        for i, child in enumerate(children if isinstance(children, list) else [children]):
            _walk(
                child,
                f"{path}.{junction}[{i}]",
                problems,
                junctor=True,
                outside=node,
                uncorrelatable=uncorrelatable,
            )


def _check_root_metadata(node: Any, path: str, problems: list[str]) -> None:
    if not isinstance(node, dict):
        problems.append(f"{path}: must be a schema")
        return
    if set(node) - {"type", "description", "properties"}:
        problems.append(f"{path}: only restrictions of name and generateName are allowed")
    if node.get("type") not in (None, "object"):
        problems.append(f"{path}: metadata must be an object")
    if set(node.get("properties", {})) - {"name", "generateName"}:
        problems.append(f"{path}: only name and generateName may be restricted")


def _check_list_type(node: dict[str, Any], path: str, problems: list[str]) -> None:
    list_type = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys")
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        problems.append(f"{path}: x-kubernetes-list-type must be atomic, set or map")
    if keys and list_type != "map":
        problems.append(f"{path}: x-kubernetes-list-map-keys needs x-kubernetes-list-type: map")
    if list_type == "map":
        items = node.get("items", {})
        if not keys:
            problems.append(f"{path}: x-kubernetes-list-type map needs x-kubernetes-list-map-keys")
        if items.get("type") != "object":
            problems.append(f"{path}: a map list's items must be objects")
        for key in keys or []:
            prop = items.get("properties", {}).get(key)
            if prop is None:
                problems.append(f"{path}: list map key {key} is not a property of the items")
            elif prop.get("type") in ("object", "array"):
                problems.append(f"{path}: list map key {key} must be a scalar")
            elif key not in items.get("required", []) and "default" not in prop:
                problems.append(f"{path}: list map key {key} must be required or defaulted")
    if list_type == "set":
        item_type = node.get("items", {}).get("type")
        if item_type in ("object", "array"):
            problems.append(f"{path}: set items must be scalars (or atomic)")


def _check_validations(
    node: dict[str, Any], path: str, problems: list[str], uncorrelatable: bool
) -> None:
    for i, rule in enumerate(node.get("x-kubernetes-validations", [])):
        where = f"{path}.x-kubernetes-validations[{i}]"
        text = (rule.get("rule") or "").strip()
        message = rule.get("message")
        if not text:
            problems.append(f"{where}: rule is empty")
        if message is not None and (not message.strip() or "\n" in message.strip()):
            problems.append(f"{where}: message must be one non-empty line")
        if "\n" in text and not message:
            problems.append(f"{where}: a rule with line breaks needs a message")
        if "oldSelf" in text and uncorrelatable:
            problems.append(
                f"{where}: oldSelf cannot be used under a list that is not x-kubernetes-list-type: map"
            )


def to_json_schema(node: Any, *, strict: bool = True) -> Any:
    """The CRD schema as JSON Schema (draft 7), for validating sample resources offline.

    strict: unknown fields are refused, as kubectl's server-side field validation does (the API
    server itself would prune them silently). CEL rules (x-kubernetes-validations) are not
    evaluated here; the API server tests cover them.
    """
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "format", "default"):
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_json_schema(value, strict=strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(v, strict=strict) for v in value]
        else:
            out[key] = copy.deepcopy(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if strict and "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


_FILTER = re.compile(r"\[\?\(.*?\)\]|\[\d*\]|\[\*\]")


def printer_column_problems(crd: dict[str, Any]) -> list[str]:
    """Printer columns whose jsonPath does not name a field of the schema, or whose type does
    not match that field."""
    problems = []
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for column in version.get("additionalPrinterColumns", []):
            where = f"{version['name']} column {column['name']!r}"
            path = column["jsonPath"]
            if path == ".metadata.creationTimestamp":
                if column["type"] != "date":
                    problems.append(f"{where}: creationTimestamp is a date")
                continue
            node: Any = schema
            for token in _FILTER.sub(".[]", path).strip(".").split("."):
                if not token:
                    continue
                if token == "[]":
                    node = node.get("items") if node.get("type") == "array" else None
                else:
                    node = node.get("properties", {}).get(token)
                if node is None:
                    break
            if node is None:
                problems.append(f"{where}: {path} is not a field of the schema")
                continue
            expected = {"date": "string"}.get(column["type"], column["type"])
            if node.get("type") != expected:
                problems.append(
                    f"{where}: {path} is {node.get('type')}, column says {column['type']}"
                )
    return problems
