"""The controller: single writer of cluster metadata (topics, assignment, epochs, moves).

This module is the controller's public facade: the names below are all that the broker, the
local cluster and the operator use. The implementation lives in the private modules beside it,
one per concern (`_membership`, `_topics`, `_leadership`, `_moves`, `_static_topics`, the
metadata log in `_log` and `_journal`, the RPC in `_rpc_wire`, `_rpc_client` and `_rpc_server`); `Controller` only sequences, commits
and publishes (docs/control-plane.md). Only this package imports its private modules
(import-linter: .importlinter). What a process hosting a controller needs from the rest of
TidalMQ (logging, health endpoints, the object store) is `tidalmq_controller.hosting`.

- The controller: `Controller`, `ControllerSettings`.
- Requests and their results: `NewTopic`, `TopicResult`, `MoveStatus` (one partition move).
- Refusals: `ControllerError` and its kinds `ControllerFenced` (this controller lost its role),
  `TopicAlreadyExists`, `UnknownTopic`, `NoBrokers`, `InvalidReplicaAssignment`,
  `InternalTopic` (no client deletes, grows or reconfigures an internal topic);
  `StaticTopicError` (a static-topic request refused).
- The metadata log: `ObjectStoreMetadataLog` (batches and snapshots in object storage), `Batch`,
  `LoadedLog`, `LogConflict` (another controller appended first: this one was deposed),
  `MetadataLost` (the log is missing what is known committed: a wiped or replaced store).
- Serving the controller over HTTP: `ControllerServer`.
- A broker's link to its controller: `ControllerClient`, `LocalControllerClient` (same
  process), `HttpControllerClient` (remote), `Heartbeat` and its `HeartbeatReply`, and
  `report_doc` (a partition closed, opened or lost, as the broker reports it).
- SCRAM credentials (AlterUserScramCredentials, docs/security.md): `ScramUpsertion`,
  `ScramDeletion`, `ScramAlterResult`; the users a controller creates at start if absent:
  `BootstrapUser`, `parse_bootstrap` (`user:MECHANISM:password` lines).
- ACLs (CreateAcls, DeleteAcls, docs/security.md): `ControllerClient.create_acls` /
  `delete_acls` take the bindings and filters of `tidalmq_core.acls`; the controller validates
  and stores them (`_acls.py`).
- Finalized feature levels (UpdateFeatures, docs/transactions-v2.md): `FeatureUpdate`,
  `UpgradeType`; `ControllerClient.update_features` checks them as Kafka does and writes the
  `feature` records (`_features.py`); a broker registers the levels it supports and is
  refused (`UnsupportedFeatureLevel`) when a finalized one is not among them; a controller
  registers its own when it claims the log, and refuses to start (`UnsupportedFinalizedLevel`)
  on a log whose finalized level its code does not support; a standby registers them with
  the active controller (`StandbyRegistration`), and `tidalmq controller forget` forgets an
  id gone for good.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidalmq_controller._controller import Controller
    from tidalmq_controller._errors import (
        ControllerError,
        ControllerFenced,
        InternalTopic,
        InvalidReplicaAssignment,
        NoBrokers,
        StaticTopicError,
        TopicAlreadyExists,
        UnknownTopic,
        UnsupportedFeatureLevel,
        UnsupportedFinalizedLevel,
    )
    from tidalmq_controller._features import FeatureUpdate, UpgradeType
    from tidalmq_controller._log import (
        Batch,
        LoadedLog,
        LogConflict,
        MetadataLost,
        ObjectStoreMetadataLog,
    )
    from tidalmq_controller._membership import Heartbeat, HeartbeatReply
    from tidalmq_controller._moves import TROUBLE, MoveStatus, Outcome
    from tidalmq_controller._rpc_client import (
        ControllerClient,
        HttpControllerClient,
        LocalControllerClient,
    )
    from tidalmq_controller._rpc_server import ControllerServer
    from tidalmq_controller._rpc_wire import report_doc
    from tidalmq_controller._scram_credentials import (
        BootstrapUser,
        ScramAlterResult,
        ScramDeletion,
        ScramUpsertion,
        parse_bootstrap,
    )
    from tidalmq_controller._settings import ControllerSettings
    from tidalmq_controller._standby import StandbyRegistration
    from tidalmq_controller._topics import NewTopic, TopicResult

# Each name is loaded from its module when first used (PEP 562): a broker, which talks to its
# controller over HTTP, loads the client and the records, never the controller itself (its
# managers, its log, its server: about 0.3 s of a broker's start, on every add-broker and
# every pod start).
_WHERE = {
    "Batch": "tidalmq_controller._log",
    "BootstrapUser": "tidalmq_controller._scram_credentials",
    "Controller": "tidalmq_controller._controller",
    "ControllerClient": "tidalmq_controller._rpc_client",
    "ControllerError": "tidalmq_controller._errors",
    "ControllerFenced": "tidalmq_controller._errors",
    "ControllerServer": "tidalmq_controller._rpc_server",
    "ControllerSettings": "tidalmq_controller._settings",
    "FeatureUpdate": "tidalmq_controller._features",
    "Heartbeat": "tidalmq_controller._membership",
    "HeartbeatReply": "tidalmq_controller._membership",
    "HttpControllerClient": "tidalmq_controller._rpc_client",
    "InternalTopic": "tidalmq_controller._errors",
    "InvalidReplicaAssignment": "tidalmq_controller._errors",
    "LoadedLog": "tidalmq_controller._log",
    "LocalControllerClient": "tidalmq_controller._rpc_client",
    "LogConflict": "tidalmq_controller._log",
    "MetadataLost": "tidalmq_controller._log",
    "MoveStatus": "tidalmq_controller._moves",
    "NewTopic": "tidalmq_controller._topics",
    "NoBrokers": "tidalmq_controller._errors",
    "ObjectStoreMetadataLog": "tidalmq_controller._log",
    "Outcome": "tidalmq_controller._moves",
    "parse_bootstrap": "tidalmq_controller._scram_credentials",
    "report_doc": "tidalmq_controller._rpc_wire",
    "ScramAlterResult": "tidalmq_controller._scram_credentials",
    "ScramDeletion": "tidalmq_controller._scram_credentials",
    "ScramUpsertion": "tidalmq_controller._scram_credentials",
    "StandbyRegistration": "tidalmq_controller._standby",
    "StaticTopicError": "tidalmq_controller._errors",
    "TopicAlreadyExists": "tidalmq_controller._errors",
    "TopicResult": "tidalmq_controller._topics",
    "TROUBLE": "tidalmq_controller._moves",
    "UnknownTopic": "tidalmq_controller._errors",
    "UnsupportedFeatureLevel": "tidalmq_controller._errors",
    "UnsupportedFinalizedLevel": "tidalmq_controller._errors",
    "UpgradeType": "tidalmq_controller._features",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "TROUBLE",
    "Batch",
    "BootstrapUser",
    "Controller",
    "ControllerClient",
    "ControllerError",
    "ControllerFenced",
    "ControllerServer",
    "ControllerSettings",
    "FeatureUpdate",
    "Heartbeat",
    "HeartbeatReply",
    "HttpControllerClient",
    "InternalTopic",
    "InvalidReplicaAssignment",
    "LoadedLog",
    "LocalControllerClient",
    "LogConflict",
    "MetadataLost",
    "MoveStatus",
    "NewTopic",
    "NoBrokers",
    "ObjectStoreMetadataLog",
    "Outcome",
    "ScramAlterResult",
    "ScramDeletion",
    "ScramUpsertion",
    "StandbyRegistration",
    "StaticTopicError",
    "TopicAlreadyExists",
    "TopicResult",
    "UnknownTopic",
    "UnsupportedFeatureLevel",
    "UnsupportedFinalizedLevel",
    "UpgradeType",
    "parse_bootstrap",
    "report_doc",
]
