"""S3 commit: the object-store interface (conditional puts for cluster metadata), and, with
the diskless-storage issue, moving WAL data into S3 objects and reading it back.
"""

from s3_commit.object_store import (
    FileObjectStore,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    open_object_store,
)

__all__ = [
    "FileObjectStore",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "open_object_store",
]
