"""The controller's errors (each maps to one Kafka error code at the API layer)."""

from __future__ import annotations


class ControllerError(Exception):
    pass


class TopicAlreadyExists(ControllerError):
    pass


class UnknownTopic(ControllerError):
    pass


class NoBrokers(ControllerError):
    pass


class ControllerFenced(ControllerError):
    """This controller was stopped or replaced by another: it decides nothing any more."""


class InvalidReplicaAssignment(ControllerError):
    pass


class UnknownBroker(ControllerError):
    pass


class ForeignStore(ControllerError):
    """The object store belongs to another cluster: nothing may be written into it."""


class InternalTopic(ControllerError):
    """An internal topic (`__consumer_offsets`, a static topic's physical queues) that no client
    may delete, grow or reconfigure, whatever its ACLs: the group coordinator finds a group's
    offsets by hashing its id over the offsets topic's partition count."""


class UnsupportedFeatureLevel(ControllerError):
    """A broker registering does not support a finalized feature level (Kafka's
    UNSUPPORTED_VERSION to its BrokerRegistration): it is not registered; it retries."""


class UnsupportedFinalizedLevel(ControllerError):
    """The metadata holds a finalized feature level this controller's code does not support
    (a newer build finalized it): it does not claim the log, so the controller that does
    support it is not deposed. The message is one line for the operator."""


class StaticTopicError(Exception):
    """A static-topic request the controller refuses; the message says why."""
