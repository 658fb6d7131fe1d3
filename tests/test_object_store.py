"""The object-store contract, run alike against SeaweedFS, moto's server and file://."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio

from s3_commit import (
    AsyncObjectStore,
    FileObjectStore,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    open_object_store,
    request_class,
)
from s3_commit.s3_store import MIN_PART_SIZE, S3ObjectStore
from tests.s3_servers import ACCESS_KEY, SECRET_KEY, moto, raw_client, seaweedfs

__all__ = ["moto", "seaweedfs"]  # fixtures, imported so pytest finds them

MakeStore = Callable[..., ObjectStore]


@pytest.fixture(params=["file", "moto", "seaweedfs"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """A factory for empty stores of one backend; S3 options are ignored by file://."""
    if request.param == "file":

        def file_store(prefix: str = "", **_s3_options: Any) -> ObjectStore:
            return FileObjectStore(tmp_path / uuid.uuid4().hex / prefix)

        return file_store
    server = request.getfixturevalue(request.param)
    return server.store  # type: ignore[no-any-return]


def _ops(store: ObjectStore) -> Counter[str]:
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def hook(op: str, nbytes: int) -> None:
        with lock:
            seen[op] += 1
            seen[f"{request_class(op)}-bytes"] += nbytes

    store.traffic_hook = hook
    return seen


def test_put_get_head_range(make_store: MakeStore) -> None:
    store = make_store()
    data = bytes(range(256)) * 40
    etag = store.put("topic/0/obj-1", data)
    assert store.get("topic/0/obj-1") == (data, etag)
    assert store.head("topic/0/obj-1") == ObjectInfo("topic/0/obj-1", len(data), etag)
    assert store.get_range("topic/0/obj-1", 0, 10) == data[:10]
    assert store.get_range("topic/0/obj-1", 1000, 300) == data[1000:1300]
    assert store.get_range("topic/0/obj-1", len(data) - 5, 100) == data[-5:]  # short at the end
    assert store.get_range("topic/0/obj-1", len(data) + 10, 5) == b""  # past the end
    assert store.get("topic/0/missing") is None
    assert store.head("topic/0/missing") is None
    assert store.get_range("topic/0/missing", 0, 4) is None
    assert store.put("topic/0/obj-1", b"v2") != etag  # an unconditional put replaces
    assert store.get("topic/0/obj-1") == (b"v2", store.head("topic/0/obj-1").etag)  # type: ignore[union-attr]


def test_list_prefix_pages_and_delete_many(make_store: MakeStore) -> None:
    store = make_store("tenant/a", list_page_size=7, delete_batch_size=4)
    ops = _ops(store)
    keys = [f"objs/{i:03d}" for i in range(20)] + ["objs.x", "other/1"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * i)
    listed = list(store.list("objs/"))
    assert [o.key for o in listed] == sorted(k for k in keys if k.startswith("objs/"))
    assert [o.size for o in listed] == list(range(20))
    # S3 and file:// list "objs.x" before "objs/000"; SeaweedFS walks its directory tree and
    # lists "objs/" first, so only the key set is compared here.
    assert sorted(o.key for o in store.list("objs")) == sorted(
        k for k in keys if k.startswith("objs")
    )
    assert sorted(o.key for o in store.list()) == sorted(keys)
    assert list(store.list("nothing/")) == []
    if isinstance(store, S3ObjectStore):
        assert ops["ListObjectsV2"] == 3 + 3 + 4 + 1  # 20, 21, 22 and 0 keys in pages of 7
        # The store's prefix is a real key prefix in the bucket.
        raw = raw_client(store.client.meta.endpoint_url)
        found = raw.list_objects_v2(Bucket=store.bucket, Prefix=f"{store.prefix}/objs.")
        assert store.prefix.endswith("tenant/a")
        assert [o["Key"] for o in found["Contents"]] == [f"{store.prefix}/objs.x"]

    store.delete_many([*keys[:10], "objs/never-existed"])
    assert sorted(o.key for o in store.list()) == sorted(keys[10:])
    if isinstance(store, S3ObjectStore):
        assert ops["DeleteObjects"] == 3  # 11 keys in batches of 4
    store.delete_many(keys[10:])
    assert list(store.list()) == []


