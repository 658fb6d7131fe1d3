"""A pyfilesystem2 FS on the userspace NFSv4.1 client ``nfs-rs``, opened as ``nfs://``.

URL form: ``nfs://host[:port]/<export>/<sub/dir>[?version=4.1&uid=..&gid=..]``. The first path
segment is the export's pseudo path (``?export=/a/b`` names a deeper one); the rest is a
directory inside it that becomes this FS's root. Ganesha cannot list an export's root, so put
the WAL in a subdirectory.

Every nfs-rs ``write`` returns only once its bytes are on stable storage (UNSTABLE WRITEs plus
one COMMIT per call), so files opened for writing are unbuffered and report
``durable_writes = True``: the WAL's fsync has nothing left to do for them.

A server restart is a normal event for an NFSv4 client, but an nfs-rs client does not outlive
it: its session and client id are gone, and every call fails from then on. So an NFSFS
reconnects: a call that fails because the server was lost (`_connection_lost`) makes a new
client (trying for ``reconnect_timeout`` seconds, one thread for all), and is repeated on it
when that is harmless (it is idempotent, or the server said it did not act on it); open files
reopen by path on the new client and repeat their positional call (a write at the same offset
by the file's one writer writes the same bytes again). A loss outlasting the reconnect
attempts is raised as an OSError with errno ENOTCONN from file methods, and as
fs.errors.RemoteConnectionError from FS methods; the WAL writer holds its group and tries again.
"""

from __future__ import annotations

import errno
import io
import logging
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO, NoReturn
from urllib.parse import quote

import nfs_rs

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    import fs.errors
    import fs.opener
    import fs.permissions
    from fs.base import FS
    from fs.enums import ResourceType
    from fs.info import Info
    from fs.mode import Mode
    from fs.opener import Opener
    from fs.opener.errors import OpenerError
    from fs.opener.parse import ParseResult
    from fs.path import abspath, normpath
    from fs.subfs import SubFS

__all__ = ["NFSFS", "NFSFile", "NFSOpener", "register_opener"]

log = logging.getLogger("zonefleet.shared_wal.nfs")

_RETRIES = 8
_FILE_IDEMPOTENT = frozenset({"read_at", "readinto_at", "write_at", "truncate", "seek"})
_CLIENT_IDEMPOTENT = frozenset({"stat", "exists", "listdir", "open", "truncate", "utime"})
_READ_BUFFER = 1024 * 1024  # one ~max_read sized READ serves many small WAL reads
_CALL_ATTEMPTS = 3  # a call is tried on at most this many clients (reconnecting in between)
_RECONNECT_BACKOFF_MAX_S = 1.0

#: nfs-rs errors after which a new client may succeed where the old one fails: the connection,
#: session, lease or open state is gone (the server restarted or is unreachable).
_LOST = (
    nfs_rs.NfsOperationOutcomeError,
    nfs_rs.NfsConnectionError,
    nfs_rs.NfsTimeoutError,
    nfs_rs.NfsStateLostError,
    nfs_rs.NfsRetryableError,
    nfs_rs.NfsRpcError,
    nfs_rs.NfsClientClosedError,
)


def _connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, _LOST)


def _repeatable(exc: nfs_rs.NfsError, name: str, idempotent: frozenset[str]) -> bool:
    """Whether a call that failed with `exc` may be made again on a new client: it is
    idempotent, or it never reached a server (a client closed by a reconnect in another
    thread), or the server said it did not act on it."""
    if isinstance(exc, nfs_rs.NfsClosedResourceError):
        return True
    return name in idempotent or exc.outcome in (
        nfs_rs.OperationOutcome.SAFE_TO_RETRY,
        nfs_rs.OperationOutcome.DEFINITE_FAILURE,
    )


