"""The state stream a main broker publishes to each subscribed zone proxy.

A subscriber first gets one full snapshot, then one frame per coalesced delta. An idle stream
sends a change at once; a busy one at most one frame per DELTA_INTERVAL_S, carrying whatever
changed meanwhile (or while the previous frame was being sent). Each frame is a typed
`internal_rpc.state_frames.StateFrame` (rows: `TopicRow`, `PartitionRow`, `ObjectStreamRow`),
sent as its `to_wire()` map; the layout, its version (`mv`) and a golden example are in
docs/formats.md, "State stream". In short (msgpack):

    {"mv": 1, "full": true, "node": main node id, "writer": WAL writer id, "wal_end": int,
     "topics": {name: [topic_id (16 bytes), partition count, {explicit configs},
                       [leader main node id per partition]]},                       # changed/new
     "deleted": [name, ...],
     "parts": [[topic, partition, leader_epoch, high_watermark, last_stable_offset,
                log_start_offset, log_end_offset], ...],                              # changed
     "objects": [[topic_id (16 bytes), partition,
                  [[start, end, object key, object size, max timestamp, bytes], ...],  # added
                  [object key, ...],                                                  # removed
                  log start (-1: stream gone)], ...],
     "links": {proxy WAL writer id: lowest PREPARED offset still linked, ...}}     # all, if changed

A delta has only "mv", "wal_end", whichever of "topics", "deleted", "parts" and "objects" is not
empty, and "links" when it changed. That is version 1; a subscriber that asks for version 2 (a
zone proxy of this release) gets "we" for "wal_end", "p" for "parts", and 5-element rows
[topic, partition, leader_epoch, high_watermark, log_start_offset] where the last stable offset
and the log end equal the high watermark: the deltas cross zones on every group commit.

"links" is the links floor (main_broker/links_floor.py): per proxy writer, the logical WAL
offset (segment + position) of the lowest PREPARED record a LINK of this main points to that no
committed object holds yet; a writer it does not name is needed by none. The whole map is sent
(one entry per proxy), in every full frame and in a delta whenever it changed. A LINK lowers it
as soon as it is indexed, before its group commit, so every frame built after the confirm's
answer reflects the link.

"objects" mirrors the main's object manifest (s3_commit/manifest_delta.py): in a full frame
every stream with all its ranges, in a delta only the streams an upload, a removal or retention
changed since the subscriber's last frame. A proxy reads the offsets its WAL mirror no longer holds
from those objects.

A proxy never serves above the high watermark it mirrored (invariant 5), so a delta is sent only
after the WAL group commit that moved it. The manifest rows of an upload go out after its
manifest CAS, in the same frame as the log start offsets it moved, and the main trims its WAL
below them only once every subscriber was sent that frame (or a timeout passed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from internal_rpc.state_frames import (
    AbortedRow,
    ObjectStreamRow,
    PartitionRow,
    StateFrame,
    TopicRow,
)
from main_broker.partition_log import PartitionLog
from s3_commit.manifest_delta import ManifestRow, manifest_delta_rows, manifest_rows

if TYPE_CHECKING:
    from main_broker.log_store import LogStore
    from s3_commit.manifest import Manifest


# Every frame costs a send to each proxy and, there, a WAL tail read: under load, group commits
# come every millisecond or two, and a frame per commit cost more CPU than the latency it saved.
DELTA_INTERVAL_S = 0.005


class StateWatcher:
    """What changed since a subscriber's last frame."""

    def __init__(self) -> None:
        self.partitions: set[PartitionLog] = set()
        self.aborted: set[PartitionLog] = set()  # their aborted transactions changed
        self.topics: set[str] = set()
        self.objects = False  # the manifest changed
        self.links = False  # the links floor changed
        self.changed = trio.Event()
        # The manifest version this subscriber was last sent (the main trims its WAL below an
        # upload once every subscriber has it); `sent` is set after each frame goes out.
        self.sent_manifest_version = -1
        self.sent = trio.Event()

    def mark_partition(self, plog: PartitionLog) -> None:
        self.partitions.add(plog)
        self.changed.set()

    def mark_aborted(self, plog: PartitionLog) -> None:
        self.aborted.add(plog)
        self.partitions.add(plog)
        self.changed.set()

    def mark_topic(self, name: str) -> None:
        self.topics.add(name)
        self.changed.set()

    def mark_links(self) -> None:
        self.links = True
        self.changed.set()

    def mark_objects(self) -> None:
        self.objects = True
        self.changed.set()

    def frame_sent(self, manifest: Manifest | None) -> None:
        if manifest is not None:
            self.sent_manifest_version = manifest.version
        self.sent.set()
        self.sent = trio.Event()


