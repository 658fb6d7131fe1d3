"""A zone proxy's copies of the cluster's small documents (ACLs, SCRAM credentials, client
quotas): each read from the metadata store every few seconds, so that every decision that
needs one is taken in the zone, never by a round trip to a main in another.

A document is parsed only when its ETag changed since the last read (a large ACL document
would otherwise cost the event loop a parse on every refresh, which shows in produce
latency); a document that is not there reads as None, every time. A failed read or a corrupt
document keeps the copy in force and logs one line per refresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, TypeVar

import trio

from kafka_wire.security_docs import SecurityDocError, doc_key
from s3_commit import AsyncObjectStore, ObjectStoreError

__all__ = ["follow_document"]

log = logging.getLogger("zonefleet.proxy.documents")

T = TypeVar("T")


async def follow_document(
    store: AsyncObjectStore,
    name: str,
    parse: Callable[[bytes | None], T],
    apply: Callable[[T], None],
    period_s: float,
) -> NoReturn:
    """Reads document `name` now and every `period_s`, and passes each new copy through
    `parse` (bytes, or None when there is none; SecurityDocError if corrupt) to `apply`."""
    key = doc_key(name)
    etag_read: str | None = None
    while True:
        try:
            found = await store.get(key)
            etag = None if found is None else found[1]
            if etag is None or etag != etag_read:
                apply(parse(None if found is None else found[0]))
                etag_read = etag
        except (ObjectStoreError, SecurityDocError) as exc:
            log.warning("%s not refreshed from %s: %s", name, key, exc)
        await trio.sleep(period_s)
