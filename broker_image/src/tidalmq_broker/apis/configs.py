"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and brokers.

Topic configs live in the topic's metadata. A broker's configs are its static settings (flags and
environment; a restart changes them) plus the dynamic broker configs of the cluster metadata: per
broker or cluster-wide (`kafka-configs --entity-default`), which is what
`kafka-reassign-partitions --throttle` sets and `--verify` clears. Altering a broker's keystore
or truststore path (`ssl.keystore.location`, `listener.name.<l>.ssl.keystore.location`, ...) to
the path it already has reloads the listeners' TLS files at once, as Kafka does
(`split_tls_reloads`).

Authorized as Kafka does (ConfigHelper, ControllerApis): describing a topic's configs needs
DESCRIBE_CONFIGS on it, altering them ALTER_CONFIGS (TOPIC_AUTHORIZATION_FAILED); a broker's
configs need DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster (CLUSTER_AUTHORIZATION_FAILED).
No client alters an internal topic's configs (the controller refuses: INVALID_TOPIC_EXCEPTION).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import READ_ONLY_TOPIC_CONFIGS, TopicInfo
from tidalmq_core.static_description import static_topic_configs
from tidalmq_core.topics import (
    CLUSTER_DEFAULT,
    DYNAMIC_BROKER_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIGS,
    StaticConfig,
    documentation,
    validate_broker_configs,
)

from tidalmq_broker.apis.broker_config_docs import BROKER_CONFIG_DOCS
from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.apis.metadata import brokers_body
from tidalmq_broker.groups.coordinator import GroupSettings
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.security.authorizer import STANDARD_AUTHORIZER

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

TOPIC = 2
BROKER = 4
# config sources (DescribeConfigs v1+)
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# config types (DescribeConfigs v3+)
_BOOLEAN, _STRING, _INT, _SHORT, _LONG, _DOUBLE, _LIST, _PASSWORD = 1, 2, 3, 4, 5, 6, 7, 9
# the broker configs' types (the topic configs' are in TOPIC_CONFIGS)
_TYPES = {
    "broker.id": _INT,
    "node.id": _INT,
    "num.partitions": _INT,
    "auto.create.topics.enable": _BOOLEAN,
    "allow.everyone.if.no.acl.found": _BOOLEAN,
    "super.users": _STRING,
    "authorizer.class.name": _STRING,
    "offsets.topic.num.partitions": _INT,
    "group.initial.rebalance.delay.ms": _INT,
    "group.min.session.timeout.ms": _INT,
    "socket.request.max.bytes": _INT,
    "default.replication.factor": _INT,
    "tidalmq.flush.interval.ms": _DOUBLE,
    # Kafka's types of the static listener and role settings
    "listeners": _STRING,
    "advertised.listeners": _STRING,
    "listener.security.protocol.map": _STRING,
    "log.dirs": _STRING,
    "process.roles": _LIST,
    "broker.rack": _STRING,
    "sasl.enabled.mechanisms": _LIST,
    "ssl.client.auth": _STRING,
    "ssl.enabled.protocols": _LIST,
    "ssl.principal.mapping.rules": _STRING,
    "ssl.cipher.suites": _LIST,
    "ssl.keystore.location": _STRING,
    "ssl.keystore.type": _STRING,
    "ssl.key.password": _PASSWORD,
    "ssl.truststore.location": _STRING,
    "ssl.truststore.type": _STRING,
    "connection.failed.authentication.delay.ms": _INT,
    "offsets.topic.replication.factor": _SHORT,
    "transaction.state.log.replication.factor": _SHORT,
    "transaction.state.log.min.isr": _INT,
    "delete.topic.enable": _BOOLEAN,
    "group.max.session.timeout.ms": _INT,
    "offset.metadata.max.bytes": _INT,
}
# Kafka broker configs whose value TidalMQ's design fixes (no setting changes them): reported
# read-only with Kafka's DEFAULT_CONFIG source
_GROUPS = GroupSettings()
FIXED_BROKER_CONFIGS = {
    # one replica per partition, its leader (the object store keeps the data durable): what
    # Metadata reports of every topic, the internal ones too
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "delete.topic.enable": "true",
    # the key and trust stores are PEM files (Kafka's PEM store type)
    "ssl.keystore.type": "PEM",
    "ssl.truststore.type": "PEM",
    "group.max.session.timeout.ms": str(_GROUPS.max_session_timeout_ms),
    "offset.metadata.max.bytes": str(_GROUPS.max_metadata_bytes),
}
# reported as Kafka reports its PASSWORD configs: is_sensitive, the value and its synonyms'
# null whether set or not (the source still tells which)
SENSITIVE_CONFIGS = frozenset({"ssl.key.password"})
# the list configs APPEND and SUBTRACT apply to (the static broker ones cannot be altered)
_LIST_TOPIC_CONFIGS = frozenset(d.name for d in TOPIC_CONFIG_DEFS if d.type == "LIST")
# static settings Kafka reports with a null value (a default) when not set
_UNSET_IS_NULL = frozenset(
    {"broker.rack", "ssl.keystore.location", "ssl.truststore.location", *SENSITIVE_CONFIGS}
)
# incremental operations (IncrementalAlterConfigs)
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3


