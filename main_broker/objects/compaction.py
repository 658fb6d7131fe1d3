"""Background compaction of the main's objects: the I/O around `s3_commit.compaction`.

`ObjectTier.run` calls `Compactor.tick` between uploads, so a compaction's manifest CAS never
races an upload's. A job GETs its source objects whole (they are small), rebuilds the streams'
batches from them as views (never decoding records), PUTs the new objects, swaps the manifest
by CAS, publishes it on the state stream and points the partitions at the new objects. The
sources stay retired in the manifest (referenced, so no orphan sweep takes them) until
`compaction_delete_delay_s` after the swap: a proxy, or a fetch of this main, that still uses
the previous manifest reads them meanwhile. Then they are deleted and dropped from the
manifest; a restart picks up where that was.

A crash between the PUTs and the CAS leaves the new objects unlisted: the orphan sweep deletes
them, exactly as for an upload. An abandoned job (retention or DeleteTopics changed a source
meanwhile) deletes its new objects at once, since no manifest ever listed them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from s3_commit.compaction import (
    CompactionAbandoned,
    CompactionJob,
    CompactionSettings,
    CorruptSource,
    JobKind,
    apply_compaction,
    collect_stream_batches,
    compacted_objects,
    due_retired,
    plan_compaction,
    without_retired,
)
from s3_commit.manifest import Manifest, UploadedObject, new_object_id
from s3_commit.manifest_store import referenced_keys
from s3_commit.object_plan import UploadPlan, plan_upload
from s3_commit.object_store import ObjectStoreError
from telemetry.pause_points import pause_point

if TYPE_CHECKING:
    from main_broker.objects.tier import ObjectTier

__all__ = ["Compactor"]

log = logging.getLogger("zonefleet.main_broker.compaction")


class Compactor:
    def __init__(self, tier: ObjectTier) -> None:
        self.tier = tier
        self.config = tier.config
        self.next_due = time.monotonic() + self.config.compaction_interval_s
        self.compactions = 0
        self.abandoned = 0
        self.failures = 0
        self.objects_replaced = 0
        self.objects_written = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.objects_deleted = 0
        self.last_error: str | None = None
        # Sources found corrupt or missing: no job takes them again (the read path reports
        # them on each read; an operator has to look).
        self.skip: set[str] = set()
        self.done = trio.Event()  # replaced after each compaction pass (tests wait)
        self._register_metrics()

    def settings(self) -> CompactionSettings:
        cfg = self.config
        return CompactionSettings(
            cfg.compaction_small_object_bytes, cfg.compaction_max_object_bytes, self.tier.split_size
        )

    async def tick(self, now: float) -> bool:
        """Delete the retired objects whose delay passed, and run one job when compaction is
        due; returns True when a job ran and another may follow at once."""
        if due_retired(self.tier.manifests.manifest, int(time.time() * 1000)):
            await self.delete_retired()
        if now < self.next_due:
            return False
        ran = False
        try:
            ran = await self.compact_once()
        except Exception as exc:  # the sources stay listed: nothing lost, retry next time
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("compaction failed: %s", exc)
        # While jobs succeed the next one follows at once (after a look at uploads).
        self.next_due = now if ran else now + self.config.compaction_interval_s
        if not ran:
            self.done.set()
            self.done = trio.Event()
        return ran

    async def compact_once(self) -> bool:
        """Plan and run one job; returns whether the manifest was swapped."""
        tier = self.tier
        # Planning is pure but may scan every object: off the event loop.
        skip = frozenset(self.skip) | self._moving_keys()
        job = await trio.to_thread.run_sync(
            plan_compaction, tier.manifests.manifest, self.settings(), skip
        )
        if job is None:
            return False
        objects: dict[str, bytes] = {}
        for key in job.sources:
            found = await tier.astore.get(key)
            if found is None:
                if key not in tier.manifests.manifest.keys():
                    # Retention or DeleteTopics removed (and deleted) it since the plan.
                    self.abandoned += 1
                    log.info("compaction abandoned: %s is no longer listed", key)
                else:
                    self._skip(key, "listed in the manifest but missing")
                return False
            objects[key] = found[0]
            self.bytes_read += len(found[0])

        def build() -> tuple[UploadPlan, list[tuple[str, bytes]]]:
            streams = collect_stream_batches(job, objects)
            plan = plan_upload(streams, tier.split_size, new_object_id)
            return plan, [(o.key, o.encode(tier.block_size).to_bytes()) for o in plan.objects]

        try:
            plan, encoded = await trio.to_thread.run_sync(build)
        except CorruptSource as exc:
            self._skip(exc.key, str(exc))
            return False
        if job.kind is JobKind.SPLIT and not plan.stream_objects:
            # The share was smaller than its recorded bytes: rewriting would change nothing.
            self._skip(job.sources[0], "no share reaches the split size")
            return False
        for key, data in encoded:
            await tier.astore.put(key, data)
        outputs = compacted_objects(job, plan, {key: len(data) for key, data in encoded})
        pause_point("after_compaction_upload")  # crash tests: new objects in, unlisted
        retire_at = int((time.time() + self.config.compaction_delete_delay_s) * 1000)
        try:
            manifest = await tier.manifests.update(
                lambda m: apply_compaction(m, job, outputs, retire_at)
            )
        except CompactionAbandoned as exc:
            self.abandoned += 1
            log.info("compaction abandoned (%s): deleting its %d new objects", exc, len(outputs))
            await tier.astore.delete_many([o.key for o in outputs])
            return False
        pause_point("after_compaction_swap")  # crash tests: swapped, nothing after it ran
        self._publish(manifest)
        self.compactions += 1
        self.objects_replaced += len(job.sources)
        self.objects_written += len(outputs)
        self.bytes_written += sum(len(data) for _, data in encoded)
        self.last_error = None
        self._log_job(job, outputs, manifest)
        return True

    def _moving_keys(self) -> frozenset[str]:
        """Objects with ranges of a partition being moved away: its new leader adopts those
        ranges as our manifest lists them (main_broker/cluster/handoff.py), so they stay as they
        are."""
        manifest = self.tier.manifests.manifest
        keys: set[str] = set()
        for topic in self.tier.broker.store.topics.values():
            for plog in topic.partitions:
                stream = manifest.stream(plog.topic_id, plog.partition) if plog.fenced else None
                if stream is not None:
                    keys.update(r.key for r in stream.ranges)
        return frozenset(keys)

    async def delete_retired(self) -> None:
        tier = self.tier
        due = due_retired(tier.manifests.manifest, int(time.time() * 1000))
        try:
            # A reassigned partition's new leader lists the objects it adopted from our
            # manifest (main_broker/cluster/handoff.py): those stay, for the orphan sweep to delete
            # once no manifest lists them.
            shared = await referenced_keys(tier.astore, skip=tier.manifests.key)
            doomed = [k for k in due if k not in shared]
            # Delete first: a crash before the CAS leaves them retired, deleted again later.
            await tier.astore.delete_many(doomed)
            tier.reader.evict(doomed)
            manifest = await tier.manifests.update(lambda m: without_retired(m, due))
        except (ObjectStoreError, OSError, ValueError) as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("deleting %d replaced objects failed: %s", len(due), exc)
            return
        self.objects_deleted += len(due)
        tier.broker.store.set_manifest(manifest)
        log.info("deleted %d objects compaction replaced", len(due))

    def _publish(self, manifest: Manifest) -> None:
        store = self.tier.broker.store
        # Proxies get the removed keys and the new ranges in one state frame; this main's
        # partitions read from the new objects from now on.
        store.set_manifest(manifest)
        store.adopt_all_objects()

    def _skip(self, key: str, reason: str) -> None:
        self.skip.add(key)
        self.failures += 1
        self.last_error = f"{key}: {reason}"
        log.error("compaction leaves %s alone: %s", key, reason)

    def _log_job(
        self, job: CompactionJob, outputs: list[UploadedObject], manifest: Manifest
    ) -> None:
        log.info(
            "compaction (%s) replaced %d objects (%d bytes) by %d, manifest version %d",
            job.kind.value,
            len(job.sources),
            job.source_bytes,
            len(outputs),
            manifest.version,
        )

    def status(self) -> dict[str, Any]:
        return {
            "compactions": self.compactions,
            "abandoned": self.abandoned,
            "failures": self.failures,
            "objects_replaced": self.objects_replaced,
            "objects_written": self.objects_written,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "retired_objects": len(self.tier.manifests.manifest.retired),
            "objects_deleted": self.objects_deleted,
            "skipped_objects": sorted(self.skip),
            "last_error": self.last_error,
        }

    def _register_metrics(self) -> None:
        registry = self.tier.broker.registry
        gauges = {
            "zonefleet_s3_compactions": (
                "Compaction jobs whose manifest swap succeeded.",
                lambda: self.compactions,
            ),
            "zonefleet_s3_compaction_replaced_objects": (
                "Objects compaction replaced.",
                lambda: self.objects_replaced,
            ),
            "zonefleet_s3_compaction_written_bytes": (
                "Object bytes compaction wrote.",
                lambda: self.bytes_written,
            ),
            "zonefleet_s3_compaction_failures": (
                "Compaction jobs that failed or were abandoned.",
                lambda: self.failures + self.abandoned,
            ),
            "zonefleet_s3_retired_objects": (
                "Replaced objects waiting for their deletion delay.",
                lambda: len(self.tier.manifests.manifest.retired),
            ),
        }
        registry.gauge_functions(gauges)
