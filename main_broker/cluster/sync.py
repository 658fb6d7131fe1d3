"""Keeps a main broker's copy of the cluster metadata document in step with the object store.

Writers change the document only by compare-and-swap and retry on PreconditionFailed, so two
mains creating topics at once both succeed (or one gets TOPIC_ALREADY_EXISTS). Readers poll at
`poll_interval_s`; a main that changed the document also pokes its peers so they need not wait.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import trio

from main_broker.cluster.doc import ClusterDoc, DocFormatError
from s3_commit import ConditionalPutUnknown, ObjectStore, ObjectStoreError, PreconditionFailed

log = logging.getLogger("zonefleet.main_broker.cluster")

DOC_KEY = "cluster/metadata.json"
MAX_CAS_ATTEMPTS = 50


class ClusterMetadata:
    def __init__(
        self,
        store: ObjectStore,
        cluster_id: str,
        on_change: Callable[[ClusterDoc], Awaitable[None]],
        poll_interval_s: float = 0.5,
    ) -> None:
        self.store = store
        self.doc = ClusterDoc(cluster_id)
        self.etag: str | None = None
        self.exists = False
        self.on_change = on_change
        self.poll_interval_s = poll_interval_s
        self._limiter = trio.CapacityLimiter(1)
        self._poked = trio.Event()
        # trio.current_time() when the latest successful read of the document began: a main
        # whose copy may be older than its fence window stops acknowledging (handoff.py).
        self.read_started: float | None = None

    async def _load(self) -> tuple[ClusterDoc, str | None, bool]:
        found = await trio.to_thread.run_sync(self.store.get, DOC_KEY, limiter=self._limiter)
        if found is None:
            return ClusterDoc(self.doc.cluster_id), None, False
        data, etag = found
        return ClusterDoc.from_bytes(data), etag, True

    async def refresh(self) -> bool:
        """Re-read the document; apply it (and return True) when it changed."""
        started = trio.current_time()
        doc, etag, exists = await self._load()
        self.read_started = started
        if etag == self.etag and exists == self.exists:
            return False
        self.doc, self.etag, self.exists = doc, etag, exists
        await self.on_change(doc)
        return True

    async def update(self, change: Callable[[ClusterDoc], ClusterDoc]) -> ClusterDoc:
        """Apply `change` by compare-and-swap; it may raise to refuse the change."""
        for _ in range(MAX_CAS_ATTEMPTS):
            started = trio.current_time()
            doc, etag, exists = await self._load()
            self.read_started = started
            new = change(doc)
            data = new.to_bytes()
            try:
                put = functools.partial(
                    self.store.put, DOC_KEY, data, if_match=etag, if_none_match=not exists
                )
                new_etag = await trio.to_thread.run_sync(put, limiter=self._limiter)
            except PreconditionFailed:
                await trio.sleep(0.01)
                continue
            except ConditionalPutUnknown:
                # The put may have gone through with its answer lost: it did when the stored
                # document is ours (a version number and content no one else would write).
                stored, stored_etag, _ = await self._load()
                if stored_etag is None or stored.to_bytes() != data:
                    continue
                new_etag = stored_etag
            self.doc, self.etag, self.exists = new, new_etag, True
            await self.on_change(new)
            return new
        raise ObjectStoreError(f"gave up updating {DOC_KEY} after {MAX_CAS_ATTEMPTS} conflicts")

    def poke(self) -> None:
        self._poked.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.refresh()
        task_status.started()
        while True:
            with trio.move_on_after(self.poll_interval_s):
                await self._poked.wait()
            self._poked = trio.Event()
            try:
                await self.refresh()
            except (OSError, ObjectStoreError, DocFormatError) as exc:
                log.warning("cannot read the cluster metadata, keeping the last copy: %s", exc)
