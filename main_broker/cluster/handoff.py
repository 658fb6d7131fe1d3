"""Partition reassignment, the I/O: a main's part in moving a partition's leadership.

The states and what to take over are in main_broker/cluster/reassignment.py. Here, on every new copy
of the cluster metadata document:

- as the **source** of a move (it leads the partition), the main fences the partition (no more
  appends: NOT_LEADER_OR_FOLLOWER), waits until every append it made is durable, and seals
  the move in the document with the partition's end offset and its WAL end;
- as the **target**, once the move is sealed (or the source is dead, see below), it adopts the
  source's object ranges of the partition into its own manifest, replays the partition's
  records the objects lack from the source's WAL into its own WAL (DATA records with the
  original offsets; a LINK's payload is read from the proxy's PREPARED record), after a
  `takeover` CONTROL record carrying the producer state, and then finishes the move in the
  document: it leads with the move's epoch;
- as a former leader, it drops the partition's stream from its own manifest once another main
  leads it (the objects stay: the new leader's manifest lists them).

A dead source never seals. The target goes ahead without the seal once the controller marked
the move `source_dead` (it found the source dead, main_broker/cluster/liveness.py) or the
source's node registration is dead or stopped. It first fences the source's WAL
(shared_wal/fence.py: `wal/main-<source>/FENCED`), then reads that WAL to its end. The source,
if it is only paused or cut off, checks for the fence after every group commit and acknowledges
nothing written after it: what it acknowledged is in the WAL the target reads, through the one
shared file system, whatever the clocks say. A fenced main stops (ClusterRole); its next
incarnation lifts the fence once no move from it is under way. The controller starts such moves
for a dead main's partitions (reassignment.evacuate, ClusterRole._evacuate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from main_broker.cluster.reassignment import (
    DATA,
    LINK,
    SEALED,
    SNAPSHOT,
    Move,
    MoveRefused,
    Tail,
    TailCollector,
    finish_move,
    seal_move,
    snapshot_starts_tails,
    takeover_header,
)
from main_broker.config import main_writer_id
from s3_commit import ObjectStoreError
from s3_commit.manifest import Manifest, StreamKey, manifest_key
from s3_commit.node_registry import NodeRegistration, now_ms, registration_key
from shared_wal import WalError, WalReader
from shared_wal.broker_records import PreparedLink, rebuild_linked_batch
from shared_wal.fence import fence_writer

if TYPE_CHECKING:
    from main_broker.cluster.doc import ClusterDoc
    from main_broker.cluster.role import ClusterRole
    from main_broker.log_store import LogStore
    from main_broker.objects.tier import ObjectTier
    from telemetry import MetricsRegistry

log = logging.getLogger("zonefleet.main_broker.handoff")

RETRY_S = 0.5
SEAL_POLL_S = 0.2
SCAN_GATHER_S = 0.05


class HandoffHost(Protocol):
    """What a handoff uses of its broker (`main_broker.broker.MainBroker` is one)."""

    @property
    def objects(self) -> ObjectTier | None: ...

    @property
    def registry(self) -> MetricsRegistry: ...

    @property
    def storage_failed(self) -> bool: ...

    @property
    def store(self) -> LogStore: ...


class Handoff:
    def __init__(self, broker: HandoffHost, role: ClusterRole) -> None:
        self.broker = broker
        self.role = role
        self.node_id = role.node_id
        self._nursery: trio.Nursery | None = None
        self._running: set[tuple[str, int, int, str]] = set()
        self._doc: ClusterDoc | None = None
        self._doc_changed = trio.Event()
        # Per source main, the takeovers waiting for the next scan of its WAL.
        self._scans: dict[int, list[_TailRequest]] = {}
        self._fence_locks: dict[int, trio.Lock] = {}  # per source: one fence, one log line
        self.completed = 0
        self.last_duration_s: float | None = None
        self.last_error: str | None = None
        broker.registry.gauge_functions(
            {
                "zonefleet_reassignments_under_way": (
                    "Partition moves in the cluster metadata document, as this main last read it.",
                    lambda: float(len(self._doc.moves)) if self._doc is not None else 0.0,
                ),
                "zonefleet_reassignment_takeovers": (
                    "Partitions this main took over from another main.",
                    lambda: float(self.completed),
                ),
            }
        )

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._doc is not None:
                self.on_doc(self._doc)
            await trio.sleep_forever()

    def status(self) -> dict[str, Any]:
        return {
            "under_way": len(self._doc.moves) if self._doc is not None else 0,
            "running": sorted(f"{t}-{p}:{role}" for t, p, _, role in self._running),
            "completed": self.completed,
            "last_duration_s": self.last_duration_s,
            "last_error": self.last_error,
        }

    # -- the document -> fencing and tasks --------------------------------------------------

    def on_doc(self, doc: ClusterDoc) -> None:
        """Called after every applied copy of the document (synchronously: fencing takes
        effect before the next produce is looked at)."""
        self._doc = doc
        self._doc_changed.set()
        self._doc_changed = trio.Event()
        store = self.broker.store
        for name, meta in doc.topics.items():
            state = store.topics.get(name)
            if state is None or state.topic_id != meta.topic_id:
                continue
            for plog, epoch in zip(state.partitions, meta.epochs, strict=False):
                move = doc.moves.get((name, plog.partition))
                fenced = plog.owned and move is not None and move.source == self.node_id
                changed = plog.fenced != fenced
                # Every main answers Metadata for every partition: all show the epoch the
                # document holds (a takeover under way holds its own until it finishes).
                taking_over = move is not None and move.target == self.node_id
                if plog.leader_epoch != epoch and not (taking_over and plog.leader_epoch > epoch):
                    plog.leader_epoch = epoch
                    changed = True
                plog.fenced = fenced
                if changed:
                    store.partition_moved(plog)
        for move in doc.moves.values():
            if move.source == self.node_id and move.state != SEALED:
                self._start(move, "seal", self._seal)
            if move.target == self.node_id:
                self._start(move, "takeover", self._takeover)
        if self.broker.objects is not None:
            self._start_release(doc)

    def _start(self, move: Move, role: str, task: Callable[[Move], Any]) -> None:
        key = (move.topic, move.partition, move.epoch, role)
        if self._nursery is None or key in self._running:
            return
        self._running.add(key)

        async def run() -> None:
            try:
                await task(move)
            finally:
                self._running.discard(key)

        self._nursery.start_soon(run)

    def _current(self, move: Move) -> Move | None:
        """The move as the latest document has it; None once it ended or was replaced."""
        doc = self._doc
        current = doc.moves.get(move.key) if doc is not None else None
        if current is None or (current.target, current.epoch) != (move.target, move.epoch):
            return None
        return current

    # -- the source -------------------------------------------------------------------------

    async def _seal(self, move: Move) -> None:
        store = self.broker.store
        plog = store.partition(move.topic, move.partition)
        if plog is None:
            return
        while self._current(move) is not None:
            # Fenced: nothing new is appended, so once every append is durable, the WAL end
            # covers the partition's last record.
            if plog.high_watermark >= plog.next_offset and not self.broker.storage_failed:
                end, wal_end = plog.next_offset, store.wal.end_offset
                try:
                    await self.role.meta.update(
                        lambda d, e=end, w=wal_end: seal_move(d, move, e, w)  # type: ignore[misc]
                    )
                except (ObjectStoreError, OSError) as exc:
                    self._failed(f"sealing {move.key}: {exc}")
                    await trio.sleep(RETRY_S)
                    continue
                log.info(
                    "sealed %s-%d for main %d at offset %d (WAL end %d)",
                    move.topic,
                    move.partition,
                    move.target,
                    end,
                    wal_end,
                )
                self.role.poke_peers()
                return
            with trio.move_on_after(SEAL_POLL_S):
                await store.data_arrived.wait()

    # -- the target -------------------------------------------------------------------------

    async def _takeover(self, move: Move) -> None:
        while True:
            current = self._current(move)
            if current is None:
                return
            if current.state == SEALED or current.source_dead or await self._source_dead(current):
                break
            with trio.move_on_after(SEAL_POLL_S * 5):
                await self._doc_changed.wait()
        started = time.monotonic()
        while self._current(move) is not None:
            current = self._current(move)
            assert current is not None
            try:
                await self._take_over(current)
            except MoveRefused as exc:
                log.info("move of %s-%d withdrawn: %s", move.topic, move.partition, exc)
                return
            except Exception as exc:  # retried: the main serves its other partitions on
                self._failed(f"taking over {move.key}: {type(exc).__name__}: {exc}")
                await trio.sleep(RETRY_S)
                continue
            self.completed += 1
            self.last_duration_s = round(time.monotonic() - started, 3)
            return

    async def _source_dead(self, move: Move) -> bool:
        """Whether the source's registration says it is gone (a move requested of a main
        that then died, before the controller marks it)."""
        try:
            found = await self.role.astore.get(registration_key("main", move.source))
        except (ObjectStoreError, OSError):
            return False
        if found is None:
            return True
        reg = NodeRegistration.from_bytes(found[0])
        return not reg.alive(now_ms(), int(self.role.session_timeout_s * 1000))

    async def _take_over(self, move: Move) -> None:
        broker = self.broker
        store = broker.store
        plog = store.partition(move.topic, move.partition)
        if plog is None:
            raise MoveRefused(3, f"{move.key} is not known here")
        key = StreamKey(plog.topic_id, plog.partition)
        stream = None
        tier = broker.objects
        if tier is not None:
            found = await tier.astore.get(manifest_key(move.source))
            if found is not None:
                stream = Manifest.from_bytes(found[0]).streams.get(key)
        start = stream.end_offset if stream is not None else 0
        sealed = move.state == SEALED
        if not sealed:
            # Fenced before the scan: whatever the source acknowledged is in what we read.
            async with self._fence_locks.setdefault(move.source, trio.Lock()):
                fence, made = await trio.to_thread.run_sync(
                    fence_writer,
                    store.reader.fs,
                    main_writer_id(move.source),
                    self.node_id,
                    f"main {self.node_id} takes its partitions over without a seal",
                    limiter=store.batches.limiter,
                )
            if made:
                log.warning("fenced main %d's WAL: %s", move.source, fence.reason)
        began = time.monotonic()
        tail = await self._tail(move, plog.topic_id, start, move.wal_end if sealed else None)
        read_s = time.monotonic() - began
        if sealed and tail.end < move.end:
            raise TakeoverIncomplete(
                f"main {move.source}'s WAL holds {move.key} up to {tail.end}, sealed at {move.end}"
            )
        if tail.gap is not None:
            log.warning(
                "%s-%d: offsets %d..%d are in neither main %d's objects nor its WAL",
                move.topic,
                move.partition,
                tail.gap[0],
                tail.gap[1] - 1,
                move.source,
            )
        if tier is not None and stream is not None:
            manifest = await tier.manifests.update(lambda m: m.with_stream(key, stream))
            tier.tracker.load({key: stream.end_offset})
            store.set_manifest(manifest)
        batches = [(b.data_header(), b.payload or b"") for b in tail.batches]
        began = time.monotonic()
        await store.take_over(takeover_header(move, tail), batches)
        write_s = time.monotonic() - began
        await self.role.meta.update(lambda d: finish_move(d, move))
        self.role.poke_peers()
        if tier is not None:
            tier.upload_soon()
        log.info(
            "took %s-%d over from main %d (%s): objects below %d, %d batches replayed to %d, "
            "leader epoch %d (tail read in %.2f s, written in %.2f s)",
            move.topic,
            move.partition,
            move.source,
            "sealed" if sealed else "source dead",
            start,
            len(tail.batches),
            tail.end,
            move.epoch,
            read_s,
            write_s,
        )

    async def _tail(self, move: Move, topic_id: bytes, start: int, end: int | None) -> Tail:
        """The partition's tail from the source's WAL. Takeovers from the same source that
        are ready together (a dead main's partitions) share one scan of its WAL."""
        request = _TailRequest(move, topic_id, start, end)
        scan = self._scans.get(move.source)
        if scan is None:
            scan = self._scans[move.source] = []
            assert self._nursery is not None
            self._nursery.start_soon(self._scan_soon, move.source)
        scan.append(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.tail is not None
        return request.tail

    async def _scan_soon(self, source: int) -> None:
        await trio.sleep(SCAN_GATHER_S)  # let the other takeovers of this source join
        requests = self._scans.pop(source)
        try:
            tails = await trio.to_thread.run_sync(
                self._read_tails, source, requests, limiter=self.broker.store.batches.limiter
            )
            for request, tail in zip(requests, tails, strict=True):
                request.tail = tail
        except Exception as exc:  # each takeover retries: a bad scan must not stop the main
            for request in requests:
                request.error = exc
        finally:
            for request in requests:
                request.done.set()

    def _read_tails(self, source: int, requests: list[_TailRequest]) -> list[Tail]:
        """Blocking: one scan of the source's WAL (to the furthest seal, or to its end when
        a move has none) for every requested partition."""
        store = self.broker.store
        ends = [r.end for r in requests]
        end = None if None in ends else max(e for e in ends if e is not None)
        collectors = [
            TailCollector(r.move.topic, r.move.partition, r.topic_id, r.start) for r in requests
        ]
        by_partition: dict[Any, TailCollector] = {(c.topic, c.partition): c for c in collectors}
        began = time.monotonic()
        scanned = 0
        reader = WalReader(store.reader.fs, main_writer_id(source))
        try:
            segments = reader.segments()
            first = _scan_start(reader, segments, requests)
            records = reader.iter_records(first, end) if segments else iter(())
            for scanned, record in enumerate(records, 1):
                rtype, header = int(record.type), record.header
                # The first record goes to every collector: only a SNAPSHOT there counts.
                if scanned > 1 and rtype in (DATA, LINK):
                    collector = by_partition.get((header.get("t"), header.get("p")))
                    if collector is not None:
                        collector.add(rtype, header, record.payload)
                else:
                    for collector in collectors:
                        collector.add(rtype, header, record.payload)
        finally:
            reader.close()
        tails = [c.result() for c in collectors]
        scan_s = time.monotonic() - began
        linked = 0
        for tail in tails:
            for batch in tail.batches:
                if batch.is_link:
                    linked += 1
                    link = PreparedLink.from_header(batch.header)
                    batch.payload = rebuild_linked_batch(
                        store.batches.reader_for(link.target.writer),
                        link,
                        batch.base_offset,
                        int(batch.header["ts"]),
                    )
                else:
                    batch.payload = bytes(batch.payload or b"")
        log.info(
            "read main %d's WAL for %d partitions: %d records scanned in %.2f s, %d linked "
            "batches rebuilt in %.2f s",
            source,
            len(requests),
            scanned,
            scan_s,
            linked,
            time.monotonic() - began - scan_s,
        )
        return tails

    # -- a former leader --------------------------------------------------------------------

    def _start_release(self, doc: ClusterDoc) -> None:
        tier = self.broker.objects
        assert tier is not None
        store = self.broker.store
        gone: list[StreamKey] = []
        for key in tier.manifests.manifest.streams:
            state = store.topics_by_id.get(key.topic_id)
            if state is None or key.partition >= len(state.partitions):
                continue  # a deleted topic: object retention removes it
            plog = state.partitions[key.partition]
            if not plog.owned and not any(
                m.target == self.node_id
                for m in doc.moves.values()
                if m.key == (state.name, key.partition)
            ):
                gone.append(key)
        if gone and self._nursery is not None and ("", -1, -1, "release") not in self._running:
            self._running.add(("", -1, -1, "release"))
            self._nursery.start_soon(self._release, gone)

    async def _release(self, keys: list[StreamKey]) -> None:
        """Drop streams another main now leads from our manifest (their objects stay: the
        leader's manifest lists them, and deleting a retired object checks other manifests)."""
        tier = self.broker.objects
        assert tier is not None
        try:
            manifest = await tier.manifests.update(lambda m: m.without_streams(keys))
            self.broker.store.set_manifest(manifest)
            for key in keys:
                tier.tracker.uploaded_end.pop(key, None)
        except (ObjectStoreError, OSError) as exc:
            self._failed(f"releasing {len(keys)} streams: {exc}")
        finally:
            self._running.discard(("", -1, -1, "release"))

    def _failed(self, message: str) -> None:
        self.last_error = message
        log.warning("%s (retrying)", message)


def _scan_start(reader: WalReader, segments: list[int], requests: list[_TailRequest]) -> int:
    """Blocking: the newest segment a scan for `requests` may start at (its head SNAPSHOT is
    below every start: reassignment.snapshot_starts_tails), so a takeover reads the tail it
    needs rather than the whole WAL; the oldest when none is."""
    wants = [(r.move.topic, r.move.partition, r.topic_id, r.start) for r in requests]
    for segment in reversed(segments[1:]):
        records = reader.iter_records(segment, None)
        try:
            head = next(records, None)
        except WalError:
            continue
        finally:
            records.close()
        if (
            head is not None
            and int(head.type) == SNAPSHOT
            and snapshot_starts_tails(head.payload, wants)
        ):
            return segment
    return segments[0] if segments else 0


@dataclass(slots=True)
class _TailRequest:
    move: Move
    topic_id: bytes
    start: int
    end: int | None
    done: trio.Event = field(default_factory=trio.Event)
    tail: Tail | None = None
    error: Exception | None = None


class TakeoverIncomplete(Exception):
    """The source's WAL does not (yet) show everything the seal promised."""
