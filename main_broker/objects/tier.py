"""The main broker's object tier: uploads committed WAL data into S3 objects, commits them to
its manifest, and serves reads the WAL no longer can.

Commit order (issue 4, "Commit and trim"): PUT the objects, then commit the manifest delta by
compare-and-swap, and only then count the data as in S3 (uploaded ends, the partition's object
ranges, the WAL retention floor). A failure anywhere before the CAS leaves the data in the WAL
and maybe orphaned objects, which the periodic sweep deletes once no manifest lists them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

__all__ = ["ObjectTier", "TieredBatchReader"]

import trio

from kafka_wire.fetch_serving import read_failures_fail_the_partition
from main_broker.links_floor import links_floor
from main_broker.objects.cleaner import LogCleaner
from main_broker.objects.compaction import Compactor
from main_broker.objects.upload import PartitionUpload, UploadTracker, retention_floor
from main_broker.partition_log import BatchEntry, ObjectSpan, PartitionLog
from s3_commit import AsyncObjectStore, ObjectStore, ObjectStoreError, open_object_store
from s3_commit.manifest import (
    Manifest,
    StreamManifest,
    StreamShare,
    UploadedObject,
    new_object_id,
)
from s3_commit.manifest_store import ManifestStore, sweep_orphans
from s3_commit.object_format import DEFAULT_BLOCK_SIZE
from s3_commit.object_plan import DEFAULT_SPLIT_SIZE, plan_upload
from s3_commit.object_reader import ObjectReader
from s3_commit.object_store import request_class
from shared_wal.batch_reader import BatchReader, StoredBatch

if TYPE_CHECKING:
    from main_broker.accounting import MainTraffic
    from main_broker.config import BrokerConfig
    from main_broker.log_store import LogStore
    from telemetry import MetricsRegistry

log = logging.getLogger("zonefleet.main_broker.objects")

Buffer = bytes | bytearray | memoryview

# An upload of 500 MiB goes up in 5 parts: with S3's request prices what matters is PUTs per
# GB, so parts are large (docs/performance.md has the arithmetic).
UPLOAD_PART_SIZE = 100 << 20
MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
IDLE_POLL_S = 1.0
PUBLISH_WAIT_S = 1.0


class TierHost(Protocol):
    """What the tier uses of its broker (`main_broker.broker.MainBroker` is one)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def registry(self) -> MetricsRegistry: ...

    @property
    def store(self) -> LogStore: ...

    @property
    def traffic(self) -> MainTraffic: ...


