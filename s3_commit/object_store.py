"""The object-store interface and its embedded `file://` backend.

Cluster metadata changes only by compare-and-swap (DESIGN.md, "Cluster metadata"): a create
is `put(..., if_none_match=True)` and a replace is `put(..., if_match=etag)`; a lost race
raises `PreconditionFailed` and the writer re-reads and retries. Calls block: async callers run
them in worker threads.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

__all__ = [
    "FileObjectStore",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "open_object_store",
]


class ObjectStoreError(Exception):
    pass


class PreconditionFailed(ObjectStoreError):
    """A conditional put lost: the object exists (create) or changed (replace)."""


class ObjectStore(Protocol):
    def get(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, or None when it does not exist."""
        ...

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        """Store the object and return its ETag; conditions as in S3."""
        ...


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class FileObjectStore:
    """Objects as files under a root directory. Conditional puts are atomic between the
    processes of one machine: an exclusive lock file serialises check-and-rename."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.root / ".cas.lock"

    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") or p.startswith(".cas") for p in parts):
            raise ObjectStoreError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, _etag(data)

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            with open(self._lock_path, "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                if if_none_match or if_match is not None:
                    current = self.get(key)
                    if if_none_match and current is not None:
                        raise PreconditionFailed(f"{key} already exists")
                    if if_match is not None and (current is None or current[1] != if_match):
                        raise PreconditionFailed(f"{key} changed since ETag {if_match}")
                os.replace(tmp, path)
                dir_fd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)


def open_object_store(url: str) -> ObjectStore:
    """`file:///path` (or a bare path). `s3://` arrives with the diskless-storage issue."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return FileObjectStore(parsed.path if parsed.scheme else url)
    raise ObjectStoreError(f"unsupported object store URL {url!r} (use file:///path)")
