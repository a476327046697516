"""InitProducerId: idempotent producers get a cluster-unique id (transactions: not yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from tidalmq_broker.apis.errors import error_code
from tidalmq_broker.apis.registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.listener import Connection


@api(22, "InitProducerId", 0, 4)
async def handle_init_producer_id(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    if body.transactional_id is not None:
        return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed,
                "producer_id": -1, "producer_epoch": -1}  # fmt: skip
    current_id = getattr(body, "producer_id", -1)
    current_epoch = getattr(body, "producer_epoch", -1)
    if current_id >= 0 and 0 <= current_epoch < 32766:
        # KIP-360: a producer bumps its epoch to recover from a sequence error; the partitions
        # see the new epoch and expect sequences from 0 again
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": current_id,
                "producer_epoch": current_epoch + 1}  # fmt: skip
    try:
        producer_id = await broker.controller.allocate_producer_id()
    except Exception as exc:
        return {"throttle_time": 0, "error_code": error_code(exc), "producer_id": -1,
                "producer_epoch": -1}  # fmt: skip
    return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": producer_id,
            "producer_epoch": 0}  # fmt: skip