class ObjectTier:
    def __init__(self, broker: TierHost, store: ObjectStore) -> None:
        cfg = broker.config
        self.broker = broker
        self.config = cfg
        self.store = store
        self.astore = AsyncObjectStore(store, max_threads=8)
        self.manifests = ManifestStore(self.astore, cfg.node_id)
        self.reader = ObjectReader(self.astore, block_cache_bytes=cfg.object_cache_bytes)
        self.tracker = UploadTracker()
        self.split_size = DEFAULT_SPLIT_SIZE
        self.block_size = DEFAULT_BLOCK_SIZE
        self.uploads = 0
        self.objects_uploaded = 0
        self.bytes_uploaded = 0
        self.failures = 0
        self.orphans_deleted = 0
        self.last_error: str | None = None
        self.last_upload_at: float | None = None
        self._last_attempt = time.monotonic()
        self._upload_soon = False
        self._requests = {"put": 0, "get": 0}
        self._request_bytes = {"put": 0, "get": 0}
        self._lock = threading.Lock()
        self.upload_done = trio.Event()  # replaced after each committed upload (tests wait)
        store.traffic_hook = self._on_request
        self._register_metrics()
        self.compaction = Compactor(self)
        self.cleaner = LogCleaner(self)

    # -- start -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, broker: TierHost) -> ObjectTier:
        """Open the store and load this main's manifest; install the read path on the store.

        Runs before the WAL replays, so every partition replay or topic creation makes learns
        its committed objects at once (a restart with an empty WAL continues after them).
        """
        url = broker.config.object_store_url
        assert url is not None
        store = await trio.to_thread.run_sync(
            lambda: open_object_store(
                url, part_size=UPLOAD_PART_SIZE, multipart_threshold=UPLOAD_PART_SIZE
            )
        )
        tier = cls(broker, store)
        manifest = await tier._load_manifest()
        tier.tracker.load({key: s.end_offset for key, s in manifest.streams.items()})
        log.info(
            "object manifest %s: %d streams, %d objects",
            tier.manifests.key,
            len(manifest.streams),
            len(manifest.keys()),
            extra={"node": broker.config.node_id},
        )
        log_store = broker.store
        log_store.manifest = manifest
        log_store.attach_objects(tier)
        log_store.batches = TieredBatchReader(log_store.reader.fs, tier, own=log_store.reader)
        return tier

    async def _load_manifest(self) -> Manifest:
        """The manifest, waiting out an unreachable store: without it the main cannot know
        which offsets are committed in objects, so it does not serve until it has it. A
        manifest that does not parse is not waited on: that needs an operator."""
        backoff = MIN_BACKOFF_S
        while True:
            try:
                manifest = await self.manifests.load()
                self.last_error = None
                return manifest
            except (ObjectStoreError, OSError) as exc:
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "cannot read manifest %s (retrying in %.1f s; not serving until then): %s",
                    self.manifests.key,
                    backoff,
                    exc,
                    extra={"node": self.config.node_id},
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def upload_soon(self) -> None:
        """Upload what is pending without waiting for the interval: after a takeover, whose
        tail (un-uploaded at the dead main, perhaps for a whole interval) the next takeover of
        the partition would otherwise scan and copy again, and the WAL holds meanwhile."""
        self._upload_soon = True
        self.broker.store.notify_data()

    def adopt(self, plog: PartitionLog) -> bool:
        return plog.adopt_objects(self.manifests.manifest.stream(plog.topic_id, plog.partition))

    # -- the background task -----------------------------------------------------------------

    async def run(self) -> None:
        cfg = self.config
        backoff = MIN_BACKOFF_S
        next_sweep = time.monotonic() + cfg.orphan_sweep_interval_s
        self._update_links_floor()  # what replay noted may already be in objects
        async with trio.open_nursery() as nursery:
            self.reader.nursery = nursery
            while True:
                arrived = self.broker.store.data_arrived
                pending = self.tracker.observe(self._owned())
                self._update_floor()
                now = time.monotonic()
                due = pending > 0 and (
                    self._upload_soon
                    or pending >= cfg.upload_threshold_bytes
                    or now - self._last_attempt >= cfg.upload_interval_s
                )
                uploaded = False
                if due:
                    self._last_attempt = now
                    self._upload_soon = False
                    try:
                        await self.upload_once()
                        backoff = MIN_BACKOFF_S
                        # More may be pending past one upload's cap; but the sweep, compaction
                        # and retired-object deletion below get their turn between uploads, or
                        # constant produce would starve them.
                        uploaded = True
                    except Exception as exc:  # the WAL keeps the data: log and retry
                        self.failures += 1
                        self.last_error = f"{type(exc).__name__}: {exc}"
                        log.warning("upload failed, retrying in %.1fs: %s", backoff, exc)
                        await trio.sleep(backoff)
                        backoff = min(backoff * 2, MAX_BACKOFF_S)
                        self._last_attempt = 0.0  # retry as soon as the backoff ends
                        continue
                if now >= next_sweep:
                    next_sweep = now + cfg.orphan_sweep_interval_s
                    await self.sweep()
                compacted = await self.compaction.tick(now)
                if await self.cleaner.tick(now) or compacted or uploaded:
                    continue  # another job or upload may follow at once
                with trio.move_on_after(min(IDLE_POLL_S, cfg.upload_interval_s)):
                    await arrived.wait()
                # Let produce fill a bit more before looking again.
                await trio.sleep(min(0.05, cfg.upload_interval_s))

    def _owned(self) -> Iterator[PartitionLog]:
        for topic in self.broker.store.topics.values():
            for plog in topic.partitions:
                if plog.owned:
                    yield plog

    def _update_floor(self) -> None:
        store = self.broker.store
        store.wal.retention_floor = retention_floor(
            self._owned(), self.tracker.uploaded_end, store.wal.end_offset
        )

    def _update_links_floor(self) -> None:
        # A full pass over the un-uploaded entries, once per upload: between uploads LINK
        # appends only lower the floors (LogStore.note_link).
        store = self.broker.store
        store.set_links_floor(links_floor(self._owned(), self.tracker.uploaded_end))

    async def upload_once(self) -> int:
        """One upload of the pending committed batches: PUT objects, commit the manifest;
        returns the bytes of batches committed."""
        # A partition being moved away is frozen: its new leader takes its manifest stream
        # and WAL tail as they are (main_broker/cluster/handoff.py).
        movable = (p for p in self._owned() if not p.fenced)
        parts = self.tracker.select(movable, self.config.upload_threshold_bytes)
        if not parts:
            return 0
        store = self.broker.store
        streams: dict[int, list[Buffer]] = {}
        by_stream: dict[int, PartitionUpload] = {}
        for part in parts:
            if part.stream_id in by_stream:
                continue  # two topics share a stream id prefix: the next upload takes it
            streams[part.stream_id] = await store.batches.batches_bytes(part.entries)
            by_stream[part.stream_id] = part
        plan = plan_upload(streams, self.split_size, new_object_id)
        uploaded: list[UploadedObject] = []
        nbytes = 0
        for obj in plan.objects:
            data = await trio.to_thread.run_sync(
                lambda o=obj: o.encode(self.block_size).to_bytes()  # type: ignore[misc]
            )
            await self.astore.put(obj.key, data)
            shares = tuple(
                _share(by_stream[r.stream_id], r.start_offset, r.end_offset) for r in obj.ranges
            )
            uploaded.append(UploadedObject(obj.key, len(data), shares))
            nbytes += len(data)
        manifest = await self.manifests.update(lambda m: m.with_upload(uploaded))
        committed = list(by_stream.values())
        # One state frame carries the new ranges and the log starts they moved.
        store.set_manifest(manifest)
        for part in committed:
            if part.plog.adopt_objects(manifest.stream(part.plog.topic_id, part.plog.partition)):
                store.partition_moved(part.plog)
        # Proxies learn of the objects before the WAL below them may go (issue 4: commit,
        # publish, then trim); a stuck subscriber delays the trim only this long.
        if not await store.wait_manifest_published(manifest.version, PUBLISH_WAIT_S):
            log.info("WAL trim goes ahead of proxies lacking manifest %d", manifest.version)
        self.tracker.committed(committed)
        self._update_floor()
        self._update_links_floor()
        # A segment per upload: the next one's head SNAPSHOT sits about where this upload
        # ended, so a takeover after this main's death scans about one upload interval of
        # its WAL, not up to a whole segment (main_broker/cluster/handoff.py _scan_start),
        # and uploaded segments go sooner.
        store.wal.roll_soon()
        self.uploads += 1
        self.objects_uploaded += len(uploaded)
        self.bytes_uploaded += nbytes
        self.last_upload_at = time.time()
        self.last_error = None
        self.upload_done.set()
        self.upload_done = trio.Event()
        log.info(
            "uploaded %d objects (%d bytes, %d partitions), manifest version %d",
            len(uploaded),
            nbytes,
            len(committed),
            manifest.version,
        )
        return sum(p.nbytes for p in committed)

    async def sweep(self) -> list[str]:
        try:
            gone = await sweep_orphans(self.astore, int(self.config.orphan_grace_s * 1000))
        except (ObjectStoreError, OSError, ValueError) as exc:
            log.warning("orphan sweep failed: %s", exc)
            return []
        self.orphans_deleted += len(gone)
        self.reader.evict(gone)
        return gone

    # -- reads -------------------------------------------------------------------------------

    async def read_span(self, span: ObjectSpan[StreamManifest]) -> list[memoryview]:
        stream_id = span.stream_id
        if span.timestamp is not None:
            rng = span.stream.find(span.base_offset)
            if rng is None:
                return []
            found = await self.reader.first_batch_at_timestamp(
                span.stream, stream_id, rng, span.timestamp, span.end
            )
            if found is None:
                return []
            view, info = found
            span.base_offset, span.max_timestamp = info.base_offset, info.max_timestamp
            return [view]
        return await self.reader.read(
            span.stream, stream_id, span.base_offset, span.end, span.size, span.must_return_one
        )

    # -- state -------------------------------------------------------------------------------

    def _on_request(self, op: str, nbytes: int) -> None:
        kind = request_class(op)
        with self._lock:
            self._requests[kind] += 1
            self._request_bytes[kind] += nbytes
        self.broker.traffic.s3_request(op, nbytes)

    def status(self) -> dict[str, Any]:
        return {
            "manifest_version": self.manifests.manifest.version,
            "objects": len(self.manifests.manifest.keys()),
            "uploaded_end": {
                f"{key.topic_id.hex()}/{key.partition}": end
                for key, end in sorted(self.tracker.uploaded_end.items())
            },
            "pending_bytes": self.tracker.pending_bytes,
            "uploads": self.uploads,
            "objects_uploaded": self.objects_uploaded,
            "bytes_uploaded": self.bytes_uploaded,
            "put_requests": self._requests["put"],
            "get_requests": self._requests["get"],
            "failures": self.failures,
            "last_error": self.last_error,
            "last_upload_at": self.last_upload_at,
            "orphans_deleted": self.orphans_deleted,
            "compaction": self.compaction.status(),
            "cleaner": self.cleaner.status(),
            "block_cache_bytes": self.reader.cached_bytes,
            "wal_retention_floor": self.broker.store.wal.retention_floor,
            "links_floor": dict(self.broker.store.links_floor),
        }

    def _register_metrics(self) -> None:
        registry = self.broker.registry
        gauges = {
            "zonefleet_s3_pending_upload_bytes": (
                "Committed bytes not yet in S3 objects.",
                lambda: float(self.tracker.pending_bytes),
            ),
            "zonefleet_s3_uploads": ("Uploads committed to the manifest.", lambda: self.uploads),
            "zonefleet_s3_uploaded_bytes": (
                "Object bytes uploaded and committed.",
                lambda: self.bytes_uploaded,
            ),
            "zonefleet_s3_upload_failures": ("Uploads that failed.", lambda: self.failures),
            "zonefleet_s3_put_requests": (
                "PUT-class S3 requests made.",
                lambda: self._requests["put"],
            ),
            "zonefleet_s3_get_requests": (
                "GET-class S3 requests made.",
                lambda: self._requests["get"],
            ),
        }
        registry.gauge_functions({**gauges, **self.reader.gauges()})


