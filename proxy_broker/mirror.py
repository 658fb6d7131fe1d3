"""A proxy's mirror of one main broker: its topics and partition states from the main's state
stream, and its batches from tailing the main's WAL on the shared file system.

The mirror never exposes an offset above the high watermark the main published (invariant 5),
nor above what it has tailed: `visible_end` is the smaller of the two.

Below what the WAL mirror holds, it reads the main's committed objects: the state stream also
carries the main's object manifest (whole on subscribe, then the streams each upload changed),
and a fetch at an offset the objects hold that the mirror has no bytes in memory for is
answered from them (proxy_broker/object_reads.py). The main trims its WAL only below what its
manifest lists, so the objects hold every offset the trimmed WAL held.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

import trio
from kio.schema.errors import ErrorCode

from internal_rpc import RpcClient, RpcError
from internal_rpc.messages import MalformedMessage
from internal_rpc.state_frames import ObjectStreamRow, PartitionRow, StateFrame, StateSubscription
from kafka_wire.record_batch import assign_offsets, parse_batch_header, stamp_log_append_time
from proxy_broker.config import MainEndpoint
from proxy_broker.object_reads import ObjectSpan, ProxyObjects
from s3_commit.manifest import Manifest, StreamManifest
from s3_commit.manifest_delta import apply_manifest_rows
from s3_commit.object_format import stream_id_for
from shared_wal import OffsetOutOfRange, RecordType, WalError, WalPosition, WalRecord
from shared_wal.batch_index import BatchEntry, BatchIndex
from shared_wal.batch_reader import BatchReader
from shared_wal.broker_records import PreparedLink, rebuild_linked_batch

log = logging.getLogger("zonefleet.proxy.mirror")

TAIL_CHUNK_BYTES = 4 * 1024 * 1024  # of the main's own WAL records per tail read
# A mirror that a fetch read within READ_ACTIVE_S tails every end the main publishes (every
# few ms under load); one nobody reads catches up at most every IDLE_TAIL_S, and at once when
# a fetch comes. Tailing (a frame, a worker call, a read) per published end cost an unread
# proxy a sixth of a core at 1000 produce requests per second.
READ_ACTIVE_S = 2.0
IDLE_TAIL_S = 0.25
PREFETCH_CACHE_SHARE = 4  # one chunk prefetches at most this fraction of the cache budget
RESUBSCRIBE_BACKOFF_S = (0.1, 2.0)


class ManifestMirrorError(Exception):
    """The state stream's manifest rows do not apply to the manifest mirrored so far."""


