"""NFSFS against a real NFS-Ganesha: opener, namespace ops, errors, append, ranged reads."""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import fs
import fs.errors
import nfs_rs
import pytest
from fs.mode import Mode
from fs.opener.errors import OpenerError

import shared_wal  # noqa: F401  (registers the nfs:// opener)
from shared_wal import storage
from shared_wal.nfs_fs import NFSFS, NFSFile
from tests.nfs_server import GaneshaServer, GaneshaUnavailable


@pytest.fixture(scope="module")
def ganesha() -> Iterator[GaneshaServer]:
    try:
        server = GaneshaServer().start()
    except GaneshaUnavailable as exc:
        pytest.skip(f"NFS-Ganesha cannot start here: {exc}")
    yield server
    server.stop()


@pytest.fixture
def nfs(ganesha: GaneshaServer) -> Iterator[NFSFS]:
    """A fresh directory of the export, opened through the opener."""
    filesystem = fs.open_fs(f"{ganesha.url}/{uuid.uuid4().hex}", create=True)
    assert isinstance(filesystem, NFSFS)
    yield filesystem
    filesystem.close()


def local(ganesha: GaneshaServer, nfs: NFSFS, path: str) -> Any:
    """The server-side file behind ``path`` (to check what reached the disk)."""
    return ganesha.local_subdir / nfs._root.split("/", 1)[1] / path


def test_opener_creates_the_root_and_rejects_bad_urls(ganesha: GaneshaServer) -> None:
    sub = uuid.uuid4().hex
    with pytest.raises(fs.errors.CreateFailed):
        fs.open_fs(f"{ganesha.url}/{sub}/deep")  # missing without create=True
    with storage.open_wal_fs(f"{ganesha.url}/{sub}/deep") as filesystem:
        assert filesystem.listdir("/") == []
        assert (ganesha.local_subdir / sub / "deep").is_dir()
    with pytest.raises(OpenerError):
        fs.open_fs("nfs://127.0.0.1:1/")
    with pytest.raises(fs.errors.CreateFailed):
        fs.open_fs(f"nfs://127.0.0.1:{ganesha.port}/no-such-export/x")


def test_directories_info_and_errors(nfs: NFSFS, ganesha: GaneshaServer) -> None:
    nfs.makedirs("a/b/c")
    nfs.makedirs("a/b", recreate=True)
    with pytest.raises(fs.errors.DirectoryExists):
        nfs.makedirs("a/b")
    with pytest.raises(fs.errors.DirectoryExists):
        nfs.makedir("a")
    with pytest.raises(fs.errors.ResourceNotFound):
        nfs.makedir("x/y")
    nfs.makedir("a/d")
    assert sorted(nfs.listdir("a")) == ["b", "d"]
    nfs.writebytes("a/f.bin", b"12345")
    info = nfs.getinfo("a/f.bin", namespaces=["details"])
    assert (info.name, info.is_dir, info.size) == ("f.bin", False, 5)
    assert info.modified is not None
    on_disk = local(ganesha, nfs, "a/f.bin").stat()
    assert abs(info.modified.timestamp() - on_disk.st_mtime) < 1
    assert nfs.getinfo("a").is_dir and nfs.isdir("a/b") and nfs.isfile("a/f.bin")
    assert nfs.exists("a/f.bin") and not nfs.exists("a/nope")
    with pytest.raises(fs.errors.ResourceNotFound):
        nfs.getinfo("a/nope")
    with pytest.raises(fs.errors.ResourceNotFound):
        nfs.listdir("nope")
    with pytest.raises(fs.errors.DirectoryExpected):
        nfs.listdir("a/f.bin")
    with pytest.raises(fs.errors.FileExpected):
        nfs.remove("a/d")  # NFS REMOVE would delete an empty directory
    with pytest.raises(fs.errors.FileExpected):
        nfs.openbin("a/d")
    with pytest.raises(fs.errors.DirectoryNotEmpty):
        nfs.removedir("a")
    with pytest.raises(fs.errors.DirectoryExpected):
        nfs.removedir("a/f.bin")
    with pytest.raises(fs.errors.ResourceNotFound):
        nfs.remove("a/nope")
    nfs.remove("a/f.bin")
    assert not local(ganesha, nfs, "a/f.bin").exists()
    nfs.removetree("a")
    assert nfs.listdir("/") == []


def test_no_syspath(nfs: NFSFS) -> None:
    nfs.writebytes("f", b"x")
    assert not nfs.hassyspath("f")
    with pytest.raises(fs.errors.NoSysPath):
        nfs.getsyspath("f")