def _share(part: PartitionUpload, start: int, end: int) -> StreamShare:
    share = part.share()
    if (share.start, share.end) != (start, end):
        raise ValueError(
            f"{part.plog.topic}/{part.plog.partition}: planned [{start}, {end}) but the batches "
            f"span [{share.start}, {share.end})"
        )
    return share


class TieredBatchReader(BatchReader):
    """The main's batch reader with the object tier behind it: `ObjectSpan` entries of a
    fetch slice are read from committed objects, every other entry from memory or the WAL."""

    def __init__(self, fs: Any, tier: ObjectTier, own: Any) -> None:
        super().__init__(fs, own=own)
        self.tier = tier

    async def batch_bytes(self, entry: StoredBatch) -> Buffer:
        if isinstance(entry, ObjectSpan):
            views = await self._read_span(entry)
            return b"".join(views) if len(views) != 1 else views[0]
        return await super().batch_bytes(entry)

    async def batches_bytes(self, entries: Sequence[StoredBatch]) -> list[Buffer]:
        if not any(isinstance(e, ObjectSpan) for e in entries):
            return await super().batches_bytes(entries)
        out: list[Buffer] = []
        for entry in entries:
            if isinstance(entry, ObjectSpan):
                out.extend(await self._read_span(entry))
            else:
                out.extend(await super().batches_bytes([cast(BatchEntry, entry)]))
        return out

    async def _read_span(self, span: ObjectSpan[StreamManifest]) -> list[memoryview]:
        what = f"offsets {span.base_offset}..{span.end - 1} of stream {span.stream_id:016x}"
        with read_failures_fail_the_partition(log, f"{what} from objects"):
            return await self.tier.read_span(span)