def partition_row(plog: PartitionLog) -> PartitionRow:
    # tuple.__new__: a NamedTuple's own __new__ is a Python call, and a delta has a row per
    # moved partition.
    return _new_row(
        PartitionRow,
        (
            plog.topic,
            plog.partition,
            plog.leader_epoch,
            plog.high_watermark,
            plog.last_stable_offset,
            plog.log_start_offset,
            plog.next_offset,
        ),
    )


def aborted_row(plog: PartitionLog) -> AbortedRow:
    return AbortedRow(
        plog.topic, plog.partition, tuple((a[0], a[1], a[2]) for a in plog.txns.aborted)
    )


_new_row = tuple.__new__


def _frame(
    store: LogStore,
    node_id: int,
    full: bool,
    topics: set[str],
    partitions: set[PartitionLog] | list[PartitionLog],
    objects: list[ManifestRow],
    links: bool,
    aborted: set[PartitionLog] | list[PartitionLog] | None = None,
) -> StateFrame:
    live = {n: store.topics[n] for n in topics if n in store.topics}
    topic_rows = tuple(
        [
            TopicRow(
                n,
                t.topic_id,
                len(t.partitions),
                t.configs,
                tuple(node_id if p.leader_id is None else p.leader_id for p in t.partitions),
            )
            for n, t in live.items()
        ]
    )
    # Partitions of a topic deleted meanwhile are no longer served.
    parts = tuple(
        [
            partition_row(p)
            for p in partitions
            if p.topic in store.topics and store.topics[p.topic].partitions[p.partition] is p
        ]
    )
    return StateFrame(
        wal_end=store.wal.end_offset,
        full=full,
        node=node_id if full else None,
        writer=store.wal_writer_id if full else None,
        topics=topic_rows,
        deleted=tuple(sorted(topics - set(live))) if topics else (),
        parts=parts,
        objects=tuple([ObjectStreamRow.of(row) for row in objects]) if objects else (),
        links=dict(store.links_floor) if full or links else None,
        txns=tuple(
            [
                aborted_row(p)
                for p in aborted or ()
                if p.topic in store.topics and store.topics[p.topic].partitions[p.partition] is p
            ]
        ),
    )


async def publish_state(
    store: LogStore,
    node_id: int,
    send: Callable[[Any], Awaitable[None]],
    version: int = 1,
) -> None:
    """Streams `store`'s state to one subscriber in frames of `version` (what it asked for)."""
    watcher = store.watch()
    try:
        everything = [p for t in store.topics.values() for p in t.partitions]
        manifest = store.manifest
        with_aborted = [p for p in everything if p.txns.aborted]
        frame = _frame(
            store,
            node_id,
            True,
            set(store.topics),
            everything,
            manifest_rows(manifest),
            True,
            with_aborted,
        )
        await send(frame.to_wire(version))
        watcher.frame_sent(manifest)
        last_wal_end = store.wal.end_offset
        last_sent = float("-inf")
        while True:
            await watcher.changed.wait()
            await trio.sleep_until(last_sent + DELTA_INTERVAL_S)
            watcher.changed = trio.Event()
            topics, partitions, aborted = watcher.topics, watcher.partitions, watcher.aborted
            watcher.topics, watcher.partitions, watcher.aborted = set(), set(), set()
            objects: list[ManifestRow] = []
            if watcher.objects:
                watcher.objects = False
                objects = manifest_delta_rows(manifest, store.manifest)
                manifest = store.manifest
            links, watcher.links = watcher.links, False
            if (
                not topics
                and not partitions
                and not objects
                and not links
                and store.wal.end_offset == last_wal_end
            ):
                watcher.frame_sent(manifest)
                continue
            frame = _frame(store, node_id, False, topics, partitions, objects, links, aborted)
            last_wal_end = frame.wal_end
            last_sent = trio.current_time()
            await send(frame.to_wire(version))
            watcher.frame_sent(manifest)
    finally:
        store.unwatch(watcher)
