"""Where a main keeps small whole documents that belong to the cluster (ACLs, SCRAM credentials).

Two places, one interface (`DocumentStore`):

- `ObjectDocuments`: with several mains (a metadata store), each document is an object next to
  the cluster metadata document, `cluster/<name>.json`, created with If-None-Match and replaced
  with If-Match of the copy the change was computed from, as `cluster_sync` does for the
  metadata document. Every main reads the same object, so each sees the others' changes.
- `WalDocuments`: a lone main (no metadata store) writes each new version as one CONTROL
  record on its own WAL (`LogStore.put_document`); replay and SNAPSHOT records bring it back
  after a restart, as they do its topics.

A change is a function of the current bytes (None: no document yet) that returns the new
bytes, or None to leave the document as it is; it may run more than once under contention.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from kafka_wire.security_docs import DOC_PREFIX, doc_key
from s3_commit import AsyncObjectStore, ConditionalPutUnknown, ObjectStoreError, PreconditionFailed

if TYPE_CHECKING:
    from main_broker.log_store import LogStore

__all__ = ["DOC_PREFIX", "MAX_CAS_ATTEMPTS", "DocumentStore", "ObjectDocuments", "WalDocuments"]

log = logging.getLogger("zonefleet.main_broker.docs")

MAX_CAS_ATTEMPTS = 50

Change = Callable[[bytes | None], bytes | None]


class DocumentStore(Protocol):
    async def load(self, name: str) -> bytes | None:
        """The stored document, read now (None: there is none)."""
        ...

    async def update(self, name: str, change: Change) -> bytes | None:
        """Apply `change` atomically; returns the document as stored afterwards."""
        ...


class ObjectDocuments:
    def __init__(self, store: AsyncObjectStore, prefix: str = DOC_PREFIX) -> None:
        self.store = store
        self.prefix = prefix
        self._lock = trio.Lock()  # this main's own writers take turns instead of conflicting

    def key(self, name: str) -> str:
        return doc_key(name, self.prefix)

    async def load(self, name: str) -> bytes | None:
        found = await self.store.get(self.key(name))
        return None if found is None else found[0]

    async def update(self, name: str, change: Change) -> bytes | None:
        key = self.key(name)
        async with self._lock:
            for _ in range(MAX_CAS_ATTEMPTS):
                found = await self.store.get(key)
                current, etag = (None, None) if found is None else found
                new = change(current)
                if new is None:
                    return current
                try:
                    if etag is None:
                        await self.store.put(key, new, if_none_match=True)
                    else:
                        await self.store.put(key, new, if_match=etag)
                except PreconditionFailed:
                    await trio.sleep(0.01)
                    continue
                except ConditionalPutUnknown:
                    # The put may have gone through with its answer lost: it did if the stored
                    # bytes are ours (each version carries a version number one higher).
                    stored = await self.store.get(key)
                    if stored is None or stored[0] != new:
                        continue
                return new
        raise ObjectStoreError(f"gave up updating {key} after {MAX_CAS_ATTEMPTS} conflicts")


class WalDocuments:
    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._lock = trio.Lock()

    async def load(self, name: str) -> bytes | None:
        return self.store.documents.get(name)

    async def update(self, name: str, change: Change) -> bytes | None:
        async with self._lock:
            current = self.store.documents.get(name)
            new = change(current)
            if new is None:
                return current
            await self.store.put_document(name, new)
            return new
