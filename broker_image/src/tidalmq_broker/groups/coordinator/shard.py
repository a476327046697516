"""GroupShard: the groups of one `__consumer_offsets` partition led by this broker, its parts
(the modules of this package) composed."""

from __future__ import annotations

from tidalmq_broker.groups.coordinator.consumer_requests import ConsumerGroupRequests
from tidalmq_broker.groups.coordinator.loading import Loading
from tidalmq_broker.groups.coordinator.offsets import Offsets


class GroupShard(Loading, Offsets, ConsumerGroupRequests):
    """The groups of one `__consumer_offsets` partition led by this broker, its parts composed
    (see the package's docstring)."""
