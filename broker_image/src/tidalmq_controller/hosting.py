"""What a process hosting a controller needs from the rest of TidalMQ, besides the controller.

The operator runs the cluster's controller in its own process and imports nothing of ours but
`tidalmq_core`, `tidalmq_controller` and this module (import-linter: .importlinter). The broker
and the local cluster host their controller beside their own storage and servers and do not need
it.

- `setup_logging`: the same log lines (text or JSON) as the brokers.
- `HealthServer`: liveness, readiness and Prometheus metrics over HTTP.
- `open_object_store`: the object store of a `file://` or `s3://` URL (the partition store, and
  the metadata log's store).
- `delete_topic_data`: deletes a deleted topic's data from the store (the controller's
  `topic_data_deleter`, bound to the store).
- `tune_runtime`: garbage collector, allocator and thread switch interval settings for a
  server process (the controller's liveness thread answers heartbeats beside a busy loop).
- `install_gc_policy`: gc.freeze() after metadata batches that changed many partitions
  (gc_policy.py), for a process whose controller is its main work (not a broker's).
"""

from tidalmq_broker.logs import setup_logging
from tidalmq_broker.server.http import HealthServer
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.topic_data import delete_topic_data
from tidalmq_broker.tuning import tune_runtime

from tidalmq_controller.gc_policy import install as install_gc_policy

__all__ = [
    "HealthServer",
    "delete_topic_data",
    "install_gc_policy",
    "open_object_store",
    "setup_logging",
    "tune_runtime",
]