def _refused(
    broker: Broker, conn: Connection, op: AclOperation, resource_type: int, name: str
) -> tuple[ErrorCode, str] | None:
    """Kafka's refusal of `op` (DESCRIBE_CONFIGS or ALTER_CONFIGS) on a config resource, or
    None (resource types other than topics and brokers are refused later, as invalid)."""
    authorizer = broker.authorizer
    if resource_type == TOPIC and not authorizer.allows(conn, op, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed, "Topic authorization failed."
    if resource_type == BROKER and not authorizer.allows(
        conn, op, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
    return None


# A keystore or truststore "altered" to the path it already has reloads it now, as Kafka does
# (`kafka-configs --entity-type brokers --entity-name 0 --alter --add-config
# listener.name.ssl.ssl.keystore.location=<the same path>`); nothing is stored (docs/security.md)
_TLS_FILE_CONFIGS = ("ssl.keystore.location", "ssl.truststore.location")
_LISTENER_TLS_FILE = re.compile(
    r"listener\.name\.([^.]+)\.(ssl\.(?:keystore|truststore)\.location)"
)


class TlsReload(NamedTuple):
    listeners: frozenset[str]  # the TLS listeners whose files to look at now (may be empty)
    rest: dict[str, str | None]  # the other changes: dynamic broker configs, for the controller
    bad: tuple[ErrorCode, str] | None


def split_tls_reloads(broker: Broker, scope: str, changes: dict[str, str | None]) -> TlsReload:
    """Split the keystore and truststore paths (plain or `listener.name.<l>.` prefixed) off the
    changes of a broker's configs: each must name this broker's own path (a reload, not a
    change: TidalMQ's paths are static settings); DELETE of one is a success that does nothing,
    as the delete of a dynamic config that is not set."""
    listeners: set[str] = set()
    rest: dict[str, str | None] = {}
    paths = {
        "ssl.keystore.location": broker.settings.ssl_keystore_location,
        "ssl.truststore.location": broker.settings.ssl_truststore_location,
    }
    for name, value in changes.items():
        match = _LISTENER_TLS_FILE.fullmatch(name)
        if match is not None:
            config, wanted = match.group(2), {match.group(1).upper()}
        elif name in _TLS_FILE_CONFIGS:
            config, wanted = name, set(broker.tls_contexts)
        else:
            rest[name] = value
            continue
        if scope != str(broker.broker_id):
            why = (
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: [{name}]"
                if scope == CLUSTER_DEFAULT
                else f"{name} reloads broker {scope}'s files: send the request to broker {scope}"
            )
            return TlsReload(frozenset(), {}, (ErrorCode.invalid_request, why))
        if value is None:
            continue
        not_tls = sorted(wanted - set(broker.tls_contexts))
        if not_tls or not wanted:
            return TlsReload(
                frozenset(),
                {},
                (
                    ErrorCode.invalid_config,
                    f"{name}: broker {broker.broker_id} has no TLS listener "
                    f"{', '.join(not_tls)}".rstrip(),
                ),
            )
        current = paths[config]
        if not current or os.path.abspath(value) != os.path.abspath(current):
            return TlsReload(
                frozenset(),
                {},
                (
                    ErrorCode.invalid_config,
                    f"{name}: the file is {current or 'not set'} and its path changes only with "
                    "a restart; replace the file, or alter the config to the same path to "
                    "reload it now",
                ),
            )
        listeners |= wanted
    return TlsReload(frozenset(listeners), rest, None)


_TYPE_CODES = {
    "INT": _INT,
    "LONG": _LONG,
    "DOUBLE": _DOUBLE,
    "BOOLEAN": _BOOLEAN,
    "STRING": _STRING,
    "LIST": _LIST,
}


def _config_type(name: str) -> int:
    topic_config = TOPIC_CONFIGS.get(name)
    if topic_config is not None:
        return _TYPE_CODES[topic_config.type]
    return _TYPES.get(name, _LONG)


def _entry(
    name: str,
    value: str | None,
    source: int,
    synonyms: list[tuple[str | None, int]],
    *,
    read_only: bool,
    include_synonyms: bool,
    documentation: str | None = None,
) -> dict[str, Any]:
    sensitive = name in SENSITIVE_CONFIGS
    if sensitive:
        value, synonyms = None, [(None, s) for _, s in synonyms]
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "is_default": source == DEFAULT_CONFIG,
        "config_source": source,
        "is_sensitive": sensitive,
        "synonyms": [{"name": name, "value": v, "source": s} for v, s in synonyms]
        if include_synonyms
        else [],
        "config_type": _config_type(name),
        "documentation": documentation,
    }


def _topic_configs(
    topic: TopicInfo, include_synonyms: bool, include_documentation: bool = False
) -> list[dict[str, Any]]:
    out = []
    fixed = topic.fixed_configs  # reported like Kafka reports the offsets topic's own configs
    static = topic.kind == "static"
    for name, value in sorted(topic.effective_configs().items()):
        definition = TOPIC_CONFIGS.get(name)
        overridden = name in topic.configs or name in fixed
        source = DYNAMIC_TOPIC_CONFIG if overridden else DEFAULT_CONFIG
        synonyms: list[tuple[str | None, int]] = [(value, source)] if overridden else []
        if name in TOPIC_CONFIG_DEFAULTS:  # an internal config (set, or not listed) has none
            synonyms.append((TOPIC_CONFIG_DEFAULTS[name], DEFAULT_CONFIG))
        out.append(
            _entry(
                name,
                value,
                source,
                synonyms,
                read_only=name in READ_ONLY_TOPIC_CONFIGS or name in fixed,
                include_synonyms=include_synonyms,
                documentation=documentation(definition, static=static)
                if include_documentation and definition is not None
                else None,
            )
        )
    return out


def _fixed_config_change(topic: TopicInfo | None, changes: dict[str, str | None]) -> str | None:
    """Why `changes` cannot apply to `topic` (they change a config fixed for it), or None."""
    if topic is None:
        return None
    for name, value in changes.items():
        fixed = topic.fixed_configs.get(name)
        if fixed is not None and value is not None and value != fixed:
            return (
                f"{name} of {topic.name} is fixed at {fixed}: the log cleaner keeps its "
                "log short, and retention would delete committed offsets"
            )
    return None


def _broker_configs(
    broker: Broker, scope: str, include_synonyms: bool, include_documentation: bool = False
) -> list[dict[str, Any]]:
    """The configs of this broker (scope = its id) or the cluster-wide dynamic defaults, each
    with its documentation when `include_documentation` (null for a name without one)."""
    entries = _broker_entries(broker, scope, include_synonyms)
    if include_documentation:
        for entry in entries:
            entry["documentation"] = BROKER_CONFIG_DOCS.get(entry["name"])
    return entries


def _broker_entries(broker: Broker, scope: str, include_synonyms: bool) -> list[dict[str, Any]]:
    meta = broker.metadata
    cluster = meta.broker_configs.get(CLUSTER_DEFAULT, {})
    if scope == CLUSTER_DEFAULT:
        return [
            _entry(
                name,
                value,
                DYNAMIC_DEFAULT_BROKER_CONFIG,
                [(value, DYNAMIC_DEFAULT_BROKER_CONFIG)],
                read_only=False,
                include_synonyms=include_synonyms,
            )
            for name, value in sorted(cluster.items())
        ]
    own = meta.broker_configs.get(scope, {})
    out: list[dict[str, Any]] = []
    value: str | None
    advertised = ",".join(f"{e.name}://{e.host}:{e.port}" for e in broker.advertised)
    configs = {
        **broker.settings.described(advertised),
        "authorizer.class.name": STANDARD_AUTHORIZER if broker.authorizer.enabled else "",
        **DYNAMIC_BROKER_CONFIG_DEFAULTS,
    }
    for name in sorted({*configs, *FIXED_BROKER_CONFIGS}):
        if name in FIXED_BROKER_CONFIGS:
            value = FIXED_BROKER_CONFIGS[name]
            out.append(
                _entry(
                    name,
                    value,
                    DEFAULT_CONFIG,
                    [(value, DEFAULT_CONFIG)],
                    read_only=True,
                    include_synonyms=include_synonyms,
                )
            )
            continue
        if name not in DYNAMIC_BROKER_CONFIG_DEFAULTS:
            # static: read-only, as Kafka reports what only a restart changes
            value = configs[name]
            if name in _UNSET_IS_NULL and not value:
                out.append(
                    _entry(
                        name,
                        None,
                        DEFAULT_CONFIG,
                        [(None, DEFAULT_CONFIG)],
                        read_only=True,
                        include_synonyms=include_synonyms,
                    )
                )
                continue
            out.append(
                _entry(
                    name,
                    value,
                    STATIC_BROKER_CONFIG,
                    [(value, STATIC_BROKER_CONFIG)],
                    read_only=True,
                    include_synonyms=include_synonyms,
                )
            )
            continue
        synonyms: list[tuple[str | None, int]] = []
        if name in own:
            synonyms.append((own[name], DYNAMIC_BROKER_CONFIG))
        if name in cluster:
            synonyms.append((cluster[name], DYNAMIC_DEFAULT_BROKER_CONFIG))
        synonyms.append((DYNAMIC_BROKER_CONFIG_DEFAULTS[name], DEFAULT_CONFIG))
        value, source = synonyms[0]
        out.append(
            _entry(
                name,
                value,
                source,
                synonyms,
                read_only=False,
                include_synonyms=include_synonyms,
            )
        )
    return out


@api(32, "DescribeConfigs", 0, 4)
async def handle_describe_configs(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    include_synonyms = getattr(body, "include_synonyms", False)
    # v3+: each entry's documentation when asked, null otherwise (as Kafka answers)
    include_documentation = bool(getattr(body, "include_documentation", False))
    results = []
    for res in body.resources:
        keys = set(res.configuration_keys) if res.configuration_keys else None
        out: dict[str, Any] = {
            "resource_type": res.resource_type,
            "resource_name": res.resource_name,
            "configs": [],
            "error_code": ErrorCode.none,
            "error_message": None,
        }
        configs: list[dict[str, Any]] = []
        refused = _refused(
            broker, conn, AclOperation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name
        )
        if refused is not None:
            out["error_code"], out["error_message"] = refused
        elif res.resource_type == TOPIC:
            topic = broker.metadata.topics.get(res.resource_name)
            if topic is None:
                out["error_code"] = ErrorCode.unknown_topic_or_partition
                out["error_message"] = f"topic {res.resource_name!r} does not exist"
            else:
                configs = _topic_configs(topic, include_synonyms, include_documentation)
                configs += static_topic_configs(
                    broker.metadata, topic, keys, include_documentation=include_documentation
                )
        elif res.resource_type == BROKER:
            scope = res.resource_name
            if scope not in (CLUSTER_DEFAULT, str(broker.broker_id)):
                # as Kafka: a broker describes itself or the cluster default, so clients send
                # each broker's request to that broker
                out["error_code"] = ErrorCode.invalid_request
                out["error_message"] = (
                    f"Unexpected broker id, expected {broker.broker_id} or empty string, but "
                    f"received {scope}"
                )
            else:
                configs = _broker_configs(broker, scope, include_synonyms, include_documentation)
        else:
            out["error_code"] = ErrorCode.invalid_request
            out["error_message"] = f"resource type {res.resource_type} is not supported"
        out["configs"] = [c for c in configs if keys is None or c["name"] in keys]
        results.append(out)
    return {"throttle_time": 0, "results": results}


def _list_items(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _changes(res: Any, current: dict[str, str]) -> tuple[dict[str, str | None], str | None]:
    """The requested changes as name -> value (None deletes), or an error message."""
    changes: dict[str, str | None] = {}
    for c in res.configs:
        op = getattr(c, "config_operation", _SET)
        if op == _SET:
            changes[c.name] = c.value
        elif op == _DELETE:
            changes[c.name] = None
        elif op in (_APPEND, _SUBTRACT) and c.name in _LIST_TOPIC_CONFIGS:
            items = _list_items(current.get(c.name))
            given = _list_items(c.value)
            if op == _APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            changes[c.name] = ",".join(items)
        else:
            return {}, f"operation {op} applies to list configs only, not to {c.name}"
    return changes, None


async def _alter(
    broker: Broker, conn: Connection, resources: Any, *, incremental: bool, validate_only: bool
) -> list[dict[str, Any]]:
    responses = []
    for res in resources:
        out: dict[str, Any] = {
            "resource_type": res.resource_type,
            "resource_name": res.resource_name,
            "error_code": ErrorCode.none,
            "error_message": None,
        }
        refused = _refused(
            broker, conn, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name
        )
        if refused is not None:
            out["error_code"], out["error_message"] = refused
            responses.append(out)
            continue
        error: Exception | None = None
        if res.resource_type == TOPIC:
            topic = broker.metadata.topics.get(res.resource_name)
            if topic is not None and topic.internal:  # whatever the change (the controller too)
                out["error_code"] = ErrorCode.invalid_topic_exception
                out["error_message"] = f"Cannot alter the configs of internal topic {topic.name}"
                responses.append(out)
                continue
            changes, bad = _changes(res, topic.configs if topic else {})
            bad = bad or _fixed_config_change(topic, changes)
            if bad is None:
                r = await broker.controller.alter_topic_configs(
                    res.resource_name,
                    changes,
                    incremental=incremental,
                    validate_only=validate_only,
                )
                error = r.error
        elif res.resource_type == BROKER:
            changes, bad = _changes(res, {})
            reload = split_tls_reloads(broker, res.resource_name, changes)
            if bad is None and reload.bad is not None:
                out["error_code"], out["error_message"] = reload.bad
                responses.append(out)
                continue
            # only keystore/truststore entries: nothing for the controller (an empty
            # AlterConfigs would clear the broker's dynamic configs)
            only_tls_files = bool(changes) and not reload.rest
            changes = reload.rest
            if bad is None and not only_tls_files:
                try:
                    # names of this broker's static settings get Kafka's "cannot update
                    # dynamically"; the controller checks the dynamic ones
                    static = frozenset({*broker.settings.described(), *FIXED_BROKER_CONFIGS})
                    validate_broker_configs(changes, static)
                except StaticConfig as exc:
                    error = exc
                except ValueError:
                    pass
                if error is None:
                    error = await broker.controller.alter_broker_configs(
                        res.resource_name,
                        changes,
                        incremental=incremental,
                        validate_only=validate_only,
                    )
            if bad is None and error is None and reload.listeners and not validate_only:
                problems = broker.reload_certificates(reload.listeners)
                if problems:  # the listeners keep serving their previous certificates
                    bad = "; ".join(f"listener {n}: {why}" for n, why in sorted(problems.items()))
        else:
            bad = f"resource type {res.resource_type} cannot be altered: only topics and brokers"
            out["error_code"] = ErrorCode.invalid_request
            out["error_message"] = bad
            responses.append(out)
            continue
        if bad is not None:
            out["error_code"] = ErrorCode.invalid_config
            out["error_message"] = bad
        elif error is not None:
            out["error_code"] = error_code(error)
            out["error_message"] = error_message(error)
        responses.append(out)
    return responses


@api(33, "AlterConfigs", 0, 2)
async def handle_alter_configs(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    responses = await _alter(
        broker, conn, body.resources, incremental=False, validate_only=body.validate_only
    )
    return {"throttle_time": 0, "responses": responses}


@api(44, "IncrementalAlterConfigs", 0, 1)
async def handle_incremental_alter_configs(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    body = request.body
    responses = await _alter(
        broker, conn, body.resources, incremental=True, validate_only=body.validate_only
    )
    return {"throttle_time": 0, "responses": responses}


# ListConfigResources (KIP-1142; v0 was ListClientMetricsResources): the resource types of each
# version, as Kafka's ListConfigResourcesRequest.supportedResourceTypes
BROKER_LOGGER, CLIENT_METRICS, GROUP = 8, 16, 32
_LISTABLE = {0: (CLIENT_METRICS,), 1: (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP)}


def _config_resources(broker: Broker, conn: Connection, types: set[int]) -> list[dict[str, Any]]:
    """The resources of `types` that have configs, in Kafka's order (groups, client metrics,
    broker loggers, brokers, topics). TidalMQ has no group configs and no client-metrics
    subscriptions (none to list) and no broker loggers to describe (none listed either)."""
    meta = broker.metadata
    out: list[dict[str, Any]] = []
    if BROKER in types:  # as Kafka: the brokers reachable on the client's listener
        out += [
            {"resource_name": str(b["node_id"]), "resource_type": BROKER}
            for b in brokers_body(meta, conn.listener)
        ]
    if TOPIC in types:  # every topic, Kafka's internal ones included (not our hidden queues)
        out += [
            {"resource_name": t.name, "resource_type": TOPIC}
            for t in sorted(meta.topics.values(), key=lambda t: t.name)
            if t.listed
        ]
    return out


@api(74, "ListConfigResources", 0, 1)
async def handle_list_config_resources(broker: Broker, request: Request, conn: Connection) -> Any:
    """As Kafka's handleListConfigResources: DESCRIBE_CONFIGS on the cluster (else
    CLUSTER_AUTHORIZATION_FAILED); no types asked: every type of the version; a type the
    version does not list: UNSUPPORTED_VERSION."""
    out: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "config_resources": []}
    if not broker.authorizer.allows(
        conn, AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        out["error_code"] = ErrorCode.cluster_authorization_failed
        return out
    supported = _LISTABLE[min(request.api_version, 1)]
    asked = set(getattr(request.body, "resource_types", ()) or supported)
    if not asked <= set(supported):
        out["error_code"] = ErrorCode.unsupported_version
        return out
    resources = _config_resources(broker, conn, asked)
    if request.api_version == 0:  # v0's resources have a name only (client metrics)
        resources = [{"resource_name": r["resource_name"]} for r in resources]
    out["config_resources"] = resources
    return out
