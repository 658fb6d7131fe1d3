"""Retention and DeleteTopics on a main's committed objects: the I/O around
`main_broker.objects.retention_policy`.

Every `retention_check_interval_s`, and at once after a topic was deleted, one pass:

1. computes, for each partition this main leads, its limits (the topic's retention.ms and
   retention.bytes, unless cleanup.policy lacks "delete") and its WAL bytes above the objects;
2. commits the manifest without the expired ranges (the log start moves past them) and without
   the streams of deleted topics, by CAS (the change is re-evaluated on a re-read manifest);
   the objects no stream lists any more are retired in the same CAS, to be deleted
   `retention_delete_delay_s` later (a reader that picked one from the previous manifest is
   done by then);
3. publishes it: state subscribers get the rows and, in the same frame, the partitions' new
   log starts; ListOffsets and Fetch below the new start answer as Kafka does at once.

The object tier deletes retired objects once their time has come and evicts them from the
block cache (`main_broker.objects.compaction`, the same path as compaction's replaced objects);
being in the manifest, they are deleted after a crash too.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from main_broker.objects.retention_policy import (
    StreamRetention,
    apply_log_starts,
    apply_retention,
    pending_log_starts,
    retire_unreferenced,
    unreferenced,
    without_topics,
)
from main_broker.objects.upload import stream_key
from main_broker.partition_log import PartitionLog
from s3_commit import ObjectStoreError
from s3_commit.manifest import Manifest, StreamKey

if TYPE_CHECKING:
    from main_broker.config import BrokerConfig
    from main_broker.log_store import LogStore
    from main_broker.objects.tier import ObjectTier

__all__ = ["ObjectRetention"]

log = logging.getLogger("zonefleet.main_broker.retention")


class LiveTopics(Protocol):
    """The fleet's list of live topics (`main_broker.cluster.view.ClusterView`)."""

    def live_topic_ids(self) -> set[bytes] | None: ...


class RetentionHost(Protocol):
    """What retention uses of its broker (`main_broker.broker.MainBroker` is one)."""

    @property
    def cluster(self) -> LiveTopics: ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> LogStore: ...


