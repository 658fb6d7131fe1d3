"""The embedded `file:///path` object store, on pyfilesystem2's OSFS.

Objects are plain files under the root, so an operator can look at them. A put writes a
temporary file, fsyncs it, and renames it into place while holding an exclusive lock on
`.cas.lock`: the condition check and the rename are atomic between the processes of one
machine, and readers never see a half-written object. ETags are the MD5 of the content, as S3
gives for single-part uploads; a put stores it in an extended attribute of the file (it moves
with the rename), so head and list need not hash the object again.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import threading
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Final

with warnings.catch_warnings():
    # fs imports pkg_resources, which warns on import; nothing we can fix from here.
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    import fs.errors
    from fs.osfs import OSFS

from s3_commit.object_store import ObjectInfo, ObjectStoreError, PreconditionFailed, TrafficHook

__all__ = ["FileObjectStore"]

LOCK_NAME: Final = ".cas.lock"
ETAG_XATTR: Final = "user.zonefleet.etag"
_HASH_CHUNK: Final = 1 << 20
_ETAG_CACHE_SIZE: Final = 4096


def _md5(data: bytes | bytearray | memoryview) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class FileObjectStore:
    """Objects as files under a root directory; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], *, traffic_hook: TrafficHook | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.traffic_hook = traffic_hook
        self._fs = OSFS(str(self.root))
        self._lock_path = self.root / LOCK_NAME
        # head() would otherwise hash the whole object; keyed by the file's identity, which a
        # put always changes (a new inode renamed into place).
        self._etags: OrderedDict[tuple[str, int, int, int, int], str] = OrderedDict()
        self._etags_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self.root)!r})"

    def _count(self, op: str, nbytes: int) -> None:
        if self.traffic_hook is not None:
            self.traffic_hook(op, nbytes)

    @staticmethod
    def _check_key(key: str) -> str:
        parts = key.split("/")
        # Names starting with "." are the store's own (lock and temporary files).
        if not key or any(not p or p.startswith(".") for p in parts):
            raise ObjectStoreError(f"invalid object key {key!r}")
        return key

    def _syspath(self, key: str) -> Path:
        return self.root.joinpath(*self._check_key(key).split("/"))

    def _open(self, key: str) -> IO[bytes] | None:
        try:
            return self._fs.openbin(self._check_key(key), "r")
        except (fs.errors.ResourceNotFound, fs.errors.FileExpected):
            return None

    # -- reads --------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[bytes, str] | None:
        f = self._open(key)
        if f is None:
            return None
        with f:
            data = f.read()
        self._count("GetObject", len(data))
        return data, _md5(data)

    def get_range(self, key: str, start: int, length: int) -> bytes | None:
        if start < 0 or length <= 0:
            raise ValueError(f"bad range start={start} length={length}")
        f = self._open(key)
        if f is None:
            return None
        with f:
            f.seek(start)
            data = f.read(length)
        self._count("GetObject", len(data))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        f = self._open(key)
        if f is None:
            return None
        with f:
            st = os.fstat(f.fileno())
            etag = self._stored_etag(f.fileno())
            identity = (key, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if etag is None:
                with self._etags_lock:
                    etag = self._etags.get(identity)
            if etag is None:
                digest = hashlib.md5(usedforsecurity=False)
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
                etag = digest.hexdigest()
                with self._etags_lock:
                    self._etags[identity] = etag
                    if len(self._etags) > _ETAG_CACHE_SIZE:
                        self._etags.popitem(last=False)
        self._count("HeadObject", 0)
        return ObjectInfo(key, st.st_size, etag)

    @staticmethod
    def _stored_etag(fd: int) -> str | None:
        try:
            return os.getxattr(fd, ETAG_XATTR).decode()
        except OSError:  # no such attribute, or a file system without user xattrs
            return None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only below the last whole directory named by the prefix, then sort: S3 lists
        # in key order, and "a.x" < "a/b" is not the order a directory walk gives.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        try:
            if base:
                self._check_key(base)
            walker = self._fs.walk.info(
                base or "/", namespaces=["details"], exclude_dirs=[".*"], exclude=[".*"]
            )
            found = sorted(
                (path.lstrip("/"), info.size)
                for path, info in walker
                if info.is_file and path.lstrip("/").startswith(prefix)
            )
        except (fs.errors.ResourceNotFound, fs.errors.DirectoryExpected, ObjectStoreError):
            found = []
        self._count("ListObjectsV2", 0)
        for key, _size in found:
            info = self.head(key)
            if info is not None:  # deleted since the walk
                yield info

    # -- writes -------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        path = self._syspath(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        etag = _md5(data)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            with contextlib.suppress(OSError):  # head falls back to hashing
                os.setxattr(f.fileno(), ETAG_XATTR, etag.encode())
            os.fsync(f.fileno())
        try:
            with open(self._lock_path, "a+b") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                if if_none_match or if_match is not None:
                    current = self._current_etag(path)
                    if if_none_match and current is not None:
                        raise PreconditionFailed(f"{key} already exists")
                    if if_match is not None and current != if_match:
                        raise PreconditionFailed(f"{key} changed since ETag {if_match}")
                os.replace(tmp, path)
                self._sync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
        self._count("PutObject", len(data))
        return etag

    def _current_etag(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as f:
                return self._stored_etag(f.fileno()) or _md5(f.read())
        except (FileNotFoundError, IsADirectoryError):
            return None

    @staticmethod
    def _sync_dir(directory: Path) -> None:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def delete_many(self, keys: Iterable[str]) -> None:
        # Empty directories stay: removing them would race with a put creating its file there.
        paths: builtins.list[Path] = [self._syspath(key) for key in keys]
        parents: set[Path] = set()
        for path in paths:
            try:
                path.unlink()
                parents.add(path.parent)
            except FileNotFoundError:
                pass
        for parent in parents:
            self._sync_dir(parent)
        if paths:
            self._count("DeleteObjects", 0)