class MirrorPartition:
    """What the proxy knows of one partition led by a main; serves Fetch from its index."""

    def __init__(
        self, topic: str, partition: int, owner: int, on_read: Callable[[], None] | None = None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.owner = owner
        self.on_read = on_read  # tells the mirror a consumer reads it (it then tails eagerly)
        self.owned = True  # the proxy serves a partition only from its leader's mirror
        self.leader_epoch = 0
        self.high_watermark = 0
        self.last_stable_offset = 0
        self.log_start_offset = 0
        self.next_offset = 0
        self.index = BatchIndex()
        # The main's aborted transactions of this partition: (producer id, first offset,
        # last offset), by last offset (main_broker/partition_txns.py).
        self.aborted: tuple[tuple[int, int, int], ...] = ()
        # The main's committed objects of this partition (None: no object store, or none yet).
        self.objects: StreamManifest | None = None
        self.stream_id = 0

    def apply(self, row: PartitionRow) -> None:
        if type(row) is not PartitionRow:
            row = PartitionRow(*row)  # a plain 7-element row (tests build them by hand)
        self.leader_epoch = row.leader_epoch
        self.high_watermark = row.high_watermark
        self.last_stable_offset = row.last_stable_offset
        self.log_start_offset = row.log_start_offset
        self.next_offset = row.log_end_offset

    def take_over(self, start: int) -> None:
        """The main took the partition over from another main (a `takeover` record in its
        WAL): as its own log (PartitionLog.reset_for_takeover), the mirror's restarts at
        `start`, where the adopted objects end, and the taken-over batches follow. Batches of
        an earlier time the main led the partition must go: they would sit below a gap in the
        index, and a fetch from them ran on across it, skipping every offset in between."""
        self.index = BatchIndex(start)

    def link_objects(
        self, stream: StreamManifest | None, stream_id: int, rewritten: bool = False
    ) -> None:
        """`rewritten`: objects of this stream were swapped for others (compaction, the log
        cleaner): the batches memory holds below the objects' end go too, so that reads see
        what the objects hold now (a compacted topic's cleaned records)."""
        self.objects, self.stream_id = stream, stream_id
        self._drop_uploaded(rewritten)

    def _drop_uploaded(self, in_memory_too: bool = False) -> None:
        """Forget the leading batches the objects hold and memory no longer does: their WAL
        segments may be gone, and the objects answer for them."""
        stream = self.objects
        if stream is None:
            return
        end = stream.end_offset
        entries = self.index.entries
        n = 0
        while (
            n < len(entries)
            and (in_memory_too or entries[n].data is None)
            and entries[n].last_offset < end
        ):
            n += 1
        self.index.drop_front(n)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """As the main's PartitionLog answers it, from the mirrored list."""
        return [(pid, first) for pid, first, last in self.aborted if last >= start and first < end]

    @property
    def readable_end(self) -> int:
        """Where what this mirror can serve ends: the main publishes a high watermark before
        the WAL tail reads the batches below it, and a fetch waits for them (within its
        max_wait: kafka_wire.fetch_serving) rather than answer without them."""
        stream = self.objects
        uploaded = stream.end_offset if stream is not None else 0
        return max(self.index.end_offset, uploaded)

    @property
    def visible_end(self) -> int:
        return min(self.high_watermark, self.index.end_offset)

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> tuple[int, Sequence[BatchEntry]]:
        """From memory or the WAL mirror; below them, from the objects (one ObjectSpan)."""
        if self.on_read is not None:
            self.on_read()
        if offset < self.log_start_offset or offset > self.next_offset:
            return ErrorCode.offset_out_of_range, []
        stream = self.objects
        mirrored = min(upper, self.index.end_offset)
        if stream is None or offset >= stream.end_offset:
            entries = self.index.fetch_slice(offset, max_bytes, mirrored, must_return_one)
            if entries and entries[0].base_offset > offset:
                # Below the index and past the objects this mirror knows of: a takeover
                # restarted the index at the adopted objects' end, and the main's manifest
                # with them is still on its way. Nothing yet, never the batches after the
                # gap: a client takes those and skips every offset in between.
                return ErrorCode.none, []
            return ErrorCode.none, entries
        self._drop_uploaded()
        uploaded = stream.end_offset
        entries = self.index.fetch_slice(offset, max_bytes, mirrored, must_return_one)
        first = entries[0] if entries else None
        if first is None or first.base_offset > offset or first.data is None:
            # The mirror does not hold `offset` in memory (it was trimmed, never tailed, or
            # evicted): the objects do. `upper` is at most the mirrored high watermark.
            end = min(uploaded, upper)
            if offset >= end or (max_bytes <= 0 and not must_return_one):
                return ErrorCode.none, []
            span = ObjectSpan(
                stream, self.stream_id, offset, end, max(max_bytes, 1), must_return_one
            )
            return ErrorCode.none, [span]
        # Stop before an uploaded batch memory lost: the next fetch reads it from the objects.
        for i in range(1, len(entries)):
            entry = entries[i]
            if entry.data is None and entry.last_offset < uploaded:
                return ErrorCode.none, entries[:i]
        return ErrorCode.none, entries


class MirrorTopic:
    def __init__(self, name: str, topic_id: bytes, configs: dict[str, str]) -> None:
        self.name = name
        self.topic_id = topic_id
        self.configs = configs
        self.partitions: list[MirrorPartition] = []
        self.leaders: list[int] = []  # main node id per partition, as the main published


class MirrorCache:
    """Recent batch bytes of every mirror, bounded in bytes; evicted ones are re-read."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.bytes = 0
        self._order: deque[BatchEntry] = deque()

    def add(self, entry: BatchEntry) -> None:
        self._order.append(entry)
        self.bytes += entry.size
        while self.bytes > self.budget and len(self._order) > 1:
            oldest = self._order.popleft()
            oldest.data = None
            self.bytes -= oldest.size


class MainMirror:
    def __init__(
        self,
        main: MainEndpoint,
        rpc: RpcClient,
        batches: BatchReader,
        cache: MirrorCache,
        own_writer: str,
        take_prepared: Callable[[int, int], memoryview | None],
        on_change: Callable[[], None],
        objects: ProxyObjects | None = None,
    ) -> None:
        self.main = main
        self.rpc = rpc
        self.batches = batches
        self.cache = cache
        self.own_writer = own_writer
        self.take_prepared = take_prepared
        self.on_change = on_change
        self.objects = objects  # None: no object store, so partitions never read objects
        self.topics: dict[str, MirrorTopic] = {}
        # The main's object manifest, as its state stream sent it.
        self.manifest = Manifest(main.node_id)
        self.writer: str | None = None
        self.wal_end = 0
        # The main's links floor (proxy_broker/prepared_trim.py), as last reported; None
        # until its first full frame.
        self.links: dict[str, int] | None = None
        self.tail_offset: int | None = None
        self.connected = False
        self._wal_moved = trio.Event()
        self._read_wanted = trio.Event()
        self.last_read = float("-inf")  # time.monotonic() of the last fetch that read us
        self.synced = trio.Event()  # set once the first full snapshot arrived
        # Called with (main node id, why) when an established state stream breaks, so the
        # controller probes that main at once (internal_rpc/reports.py).
        self.on_lost: Callable[[int, str], None] | None = None
        # Called when `connected` flips (the zone view routes around a main that is down).
        self.on_connected: Callable[[], None] | None = None

    def note_read(self) -> None:
        now = time.monotonic()
        idle = now - self.last_read > READ_ACTIVE_S
        self.last_read = now
        if idle:
            self._read_wanted.set()

    # -- state stream ------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_state)
            nursery.start_soon(self._tail)

    async def _follow_state(self) -> None:
        backoff = RESUBSCRIBE_BACKOFF_S[0]
        while True:
            try:
                async with self.rpc.subscribe("state", StateSubscription().to_wire()) as frames:
                    async for msg in frames:
                        self.apply_frame(msg)
                        self._set_connected(True)
                        backoff = RESUBSCRIBE_BACKOFF_S[0]
            except RpcError as exc:
                if self.connected:
                    log.warning("state stream of main %d lost: %s", self.main.node_id, exc)
                    if self.on_lost is not None:
                        self.on_lost(self.main.node_id, f"state stream lost: {exc}")
            except MalformedMessage as exc:
                # Refused whole, before any of it applied: the mirror stays as the previous
                # frame left it, and a new subscription starts from a full frame.
                log.error(
                    "main %d sent a malformed state frame (%s); resubscribing",
                    self.main.node_id,
                    exc,
                )
            except ManifestMirrorError as exc:
                log.error("%s; resubscribing", exc)
            self._set_connected(False)  # `links` stays: the floor it last reported holds
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RESUBSCRIBE_BACKOFF_S[1])

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            if self.on_connected is not None:
                self.on_connected()

    def apply_frame(self, msg: object) -> None:
        """One push of the state stream as it came off the wire. It is decoded strictly first
        (`MalformedMessage` naming the field at fault), so a bad frame changes nothing."""
        self.apply_state(StateFrame.from_wire(msg))

    def apply_state(self, frame: StateFrame) -> None:
        full = frame.full
        if full:
            self.writer = frame.writer
            self.links = frame.links  # a main that sends none blocks the trim
            live = {row.name for row in frame.topics}
            for name in set(self.topics) - live:
                del self.topics[name]
        elif frame.links is not None:
            self.links = frame.links
        for name in frame.deleted:
            self.topics.pop(name, None)
        for row in frame.topics:
            name, count = row.name, row.partition_count
            topic = self.topics.get(name)
            if topic is None or topic.topic_id != row.topic_id:
                topic = self.topics[name] = MirrorTopic(name, row.topic_id, row.configs)
            topic.configs = row.configs
            topic.leaders = (
                list(row.leaders) if row.leaders is not None else [self.main.node_id] * count
            )
            while len(topic.partitions) < count:
                topic.partitions.append(
                    MirrorPartition(name, len(topic.partitions), self.main.node_id, self.note_read)
                )
        for part in frame.parts:
            topic = self.topics.get(part.topic)
            if topic is not None and part.partition < len(topic.partitions):
                topic.partitions[part.partition].apply(part)
        if full:
            for topic in self.topics.values():
                for mirrored in topic.partitions:
                    mirrored.aborted = ()
        for txns in frame.txns:
            topic = self.topics.get(txns.topic)
            if topic is not None and txns.partition < len(topic.partitions):
                topic.partitions[txns.partition].aborted = txns.aborted
        if full or frame.objects or frame.topics:
            self._apply_objects(frame.objects, full)
        if frame.wal_end != self.wal_end:
            self.wal_end = frame.wal_end
            self._wal_moved.set()
        self.synced.set()
        self.on_change()

    def _apply_objects(self, rows: Sequence[ObjectStreamRow], full: bool) -> None:
        old = self.manifest
        base = Manifest(self.main.node_id) if full else old
        try:
            self.manifest = apply_manifest_rows(base, [row.to_wire() for row in rows])
        except (ValueError, TypeError) as exc:
            # Later deltas would build on a manifest we could not follow: start over from a
            # new subscription's full frame (the current one stays valid meanwhile).
            raise ManifestMirrorError(
                f"main {self.main.node_id} sent manifest rows we cannot apply: {exc}"
            ) from exc
        if self.objects is None:
            return
        gone = old.keys() - self.manifest.keys() if self.manifest is not old else set()
        if gone:
            self.objects.evict(sorted(gone))
        # Cheap enough: topics and manifests change rarely (an upload every tens of seconds).
        for topic in self.topics.values():
            for part in topic.partitions:
                stream = self.manifest.stream(topic.topic_id, part.partition)
                before = old.stream(topic.topic_id, part.partition)
                rewritten = (
                    bool(gone) and before is not None and any(r.key in gone for r in before.ranges)
                )
                part.link_objects(stream, stream_id_for(topic.topic_id, part.partition), rewritten)

    # -- WAL tail ----------------------------------------------------------------------------

    async def _tail(self) -> None:
        await self.synced.wait()
        caught_up = False
        while True:
            while self.tail_offset is not None and self.tail_offset >= self.wal_end:
                self._wal_moved = trio.Event()
                await self._wal_moved.wait()
            # Only while following: a mirror catching up (after a start or a pause) reads on.
            if caught_up and time.monotonic() - self.last_read > READ_ACTIVE_S:
                with trio.move_on_after(IDLE_TAIL_S):
                    await self._read_wanted.wait()
                self._read_wanted = trio.Event()
            try:
                records, prefetched = await trio.to_thread.run_sync(
                    self._read_chunk, limiter=self.batches.limiter
                )
            except (WalError, OSError) as exc:
                log.warning("tailing main %d's WAL failed, retrying: %s", self.main.node_id, exc)
                await trio.sleep(0.5)
                continue
            for record in records:
                self._apply_record(record, prefetched)
            if records:
                self.tail_offset = records[-1].position.end_offset
                self.on_change()
            caught_up = self.tail_offset is not None and self.tail_offset >= self.wal_end

    def _read_chunk(self) -> tuple[list[WalRecord], dict[WalPosition, bytearray]]:
        """Blocking: the next WAL records up to the published end, and the batches that LINKs
        among them point to in other writers' PREPARED records, rebuilt as the main served
        them. Reading those here, one worker call per chunk, keeps a consumer's fetches off
        the file system; a fetch reading them one batch at a time fell seconds behind."""
        assert self.writer is not None
        reader = self.batches.reader_for(self.writer)
        if self.tail_offset is None:
            segments = reader.segments()
            self.tail_offset = segments[0] if segments else 0
        out: list[WalRecord] = []
        prefetched: dict[WalPosition, bytearray] = {}
        prefetched_bytes = 0
        # Only for a mirror consumers read: prefetching every other proxy's payloads for one
        # nobody reads cost its proxy a core's worth of copying at full produce throughput.
        reading = time.monotonic() - self.last_read <= READ_ACTIVE_S
        byte_cap = self.cache.budget // PREFETCH_CACHE_SHARE if reading else 0
        try:
            records = reader.tail(self.tail_offset, self.wal_end, TAIL_CHUNK_BYTES)
        except OffsetOutOfRange:
            # Retention deleted what we had not read yet: continue from the oldest segment.
            segments = reader.segments()
            self.tail_offset = segments[0] if segments else 0
            records = []
        for record in records:
            if record.type == RecordType.LINK and prefetched_bytes < byte_cap:
                data = self._prefetch_link(record)
                if data is not None:
                    prefetched[record.position] = data
                    prefetched_bytes += len(data)
            out.append(record)
            if reading and prefetched_bytes >= byte_cap:
                break
        return out, prefetched

    def _prefetch_link(self, record: WalRecord) -> bytearray | None:
        header = record.header
        link = PreparedLink.from_header(header)
        if link.target.writer == self.own_writer:
            return None  # still in memory (take_prepared); read lazily if it is not
        try:
            return rebuild_linked_batch(
                self.batches.reader_for(link.target.writer), link, header["b"], header["ts"]
            )
        except (WalError, OSError) as exc:
            # Left for the fetch path to read (and report) should a consumer want it.
            log.debug("prefetching %s for %s failed: %s", link.target, record.position, exc)
            return None

    def _apply_record(self, record: WalRecord, prefetched: dict[WalPosition, bytearray]) -> None:
        header = record.header
        takeover = record.type == RecordType.CONTROL and header.get("k") == "takeover"
        if record.type not in (RecordType.DATA, RecordType.LINK) and not takeover:
            return
        topic = self.topics.get(header["t"])
        if topic is None or header["p"] >= len(topic.partitions):
            return
        part = topic.partitions[header["p"]]
        if takeover:
            part.take_over(header["s"])
            return
        base, last = header["b"], header["l"]
        if base < part.index.end_offset:
            return  # replayed after a snapshot, or already tailed
        if record.type == RecordType.DATA:
            entry = BatchEntry(
                base, last, header["ts"], len(record.payload), record.payload, record.position
            )
        else:
            link = PreparedLink.from_header(header)
            fetched = prefetched.get(record.position)
            data = memoryview(fetched) if fetched is not None else None
            if link.target.writer == self.own_writer:
                # We wrote this payload ourselves moments ago: patch it in memory, no read.
                data = self.take_prepared(link.target.segment, link.target.position)
                if data is not None:
                    info = parse_batch_header(data, 0)
                    assign_offsets(data, info, base, link.leader_epoch)
                    if link.log_append_time:
                        stamp_log_append_time(data, info, header["ts"])
            entry = BatchEntry(base, last, header["ts"], header["sz"], data, record.position, link)
        part.index.add(entry)
        if entry.data is not None:
            self.cache.add(entry)
