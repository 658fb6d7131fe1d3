"""The file-system seam: every FS-specific call of the WAL goes through this module.

Files without an OS descriptor (MemoryFS, ``nfs://`` via :mod:`shared_wal.nfs_fs`) take the
fallbacks below: one joined write per group, and no fsync when the file says its writes are
already durable.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Sequence
from typing import IO, Any

with warnings.catch_warnings():
    # fs imports pkg_resources, which warns on import; nothing we can fix from here.
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    import fs
    import fs.errors
    from fs.base import FS

from shared_wal.nfs_fs import register_opener

register_opener()  # fs.open_fs("nfs://...") works once shared_wal is imported

__all__ = [
    "FS",
    "InsufficientStorage",
    "RemoteConnectionError",
    "ResourceNotFound",
    "check_writer_id",
    "file_size",
    "list_segment_ids",
    "list_writer_dirs",
    "open_for_append",
    "open_for_read",
    "open_for_recovery",
    "open_wal_fs",
    "read_exact",
    "read_exact_at",
    "real_fileno",
    "segment_mtime",
    "segment_path",
    "sync_dir",
    "sync_file",
    "wal_dir",
    "write_buffers",
]

ResourceNotFound = fs.errors.ResourceNotFound
InsufficientStorage = fs.errors.InsufficientStorage  # ENOSPC/EDQUOT from an fs call (OSFS)
RemoteConnectionError = fs.errors.RemoteConnectionError  # a remote FS (nfs://) unreachable

WAL_ROOT = "wal"
_SEGMENT_RE = re.compile(r"^(\d{20})\.wal$")
_WRITER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def open_wal_fs(url: str) -> FS:
    """Open (creating if needed) the FS that holds ``wal/<writer-id>/`` directories."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return fs.open_fs(url, create=True)
        except fs.errors.CreateFailed as exc:
            # OSFS checks for its root and then creates it: the mains of a fleet start
            # together on one shared directory, and another may create it in between.
            if not isinstance(exc.exc, FileExistsError):
                raise
            return fs.open_fs(url, create=True)


def check_writer_id(writer_id: str) -> str:
    if not isinstance(writer_id, str) or not _WRITER_RE.match(writer_id):
        raise ValueError(f"invalid WAL writer id {writer_id!r}")
    return writer_id


def wal_dir(writer_id: str) -> str:
    return f"{WAL_ROOT}/{check_writer_id(writer_id)}"


def segment_path(writer_id: str, segment: int) -> str:
    return f"{wal_dir(writer_id)}/{segment:020d}.wal"


def list_segment_ids(filesystem: FS, writer_id: str) -> list[int]:
    """Segment ids in the writer's directory, oldest first; [] if the directory is missing."""
    try:
        names = filesystem.listdir(wal_dir(writer_id))
    except ResourceNotFound:
        return []
    ids = [int(m.group(1)) for m in map(_SEGMENT_RE.match, names) if m]
    ids.sort()
    return ids


def list_writer_dirs(filesystem: FS) -> list[str]:
    try:
        names = filesystem.listdir(WAL_ROOT)
    except ResourceNotFound:
        return []
    return sorted(n for n in names if _WRITER_RE.match(n) and filesystem.isdir(f"{WAL_ROOT}/{n}"))


def segment_mtime(filesystem: FS, path: str) -> float | None:
    """Modification time (epoch seconds) or None where the FS does not know it."""
    modified = filesystem.getinfo(path, namespaces=["details"]).modified
    return modified.timestamp() if modified is not None else None


def open_for_append(filesystem: FS, path: str, *, create: bool) -> IO[bytes]:
    # Unbuffered, so writes through the fd (os.writev) and through the object never interleave.
    return filesystem.openbin(path, "xb" if create else "ab", buffering=0)


def open_for_read(filesystem: FS, path: str, *, buffered: bool) -> IO[bytes]:
    return filesystem.openbin(path, "rb", buffering=-1 if buffered else 0)


def open_for_recovery(filesystem: FS, path: str) -> IO[bytes]:
    return filesystem.openbin(path, "r+b")


def real_fileno(f: Any) -> int | None:
    """The OS file descriptor behind ``f``, or None (MemoryFS and other virtual files)."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def sync_file(f: Any) -> None:
    """Make everything written to ``f`` durable (fsync where there is a real fd)."""
    if getattr(f, "durable_writes", False):
        return  # e.g. NFS: every write() returned only after reaching stable storage
    f.flush()
    fd = real_fileno(f)
    if fd is not None:
        os.fsync(fd)


def sync_dir(filesystem: FS, path: str) -> None:
    """fsync a directory so a newly created segment's name is durable (real paths only)."""
    if not filesystem.hassyspath(path):
        return
    fd = os.open(filesystem.getsyspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_buffers(f: Any, buffers: Sequence[bytes | memoryview]) -> int:
    """Write all ``buffers`` back to back: ``os.writev`` on a real fd, else one joined write."""
    views = [memoryview(b) for b in buffers if len(b)]
    total = sum(v.nbytes for v in views)
    fd = real_fileno(f)
    if fd is None:
        # One write per group: on NFS each write() costs WRITEs plus a COMMIT.
        data = views[0] if len(views) == 1 else memoryview(b"".join(views))
        while data.nbytes:
            n = f.write(data)
            if not n:
                raise OSError(f"short write to {f!r}")
            data = data[n:]
        return total
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        if n <= 0:
            raise OSError("writev wrote nothing")
        # Short writes are legal (e.g. a signal or a nearly full disk): resume mid-buffer.
        while n:
            size = views[i].nbytes
            if n >= size:
                n -= size
                i += 1
            else:
                views[i] = views[i][n:]
                n = 0
    return total


def read_exact_at(f: Any, position: int, n: int) -> bytes:
    """Read up to ``n`` bytes at ``position`` (fewer only at end of file)."""
    fd = real_fileno(f)
    if fd is not None:
        data = os.pread(fd, n, position)
        if len(data) == n or not data:
            return data
        parts = [data]
        got = len(data)
        while got < n:
            more = os.pread(fd, n - got, position + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)
    f.seek(position)
    return read_exact(f, n)


def read_exact(f: Any, n: int) -> bytes:
    """Read ``n`` bytes from the current position (fewer only at end of file)."""
    data = f.read(n)
    if data is None:
        data = b""
    if len(data) == n or not data:
        return bytes(data)
    parts = [data]
    got = len(data)
    while got < n:
        more = f.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def file_size(f: Any) -> int:
    fd = real_fileno(f)
    if fd is not None:
        return os.fstat(fd).st_size
    end = f.seek(0, io.SEEK_END)
    return int(end)
