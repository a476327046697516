"""Build kio's versioned dataclasses from plain dicts.

Each Kafka API has one dataclass per version and the fields differ between versions. The API
handlers describe a response once, as nested dicts with every field any version knows; `build`
keeps the fields the target version has, converts the few types kio insists on (error codes,
durations, UUIDs) and recurses into nested entities. Fields a version has but the dict lacks take
the schema default, so a missing required field is a programming error reported by name.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

_MISSING = dataclasses.MISSING


class _Kind:
    PLAIN = 0
    ERROR = 1
    TIMEDELTA = 2
    ENTITY = 3
    ENTITY_TUPLE = 4
    UUID = 5
    DATETIME = 6


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kind: int
    target: Any  # nested entity class for ENTITY/ENTITY_TUPLE
    has_default: bool
    default: Any
    null_value: Any = None  # what None becomes in a field that is not nullable


def build(cls: type, data: Mapping[str, Any] | Any) -> Any:
    """Instantiate kio dataclass `cls` from `data` (a dict, or already an instance)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise TypeError(f"cannot build {cls.__qualname__} from {type(data).__name__}")
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):
        if plan.name in data:
            kwargs[plan.name] = _convert(plan, data[plan.name])
        elif plan.has_default:
            continue
        else:
            raise KeyError(f"{cls.__module__}.{cls.__qualname__} needs field {plan.name!r}")
    return cls(**kwargs)


def _convert(plan: _FieldPlan, value: Any) -> Any:
    if value is None:
        # Versions that predate a field's nullability (e.g. JoinGroup's protocol name before
        # v7) encode "no value" as empty.
        return plan.null_value
    kind = plan.kind
    if kind == _Kind.PLAIN:
        return value
    if kind == _Kind.ERROR:
        return value if isinstance(value, ErrorCode) else ErrorCode(int(value))
    if kind == _Kind.TIMEDELTA:
        if isinstance(value, datetime.timedelta):
            return value
        return datetime.timedelta(milliseconds=int(value))
    if kind == _Kind.ENTITY:
        return build(plan.target, value)
    if kind == _Kind.ENTITY_TUPLE:
        return tuple(build(plan.target, item) for item in value)
    if kind == _Kind.UUID:
        if isinstance(value, uuid.UUID):
            return value
        return uuid.UUID(str(value))
    if kind == _Kind.DATETIME:
        if isinstance(value, datetime.datetime):
            return value
        return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)
    raise AssertionError(kind)


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    hints = typing.get_type_hints(cls)
    plans = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        kind, target = _classify(hint)
        null_value = None if _nullable(hint) else _empty_of(hint)
        if f.default is not _MISSING:
            plans.append(_FieldPlan(f.name, kind, target, True, f.default, null_value))
        elif f.default_factory is not _MISSING:
            plans.append(_FieldPlan(f.name, kind, target, True, None, null_value))
        else:
            plans.append(_FieldPlan(f.name, kind, target, False, None, null_value))
    return tuple(plans)


def _nullable(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _empty_of(tp: Any) -> Any:
    if typing.get_origin(tp) is tuple:
        return ()
    if isinstance(tp, type):
        if issubclass(tp, str):
            return ""
        if issubclass(tp, bytes):
            return b""
    return None


def _classify(tp: Any) -> tuple[int, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _classify(args[0])
        return _Kind.PLAIN, None
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(inner):
            return _Kind.ENTITY_TUPLE, inner
        return _Kind.PLAIN, None
    if isinstance(tp, type):
        if issubclass(tp, ErrorCode):
            return _Kind.ERROR, None
        if issubclass(tp, datetime.timedelta):
            return _Kind.TIMEDELTA, None
        if issubclass(tp, datetime.datetime):
            return _Kind.DATETIME, None
        if issubclass(tp, uuid.UUID):
            return _Kind.UUID, None
        if dataclasses.is_dataclass(tp):
            return _Kind.ENTITY, tp
    return _Kind.PLAIN, None
