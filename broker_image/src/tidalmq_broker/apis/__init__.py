"""Kafka API handlers, one module per API family. Importing this package registers them all;
`KAFKA_APIS` is the table a Broker is built with (apis/registry.py)."""

from kio.schema.errors import ErrorCode

from tidalmq_broker.apis import (  # noqa: F401
    acls,
    api_versions,
    configs,
    consumer_groups,
    features,
    fetch,
    groups,
    leaders,
    log_dirs,
    metadata,
    produce,
    producer_ids,
    reassignments,
    sasl,
    scram_credentials,
    topics,
    txn_markers,
)
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import KAFKA
from tidalmq_broker.apis.registry import ApiTable

KAFKA_APIS = ApiTable(
    KAFKA.specs, KAFKA.supported_versions, lambda: api_versions_body(ErrorCode.unsupported_version)
)
