"""The object-store interface, its errors, and `open_object_store`.

Cluster metadata changes only by compare-and-swap (DESIGN.md, "Cluster metadata"): a create
is `put(..., if_none_match=True)` and a replace is `put(..., if_match=etag)`; a lost race
raises `PreconditionFailed` and the writer re-reads and retries. Calls block: async callers go
through `s3_commit.async_store.AsyncObjectStore`, which runs them in worker threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, urlparse

__all__ = [
    "GET_OPS",
    "PUT_OPS",
    "ConditionalPutUnknown",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "TrafficHook",
    "open_object_store",
    "request_class",
]

# One call per request the store makes: ``hook(op, nbytes)`` with op the S3 API name (the
# file backend reports the request S3 would have made) and nbytes the payload moved. It runs in
# whichever thread made the request, so it must be thread-safe and cheap.
TrafficHook = Callable[[str, int], None]

# S3 bills writes and listings as PUT-class requests, reads as GET-class: the traffic channels
# s3-put and s3-get follow the same split (DeleteObjects is free but still a request).
PUT_OPS: Final = frozenset(
    {
        "PutObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
        "ListObjectsV2",
        "DeleteObjects",
    }
)
GET_OPS: Final = frozenset({"GetObject", "HeadObject"})


def request_class(op: str) -> str:
    """ "put" or "get": the S3 request class (and zonefleet traffic channel) of `op`."""
    return "get" if op in GET_OPS else "put"


class ObjectStoreError(Exception):
    pass


class PreconditionFailed(ObjectStoreError):
    """A conditional put lost: the object exists (create) or changed or vanished (replace)."""


class ConditionalPutUnknown(ObjectStoreError):
    """A conditional put may or may not have been applied: an attempt failed in a way that
    hides its outcome, and the object now holds someone else's write. The caller must re-read
    and check whether its change is there before trying again."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


class ObjectStore(Protocol):
    """Blocking calls; keys are "/"-separated and relative to the store's root or prefix."""

    traffic_hook: TrafficHook | None

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when it does not exist."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        """`length` bytes from `start` (fewer at the end of the object, b"" past it), or None
        when the object does not exist."""
        ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        """Store the object and return its ETag. `if_none_match` creates only; `if_match`
        replaces only that version; either raises PreconditionFailed when it does not hold."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order, fetched page by page."""
        ...

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete the objects, in batches; keys that do not exist are not an error."""
        ...


def _as_bool(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


_S3_INT_OPTIONS: Final = ("multipart_threshold", "part_size", "max_attempts", "list_page_size")
_S3_FLOAT_OPTIONS: Final = ("connect_timeout_s", "read_timeout_s")


def _s3_options_from_query(query: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=False):
        if name in ("endpoint", "endpoint_url"):
            options["endpoint_url"] = value
        elif name in ("region", "access_key_id", "secret_access_key", "session_token"):
            options[name] = value
        elif name == "path_style":
            options["path_style"] = _as_bool(value)
        elif name in _S3_INT_OPTIONS:
            options[name] = int(value)
        elif name in _S3_FLOAT_OPTIONS:
            options[name] = float(value)
        else:
            raise ObjectStoreError(f"unknown s3:// URL option {name!r}")
    return options


def open_object_store(
    url: str, *, traffic_hook: TrafficHook | None = None, **s3_options: Any
) -> ObjectStore:
    """`file:///path` (or a bare path), or `s3://bucket/prefix?endpoint=...&region=...`.

    s3:// options come from the URL query and `s3_options` (explicit arguments win); see
    `S3ObjectStore` for their names. Credentials default to the usual AWS chain (environment,
    profile, instance role).
    """
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        from s3_commit.file_store import FileObjectStore

        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ObjectStoreError(f"file:// URL with a host {url!r} (use file:///path)")
        return FileObjectStore(parsed.path if parsed.scheme else url, traffic_hook=traffic_hook)
    if parsed.scheme == "s3":
        from s3_commit.s3_store import S3ObjectStore

        if not parsed.netloc:
            raise ObjectStoreError(f"s3:// URL without a bucket {url!r}")
        options: Mapping[str, Any] = {**_s3_options_from_query(parsed.query), **s3_options}
        return S3ObjectStore(
            parsed.netloc, parsed.path.strip("/"), traffic_hook=traffic_hook, **options
        )
    raise ObjectStoreError(f"unsupported object store URL {url!r} (use file:///path or s3://)")