def _raise_fs_error(exc: nfs_rs.NfsError, path: str, *, op: str) -> NoReturn:
    """Re-raise an nfs-rs error as the matching fs.errors exception."""
    if isinstance(exc, nfs_rs.NfsNotFoundError):
        raise fs.errors.ResourceNotFound(path, exc=exc) from exc
    if isinstance(exc, nfs_rs.NfsAlreadyExistsError):
        if op == "makedir":
            raise fs.errors.DirectoryExists(path, exc=exc) from exc
        raise fs.errors.FileExists(path, exc=exc) from exc
    if isinstance(exc, nfs_rs.NfsIsADirectoryError):
        raise fs.errors.FileExpected(path, exc=exc) from exc
    if isinstance(exc, nfs_rs.NfsNotADirectoryError):
        if op == "listdir":
            raise fs.errors.DirectoryExpected(path, exc=exc) from exc
        raise fs.errors.ResourceNotFound(path, exc=exc) from exc  # a parent is a file
    if isinstance(exc, nfs_rs.NfsPermissionError):
        raise fs.errors.PermissionDenied(path, exc=exc) from exc
    if exc.errno == errno.ENOTEMPTY or exc.code_name == "NFS4ERR_NOTEMPTY":
        raise fs.errors.DirectoryNotEmpty(path, exc=exc) from exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise fs.errors.InsufficientStorage(path, exc=exc, msg=f"NFS {op} failed: {exc}") from exc
    if _connection_lost(exc):
        raise fs.errors.RemoteConnectionError(path, exc=exc, msg=f"NFS {op} failed: {exc}") from exc
    raise fs.errors.OperationFailed(
        path, exc=exc, msg=f"NFS {op} of {path!r} failed: {exc}"
    ) from exc


class _Retrying:
    """Proxy that retries calls the server refused without acting on them.

    Ganesha answers NFS4ERR_RETRY_UNCACHED_REP now and then when several threads share a
    session; nfs-rs reports that as SAFE_TO_RETRY (nothing happened), or as UNCERTAIN for a
    modifying call. Uncertain calls are retried only when repeating them is harmless
    (``idempotent``: positional writes by the single writer, truncation to a size, opens).
    """

    __slots__ = ("_idempotent", "_target")

    def __init__(self, target: Any, idempotent: frozenset[str]) -> None:
        self._target = target
        self._idempotent = idempotent

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        retry_on = {nfs_rs.OperationOutcome.SAFE_TO_RETRY}
        if name in self._idempotent:
            retry_on.add(nfs_rs.OperationOutcome.UNCERTAIN)

        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(_RETRIES):
                try:
                    return attr(*args, **kwargs)
                except nfs_rs.NfsError as exc:
                    if exc.outcome not in retry_on or attempt == _RETRIES - 1:
                        raise
                time.sleep(0.001 * 2**attempt)
            raise AssertionError("unreachable")

        return call


@contextmanager
def _fs_errors(path: str, op: str) -> Iterator[None]:
    try:
        yield
    except nfs_rs.NfsError as exc:
        _raise_fs_error(exc, path, op=op)


@contextmanager
def _io_errors() -> Iterator[None]:
    """File methods raise OSError (as io does); some nfs-rs errors are only RuntimeErrors.
    A lost server is ENOTCONN."""
    try:
        yield
    except nfs_rs.NfsError as exc:
        if isinstance(exc, OSError) and not _connection_lost(exc):
            raise
        if _connection_lost(exc):
            raise OSError(errno.ENOTCONN, f"NFS server lost: {exc}") from exc
        raise OSError(f"NFS I/O failed: {exc}") from exc


