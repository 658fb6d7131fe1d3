"""Trio access to a blocking ObjectStore: every call runs in a worker thread.

boto3 and file I/O block, so nothing here touches the store on the event loop. A
`trio.CapacityLimiter` bounds the threads (and so the concurrent requests) per store; callers
that share a budget pass one limiter to several wrappers. A cancelled call still waits for its
thread: abandoning a put would leave its outcome unknown to the caller.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Iterable

import trio

from s3_commit.object_store import ObjectInfo, ObjectStore

__all__ = ["DEFAULT_MAX_THREADS", "AsyncObjectStore"]

DEFAULT_MAX_THREADS = 16


class AsyncObjectStore:
    def __init__(
        self,
        store: ObjectStore,
        *,
        limiter: trio.CapacityLimiter | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        self.store = store
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(max_threads)

    def __repr__(self) -> str:
        return f"AsyncObjectStore({self.store!r})"

    async def get(self, key: str) -> tuple[bytes, str] | None:
        return await trio.to_thread.run_sync(self.store.get, key, limiter=self.limiter)

    async def get_range(self, key: str, start: int, length: int) -> bytes | None:
        return await trio.to_thread.run_sync(
            self.store.get_range, key, start, length, limiter=self.limiter
        )

    async def head(self, key: str) -> ObjectInfo | None:
        return await trio.to_thread.run_sync(self.store.head, key, limiter=self.limiter)

    async def put(
        self,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        call = functools.partial(
            self.store.put, key, data, if_match=if_match, if_none_match=if_none_match
        )
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """The whole listing, fetched page by page in one worker thread."""

        def collect() -> builtins.list[ObjectInfo]:
            return builtins.list(self.store.list(prefix))

        return await trio.to_thread.run_sync(collect, limiter=self.limiter)

    async def delete_many(self, keys: Iterable[str]) -> None:
        batch = builtins.list(keys)  # the iterable may not be safe to consume in a thread
        await trio.to_thread.run_sync(self.store.delete_many, batch, limiter=self.limiter)
