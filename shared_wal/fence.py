"""Fencing a WAL writer through the shared file system: another node takes a writer's
partitions over without the writer's cooperation (it is dead, or only paused).

The taker creates `wal/<writer-id>/FENCED` (docs/formats.md, "WAL fence") before it reads the
writer's WAL. A writer with fence checks on looks for that file after every group commit's
fsync and before anything in the group counts as durable: found, the group fails with
`WalFenced`, and so does every later one. Both sides go through the one NFS server, so either
the writer's check came first (and its group is already in the file the taker reads next) or
the check sees the fence (and nothing of the group is acknowledged). No clocks are involved.

The file stays until the writer's next incarnation lifts it, once nothing is taken over from
it any more (main_broker/cluster/role.py).

Bytes: {"format": 1, "writer": str, "by": int, "at_ms": int, "reason": str}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from shared_wal import storage
from shared_wal.record import WalError

__all__ = [
    "FENCE_NAME",
    "WalFence",
    "WalFenced",
    "fence_path",
    "fence_writer",
    "is_fenced",
    "lift_fence",
    "read_fence",
]

FORMAT = 1
FENCE_NAME = "FENCED"


class WalFenced(WalError):
    """Another node fenced this writer: nothing it writes from now on may be acknowledged."""


@dataclass(frozen=True, slots=True)
class WalFence:
    writer: str
    by: int  # the node id of the taker
    at_ms: int
    reason: str

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "writer": self.writer,
            "by": self.by,
            "at_ms": self.at_ms,
            "reason": self.reason,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> WalFence:
        try:
            raw: Any = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"WAL fence is not JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError("not a format-1 WAL fence")
        writer, by, at_ms, reason = (raw.get(k) for k in ("writer", "by", "at_ms", "reason"))
        if not (
            isinstance(writer, str)
            and isinstance(by, int)
            and isinstance(at_ms, int)
            and isinstance(reason, str)
        ):
            raise ValueError("WAL fence fields have the wrong types")
        return cls(writer, by, at_ms, reason)


def fence_path(writer_id: str) -> str:
    return f"{storage.wal_dir(writer_id)}/{FENCE_NAME}"


def fence_writer(
    filesystem: storage.FS, writer_id: str, by: int, reason: str
) -> tuple[WalFence, bool]:
    """Blocking: fence `writer_id`; (the fence, whether this call made it). Idempotent: a
    fence already there stays as it was. Its name is durable before this returns, so a check
    that follows sees it."""
    path = fence_path(writer_id)
    if filesystem.exists(path):
        found = read_fence(filesystem, writer_id)
        if found is not None:
            return found, False
    fence = WalFence(writer_id, by, int(time.time() * 1000), reason)
    filesystem.makedirs(storage.wal_dir(writer_id), recreate=True)
    with filesystem.openbin(path, "wb") as f:
        f.write(fence.to_bytes())
        storage.sync_file(f)
    storage.sync_dir(filesystem, storage.wal_dir(writer_id))
    return fence, True


def is_fenced(filesystem: storage.FS, writer_id: str) -> bool:
    return bool(filesystem.exists(fence_path(writer_id)))


def read_fence(filesystem: storage.FS, writer_id: str) -> WalFence | None:
    """The fence on `writer_id`, None when there is none; an unreadable one still fences (a
    placeholder says so)."""
    try:
        data = filesystem.readbytes(fence_path(writer_id))
    except storage.ResourceNotFound:
        return None
    try:
        return WalFence.from_bytes(data)
    except ValueError as exc:
        return WalFence(writer_id, -1, 0, f"unreadable fence file: {exc}")


def lift_fence(filesystem: storage.FS, writer_id: str) -> None:
    try:
        filesystem.remove(fence_path(writer_id))
    except storage.ResourceNotFound:
        return
    storage.sync_dir(filesystem, storage.wal_dir(writer_id))