# moto takes ~10 s for 1100 puts; the S3 page and batch logic is covered with small limits
# above, and the default limits (1000) here on file://.
@pytest.mark.parametrize("make_store", ["file"], indirect=True)
def test_list_and_delete_more_than_a_page(make_store: MakeStore) -> None:
    store = make_store()
    keys = [f"wal-objects/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, k.encode()), keys))
    ops = _ops(store)
    assert [o.key for o in store.list("wal-objects/")] == keys
    if isinstance(store, S3ObjectStore):
        assert ops["ListObjectsV2"] == 2  # S3 pages hold at most 1000 keys
    store.delete_many(keys)
    if isinstance(store, S3ObjectStore):
        assert ops["DeleteObjects"] == 2  # DeleteObjects takes at most 1000 keys
    assert list(store.list("wal-objects/")) == []


def test_multipart_above_threshold(make_store: MakeStore) -> None:
    store = make_store(multipart_threshold=MIN_PART_SIZE + 1, part_size=MIN_PART_SIZE)
    ops = _ops(store)
    data = (bytes(range(251)) * (11 * MIN_PART_SIZE // 251 + 2))[: 2 * MIN_PART_SIZE + 12345]
    etag = store.put("big", data)
    assert store.get("big") == (data, etag)
    edge = MIN_PART_SIZE - 100
    assert store.get_range("big", edge, 200) == data[edge : edge + 200]  # across parts
    head = store.head("big")
    assert head is not None and head.size == len(data)
    small = store.put("small", b"s" * MIN_PART_SIZE)
    if isinstance(store, S3ObjectStore):
        assert etag.strip('"').endswith("-3")  # S3's ETag of a 3-part upload
        assert small.strip('"').isalnum()  # at the threshold: one PutObject
        assert ops["CreateMultipartUpload"] == 1 and ops["CompleteMultipartUpload"] == 1
        assert ops["UploadPart"] == 3 and ops["PutObject"] == 1
        assert ops["put-bytes"] == len(data) + MIN_PART_SIZE

        # A conditional multipart create that loses leaves no upload behind.
        with pytest.raises(PreconditionFailed):
            store.put("big", data, if_none_match=True)
        raw = raw_client(store.client.meta.endpoint_url)
        uploads = raw.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
        assert uploads.get("Uploads", []) == []
        assert store.get("big") == (data, etag)
        replaced = store.put("big", data[::-1], if_match=etag)
        assert store.get("big") == (data[::-1], replaced)


def test_conditional_create_and_replace(make_store: MakeStore) -> None:
    store = make_store()
    etag = store.put("cluster/doc", b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("cluster/doc", b"x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("cluster/doc", b"x", if_match='"0123456789abcdef0123456789abcdef"')
    with pytest.raises(PreconditionFailed):
        store.put("cluster/other", b"x", if_match=etag)  # replace of a missing object
    assert store.get("cluster/doc") == (b"1", etag)
    assert store.get("cluster/other") is None
    etag2 = store.put("cluster/doc", b"2", if_match=etag)
    with pytest.raises(PreconditionFailed):
        store.put("cluster/doc", b"3", if_match=etag)  # that version is gone
    assert store.get("cluster/doc") == (b"2", etag2)


def test_racing_writers_never_lose_an_update(make_store: MakeStore) -> None:
    store = make_store()
    writers, increments = 4, 15
    conflicts = Counter[int]()

    def bump(writer: int) -> None:
        for _ in range(increments):
            while True:
                found = store.get("counter")
                try:
                    if found is None:
                        store.put("counter", b"1", if_none_match=True)
                    else:
                        store.put("counter", str(int(found[0]) + 1).encode(), if_match=found[1])
                    break
                except PreconditionFailed:
                    conflicts[writer] += 1

    threads = [threading.Thread(target=bump, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = store.get("counter")
    assert found is not None and int(found[0]) == writers * increments
    assert sum(conflicts.values()) > 0  # the writers did race


def test_open_object_store_urls(moto: Any, tmp_path: Path) -> None:
    store = open_object_store(f"file://{tmp_path}/objects")
    assert isinstance(store, FileObjectStore) and store.root == tmp_path / "objects"
    bucket = moto.new_bucket()
    s3 = open_object_store(
        f"s3://{bucket}/fleet-1/?endpoint={moto.endpoint}&region=eu-west-1"
        f"&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}&part_size={MIN_PART_SIZE}"
    )
    assert isinstance(s3, S3ObjectStore)
    assert (s3.bucket, s3.prefix, s3.part_size) == (bucket, "fleet-1", MIN_PART_SIZE)
    assert s3.client.meta.region_name == "eu-west-1"
    s3.put("k", b"v")
    raw = raw_client(moto.endpoint)
    assert raw.get_object(Bucket=bucket, Key="fleet-1/k")["Body"].read() == b"v"


class _WatchedStore(FileObjectStore):
    """Records which threads ran the calls and how many overlapped."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.threads: set[int] = set()
        self.running = 0
        self.peak = 0
        self.gate = threading.Lock()

    def put(self, key: str, data: bytes | bytearray | memoryview, **kw: Any) -> str:
        with self.gate:
            self.threads.add(threading.get_ident())
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            threading.Event().wait(0.02)  # hold the thread so that calls overlap
            return super().put(key, data, **kw)
        finally:
            with self.gate:
                self.running -= 1


async def test_async_store_runs_in_bounded_worker_threads(tmp_path: Path) -> None:
    watched = _WatchedStore(tmp_path)
    store = AsyncObjectStore(watched, max_threads=3)
    async with trio.open_nursery() as nursery:
        for i in range(12):
            nursery.start_soon(store.put, f"k/{i:02d}", str(i).encode())
    assert threading.get_ident() not in watched.threads  # never on the event loop's thread
    assert 1 < watched.peak <= 3
    assert [o.key for o in await store.list("k/")] == [f"k/{i:02d}" for i in range(12)]
    assert await store.get_range("k/11", 1, 1) == b"1"
    etag = await store.put("doc", b"a", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("doc", b"b", if_none_match=True)
    assert await store.get("doc") == (b"a", etag)
    assert (await store.head("doc")) == ObjectInfo("doc", 1, etag)
    await store.delete_many(o.key for o in await store.list())
    assert await store.list() == []
