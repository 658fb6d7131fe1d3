"""A main broker's manifest in the object store, changed only by compare-and-swap, and the
orphan sweep that reads every manifest.

The owner is the only writer of its manifest, so it keeps the ETag of its last write and
normally commits with one conditional PUT and no GET; a lost race (PreconditionFailed) or a
put whose outcome is unknown (ConditionalPutUnknown) re-reads and re-applies the change, which
is idempotent (`Manifest.with_upload` returns the manifest unchanged when the upload is there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from s3_commit.async_store import AsyncObjectStore
from s3_commit.manifest import MANIFEST_PREFIX, Manifest, manifest_key, orphan_keys
from s3_commit.object_plan import DATA_PREFIX
from s3_commit.object_store import ConditionalPutUnknown, ObjectStoreError, PreconditionFailed
from telemetry.pause_points import pause_point

__all__ = ["MAX_CAS_ATTEMPTS", "ManifestStore", "referenced_keys", "sweep_orphans"]

log = logging.getLogger("zonefleet.s3_commit.manifest")

MAX_CAS_ATTEMPTS = 20


class ManifestStore:
    def __init__(self, store: AsyncObjectStore, node_id: int) -> None:
        self.store = store
        self.key = manifest_key(node_id)
        self.manifest = Manifest(node_id)
        self.etag: str | None = None
        self.exists = False
        self.puts = 0
        # Upload, compaction and retention commit from different tasks: one CAS at a time, so
        # each sees the manifest the previous one left and the committed versions go in order.
        self._lock = trio.Lock()

    async def load(self) -> Manifest:
        found = await self.store.get(self.key)
        if found is None:
            self.manifest, self.etag, self.exists = Manifest(self.manifest.node_id), None, False
        else:
            data, etag = found
            self.manifest, self.etag, self.exists = Manifest.from_bytes(data), etag, True
        return self.manifest

    async def update(self, change: Callable[[Manifest], Manifest]) -> Manifest:
        """Apply `change` (pure, idempotent) by CAS; it may raise to refuse the change."""
        async with self._lock:
            return await self._update(change)

    async def _update(self, change: Callable[[Manifest], Manifest]) -> Manifest:
        for _ in range(MAX_CAS_ATTEMPTS):
            new = change(self.manifest)
            if new is self.manifest:
                return new
            pause_point("after_upload")  # crash tests: the change's objects are in, unlisted
            try:
                self.puts += 1
                etag = await self.store.put(
                    self.key, new.to_bytes(), if_match=self.etag, if_none_match=not self.exists
                )
            except (PreconditionFailed, ConditionalPutUnknown) as exc:
                log.info("manifest %s changed under us (%s), re-reading", self.key, exc)
                await self.load()
                await trio.sleep(0.01)
                continue
            pause_point("after_manifest")
            self.manifest, self.etag, self.exists = new, etag, True
            return new
        raise ObjectStoreError(f"gave up updating {self.key} after {MAX_CAS_ATTEMPTS} conflicts")


async def referenced_keys(store: AsyncObjectStore, skip: str | None = None) -> set[str]:
    """Every object key any main's manifest (but the one at key `skip`) lists or retired.
    Raises on an unreadable manifest: a sweep that cannot see every reference must delete
    nothing."""
    keys: set[str] = set()
    for info in await store.list(MANIFEST_PREFIX):
        if info.key == skip:
            continue
        found = await store.get(info.key)
        if found is not None:
            keys |= Manifest.from_bytes(found[0]).referenced_keys()
    return keys


async def sweep_orphans(
    store: AsyncObjectStore, grace_ms: int, now_ms: int | None = None
) -> list[str]:
    """Delete data objects that no manifest lists and that are older than `grace_ms` (an
    upload crashed or failed between its PUT and its manifest commit); returns their keys.

    The listing of data objects comes before reading the manifests, so an object committed
    meanwhile is seen as referenced.
    """
    listed = [info.key for info in await store.list(DATA_PREFIX)]
    referenced = await referenced_keys(store)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    orphans = orphan_keys(listed, referenced, now, grace_ms)
    if orphans:
        await store.delete_many(orphans)
        log.info("deleted %d orphaned objects", len(orphans))
    return orphans