def test_append_goes_to_the_end_and_is_durable_per_write(
    nfs: NFSFS, ganesha: GaneshaServer
) -> None:
    nfs.makedir("w")
    with pytest.raises(fs.errors.ResourceNotFound):
        nfs.openbin("w/missing", "rb")
    with storage.open_for_append(nfs, "w/seg", create=True) as f:
        assert isinstance(f, NFSFile) and storage.real_fileno(f) is None
        assert storage.write_buffers(f, [b"ab", memoryview(b"cd"), b"", b"ef"]) == 6
        # Already on the server's disk before any sync or close.
        assert local(ganesha, nfs, "w/seg").read_bytes() == b"abcdef"
        storage.sync_file(f)
    with pytest.raises(fs.errors.FileExists):
        storage.open_for_append(nfs, "w/seg", create=True)
    with storage.open_for_append(nfs, "w/seg", create=False) as f:
        assert f.tell() == 6
        f.write(b"gh")
    assert nfs.readbytes("w/seg") == b"abcdefgh"
    with storage.open_for_recovery(nfs, "w/seg") as f:
        assert storage.file_size(f) == 8
        f.truncate(3)
        storage.sync_file(f)
    assert local(ganesha, nfs, "w/seg").read_bytes() == b"abc"


def test_one_nfs_write_per_group(nfs: NFSFS, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = NFSFile.write

    def counting(self: NFSFile, data: Any) -> int:
        writes.append(memoryview(data).nbytes)
        return real(self, data)

    monkeypatch.setattr(NFSFile, "write", counting)
    with storage.open_for_append(nfs, "g", create=True) as f:
        storage.write_buffers(f, [bytes([i]) * 1000 for i in range(50)])
    assert writes == [50_000]
    assert nfs.readbytes("g") == b"".join(bytes([i]) * 1000 for i in range(50))


def test_reads_are_ranged(nfs: NFSFS) -> None:
    size = 6 * 1024 * 1024
    blob = bytes(range(256)) * (size // 256)
    nfs.writebytes("big", blob)
    with storage.open_for_read(nfs, "big", buffered=False) as raw:
        assert storage.read_exact_at(raw, 5_000_000, 7) == blob[5_000_000:5_000_007]
        assert raw.tell() == 5_000_007
        assert storage.file_size(raw) == size
    with storage.open_for_read(nfs, "big", buffered=True) as f:
        assert isinstance(f, io.BufferedReader)
        f.seek(100)
        assert f.read(4) == blob[100:104]
        assert f.raw.tell() <= 100 + 1024 * 1024  # read ahead one buffer, not the file
        assert storage.read_exact(f, 3 * 1024 * 1024) == blob[104 : 104 + 3 * 1024 * 1024]
        assert f.seek(0, io.SEEK_END) == size
        assert f.read(10) == b""


def test_concurrent_threads_share_the_client(nfs: NFSFS) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            data = bytes([i]) * (10_000 + i)
            for j in range(5):
                nfs.writebytes(f"t{i}-{j}", data)
                assert nfs.readbytes(f"t{i}-{j}") == data
                assert nfs.getinfo(f"t{i}-{j}", ["details"]).size == len(data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(nfs.listdir("/")) == 40


def test_rename_and_setinfo(nfs: NFSFS) -> None:
    nfs.writebytes("a", b"1")
    nfs.move("a", "b")
    assert nfs.listdir("/") == ["b"]
    nfs.setinfo("b", {"details": {"modified": 1_000_000.0}})
    modified = nfs.getinfo("b", ["details"]).modified
    assert modified is not None and modified.timestamp() == pytest.approx(1_000_000.0)


def test_an_uncertain_close_after_durable_writes_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # CI: "file close completed with errors: Uncertain NFS operation ReplaySensitive" failed a
    # writebytes whose bytes were already on stable storage (every write is durable).
    class Inner:
        def write_at(self, data: bytes, position: int) -> int:
            return len(data)

        def close(self) -> None:
            uncertain = nfs_rs.NfsUncertainOutcomeError(
                message="Uncertain NFS operation ReplaySensitive",
                outcome="uncertain",
                operation_class="replay_sensitive",
                recovery_action="verify_then_resume",
            )
            raise nfs_rs.NfsFileCloseError(
                message="file close completed with errors", errors=(uncertain,)
            )

    f = NFSFile(Inner(), "seg", Mode("wb"), 0)  # type: ignore[arg-type]
    assert f.write(b"abc") == 3
    f.close()
    assert f.closed
    assert "its writes were durable" in caplog.text

    class Broken(Inner):
        def write_at(self, data: bytes, position: int) -> int:
            raise nfs_rs.NfsTimeoutError(message="timed out", outcome="uncertain")

    g = NFSFile(Broken(), "seg", Mode("wb"), 0)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        g.write(b"abc")  # a write that failed is still an error
    g.close()