class _Link:
    """An NFSFS's nfs-rs client, replaced by a new one when the server is lost.

    FS methods are called through it by name (``link.stat(path)``); `call` repeats a call on
    a new client when the old one lost the server and repeating is harmless.
    """

    def __init__(self, connect: Callable[[], Any], reconnect_timeout: float, label: str) -> None:
        self._connect = connect
        self._reconnect_timeout = reconnect_timeout
        self._label = label
        self._lock = threading.Lock()
        self.client: Any = _Retrying(connect(), _CLIENT_IDEMPOTENT)
        self.generation = 0  # bumped by each reconnect
        self.reconnects = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed or bool(self.client.closed)

    def close(self) -> None:
        self._closed = True
        self.client.close()

    def reconnect(self, seen: int, cause: nfs_rs.NfsError) -> None:
        """Replace the client, unless another thread did since `seen` (a generation): tries
        for reconnect_timeout seconds, then raises `cause`."""
        with self._lock:
            if self.generation != seen:
                return
            if self._closed:
                raise cause
            log.warning("NFS %s: server lost (%s); reconnecting", self._label, cause)
            started = time.monotonic()
            delay = 0.05
            while True:
                try:
                    client = self._connect()
                    break
                except nfs_rs.NfsError as exc:
                    if time.monotonic() + delay - started > self._reconnect_timeout:
                        log.error(
                            "NFS %s: cannot reconnect after %.0f s: %s",
                            self._label,
                            time.monotonic() - started,
                            exc,
                        )
                        raise cause from exc
                time.sleep(delay)
                delay = min(delay * 2, _RECONNECT_BACKOFF_MAX_S)
            old, self.client = self.client, _Retrying(client, _CLIENT_IDEMPOTENT)
            self.generation += 1
            self.reconnects += 1
            try:
                old.close()
            except Exception:  # the old client's server state is gone; nothing to release
                pass
            log.warning("NFS %s: reconnected in %.2f s", self._label, time.monotonic() - started)

    def call_on(self, name: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        """Call client method `name`; returns the generation of the client that answered."""
        for attempt in range(_CALL_ATTEMPTS):
            generation, client = self.generation, self.client
            try:
                return generation, getattr(client, name)(*args, **kwargs)
            except nfs_rs.NfsError as exc:
                if (
                    not _connection_lost(exc)
                    or attempt == _CALL_ATTEMPTS - 1
                    or not _repeatable(exc, name, _CLIENT_IDEMPOTENT)
                ):
                    raise
                self.reconnect(generation, exc)
        raise AssertionError("unreachable")

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call_on(name, *args, **kwargs)[1]

        return call


class NFSFile(io.RawIOBase):
    """A raw binary file on NFS: positional READ/WRITE at a locally tracked offset.

    Append mode writes at the end known locally (one writer per file), so an append costs
    the WRITEs and one COMMIT, with no GETATTR to find the end first.
    """

    durable_writes = True  # each write() returns after the server has it on stable storage

    def __init__(
        self,
        inner: nfs_rs.File,
        path: str,
        mode: Mode,
        position: int,
        *,
        link: _Link | None = None,
        generation: int = 0,
        target: str = "",
    ) -> None:
        super().__init__()
        self._link = link  # None: no reopening on a new client
        self._generation = generation  # of the client `inner` was opened on
        self._f: Any = _Retrying(inner, _FILE_IDEMPOTENT)
        self._target = target  # export-relative path, to reopen by
        self._stale = False
        self.name = path
        self.mode = mode.to_platform_bin()
        self._mode = mode
        self._pos = position

    def _call(self, name: str, *args: Any) -> Any:
        """Call file method `name`, on a reopened file once the server was lost. Every method
        called so is positional (or a truncation to a size), so repeating it is harmless."""
        for attempt in range(_CALL_ATTEMPTS):
            generation = self._generation
            try:
                if self._stale:
                    self._reopen()
                return getattr(self._f, name)(*args)
            except nfs_rs.NfsError as exc:
                if self._link is None or attempt == _CALL_ATTEMPTS - 1:
                    raise
                if generation == self._link.generation:
                    if not _connection_lost(exc):
                        raise
                    self._link.reconnect(generation, exc)
                # else: opened on a client since replaced (and closed): reopen on the new one
                self._stale = True
        raise AssertionError("unreachable")

    def _reopen(self) -> None:
        assert self._link is not None
        # Never truncating: the file was created (or truncated) by the first open already.
        generation, inner = self._link.call_on(
            "open", self._target, "r+b" if self._mode.writing else "rb"
        )
        old, self._f = self._f, _Retrying(inner, _FILE_IDEMPOTENT)
        self._generation = generation
        self._stale = False
        try:
            old.close()
        except Exception:  # opened on the lost client: nothing left to release
            pass

    def readable(self) -> bool:
        return self._mode.reading

    def writable(self) -> bool:
        return self._mode.writing

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("NFS files have no OS file descriptor")

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            with _io_errors():
                pos = self._call("seek", 0, io.SEEK_END) + offset  # a GETATTR for the size
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if pos < 0:
            raise OSError(errno.EINVAL, f"negative seek position {pos}")
        self._pos = pos
        return pos

    def read(self, size: int | None = -1) -> bytes:
        self._check_open()
        if not self._mode.reading:
            raise io.UnsupportedOperation("file not open for reading")
        with _io_errors():
            data = self._call("read_at", self._pos, -1 if size is None or size < 0 else size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        if not self._mode.reading:
            raise io.UnsupportedOperation("file not open for reading")
        with _io_errors():
            n = self._call("readinto_at", buffer, self._pos)
        self._pos += n
        return n

    def write(self, data: Any) -> int:
        self._check_open()
        if not self._mode.writing:
            raise io.UnsupportedOperation("file not open for writing")
        with _io_errors():
            n = self._call("write_at", data, self._pos)
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        self._check_open()
        if not self._mode.writing:
            raise io.UnsupportedOperation("file not open for writing")
        target = self._pos if size is None else size
        with _io_errors():
            return self._call("truncate", target)

    def flush(self) -> None:
        pass  # nothing is held back: every write is already durable

    def close(self) -> None:
        if self.closed:
            return
        try:
            with _io_errors():
                try:
                    self._f.close()
                except nfs_rs.NfsFileCloseError as exc:
                    # CLOSE only releases the open state: every write() returned once its
                    # bytes were on stable storage, so nothing is lost when its outcome is
                    # uncertain (Ganesha's NFS4ERR_RETRY_UNCACHED_REP when threads share a
                    # session); the server drops the state when the lease runs out.
                    log.warning("closing %s on NFS: %s (its writes were durable)", self.name, exc)
        finally:
            super().close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def __repr__(self) -> str:
        return f"NFSFile({self.name!r}, {self.mode!r})"


class NFSFS(FS):
    """An NFSv4.1 export (or a directory inside it) over one nfs-rs client.

    The client is shared by all threads; pyfilesystem's lock is not held around RPCs.
    """

    _meta = {
        "case_insensitive": False,
        "invalid_path_chars": "\0",
        "max_path_length": None,
        "max_sys_path_length": None,
        "network": True,
        "read_only": False,
        "supports_rename": True,
        "thread_safe": True,
        "unicode_paths": True,
        "virtual": False,
    }

    def __init__(
        self,
        host: str,
        export: str,
        root: str = "",
        *,
        port: int | None = None,
        create: bool = False,
        version: str = "4.1",
        uid: int | None = None,
        gid: int | None = None,
        connect_timeout: float = 10.0,
        operation_timeout: float = 60.0,
        reconnect_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self._host = host
        self._port = port
        self._export = "/" + export.strip("/")
        self._root = normpath(root).strip("/")
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc += f":{port}"
        url = f"nfs://{netloc}{quote(self._export)}?version={version}"

        def connect() -> Any:
            return nfs_rs.Client.connect(
                url,
                uid=uid,
                gid=gid,
                noresvport=True,
                connect_timeout=connect_timeout,
                operation_timeout=operation_timeout,
            )

        try:
            self._client = _Link(connect, reconnect_timeout, url)
        except nfs_rs.NfsError as exc:
            raise fs.errors.CreateFailed(f"cannot mount {url}: {exc}", exc=exc) from exc
        if self._root:
            try:
                with _fs_errors(self._root, "makedir"):
                    if create:
                        self._client.mkdir(self._root, parents=True, exist_ok=True)
                    info = self._client.stat(self._root)
                if info.type != nfs_rs.FileType.DIRECTORY:
                    raise fs.errors.CreateFailed(f"{self._root!r} on {url} is not a directory")
            except fs.errors.FSError as exc:
                self._client.close()
                if isinstance(exc, fs.errors.CreateFailed):
                    raise
                raise fs.errors.CreateFailed(f"cannot open {self._root!r} on {url}: {exc}") from exc

    def __repr__(self) -> str:
        port = f":{self._port}" if self._port is not None else ""
        return f"NFSFS('{self._host}{port}{self._export}/{self._root}')"

    # -- paths ---------------------------------------------------------------------------

    def _nfs_path(self, path: str) -> str:
        """The export-relative path of an FS path ('' is the export root)."""
        rel = abspath(normpath(self.validatepath(path))).strip("/")
        if self._root:
            return f"{self._root}/{rel}" if rel else self._root
        return rel

    # -- the required FS methods ----------------------------------------------------------

    def getinfo(self, path: str, namespaces: Collection[str] | None = None) -> Info:
        target = self._nfs_path(path)
        name = "" if abspath(normpath(path)) == "/" else target.rsplit("/", 1)[-1]
        if not target:  # the export root itself: nfs-rs cannot address it by path
            return Info({"basic": {"name": "", "is_dir": True}})
        self.check()
        with _fs_errors(path, "getinfo"):
            st = self._client.stat(target)
        is_dir = st.type == nfs_rs.FileType.DIRECTORY
        raw: dict[str, dict[str, Any]] = {"basic": {"name": name, "is_dir": is_dir}}
        wanted = set(namespaces or ())
        if "details" in wanted:
            raw["details"] = {
                "type": int(ResourceType.directory if is_dir else _resource_type(st.type)),
                "size": st.size,
                "accessed": st.atime / 1e9,
                "modified": st.mtime / 1e9,
                "metadata_changed": st.ctime / 1e9,
                "created": None,
            }
        if "access" in wanted:
            raw["access"] = {
                "permissions": fs.permissions.Permissions(mode=st.mode).dump(),
                "uid": st.uid,
                "gid": st.gid,
                "user": st.owner,
                "group": st.group,
            }
        return Info(raw)

    def listdir(self, path: str) -> list[str]:
        target = self._nfs_path(path)
        if not target:
            raise fs.errors.OperationFailed(
                path, msg="cannot list an NFS export's root; open a subdirectory of it"
            )
        self.check()
        with _fs_errors(path, "listdir"):
            return self._client.listdir(target)

    def makedir(self, path: str, permissions: Any = None, recreate: bool = False) -> SubFS[FS]:
        target = self._nfs_path(path)
        self.check()
        if target and target != self._root:
            mode = permissions.mode if permissions is not None else 0o777
            try:
                with _fs_errors(path, "makedir"):
                    self._client.mkdir(target, mode)
            except fs.errors.DirectoryExists:
                if not recreate or not self.isdir(path):
                    raise
        elif not recreate:
            raise fs.errors.DirectoryExists(path)
        return self.opendir(path)

    def makedirs(self, path: str, permissions: Any = None, recreate: bool = False) -> SubFS[FS]:
        target = self._nfs_path(path)
        self.check()
        if target and target != self._root:
            mode = permissions.mode if permissions is not None else 0o777
            with _fs_errors(path, "makedir"):
                self._client.mkdir(target, mode, parents=True, exist_ok=recreate)
        elif not recreate:
            raise fs.errors.DirectoryExists(path)
        return self.opendir(path)

    def openbin(self, path: str, mode: str = "r", buffering: int = -1, **options: Any) -> BinaryIO:
        _mode = Mode(mode)
        _mode.validate_bin()
        target = self._nfs_path(path)
        self.check()
        if not target or target == self._root:
            raise fs.errors.FileExpected(path)
        with _fs_errors(path, "openbin"):
            raw = self._open_raw(target, path, _mode)
        if buffering == 0 or not _mode.reading:
            return raw  # type: ignore[return-value]  # writes are durable when they return
        size = buffering if buffering > 1 else _READ_BUFFER
        if _mode.writing:  # r+/w+/a+: buffered writes become durable at flush()
            return io.BufferedRandom(raw, size)  # type: ignore[return-value]
        return io.BufferedReader(raw, size)  # type: ignore[return-value]

    def _open_raw(self, target: str, path: str, mode: Mode) -> NFSFile:
        link = self._client

        def opened(nfs_mode: str) -> NFSFile:
            generation, inner = link.call_on("open", target, nfs_mode)
            return NFSFile(inner, path, mode, 0, link=link, generation=generation, target=target)

        if mode.exclusive:
            # nfs-rs has no exclusive create; the WAL has one writer per file, so check first.
            if link.exists(target):
                raise fs.errors.FileExists(path)
            return opened("w+b")
        if mode.truncate:
            return opened("w+b")
        if mode.appending:
            try:
                f = opened("r+b")
            except nfs_rs.NfsNotFoundError:
                return opened("w+b")
            try:
                f.seek(0, io.SEEK_END)
            except BaseException:
                f.close()
                raise
            return f
        return opened("r+b" if mode.writing else "rb")

    def remove(self, path: str) -> None:
        target = self._nfs_path(path)
        self.check()
        if not target or target == self._root:
            raise fs.errors.FileExpected(path)
        with _fs_errors(path, "remove"):
            # NFS REMOVE also deletes empty directories; fs.remove must not.
            if self._client.stat(target).type == nfs_rs.FileType.DIRECTORY:
                raise fs.errors.FileExpected(path)
            self._client.remove(target)

    def removedir(self, path: str) -> None:
        target = self._nfs_path(path)
        self.check()
        if not target or target == self._root:
            raise fs.errors.RemoveRootError(path)
        with _fs_errors(path, "removedir"):
            if self._client.stat(target).type != nfs_rs.FileType.DIRECTORY:
                raise fs.errors.DirectoryExpected(path)
            self._client.rmdir(target)

    def setinfo(self, path: str, info: Mapping[str, Mapping[str, Any]]) -> None:
        target = self._nfs_path(path)
        self.check()
        with _fs_errors(path, "setinfo"):
            st = self._client.stat(target) if target else None
            details = info.get("details", {})
            if st is not None and ("modified" in details or "accessed" in details):
                accessed = details.get("accessed")
                modified = details.get("modified")
                ns = (
                    int(accessed * 1e9) if accessed is not None else st.atime,
                    int(modified * 1e9) if modified is not None else st.mtime,
                )
                self._client.utime(target, ns=ns)

    # -- cheaper or NFS-specific overrides -------------------------------------------------

    def exists(self, path: str) -> bool:
        target = self._nfs_path(path)
        if not target:
            return True
        self.check()
        with _fs_errors(path, "exists"):
            return self._client.exists(target)

    def move(
        self, src_path: str, dst_path: str, overwrite: bool = False, preserve_time: bool = False
    ) -> None:
        """Move a file with one NFS RENAME (atomic on the server)."""
        self.check()
        if not overwrite and self.exists(dst_path):
            raise fs.errors.DestinationExists(dst_path)
        if self.getinfo(src_path).is_dir:
            raise fs.errors.FileExpected(src_path)
        with _fs_errors(src_path, "rename"):
            self._client.rename(self._nfs_path(src_path), self._nfs_path(dst_path))

    def close(self) -> None:
        client = getattr(self, "_client", None)  # None when __init__ failed to connect
        if not self.isclosed() and client is not None and not client.closed:
            try:
                client.close()
            except RuntimeError:  # NfsError, or nfs-rs failing at interpreter exit
                pass  # the server may already be gone; nothing to release locally
        super().close()


def _resource_type(kind: nfs_rs.FileType) -> ResourceType:
    return {
        nfs_rs.FileType.FILE: ResourceType.file,
        nfs_rs.FileType.DIRECTORY: ResourceType.directory,
        nfs_rs.FileType.SYMLINK: ResourceType.symlink,
        nfs_rs.FileType.BLOCK_DEVICE: ResourceType.block_special_file,
        nfs_rs.FileType.CHARACTER_DEVICE: ResourceType.character,
        nfs_rs.FileType.FIFO: ResourceType.fifo,
        nfs_rs.FileType.SOCKET: ResourceType.socket,
    }.get(kind, ResourceType.unknown)


class NFSOpener(Opener):
    """``nfs://host[:port]/export/dir?version=4.1&uid=0&gid=0&export=/a/b`` (also
    ``connect_timeout``, ``operation_timeout``, ``reconnect_timeout``: seconds)."""

    protocols = ["nfs"]

    def open_fs(
        self, fs_url: str, parse_result: ParseResult, writeable: bool, create: bool, cwd: str
    ) -> NFSFS:
        netloc, _, path = parse_result.resource.partition("/")
        host, port = _split_host_port(netloc, fs_url)
        params = parse_result.params
        path = "/" + path.strip("/")
        export = params.get("export")
        if export:
            export = "/" + export.strip("/")
            if path != export and not path.startswith(export + "/"):
                raise OpenerError(f"{fs_url}: path is not inside export {export}")
            root = path[len(export) :]
        else:
            export, _, root = path.strip("/").partition("/")
            if not export:
                raise OpenerError(f"{fs_url}: no export in the URL")
        uid, gid = params.get("uid"), params.get("gid")
        return NFSFS(
            host,
            export,
            root,
            port=port,
            create=create,
            version=params.get("version", "4.1"),
            uid=int(uid) if uid is not None else None,
            gid=int(gid) if gid is not None else None,
            connect_timeout=float(params.get("connect_timeout", 10.0)),
            operation_timeout=float(params.get("operation_timeout", 60.0)),
            reconnect_timeout=float(params.get("reconnect_timeout", 60.0)),
        )


def _split_host_port(netloc: str, fs_url: str) -> tuple[str, int | None]:
    if netloc.startswith("["):  # [v6]:port
        host, _, rest = netloc[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = netloc.partition(":")
    if not host:
        raise OpenerError(f"{fs_url}: no host in the URL")
    try:
        return host, int(port_text) if port_text else None
    except ValueError:
        raise OpenerError(f"{fs_url}: bad port {port_text!r}") from None


_registered = False


def register_opener() -> None:
    """Make ``fs.open_fs("nfs://...")`` use :class:`NFSOpener` (idempotent)."""
    global _registered
    if not _registered:
        fs.opener.registry.install(NFSOpener)
        _registered = True
