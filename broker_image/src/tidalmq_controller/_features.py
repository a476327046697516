"""Finalized feature levels: UpdateFeatures (`kafka-features upgrade|downgrade|disable`), checked
as Kafka's controller checks it (FeatureControlManager.updateFeatures), docs/transactions-v2.md.

Each update names a feature, a level and an upgrade type (1 upgrade, 2 safe downgrade, 3 unsafe
downgrade). The request is all or nothing, as Kafka's: the first update that fails fails the
whole request with INVALID_UPDATE_VERSION and its reason ("Invalid update version 3 for feature
transaction.version. The controller only supports versions 0-2"), and nothing is written.
The rules, in Kafka's order:

- an unknown upgrade type is refused; so is a level below 0;
- the level must be one this code supports (`SUPPORTED_FEATURES`; a feature it does not know
  is "not supported" at any level);
- every controller that registered (each claims the log with the levels its code supports)
  must support it ("Controller operator only supports versions 0-1"): at a failover any of
  them may lead again, and one that does not support a finalized level refuses to start
  (`start_refused`);
- every registered broker must support it (the ranges it registered with: "Broker 3 only
  supports versions 0-1", or "Broker 3 does not support this feature." when it lists only 0);
- a lower level than the finalized one needs a downgrade type (an upgrade that lowers is
  refused), and a downgrade type cannot raise the level.

Each accepted change is one `feature` record (the one the controller writes at start for
`transaction.version`), so the level is in the metadata log and its snapshots, survives
restarts and reaches every broker as any other change does. An update to the level the
feature already has writes nothing.

What downgrade means for `transaction.version` 2 -> 1 (or 0): Kafka accepts it as a safe
downgrade (TV2 declares no dependency and no data it would lose), and so does TidalMQ: no
record format depends on the level (a transaction's stored `txn_version` decides how its
EndTxn is handled whatever the level is now), clients re-read the level at their next
transaction, and a TV2 transaction open across the change ends by its EndTxn or aborts; nothing
acknowledged is lost.

Kafka's further check, that every registered broker supports the new level, is made from the
ranges brokers send when they register (`BrokerInfo.supported_features`; the controller's own
are `SUPPORTED_FEATURES`, checked first): "Invalid update version 2 for feature
transaction.version. Broker 3 only supports versions 0-1". The reverse check is made at
registration (`registration_refused`): a broker whose range does not hold a finalized level is
refused (UnsupportedFeatureLevel, Kafka's UNSUPPORTED_VERSION) and retries. What a registration
from an older build, without ranges, means: `BrokerInfo.supported_range`;
docs/transactions-v2.md, "Which levels the brokers support".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

from tidalmq_core.metadata import SUPPORTED_FEATURES, BrokerInfo, ClusterMetadata
from tidalmq_core.records import (
    Record,
    controller_record,
    feature_record,
    forget_controller_record,
)


class UpgradeType(IntEnum):
    """Kafka's FeatureUpdate.UpgradeType codes (UpdateFeatures v1+'s `upgrade_type`)."""

    UNKNOWN = 0
    UPGRADE = 1
    SAFE_DOWNGRADE = 2
    UNSAFE_DOWNGRADE = 3


@dataclass(frozen=True, slots=True)
class FeatureUpdate:
    name: str
    level: int
    upgrade_type: int = UpgradeType.UPGRADE


def _upgrade_type(code: int) -> UpgradeType:
    try:
        return UpgradeType(code)
    except ValueError:
        return UpgradeType.UNKNOWN


def _range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def _broker_refuses(image: ClusterMetadata, update: FeatureUpdate) -> str | None:
    """Kafka's QuorumFeatures.reasonNotSupported for each registered broker, in id order: every
    registration in the image counts, a dead or draining broker's too (Kafka checks fenced
    brokers alike: a broker coming back runs the code it registered with)."""
    finalized = image.feature_level(update.name)
    for broker_id, info in sorted(image.brokers.items()):
        low, high = info.supported_range(update.name, finalized)
        if low <= update.level <= high:
            continue
        if high == 0:
            return f"Broker {broker_id} does not support this feature."
        return f"Broker {broker_id} only supports versions {_range(low, high)}"
    return None


def _controller_refuses(image: ClusterMetadata, update: FeatureUpdate) -> str | None:
    """The same for each controller that registered the levels it supports (Kafka's
    QuorumFeatures checks every controller of the quorum), in id order. A controller that
    does not list a feature supports level 0 of it only, as a broker."""
    for cid, ranges in sorted(image.controllers.items()):
        low, high = ranges.get(update.name, (0, 0))
        if low <= update.level <= high:
            continue
        if high == 0:
            return f"Controller {cid} does not support this feature."
        return f"Controller {cid} only supports versions {_range(low, high)}"
    return None


def start_refused(image: ClusterMetadata) -> str | None:
    """Why this controller's code cannot lead a cluster whose metadata is `image`, or None: a
    finalized level outside what it supports (a newer build finalized it). One line, for the
    log of the process that would have hosted it."""
    for name in sorted(set(SUPPORTED_FEATURES) | set(image.features)):
        level = image.feature_level(name)
        low, high = SUPPORTED_FEATURES.get(name, (0, 0))
        if not low <= level <= high:
            return (
                f"the cluster's finalized version {level} of feature {name} is not supported by "
                f"this controller (it supports {_range(low, high)}): it does not take the "
                "controller role; run a build that supports it, or lower the level first "
                "(kafka-features downgrade) with one"
            )
    return None


def registration_refused(image: ClusterMetadata, info: BrokerInfo) -> str | None:
    """Why a broker registering cannot join (Kafka's UNSUPPORTED_VERSION message to its
    BrokerRegistration), or None: a finalized level outside the range it registers with.
    Every feature this code knows is finalized (one without a record is at its default), and
    a feature only the broker knows is at 0; a broker that does not list a feature supports
    level 0 of it only. A registration without any list (a build from before it) is never
    refused: its range always holds the finalized level (`BrokerInfo.supported_range`)."""
    for name in sorted(set(SUPPORTED_FEATURES) | set(info.supported_features or {})):
        finalized = image.feature_level(name)
        low, high = info.supported_range(name, finalized)
        if not low <= finalized <= high:
            return (
                f"Unable to register because the broker does not support finalized version "
                f"{finalized} of {name}. The broker wants a version between {low} and {high}, "
                "inclusive."
            )
    return None


def _ranges(ranges: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{name} {_range(*r)}" for name, r in sorted(ranges.items())) or "none"


def register_controller(
    image: ClusterMetadata, active_id: str, controller_id: str, ranges: dict[str, tuple[int, int]]
) -> tuple[str | None, list[Record]]:
    """A controller that is not leading registers the levels it supports (KIP-919's
    ControllerRegistration, sent by every controller at start): (a refusal, no records) or
    (None, the record; none when it is registered with these ranges already). O(1) plus the
    size of its ranges. Never refused for a level it lacks: it is registered so that nothing
    is raised further above it, and it refuses to lead itself (`start_refused`). The active
    controller's own id is refused with other ranges: two builds would share one entry (give
    the standby an id of its own)."""
    if not controller_id:
        return "a controller registers with an id", []
    for name, (low, high) in ranges.items():
        if not 0 <= low <= high:
            return f"a supported range of {name} is lowest <= highest, from 0: {low}-{high}", []
    if controller_id == active_id and ranges != SUPPORTED_FEATURES:
        return (
            f"controller id {controller_id} is the active controller's, which supports "
            f"{_ranges(SUPPORTED_FEATURES)} (this one: {_ranges(ranges)}): give this controller "
            "an id of its own",
            [],
        )
    if image.controllers.get(controller_id) == ranges:
        return None, []
    return None, [controller_record(image.controller_epoch, controller_id, ranges)]


def forget_controller(
    image: ClusterMetadata, active_id: str, controller_id: str
) -> tuple[str | None, list[Record]]:
    """A controller id gone for good no longer counts (Kafka's `kafka-metadata-quorum
    remove-controller`): (a refusal, no records) or (None, the record). The active controller
    is refused (it would register again at its next claim, and it is the one leading); so is
    an id that is not registered, naming those that are. A standby still running registers
    again at its next attempt."""
    if controller_id == active_id:
        return f"controller {controller_id} is the active controller: it cannot be forgotten", []
    if controller_id not in image.controllers:
        known = ", ".join(sorted(image.controllers)) or "none"
        return f"no controller {controller_id} is registered (registered: {known})", []
    return None, [forget_controller_record(image.controller_epoch, controller_id)]


def reason_refused(image: ClusterMetadata, update: FeatureUpdate) -> str | None:
    """Why `update` cannot be applied to `image` (Kafka's INVALID_UPDATE_VERSION message), or
    None."""
    kind = _upgrade_type(update.upgrade_type)
    if kind == UpgradeType.UNKNOWN:
        why = "The controller does not support the given upgrade type."
    elif update.level < 0:
        why = "A feature version cannot be less than 0."
    elif update.name not in SUPPORTED_FEATURES:
        why = "The controller does not support this feature."
    elif (
        not SUPPORTED_FEATURES[update.name][0] <= update.level <= SUPPORTED_FEATURES[update.name][1]
    ):
        why = f"The controller only supports versions {_range(*SUPPORTED_FEATURES[update.name])}"
    elif (controller_why := _controller_refuses(image, update)) is not None:
        why = controller_why
    elif (broker_why := _broker_refuses(image, update)) is not None:
        why = broker_why
    elif update.level < image.feature_level(update.name) and kind == UpgradeType.UPGRADE:
        why = (
            "Can't downgrade the version of this feature without setting the upgrade type to "
            "either safe or unsafe downgrade."
        )
    elif update.level > image.feature_level(update.name) and kind != UpgradeType.UPGRADE:
        why = "Can't downgrade to a newer version."
    else:
        return None
    return f"Invalid update version {update.level} for feature {update.name}. {why}"


def update(
    image: ClusterMetadata, updates: Iterable[FeatureUpdate]
) -> tuple[str | None, list[Record]]:
    """(the first refusal, no records) or (None, the records making the changes)."""
    records: list[Record] = []
    for u in updates:
        why = reason_refused(image, u)
        if why is not None:
            return why, []
        if u.level != image.feature_level(u.name):
            records.append(feature_record(u.name, u.level))
    return None, records
