"""Kafka API handlers, one module per API family. Importing this package registers them all."""

from tidalmq_broker.apis import (  # noqa: F401
    acls,
    api_versions,
    configs,
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
