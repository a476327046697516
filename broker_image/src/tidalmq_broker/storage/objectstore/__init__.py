"""Object stores: one async interface (base.py) and its backends (local directory, S3 API)."""

from tidalmq_broker.storage.objectstore.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
)
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.objectstore.metered import MeteredObjectStore
from tidalmq_broker.storage.objectstore.s3 import S3ObjectStore

__all__ = [
    "LocalDirObjectStore",
    "MeteredObjectStore",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "PreconditionFailed",
    "S3ObjectStore",
    "open_object_store",
]