class ObjectRetention:
    def __init__(self, broker: RetentionHost, tier: ObjectTier) -> None:
        self.broker = broker
        self.tier = tier
        self.interval_s = broker.config.retention_check_interval_s
        self.delete_delay_s = broker.config.retention_delete_delay_s
        # Ids of topics deleted since start (replay included). Kept: an upload that was in
        # flight when its topic went may still commit the topic's stream, and the next pass
        # removes it again.
        self.deleted_topics: set[bytes] = set()
        # DeleteRecords moves not yet (fully) in the manifest: stream -> requested log start.
        self.log_start_requests: dict[StreamKey, int] = {}
        self._wake = trio.Event()
        self.passes = 0
        self.log_start_moves = 0
        self.streams_removed = 0
        self.objects_retired = 0
        self.last_error: str | None = None
        self.pass_done = trio.Event()  # replaced after each pass (tests wait)

    def topic_deleted(self, name: str, topic_id: bytes | None) -> None:
        """A topic left the broker's store (DeleteTopics, replay, the cluster document): a
        `TopicDeletionListener` of the log store (None: the store did not hold it)."""
        if topic_id is None:
            return
        self.deleted_topics.add(topic_id)
        self._wake.set()

    def records_deleted(self, plog: PartitionLog) -> None:
        """DeleteRecords moved a partition's log start: the next pass records it in the
        manifest (a restart with an empty WAL then still starts there)."""
        key = stream_key(plog)
        self.log_start_requests[key] = max(
            self.log_start_requests.get(key, 0), plog.log_start_offset
        )
        self._wake.set()

    # -- the background task -----------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
                self.last_error = None
            except (ObjectStoreError, OSError, ValueError) as exc:
                # The manifest is unchanged or committed; either way the next pass re-decides.
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("retention pass failed: %s", exc)
            with trio.move_on_after(self.interval_s):
                await self._wake.wait()
            self._wake = trio.Event()

    async def run_once(self) -> Manifest:
        """One pass: commit what expired or was deleted (retiring the objects it frees), and
        publish it."""
        store = self.broker.store
        tier = self.tier
        deleted = {t for t in self.deleted_topics if t not in store.topics_by_id}
        live = self._live_topic_ids()
        now_ms = int(time.time() * 1000)
        delete_after_ms = now_ms + int(self.delete_delay_s * 1000)
        outcome: dict[str, Any] = {}
        requests = dict(self.log_start_requests)

        def change(manifest: Manifest) -> Manifest:
            kept = apply_log_starts(without_topics(manifest, deleted, live), requests)
            # The WAL bytes above the objects are measured against this very manifest: an
            # upload committed meanwhile moves them into a range, and counting them twice
            # would drop a range that retention.bytes keeps.
            expired = apply_retention(kept, self._limits(kept), now_ms)
            new = retire_unreferenced(manifest, expired, delete_after_ms)
            outcome["changed"] = new is not manifest
            outcome["removed"] = unreferenced(manifest, new)
            outcome["streams"] = manifest.streams.keys() - kept.streams.keys()
            outcome["moved"] = [
                k for k, s in new.streams.items() if s.log_start != kept.streams[k].log_start
            ]
            return new

        manifest = await tier.manifests.update(change)
        pending = pending_log_starts(manifest, requests, store.topics_by_id.keys())
        for key, offset in requests.items():
            if self.log_start_requests.get(key) == offset and key not in pending:
                del self.log_start_requests[key]  # a later, higher request stays
        self._pass_done()
        if not outcome.get("changed"):
            return manifest
        gone_streams: set[StreamKey] = outcome["streams"]
        removed: set[str] = outcome["removed"]
        self.streams_removed += len(gone_streams)
        self.log_start_moves += len(outcome["moved"])
        self.objects_retired += len(removed)
        for key in gone_streams:
            tier.tracker.uploaded_end.pop(key, None)
        # One state frame carries the rows and the log starts they moved.
        store.set_manifest(manifest)
        for topic in store.topics.values():
            for plog in topic.partitions:
                if tier.adopt(plog):
                    store.partition_moved(plog)
        log.info(
            "retention: manifest version %d, %d log starts moved, %d streams of deleted topics "
            "removed, %d objects retired for deletion in %.1fs",
            manifest.version,
            len(outcome["moved"]),
            len(gone_streams),
            len(removed),
            self.delete_delay_s,
        )
        return manifest

    def _pass_done(self) -> None:
        self.passes += 1
        self.pass_done.set()
        self.pass_done = trio.Event()

    def _owned(self) -> list[PartitionLog]:
        store = self.broker.store
        # A partition being moved away keeps its manifest stream as it is (handoff.py).
        return [p for t in store.topics.values() for p in t.partitions if p.owned and not p.fenced]

    def _limits(self, manifest: Manifest) -> dict[StreamKey, StreamRetention]:
        out: dict[StreamKey, StreamRetention] = {}
        for plog in self._owned():
            cfg = plog.config
            if not cfg.retention_deletes:
                continue  # cleanup.policy=compact alone: no time or size retention (Kafka)
            key = stream_key(plog)
            stream = manifest.streams.get(key)
            if stream is None:
                continue
            wal_bytes = plog.bytes_available(stream.end_offset, plog.high_watermark)
            out[key] = StreamRetention(cfg.retention_ms, cfg.retention_bytes, wal_bytes)
        return out

    def _live_topic_ids(self) -> set[bytes] | None:
        """Every topic id of the cluster metadata document, when this main has one: a stream
        of any other topic belongs to a topic deleted while this main was down. None without
        that document (a main's own WAL is no such authority: it may have been wiped)."""
        return self.broker.cluster.live_topic_ids()

    # -- state -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "log_start_moves": self.log_start_moves,
            "streams_removed": self.streams_removed,
            "objects_retired": self.objects_retired,
            "last_error": self.last_error,
        }
