"""A pyfilesystem2 FS on the userspace NFSv4.1 client ``nfs-rs``, opened as ``nfs://``.

URL form: ``nfs://host[:port]/<export>/<sub/dir>[?version=4.1&uid=..&gid=..]``. The first path
segment is the export's pseudo path (``?export=/a/b`` names a deeper one); the rest is a
directory inside it that becomes this FS's root. Ganesha cannot list an export's root, so put
the WAL in a subdirectory.

Every nfs-rs ``write`` returns only once its bytes are on stable storage (UNSTABLE WRITEs plus
one COMMIT per call), so files opened for writing are unbuffered and report
``durable_writes = True``: the WAL's fsync has nothing left to do for them.
"""

from __future__ import annotations

import errno
import io
import logging
import time
import warnings
from collections.abc import Collection, Iterator, Mapping
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
    if isinstance(exc, nfs_rs.NfsTimeoutError | nfs_rs.NfsConnectionError):
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
    """File methods raise OSError (as io does); some nfs-rs errors are only RuntimeErrors."""
    try:
        yield
    except nfs_rs.NfsError as exc:
        if isinstance(exc, OSError):
            raise
        raise OSError(f"NFS I/O failed: {exc}") from exc


class NFSFile(io.RawIOBase):
    """A raw binary file on NFS: positional READ/WRITE at a locally tracked offset.

    Append mode writes at the end known locally (one writer per file), so an append costs
    the WRITEs and one COMMIT, with no GETATTR to find the end first.
    """

    durable_writes = True  # each write() returns after the server has it on stable storage

    def __init__(self, inner: nfs_rs.File, path: str, mode: Mode, position: int) -> None:
        super().__init__()
        self._f: Any = _Retrying(inner, _FILE_IDEMPOTENT)
        self.name = path
        self.mode = mode.to_platform_bin()
        self._mode = mode
        self._pos = position

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
                pos = self._f.seek(0, io.SEEK_END) + offset  # a GETATTR for the size
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
            data = self._f.read_at(self._pos, -1 if size is None or size < 0 else size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        self._check_open()
        if not self._mode.reading:
            raise io.UnsupportedOperation("file not open for reading")
        with _io_errors():
            n = self._f.readinto_at(buffer, self._pos)
        self._pos += n
        return n

    def write(self, data: Any) -> int:
        self._check_open()
        if not self._mode.writing:
            raise io.UnsupportedOperation("file not open for writing")
        with _io_errors():
            n = self._f.write_at(data, self._pos)
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        self._check_open()
        if not self._mode.writing:
            raise io.UnsupportedOperation("file not open for writing")
        target = self._pos if size is None else size
        with _io_errors():
            return self._f.truncate(target)

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
        try:
            client = nfs_rs.Client.connect(
                url,
                uid=uid,
                gid=gid,
                noresvport=True,
                connect_timeout=connect_timeout,
                operation_timeout=operation_timeout,
            )
        except nfs_rs.NfsError as exc:
            raise fs.errors.CreateFailed(f"cannot mount {url}: {exc}", exc=exc) from exc
        self._client: Any = _Retrying(client, _CLIENT_IDEMPOTENT)
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
        client = self._client
        if mode.exclusive:
            # nfs-rs has no exclusive create; the WAL has one writer per file, so check first.
            if client.exists(target):
                raise fs.errors.FileExists(path)
            return NFSFile(client.open(target, "w+b"), path, mode, 0)
        if mode.truncate:
            return NFSFile(client.open(target, "w+b"), path, mode, 0)
        if mode.appending:
            try:
                inner = client.open(target, "r+b")
            except nfs_rs.NfsNotFoundError:
                return NFSFile(client.open(target, "w+b"), path, mode, 0)
            try:
                end = inner.seek(0, io.SEEK_END)
            except BaseException:
                inner.close()
                raise
            return NFSFile(inner, path, mode, end)
        return NFSFile(client.open(target, "r+b" if mode.writing else "rb"), path, mode, 0)

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
    """``nfs://host[:port]/export/dir?version=4.1&uid=0&gid=0&export=/a/b``."""

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
