"""The log cleaner of compacted topics (issue 13, "Log compaction"): the I/O around
`s3_commit.cleaner`.

`ObjectTier.run` calls `LogCleaner.tick` next to the object compaction, so no manifest CAS of
the cleaner races one of an upload, a compaction or another cleaning on this main. Every
`log_cleaner_interval_s` it computes, for each partition this main leads whose cleanup.policy
has "compact", the clean and dirty sections of its objects (`cleanable_section`: the last
stable offset, min/max.compaction.lag.ms) and publishes the dirty ratio; it cleans the partition
whose need is greatest (a forced one first, then the highest ratio), then looks again at once.

A cleaning of one partition:

1. GETs the objects of its dirty section one at a time and fills the offset map (a budget of
   `log_cleaner_dedupe_buffer_bytes`, allocated once); a full map ends the section early;
2. rewrites, one source object at a time and in offset order, every object whose range of the
   partition lies below that end: the source's other streams' batches are carried over as
   they are, the partition's are filtered (`StreamCleaner`), the new objects laid out by
   `plan_upload`, PUT, and swapped in by the object compaction's own swap
   (`apply_compaction`: the new objects cover exactly the source's offsets; the source is
   retired and deleted `compaction_delete_delay_s` later by `Compactor.delete_retired`). An
   object the filter would not change is left alone;
3. moves the partition's checkpoint (the first dirty offset) to the end and PUTs this main's
   checkpoints (`cleaner/<node id>.json`, read back at the first look after a start). The
   checkpoint only decides what counts as dirty: one lost (a failed PUT, a crash, a partition
   that moved here) makes the partition dirty again and costs a cleaning, never data; one
   from before the partition's objects changed under it cleans less, never wrongly.

Crashes: before a swap's CAS the new objects are unlisted orphans that the orphan sweep deletes
(as for an upload); after it, the source is retired in the manifest and is deleted after its
delay, by this main or by itself after a restart. Each swap on its own keeps every record it
must: a record goes only when a later record of its key, which stays, exists, so a cleaning
cut short anywhere leaves a valid, partly cleaned log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from main_broker.objects.upload import stream_key
from main_broker.partition_log import PartitionLog
from main_broker.topic_config import EffectiveTopicConfig
from s3_commit.cleaner import (
    CleanableSection,
    CleaningPolicy,
    CleanStats,
    CorruptRecords,
    StreamCleaner,
    build_offset_map,
    checkpoint_key,
    cleanable_section,
    decode_checkpoints,
    encode_checkpoints,
)
from s3_commit.compaction import (
    CompactionAbandoned,
    CompactionJob,
    CorruptSource,
    JobKind,
    SourceRange,
    apply_compaction,
    collect_stream_batches,
    compacted_objects,
)
from s3_commit.manifest import Manifest, ObjectRange, StreamKey, new_object_id
from s3_commit.object_plan import UploadPlan, plan_upload
from s3_commit.object_store import ObjectStoreError
from s3_commit.offset_map import OffsetMap
from telemetry.pause_points import pause_point

if TYPE_CHECKING:
    from main_broker.objects.tier import ObjectTier

__all__ = ["LogCleaner", "policy_of"]

log = logging.getLogger("zonefleet.main_broker.cleaner")


def policy_of(config: EffectiveTopicConfig) -> CleaningPolicy:
    return CleaningPolicy(
        config.min_cleanable_dirty_ratio,
        config.min_compaction_lag_ms,
        config.max_compaction_lag_ms,
        config.delete_retention_ms,
    )


class CleaningAbandoned(Exception):
    """A source changed or vanished since the cleaning began (retention, DeleteTopics, a
    reassignment): the rest of the pass is dropped; the next one starts afresh."""


@dataclass(slots=True)
class _Candidate:
    plog: PartitionLog
    key: StreamKey
    section: CleanableSection
    policy: CleaningPolicy


class LogCleaner:
    def __init__(self, tier: ObjectTier) -> None:
        cfg = tier.config
        self.tier = tier
        self.enabled = cfg.log_cleaner_enable
        self.interval_s = cfg.log_cleaner_interval_s
        self.budget_bytes = cfg.log_cleaner_dedupe_buffer_bytes
        self.next_due = time.monotonic() + self.interval_s
        # Per partition the first dirty offset (Kafka's cleaner-offset-checkpoint), in memory.
        self.checkpoints: dict[StreamKey, int] = {}
        self.checkpoints_loaded = False
        self.offset_map: OffsetMap | None = None
        self.stats = CleanStats()
        self.cleanings = 0
        self.abandoned = 0
        self.failures = 0
        self.objects_replaced = 0
        self.objects_written = 0
        self.last_error: str | None = None
        self.last_cleaning: dict[str, Any] | None = None
        self.ratios: dict[StreamKey, float] = {}
        self.done = trio.Event()  # replaced after each pass that found nothing to do (tests)
        self.cleaned = trio.Event()  # replaced after each completed cleaning (tests)
        self._register_metrics()

    # -- the tier's loop ---------------------------------------------------------------------

    async def tick(self, now: float) -> bool:
        """Clean one partition when a look is due and one needs it; True when one was
        cleaned and another may follow at once."""
        if not self.enabled or now < self.next_due:
            return False
        ran = False
        try:
            ran = await self.clean_once()
        except Exception as exc:  # sources stay listed until a swap: nothing lost; retry
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("log cleaning failed: %s", exc)
        self.next_due = now if ran else now + self.interval_s
        if not ran:
            self.done.set()
            self.done = trio.Event()
        return ran

    def wake(self) -> None:
        """Look at once (tests, an operator)."""
        self.next_due = 0.0

    async def clean_once(self) -> bool:
        if not self.checkpoints_loaded:
            await self._load_checkpoints()
        candidate = self._choose(self.tier.manifests.manifest, int(time.time() * 1000))
        if candidate is None:
            return False
        try:
            await self.clean_partition(candidate)
        except CleaningAbandoned as exc:
            self.abandoned += 1
            log.info("log cleaning of %s abandoned: %s", _name(candidate.plog), exc)
        return True

    def _choose(self, manifest: Manifest, now_ms: int) -> _Candidate | None:
        compactor = self.tier.compaction
        avoid = compactor.skip | compactor._moving_keys()
        best: _Candidate | None = None
        seen: set[StreamKey] = set()
        for topic in self.tier.broker.store.topics.values():
            for plog in topic.partitions:
                if not plog.owned or plog.fenced or not plog.config.compacted:
                    continue
                key = stream_key(plog)
                stream = manifest.streams.get(key)
                if stream is None:
                    continue
                policy = policy_of(plog.config)
                section = cleanable_section(
                    stream, self.checkpoints.get(key, 0), plog.last_stable_offset, now_ms, policy
                )
                seen.add(key)
                self._set_ratio(plog, key, section.dirty_ratio)
                if not section.due(policy) or any(r.key in avoid for r in section.ranges):
                    continue
                if best is None or (section.forced, section.dirty_ratio) > (
                    best.section.forced,
                    best.section.dirty_ratio,
                ):
                    best = _Candidate(plog, key, section, policy)
        for key in self.ratios.keys() - seen:
            del self.ratios[key]
        return best

    # -- one cleaning ------------------------------------------------------------------------

    async def clean_partition(self, candidate: _Candidate) -> None:
        plog, key, section = candidate.plog, candidate.key, candidate.section
        stream_id = plog.stream_id
        now_ms = int(time.time() * 1000)
        aborted = [(a.producer_id, a.first_offset, a.last_offset) for a in plog.txns.aborted]
        if self.offset_map is None:
            self.offset_map = OffsetMap(self.budget_bytes)
        offset_map = self.offset_map
        offset_map.clear()
        started = time.monotonic()
        end = section.end
        for rng in section.ranges:
            if rng.end <= section.first_dirty:
                continue
            batches = await self._stream_batches(rng, key, stream_id)
            result = await trio.to_thread.run_sync(
                build_offset_map,
                batches,
                offset_map,
                max(section.first_dirty, rng.start),
                section.end,
                aborted,
            )
            if result.full:
                end = result.end
                break
        if end <= section.first_dirty:
            raise ValueError(
                f"{_name(plog)}: the batch at {end} holds more keys than the offset map's "
                f"{offset_map.capacity} (log_cleaner_dedupe_buffer_bytes)"
            )
        cleaner = StreamCleaner(
            offset_map, end, now_ms, candidate.policy.delete_retention_ms, aborted
        )
        replaced = 0
        for rng in section.ranges:
            if rng.start >= end:
                break
            if plog.fenced or not plog.owned:
                # Being moved away: its new leader adopts the ranges as they are listed now.
                raise CleaningAbandoned("the partition is moving to another main")
            replaced += await self._rewrite(rng, key, stream_id, cleaner)
        self.checkpoints[key] = end
        await self._save_checkpoints()
        self.stats.add(cleaner.stats)
        self.cleanings += 1
        self.last_error = None
        stats = cleaner.stats
        self.last_cleaning = {
            "partition": _name(plog),
            "start": section.log_start,
            "first_dirty": section.first_dirty,
            "end": end,
            "dirty_ratio": round(section.dirty_ratio, 4),
            "map_entries": len(offset_map),
            "records_read": stats.records_read,
            "records_removed": stats.records_removed,
            "bytes_read": stats.bytes_read,
            "bytes_written": stats.bytes_written,
            "objects_replaced": replaced,
            "seconds": round(time.monotonic() - started, 3),
        }
        self.cleaned.set()
        self.cleaned = trio.Event()
        log.info("log cleaning: %s", self.last_cleaning)

    async def _load_checkpoints(self) -> None:
        found = await self.tier.astore.get(checkpoint_key(self.tier.config.node_id))
        self.checkpoints_loaded = True
        if found is None:
            return
        try:
            loaded = decode_checkpoints(found[0])
        except ValueError as exc:
            log.warning("ignoring the log cleaner's checkpoints (all counts as dirty): %s", exc)
            return
        self.checkpoints = {**loaded, **self.checkpoints}

    async def _save_checkpoints(self) -> None:
        listed = self.tier.manifests.manifest.streams.keys()
        self.checkpoints = {k: v for k, v in self.checkpoints.items() if k in listed}
        data = encode_checkpoints(self.tier.config.node_id, self.checkpoints)
        try:
            await self.tier.astore.put(checkpoint_key(self.tier.config.node_id), data)
        except (ObjectStoreError, OSError) as exc:
            log.warning("saving the log cleaner's checkpoints failed: %s", exc)

    async def _get(self, key: str) -> bytes:
        found = await self.tier.astore.get(key)
        if found is None:
            if key in self.tier.manifests.manifest.keys():
                self.tier.compaction._skip(key, "listed in the manifest but missing")
            raise CleaningAbandoned(f"{key} is gone")
        return found[0]

    def _job(self, rng: ObjectRange, key: StreamKey) -> CompactionJob:
        """A one-object job for the object holding `rng`, with every stream's range in it."""
        manifest = self.tier.manifests.manifest
        ranges = tuple(
            SourceRange(k, s.topic, r)
            for k, s in manifest.streams.items()
            for r in s.ranges
            if r.key == rng.key
        )
        if not any(r.stream == key and r.range == rng for r in ranges):
            raise CleaningAbandoned(f"{rng.key} no longer holds [{rng.start}, {rng.end})")
        return CompactionJob(JobKind.CLEAN, (rng.key,), ranges)

    async def _stream_batches(
        self, rng: ObjectRange, key: StreamKey, stream_id: int
    ) -> list[memoryview]:
        """The partition's batches in one object range, checked (sizes, CRCs, coverage)."""
        data = await self._get(rng.key)
        job = CompactionJob(JobKind.CLEAN, (rng.key,), (SourceRange(key, "", rng),))

        def collect() -> list[memoryview]:
            try:
                return collect_stream_batches(job, {rng.key: data})[stream_id]
            except CorruptSource as exc:
                self.tier.compaction._skip(exc.key, str(exc))
                raise CleaningAbandoned(str(exc)) from None

        return await trio.to_thread.run_sync(collect)

    async def _rewrite(
        self, rng: ObjectRange, key: StreamKey, stream_id: int, cleaner: StreamCleaner
    ) -> int:
        """Clean the partition's range in one object and swap the result in; the number of
        objects replaced (0: nothing to change)."""
        tier = self.tier
        job = self._job(rng, key)
        data = await self._get(rng.key)

        def build() -> tuple[UploadPlan, list[tuple[str, bytes]]] | None:
            try:
                streams = collect_stream_batches(job, {rng.key: data})
                kept, changed = cleaner.clean_range(streams[stream_id])
            except (CorruptSource, CorruptRecords) as exc:
                tier.compaction._skip(rng.key, str(exc))
                raise CleaningAbandoned(str(exc)) from None
            if not changed:
                return None
            out: dict[int, list[Any]] = dict(streams)
            out[stream_id] = kept
            plan = plan_upload(out, tier.split_size, new_object_id)
            return plan, [(o.key, o.encode(tier.block_size).to_bytes()) for o in plan.objects]

        built = await trio.to_thread.run_sync(build)
        if built is None:
            return 0
        plan, encoded = built
        for object_key, body in encoded:
            await tier.astore.put(object_key, body)
        outputs = compacted_objects(job, plan, {k: len(b) for k, b in encoded})
        pause_point("after_cleaner_upload")  # crash tests: new objects in, unlisted
        retire_at = int((time.time() + tier.config.compaction_delete_delay_s) * 1000)
        try:
            manifest = await tier.manifests.update(
                lambda m: apply_compaction(m, job, outputs, retire_at)
            )
        except CompactionAbandoned as exc:
            await tier.astore.delete_many([o.key for o in outputs])
            raise CleaningAbandoned(str(exc)) from None
        pause_point("after_cleaner_swap")  # crash tests: swapped, nothing after it ran
        tier.compaction._publish(manifest)
        self.objects_replaced += 1
        self.objects_written += len(outputs)
        return 1

    # -- state -------------------------------------------------------------------------------

    def _set_ratio(self, plog: PartitionLog, key: StreamKey, ratio: float) -> None:
        self.ratios[key] = ratio
        self._ratio_gauge.labels(plog.topic, str(plog.partition)).set(ratio)

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {
            "enabled": self.enabled,
            "cleanings": self.cleanings,
            "abandoned": self.abandoned,
            "failures": self.failures,
            "records_read": s.records_read,
            "records_removed": s.records_removed,
            "tombstones_removed": s.tombstones_removed,
            "markers_removed": s.markers_removed,
            "aborted_batches_removed": s.aborted_batches_removed,
            "bytes_read": s.bytes_read,
            "bytes_written": s.bytes_written,
            "objects_replaced": self.objects_replaced,
            "objects_written": self.objects_written,
            "offset_map_bytes": self.offset_map.nbytes if self.offset_map else 0,
            "checkpoints": {
                f"{k.topic_id.hex()}/{k.partition}": v for k, v in self.checkpoints.items()
            },
            "last_cleaning": self.last_cleaning,
            "last_error": self.last_error,
        }

    def _register_metrics(self) -> None:
        registry = self.tier.broker.registry
        self._ratio_gauge = registry.gauge(
            "zonefleet_log_cleaner_dirty_ratio",
            "Uncleaned over all object bytes of a compacted partition (min.cleanable.dirty.ratio).",
            ("topic", "partition"),
        )
        s = self.stats
        registry.gauge_functions(
            {
                "zonefleet_log_cleaner_cleanings": (
                    "Log cleanings of compacted partitions completed.",
                    lambda: self.cleanings,
                ),
                "zonefleet_log_cleaner_read_bytes": (
                    "Batch bytes the log cleaner filtered.",
                    lambda: s.bytes_read,
                ),
                "zonefleet_log_cleaner_written_bytes": (
                    "Batch bytes the log cleaner kept.",
                    lambda: s.bytes_written,
                ),
                "zonefleet_log_cleaner_removed_records": (
                    "Records the log cleaner removed (superseded, tombstones, aborted, markers).",
                    lambda: s.records_removed,
                ),
                "zonefleet_log_cleaner_failures": (
                    "Log cleanings that failed or were abandoned.",
                    lambda: self.failures + self.abandoned,
                ),
                "zonefleet_log_cleaner_max_dirty_ratio": (
                    "The highest dirty ratio of this main's compacted partitions.",
                    lambda: max(self.ratios.values(), default=0.0),
                ),
            }
        )


def _name(plog: PartitionLog) -> str:
    return f"{plog.topic}/{plog.partition}"
