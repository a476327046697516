"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (and broker reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import READ_ONLY_TOPIC_CONFIGS, TOPIC_CONFIG_DEFAULTS

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.registry import api
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.static_topics.describe import static_topic_configs

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.listener import Connection

TOPIC = 2
BROKER = 4
# config sources (DescribeConfigs v1+)
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# config types (DescribeConfigs v3+)
_TYPES = {"cleanup.policy": 7, "message.timestamp.type": 2, "compression.type": 2}
_LONG = 5
_INT = 3


def _config_type(name: str) -> int:
    if name in _TYPES:
        return _TYPES[name]
    return _INT if name in ("max.message.bytes", "segment.bytes", "min.insync.replicas") else _LONG


@api(32, "DescribeConfigs", 0, 4)
async def handle_describe_configs(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    include_synonyms = getattr(body, "include_synonyms", False)
    results = []
    for res in body.resources:
        keys = set(res.configuration_keys) if res.configuration_keys else None
        out: dict[str, Any] = {"resource_type": res.resource_type,
                               "resource_name": res.resource_name, "configs": [],
                               "error_code": ErrorCode.none, "error_message": None}  # fmt: skip
        if res.resource_type == TOPIC:
            topic = broker.metadata.topics.get(res.resource_name)
            if topic is None:
                out["error_code"] = ErrorCode.unknown_topic_or_partition
                out["error_message"] = f"topic {res.resource_name!r} does not exist"
            else:
                for name, value in sorted(topic.effective_configs().items()):
                    if keys is not None and name not in keys:
                        continue
                    overridden = name in topic.configs
                    source = DYNAMIC_TOPIC_CONFIG if overridden else DEFAULT_CONFIG
                    synonyms = []
                    if include_synonyms:
                        if overridden:
                            synonyms.append({"name": name, "value": value, "source": source})
                        synonyms.append({"name": name, "value": TOPIC_CONFIG_DEFAULTS[name],
                                         "source": DEFAULT_CONFIG})  # fmt: skip
                    out["configs"].append({
                        "name": name, "value": value,
                        "read_only": name in READ_ONLY_TOPIC_CONFIGS,
                        "is_default": not overridden, "config_source": source,
                        "is_sensitive": False, "synonyms": synonyms,
                        "config_type": _config_type(name), "documentation": None,
                    })  # fmt: skip
                out["configs"] += static_topic_configs(broker.metadata, topic, keys)
        elif res.resource_type == BROKER:
            for name, value in sorted(broker.settings.described().items()):
                if keys is not None and name not in keys:
                    continue
                out["configs"].append({
                    "name": name, "value": value, "read_only": True, "is_default": False,
                    "config_source": STATIC_BROKER_CONFIG, "is_sensitive": False,
                    "synonyms": [], "config_type": 2, "documentation": None,
                })  # fmt: skip
        else:
            out["error_code"] = ErrorCode.invalid_request
            out["error_message"] = f"resource type {res.resource_type} is not supported"
        results.append(out)
    return {"throttle_time": 0, "results": results}


async def _alter(
    broker: Broker, resources: Any, *, incremental: bool, validate_only: bool
) -> list[dict[str, Any]]:
    responses = []
    for res in resources:
        out: dict[str, Any] = {"resource_type": res.resource_type,
                               "resource_name": res.resource_name,
                               "error_code": ErrorCode.none, "error_message": None}  # fmt: skip
        if res.resource_type != TOPIC:
            out["error_code"] = ErrorCode.invalid_request
            out["error_message"] = "only topic configs can be altered"
            responses.append(out)
            continue
        changes: dict[str, str | None] = {}
        bad = None
        for c in res.configs:
            op = getattr(c, "config_operation", 0)
            if op == 0:  # SET
                changes[c.name] = c.value
            elif op == 1:  # DELETE
                changes[c.name] = None
            else:  # APPEND/SUBTRACT only apply to list configs, none of ours is one
                bad = f"operation {op} is not supported for {c.name}"
        if bad:
            out["error_code"] = ErrorCode.invalid_config
            out["error_message"] = bad
        else:
            r = await broker.controller.alter_topic_configs(
                res.resource_name, changes, incremental=incremental, validate_only=validate_only
            )
            if r.error is not None:
                out["error_code"] = error_code(r.error)
                out["error_message"] = error_message(r.error)
        responses.append(out)
    return responses


@api(33, "AlterConfigs", 0, 2)
async def handle_alter_configs(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    responses = await _alter(
        broker, body.resources, incremental=False, validate_only=body.validate_only
    )
    return {"throttle_time": 0, "responses": responses}


@api(44, "IncrementalAlterConfigs", 0, 1)
async def handle_incremental_alter_configs(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    body = request.body
    responses = await _alter(
        broker, body.resources, incremental=True, validate_only=body.validate_only
    )
    return {"throttle_time": 0, "responses": responses}
