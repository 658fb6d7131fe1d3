"""The log cleaner of compacted topics (issue 13, "Log compaction"): the I/O around
`s3_commit.cleaner`.

`ObjectTier.run` calls `LogCleaner.tick` next to the object compaction, so no manifest CAS of
the cleaner races one of an upload, a compaction or another cleaning on this main. Every
`log_cleaner_interval_s` it computes, for each partition this main leads whose cleanup.policy
has "compact", the clean and dirty sections of its objects (`cleanable_section`: the last
stable offset, min/max.compaction.lag.ms) and publishes the dirty ratio; it cleans the partition
whose need is greatest (a forced one first, then the highest ratio), then looks again at once.
A cleaning goes one object per step, and each tick takes steps for at most `STEP_BUDGET_S`
before the loop gets back to uploads and compaction, so a large partition does not hold up the
WAL's uploads; each step finds its object by offset in the manifest as it is then.

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
from s3_commit.manifest import Manifest, ObjectRange, StreamKey, StreamManifest, new_object_id
from s3_commit.object_plan import UploadPlan, plan_upload
from s3_commit.object_store import ObjectStoreError
from s3_commit.offset_map import OffsetMap
from telemetry.pause_points import pause_point

if TYPE_CHECKING:
    from main_broker.objects.tier import ObjectTier

__all__ = ["LogCleaner", "policy_of"]

log = logging.getLogger("zonefleet.main_broker.cleaner")

# A tick works on a cleaning this long (whole objects), then hands the loop back to uploads
# and compaction: a partition of many objects does not hold up the WAL's uploads.
STEP_BUDGET_S = 0.5


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


@dataclass(slots=True)
class _Pass:
    """A cleaning under way: first the offset map over [first dirty, end), then the filter over
    [log start, end); `next_offset` is where the next step starts."""

    candidate: _Candidate
    stream_id: int
    aborted: list[tuple[int, int, int]]
    now_ms: int
    end: int
    next_offset: int
    started: float
    cleaner: StreamCleaner | None = None  # None while the map is being built
    replaced: int = 0


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
        self._pass: _Pass | None = None
        self.stats = CleanStats()
        self.cleanings = 0
        self.abandoned = 0
        self.failures = 0
        self.objects_replaced = 0
        self.objects_written = 0
        self.last_error: str | None = None
        self.last_cleaning: dict[str, Any] | None = None
        self.ratios: dict[StreamKey, float] = {}
        self._ratio_labels: dict[StreamKey, tuple[str, str]] = {}
        self.done = trio.Event()  # replaced after each pass that found nothing to do (tests)
        self.cleaned = trio.Event()  # replaced after each completed cleaning (tests)
        self._register_metrics()

    # -- the tier's loop ---------------------------------------------------------------------

    async def tick(self, now: float) -> bool:
        """Work on the cleaning under way for up to `STEP_BUDGET_S`, or start the one that is
        needed most when a look is due; True while there is more to do at once."""
        if not self.enabled or (self._pass is None and now < self.next_due):
            return False
        busy = False
        try:
            busy = await self._work()
        except CleaningAbandoned as exc:
            self.abandoned += 1
            log.info("log cleaning abandoned: %s", exc)
            self._pass = None
            busy = True  # look again at once: another partition, or this one afresh
        except Exception as exc:  # sources stay listed until a swap: nothing lost; retry
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("log cleaning failed: %s", exc)
            self._pass = None
        self.next_due = now if busy else now + self.interval_s
        if not busy:
            self.done.set()
            self.done = trio.Event()
        return busy

    def wake(self) -> None:
        """Look at once (tests, an operator)."""
        self.next_due = 0.0

    async def _work(self) -> bool:
        if self._pass is None:
            if not self.checkpoints_loaded:
                await self._load_checkpoints()
            candidate = self._choose(self.tier.manifests.manifest, int(time.time() * 1000))
            if candidate is None:
                return False
            self._pass = self._start(candidate)
        deadline = time.monotonic() + STEP_BUDGET_S
        while self._pass is not None:
            await self._step(self._pass)
            if time.monotonic() >= deadline:
                break
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
            # Not compacted, led or listed here any more: its series goes from /metrics too.
            del self.ratios[key]
            self._ratio_gauge.remove(*self._ratio_labels.pop(key))
        return best

    # -- one cleaning, a step (one object) at a time -----------------------------------------

    def _start(self, candidate: _Candidate) -> _Pass:
        plog = candidate.plog
        if self.offset_map is None:
            self.offset_map = OffsetMap(self.budget_bytes)
        self.offset_map.clear()
        return _Pass(
            candidate,
            plog.stream_id,
            [(a.producer_id, a.first_offset, a.last_offset) for a in plog.txns.aborted],
            int(time.time() * 1000),
            candidate.section.end,
            candidate.section.first_dirty,
            time.monotonic(),
        )

    async def _step(self, p: _Pass) -> None:
        """One object of the pass. Each step looks the next offset up in the manifest as it is
        now, so a compaction or retention swap between steps changes which object holds it,
        never which offsets a step covers."""
        plog, key = p.candidate.plog, p.candidate.key
        if plog.fenced or not plog.owned:
            # Being moved away: its new leader adopts the ranges as they are listed now.
            raise CleaningAbandoned(f"{_name(plog)} is moving to another main")
        stream = self.tier.manifests.manifest.streams.get(key)
        if stream is None:
            raise CleaningAbandoned(f"{_name(plog)} has no objects any more")
        rng = stream.find(p.next_offset)
        if p.cleaner is None:  # building the offset map over the dirty section
            if rng is None or rng.start >= p.end:
                self._begin_filtering(p, stream)
                return
            assert self.offset_map is not None
            batches = await self._stream_batches(rng, key, p.stream_id)
            try:
                result = await trio.to_thread.run_sync(
                    build_offset_map,
                    batches,
                    self.offset_map,
                    max(p.next_offset, rng.start),
                    p.end,
                    p.aborted,
                )
            except CorruptRecords as exc:
                self.tier.compaction._skip(rng.key, str(exc))
                raise CleaningAbandoned(str(exc)) from None
            if result.full:
                p.end = result.end
                self._begin_filtering(p, stream)
            else:
                p.next_offset = rng.end
            return
        if rng is None or rng.start >= p.end:
            await self._finish(p)
            return
        p.replaced += await self._rewrite(rng, key, p.stream_id, p.cleaner)
        p.next_offset = rng.end

    def _begin_filtering(self, p: _Pass, stream: StreamManifest) -> None:
        assert self.offset_map is not None
        if p.end <= p.candidate.section.first_dirty:
            raise ValueError(
                f"{_name(p.candidate.plog)}: the batch at {p.end} holds more keys than the "
                f"offset map's {self.offset_map.capacity} (log_cleaner_dedupe_buffer_bytes)"
            )
        p.cleaner = StreamCleaner(
            self.offset_map, p.end, p.now_ms, p.candidate.policy.delete_retention_ms, p.aborted
        )
        p.next_offset = stream.start_offset

    async def _finish(self, p: _Pass) -> None:
        cleaner = p.cleaner
        assert cleaner is not None and self.offset_map is not None
        section = p.candidate.section
        self._pass = None
        plog = p.candidate.plog
        if plog.owned and not plog.fenced and plog.objects is not None:
            # The WAL index may still hold copies of what the objects now hold cleaned (until
            # WAL retention deletes their segments; the active one may stay for long): reads
            # below the end go to the objects from now on.
            plog.index.drop_front(plog.index.first_index_at(min(p.end, plog.objects.end_offset)))
        self.checkpoints[p.candidate.key] = p.end
        await self._save_checkpoints()
        self.stats.add(cleaner.stats)
        self.cleanings += 1
        self.last_error = None
        stats = cleaner.stats
        self.last_cleaning = {
            "partition": _name(p.candidate.plog),
            "start": section.log_start,
            "first_dirty": section.first_dirty,
            "end": p.end,
            "dirty_ratio": round(section.dirty_ratio, 4),
            "map_entries": len(self.offset_map),
            "records_read": stats.records_read,
            "records_removed": stats.records_removed,
            "bytes_read": stats.bytes_read,
            "bytes_written": stats.bytes_written,
            "objects_replaced": p.replaced,
            "seconds": round(time.monotonic() - p.started, 3),
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
        labels = self._ratio_labels[key] = (plog.topic, str(plog.partition))
        self._ratio_gauge.labels(*labels).set(ratio)

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
