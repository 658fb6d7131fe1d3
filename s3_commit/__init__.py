"""S3 commit: the object store, and moving WAL data into S3 objects and reading it back.

The object-store interface (`ObjectStore`, blocking; `AsyncObjectStore` runs it in trio worker
threads under a `trio.CapacityLimiter`):

- `get(key)` -> (bytes, etag) or None; `get_range(key, start, length)` -> bytes or None;
  `head(key)` -> ObjectInfo(key, size, etag) or None.
- `put(key, data, if_none_match=True)` creates only (`If-None-Match: *`);
  `put(key, data, if_match=etag)` replaces only that version (`If-Match`). A lost condition
  raises `PreconditionFailed`; a conditional put whose outcome cannot be known raises
  `ConditionalPutUnknown`; anything else `ObjectStoreError`. Large puts go up in parts.
- `list(prefix)` yields ObjectInfo in key order, page by page; `delete_many(keys)` deletes in
  batches of up to 1000.
- `traffic_hook(op, nbytes)`, when set, is called once per request with the S3 API name;
  `request_class(op)` says whether it is a PUT- or GET-class request (channels s3-put, s3-get).

`open_object_store(url)` opens `file:///path` (`s3_commit.file_store`, pyfilesystem2, the
embedded default) or `s3://bucket/prefix?endpoint=...&region=...` (`s3_commit.s3_store`,
boto3, bounded retries from `s3_commit.retry`). The objects' byte format is in
`s3_commit.object_format` and docs/formats.md.
"""

from s3_commit.async_store import AsyncObjectStore
from s3_commit.file_store import FileObjectStore
from s3_commit.object_store import (
    ConditionalPutUnknown,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    TrafficHook,
    open_object_store,
    request_class,
)

__all__ = [
    "AsyncObjectStore",
    "ConditionalPutUnknown",
    "FileObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "TrafficHook",
    "open_object_store",
    "request_class",
]
