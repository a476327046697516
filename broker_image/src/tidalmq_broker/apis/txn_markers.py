"""WriteTxnMarkers (API 27): the transaction coordinator asks a partition leader to end a
producer's transaction on its partitions with a commit or abort marker (docs/transactions.md).

Only the coordinator sends it (Kafka's brokers to each other): CLUSTER_ACTION on the cluster is
required when the authorizer is on (CLUSTER_AUTHORIZATION_FAILED for every partition otherwise).
Each partition's answer comes once its marker is durable. The writing itself is
transactions/marker_writes.py, the same path for a coordinator in this process; it tells
`broker.txn_marker_listeners` of every marker written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.transactions.marker_writes import answer, write_markers

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


@api(27, "WriteTxnMarkers", 1, 2)
async def handle_write_txn_markers(broker: Broker, request: Request, conn: Connection) -> Any:
    markers = request.body.markers
    if not broker.authorizer.allows(
        conn, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        return {
            "markers": answer(markers, lambda _m, _t, _p: ErrorCode.cluster_authorization_failed)
        }
    return {"markers": await write_markers(broker, markers)}
