"""The main broker's durable state on its WAL: topics, partition logs, offsets, producer ids.

Every state change is a WAL record; on start the store replays the WAL (oldest retained
segment first, which begins with a SNAPSHOT of everything before it) and rebuilds the same
state. The WAL's group commit is the only durability point: callers get their answer once the
group holding their record has been fsynced.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import trio

from kafka_wire.control_batch import build_marker
from kafka_wire.record_batch import parse_batch_header
from main_broker import links_floor
from main_broker.linked_payloads import LinkedPayloads
from main_broker.partition_log import BatchEntry, PartitionLog
from main_broker.state_stream import StateWatcher
from main_broker.topic_config import EffectiveTopicConfig
from shared_wal import (
    AppendTicket,
    RecordType,
    WalPosition,
    WalReader,
    WalRecord,
    WalWriter,
)
from shared_wal import broker_records as wal_records
from shared_wal.batch_reader import BatchReader, Buffer
from shared_wal.broker_records import PreparedLink

if TYPE_CHECKING:
    from main_broker.appender import WalIntent
    from s3_commit.manifest import Manifest

log = logging.getLogger("zonefleet.main_broker.store")

PRODUCER_ID_BLOCK = 1000

# The SNAPSHOT body's sections that participants own, and the CONTROL record kinds they write
# and replay (the store's own: topics, producer ids, documents, log starts, takeovers).
PARTICIPANT_SECTIONS = ("offsets", "groups", "consumer_groups", "txn_offsets", "transactions")
PARTICIPANT_KINDS = frozenset(
    {
        "offsets",
        "group_delete",
        "offsets_delete",
        "classic_group",
        "consumer_group",
        "txn_offsets",
        "txn_offsets_end",
        "txn",
    }
)


class StoreParticipant(Protocol):
    """A component whose state lives on the store's WAL beside the topics (group offsets,
    classic groups, KIP-848 groups): it owns one section of every SNAPSHOT and some CONTROL
    record kinds, writes its records itself, and gets both back on replay."""

    @property
    def snapshot_section(self) -> str:
        """Its section of the SNAPSHOT body (one of PARTICIPANT_SECTIONS)."""
        ...

    @property
    def record_kinds(self) -> frozenset[str]:
        """The CONTROL record kinds (`k`) it replays (of PARTICIPANT_KINDS)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """Its section of a SNAPSHOT being written (msgpack-encodable)."""
        ...

    def restore(self, section: dict[str, Any]) -> None:
        """Its section of the SNAPSHOT replay starts from."""
        ...

    def replay(self, header: dict[str, Any]) -> None:
        """One of its CONTROL records, as replay reads it."""
        ...


class TopicDeletionListener(Protocol):
    def topic_deleted(self, name: str, topic_id: bytes | None) -> None:
        """A topic leaves the store (DeleteTopics, replay, the cluster document); `topic_id`
        is None when the store did not hold it (a replayed deletion of an unknown topic)."""
        ...


class ObjectSource(Protocol):
    def adopt(self, plog: PartitionLog) -> bool:
        """Give the partition its committed objects; True when its offsets moved."""
        ...


class RegistrationClosed(RuntimeError):
    """A participant registered with a store that has started replaying its WAL: it would
    have missed the records replayed before it."""


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: bytes
    configs: dict[str, str]
    effective: EffectiveTopicConfig
    partitions: list[PartitionLog] = field(default_factory=list)


class BatchCache:
    """The WAL cache: recent batch bytes kept in memory, bounded in bytes, oldest out first."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.bytes = 0
        self._order: deque[BatchEntry] = deque()

    def add(self, entry: BatchEntry) -> None:
        self._order.append(entry)
        self.bytes += entry.size
        while self.bytes > self.budget and self._order:
            oldest = self._order[0]
            if oldest.position is None:
                break  # not durable yet: the bytes are the only copy we can serve from
            self._order.popleft()
            oldest.data = None
            self.bytes -= oldest.size


class LogStore:
    """A main's topics and partition logs, rebuilt from its WAL and changed only through it.

    It owns the WAL writer and reader, the batch cache, the topics (configs, partitions,
    leaders), producer ids and the small documents; it tells state subscribers (the zone
    proxies' state stream) what changed.

    Other components plug in by registering before `replay`, in any order (registering once
    replay has started raises RegistrationClosed):

    - `register(StoreParticipant)`: a section of every SNAPSHOT and the CONTROL record kinds
      it replays (group offsets, classic and KIP-848 groups: main_broker/groups/wiring.py);
    - `listen_topic_deletions(TopicDeletionListener)`: told of every topic that leaves the
      store (offsets of its partitions, its objects: main_broker/objects/retention.py);
    - `attach_objects(ObjectSource)`: the committed objects of every partition the store
      makes, replays or takes over (main_broker/objects/tier.py), when there is an object store.

    The WAL and SNAPSHOT formats do not depend on who registered: a section without a
    participant is written empty, and records of a kind without one are skipped.
    """

    def __init__(
        self,
        wal: WalWriter,
        reader: WalReader,
        cache_budget_bytes: int,
        topic_defaults: dict[str, str],
    ) -> None:
        self.wal = wal
        self.reader = reader
        self.cache = BatchCache(cache_budget_bytes)
        self.topic_defaults = topic_defaults
        self.topics: dict[str, TopicState] = {}
        self.topics_by_id: dict[bytes, TopicState] = {}
        self.next_producer_id = 0
        self._producer_id_limit = 0
        self._producer_id_lock = trio.Lock()
        # Our own segments and the proxies' PREPARED payloads our LINKs point to.
        self.batches = BatchReader(reader.fs, own=reader)
        # Linked batches' bytes, read back off the produce path into the cache.
        self.linked_payloads = LinkedPayloads(self.batches, self.cache.add)
        self._watchers: list[StateWatcher] = []
        # Per proxy writer, the lowest PREPARED offset our un-uploaded LINKs point to
        # (main_broker/links_floor.py); published on the state stream.
        self.links_floor: dict[str, int] = {}
        self.data_arrived = trio.Event()
        # The registry (see the class docstring); closed once replay starts.
        self._replay_started = False
        self._sections: dict[str, StoreParticipant] = {}
        self._kinds: dict[str, StoreParticipant] = {}
        self._deletion_listeners: list[TopicDeletionListener] = []
        self._objects: ObjectSource | None = None
        # The committed object manifest (None without an object store): state subscribers
        # get it whole, then the rows each commit changed.
        self.manifest: Manifest | None = None
        # Small whole documents kept on the WAL, by name (main_broker/security/doc_store.py: a lone
        # main's ACLs and SCRAM credentials); the last one written wins, snapshots carry them.
        self.documents: dict[str, bytes] = {}

    # -- the registry ------------------------------------------------------------------------

    def _check_open(self, what: object) -> None:
        if self._replay_started:
            raise RegistrationClosed(
                f"{what!r} registered with the log store after its WAL replay started; "
                "register every participant before LogStore.replay"
            )

    def register(self, participant: StoreParticipant) -> None:
        """Add a participant (before replay); its section and kinds must be free."""
        self._check_open(participant)
        section, kinds = participant.snapshot_section, participant.record_kinds
        if section not in PARTICIPANT_SECTIONS:
            raise ValueError(f"unknown snapshot section {section!r}")
        if section in self._sections:
            raise ValueError(f"snapshot section {section!r} is taken")
        if not kinds <= PARTICIPANT_KINDS:
            raise ValueError(f"unknown record kinds {sorted(kinds - PARTICIPANT_KINDS)}")
        if taken := sorted(kinds & self._kinds.keys()):
            raise ValueError(f"record kinds {taken} are taken")
        self._sections[section] = participant
        for kind in kinds:
            self._kinds[kind] = participant

    def listen_topic_deletions(self, listener: TopicDeletionListener) -> None:
        """Tell `listener` of every topic that leaves the store (register before replay)."""
        self._check_open(listener)
        self._deletion_listeners.append(listener)

    def attach_objects(self, source: ObjectSource) -> None:
        """The broker's object tier (before replay): every partition the store makes, replays
        or takes over adopts its committed objects from it."""
        self._check_open(source)
        if self._objects is not None:
            raise ValueError("the log store already has an object source")
        self._objects = source

    def adopt_objects(self, plog: PartitionLog) -> bool:
        """Give the partition its committed objects (none without an object store); True
        when its offsets moved."""
        return self._objects is not None and self._objects.adopt(plog)

    def _replay_participant(self, kind: str, header: dict[str, Any]) -> None:
        participant = self._kinds.get(kind)
        if participant is not None:
            participant.replay(header)

    # -- topics ------------------------------------------------------------------------------

    def _apply_topic_create(
        self, name: str, topic_id: bytes, partitions: int, configs: dict[str, str]
    ) -> TopicState:
        effective = EffectiveTopicConfig.from_explicit(configs, self.topic_defaults)
        state = TopicState(name, topic_id, dict(configs), effective)
        state.partitions = [PartitionLog(name, p, topic_id, effective) for p in range(partitions)]
        for plog in state.partitions:
            self.adopt_objects(plog)
        self.topics[name] = state
        self.topics_by_id[topic_id] = state
        self._topic_changed(name)
        for plog in state.partitions:
            self._partition_changed(plog)
        return state

    def _apply_topic_delete(self, name: str) -> None:
        state = self.topics.get(name)
        topic_id = state.topic_id if state is not None else None
        for listener in self._deletion_listeners:
            listener.topic_deleted(name, topic_id)
        self.topics.pop(name, None)
        self._topic_changed(name)
        if state is not None:
            self.topics_by_id.pop(state.topic_id, None)
            for plog in state.partitions:
                for entry in plog.entries:
                    entry.data = None

    async def create_topic(
        self,
        name: str,
        partitions: int,
        configs: dict[str, str],
        topic_id: bytes | None = None,
        leaders: list[int | None] | None = None,
    ) -> TopicState:
        """`leaders`: who leads each partition (None: this broker), set before anyone sees it."""
        topic_id = topic_id or uuid.uuid4().bytes
        header = wal_records.topic_create_header(name, topic_id, partitions, configs)
        ticket = self.wal.submit(RecordType.CONTROL, header)
        state = self._apply_topic_create(name, topic_id, partitions, configs)
        if leaders is not None:
            self.set_leaders(name, leaders)
        await ticket.wait()
        return state

    async def delete_topic(self, name: str) -> None:
        ticket = self.wal.submit(RecordType.CONTROL, wal_records.topic_delete_header(name))
        self._apply_topic_delete(name)
        await ticket.wait()

    # -- topic changes (configs, partitions, log start) ---------------------------------------

    def _apply_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        state = self.topics.get(name)
        if state is None:
            return
        state.configs = dict(configs)
        state.effective = EffectiveTopicConfig.from_explicit(configs, self.topic_defaults)
        for plog in state.partitions:
            plog.config = state.effective  # produce and retention read it from here on
        self._topic_changed(name)

    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """The topic's whole explicit config set (AlterConfigs, IncrementalAlterConfigs)."""
        ticket = self.wal.submit(
            RecordType.CONTROL, wal_records.topic_configs_header(name, configs)
        )
        self._apply_topic_configs(name, configs)
        await ticket.wait()

    def _apply_add_partitions(self, name: str, count: int) -> None:
        state = self.topics.get(name)
        if state is None or count <= len(state.partitions):
            return
        for index in range(len(state.partitions), count):
            plog = PartitionLog(name, index, state.topic_id, state.effective)
            self.adopt_objects(plog)
            state.partitions.append(plog)
            self._partition_changed(plog)
        self._topic_changed(name)

    async def add_partitions(
        self, name: str, count: int, leaders: list[int | None] | None = None
    ) -> None:
        """CreatePartitions: the topic grows to `count` partitions (`leaders`: for all)."""
        ticket = self.wal.submit(
            RecordType.CONTROL, wal_records.topic_partitions_header(name, count)
        )
        self._apply_add_partitions(name, count)
        if leaders is not None:
            self.set_leaders(name, leaders)
        await ticket.wait()

    async def delete_records(self, plog: PartitionLog, offset: int) -> int:
        """DeleteRecords: move the log start up to `offset`, durably; the new log start."""
        if plog.delete_records(offset):
            header = wal_records.log_start_header(plog.topic, plog.partition, offset)
            ticket = self.wal.submit(RecordType.CONTROL, header)
            self.partition_moved(plog)
            await ticket.wait()
        return plog.log_start_offset

    @property
    def wal_writer_id(self) -> str:
        return self.reader.writer_id

    def watch(self) -> StateWatcher:
        watcher = StateWatcher()
        self._watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: StateWatcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def _partition_changed(self, plog: PartitionLog) -> None:
        for watcher in self._watchers:
            watcher.mark_partition(plog)

    def _aborted_changed(self, plog: PartitionLog) -> None:
        for watcher in self._watchers:
            watcher.mark_aborted(plog)

    def partition_moved(self, plog: PartitionLog) -> None:
        """A partition's offsets moved outside produce (objects adopted): tell subscribers
        and waiting fetches."""
        self._partition_changed(plog)
        self.notify_data()

    def note_link(self, target: WalPosition) -> None:
        """A LINK to `target` was indexed: subscribers hear of a floor it lowers before the
        LINK is acknowledged, so a proxy never frees a payload a main has just linked."""
        if links_floor.lower(self.links_floor, target):
            self._links_changed()

    def set_links_floor(self, floors: dict[str, int]) -> None:
        """Floors recomputed from the partitions (after an upload)."""
        if floors != self.links_floor:
            self.links_floor = floors
            self._links_changed()

    def _links_changed(self) -> None:
        for watcher in self._watchers:
            watcher.mark_links()

    def set_manifest(self, manifest: Manifest) -> None:
        """A manifest commit: subscribers are sent the streams it changed."""
        self.manifest = manifest
        for watcher in self._watchers:
            watcher.mark_objects()

    async def wait_manifest_published(self, version: int, timeout: float) -> bool:
        """Wait until every current state subscriber was sent manifest `version` (or later),
        at most `timeout` seconds; returns whether they all were."""
        with trio.move_on_after(timeout):
            while True:
                behind = [w for w in self._watchers if w.sent_manifest_version < version]
                if not behind:
                    return True
                await behind[0].sent.wait()
        return False

    def set_leaders(self, name: str, leaders: list[int | None]) -> None:
        """Who leads each partition (None: this broker); subscribers hear of changes."""
        state = self.topics[name]
        changed = False
        for plog, leader in zip(state.partitions, leaders, strict=True):
            if plog.leader_id != leader:
                plog.leader_id = leader
                changed = True
                self._partition_changed(plog)
        if changed:
            self._topic_changed(name)

    def _topic_changed(self, name: str) -> None:
        for watcher in self._watchers:
            watcher.mark_topic(name)

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        state = self.topics.get(topic)
        if state is None or not 0 <= partition < len(state.partitions):
            return None
        return state.partitions[partition]

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())

    def led_partition_count(self) -> int:
        return sum(p.owned for t in self.topics.values() for p in t.partitions)

    async def put_document(self, name: str, data: bytes) -> None:
        """Replace document `name`; durable when this returns."""

        def applied() -> None:
            self.documents[name] = data

        header = wal_records.document_header(name, data)
        await self.wal.append(RecordType.CONTROL, header, on_durable=applied)

    # -- produce -----------------------------------------------------------------------------

    def submit_intent(self, intent: WalIntent) -> AppendTicket:
        """Queue the WAL record of a freshly appended batch (an `Appender` decision); returns
        the WAL ticket. The writer applies its durability as the group commit lands (the high
        watermark moves, fetches wake), whether or not anyone waits on the ticket.

        A batch a proxy already wrote (`intent.prepared`) gets a LINK record with no payload;
        any other gets a DATA record carrying the batch.
        """
        plog, entry, prepared = intent.plog, intent.entry, intent.prepared
        header = wal_records.data_header(
            plog.topic,
            plog.partition,
            entry.base_offset,
            entry.last_offset,
            entry.max_timestamp,
            intent.producer,
            intent.transactional,
        )
        if prepared is not None:
            lat = plog.config.log_append_time
            header = wal_records.link_header(header, prepared, entry.size, plog.leader_epoch, lat)
            entry.link = PreparedLink(prepared, plog.leader_epoch, lat)
            self.note_link(prepared)
            ticket = self.wal.submit(RecordType.LINK, header)
        else:
            assert entry.data is not None
            ticket = self.wal.submit(RecordType.DATA, header, entry.data)
        # Set before any checkpoint, so before the writer can resolve the ticket.
        ticket.on_durable = partial(self._on_durable, plog, entry, ticket)
        if entry.data is not None:
            self.cache.add(entry)
        return ticket

    def _on_durable(self, plog: PartitionLog, entry: BatchEntry, ticket: AppendTicket) -> None:
        position = ticket.position
        assert position is not None  # set before the writer runs on_durable
        if plog.mark_durable(entry, position):
            self._partition_changed(plog)
            self.notify_data()
        if entry.data is None and entry.link is not None:
            self.linked_payloads.want(entry)

    def append_marker(
        self,
        plog: PartitionLog,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        now_ms: int,
    ) -> AppendTicket:
        """Append a transaction marker (WriteTxnMarkers) as a DATA record; the producer's
        transaction closes (the last stable offset moves) when it is durable."""
        buf = memoryview(
            bytearray(build_marker(commit, producer_id, producer_epoch, coordinator_epoch, now_ms))
        )
        batch = parse_batch_header(buf)
        entry = plog.append_marker(buf, batch, now_ms)
        header = wal_records.marker_header(
            plog.topic,
            plog.partition,
            entry.base_offset,
            entry.max_timestamp,
            producer_id,
            producer_epoch,
            commit,
        )
        ticket = self.wal.submit(RecordType.DATA, header, buf)

        def durable() -> None:
            self._on_durable(plog, entry, ticket)
            if plog.apply_marker(producer_id, entry.base_offset, commit) is not None:
                self._aborted_changed(plog)
            self._partition_changed(plog)
            self.notify_data()

        ticket.on_durable = durable
        self.cache.add(entry)
        return ticket

    def notify_data(self) -> None:
        self.data_arrived.set()
        self.data_arrived = trio.Event()

    async def batch_bytes(self, entry: BatchEntry) -> memoryview | bytes | bytearray:
        return await self.batches.batch_bytes(entry)

    # -- producer ids ------------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        async with self._producer_id_lock:
            if self.next_producer_id >= self._producer_id_limit:
                limit = self.next_producer_id + PRODUCER_ID_BLOCK

                def applied() -> None:
                    self._producer_id_limit = limit

                header = wal_records.producer_ids_header(limit)
                await self.wal.append(RecordType.CONTROL, header, on_durable=applied)
            pid = self.next_producer_id
            self.next_producer_id += 1
            return pid

    # -- offsets -----------------------------------------------------------------------------

    # `applied` puts the change into the offset table as the record becomes durable, so the
    # snapshot of a segment rolled right after it holds it (shared_wal.AppendTicket).

    async def persist_offsets(
        self,
        group_id: str,
        offsets: list[tuple[str, int, int, int, str]],
        applied: Callable[[], None] | None = None,
    ) -> None:
        header = wal_records.offsets_header(group_id, offsets)
        await self.wal.append(RecordType.CONTROL, header, on_durable=applied)

    async def persist_offsets_delete(
        self,
        group_id: str,
        partitions: list[tuple[str, int]] | None,
        applied: Callable[[], None] | None = None,
    ) -> None:
        if partitions is None:
            header = wal_records.group_delete_header(group_id)
        else:
            header = wal_records.offsets_delete_header(group_id, partitions)
        await self.wal.append(RecordType.CONTROL, header, on_durable=applied)

    # -- snapshot and replay -----------------------------------------------------------------

    def _section(self, name: str) -> dict[str, Any]:
        participant = self._sections.get(name)
        return participant.snapshot() if participant is not None else {}

    def snapshot(self) -> tuple[dict[str, Any], bytes]:
        # The body's key order is part of the format (msgpack keeps it): do not reorder.
        body = {
            "topics": [
                {
                    "n": t.name,
                    "id": t.topic_id,
                    "c": t.configs,
                    "parts": [p.to_snapshot() for p in t.partitions],
                }
                for t in self.topics.values()
            ],
            "pid_next": self._producer_id_limit,
            "offsets": self._section("offsets"),
            "docs": dict(self.documents),
            "groups": self._section("groups"),
            "consumer_groups": self._section("consumer_groups"),
            "txn_offsets": self._section("txn_offsets"),
            "transactions": self._section("transactions"),
        }
        return wal_records.snapshot_record(body)

    def _restore_snapshot(self, payload: memoryview) -> None:
        body = wal_records.decode_snapshot(payload)
        for t in body["topics"]:
            state = self._apply_topic_create(t["n"], t["id"], len(t["parts"]), t["c"])
            for plog, snap in zip(state.partitions, t["parts"], strict=True):
                plog.restore_snapshot(snap)
        self.next_producer_id = self._producer_id_limit = body["pid_next"]
        self.documents = {str(n): bytes(d) for n, d in body.get("docs", {}).items()}
        for section in PARTICIPANT_SECTIONS:
            participant = self._sections.get(section)
            if participant is not None:
                participant.restore(body.get(section, {}))

    def replay(self, records: Iterable[WalRecord]) -> int:
        """Rebuild the state from the WAL's records; closes the registry (see the class
        docstring). Returns how many records it read."""
        self._replay_started = True
        count = 0
        first = True
        for record in records:
            count += 1
            try:
                self._replay_one(record, first)
            except (KeyError, TypeError, ValueError) as exc:
                log.error(
                    "skipping unreadable WAL record at %s: %r",
                    record.position,
                    exc,
                    extra={"position": str(record.position)},
                )
            first = False
        for topic in self.topics.values():
            for plog in topic.partitions:
                self.adopt_objects(plog)
                for entry in plog.entries:
                    if entry.data is not None:
                        self.cache.add(entry)
        return count

    def adopt_all_objects(self) -> None:
        """Re-apply the committed objects to every partition (after the manifest loaded)."""
        for topic in self.topics.values():
            for plog in topic.partitions:
                if self.adopt_objects(plog):
                    self._partition_changed(plog)

    def _replay_one(self, record: WalRecord, first: bool) -> None:
        header = record.header
        if record.type == RecordType.CONTROL and header.get("k") == "takeover":
            self.apply_takeover(header)
            return
        if record.type == RecordType.SNAPSHOT:
            # Only the oldest retained segment's snapshot matters; later ones repeat what the
            # records before them already rebuilt.
            if first:
                self._restore_snapshot(record.payload)
            return
        if record.type == RecordType.DATA:
            plog = self.partition(header["t"], header["p"])
            if plog is not None:
                plog.replay_batch(header, record.payload, record.position)
            return
        if record.type == RecordType.LINK:
            plog = self.partition(header["t"], header["p"])
            if plog is not None:
                link = PreparedLink.from_header(header)
                plog.replay_batch(header, None, record.position, link)
                self.note_link(link.target)
            return
        if record.type != RecordType.CONTROL:
            return
        kind = header["k"]
        if kind == "doc":
            self.documents[str(header["n"])] = bytes(header["b"])
            return
        if kind == "topic_create":
            existing = self.topics.get(header["n"])
            if existing is not None and existing.topic_id == header["id"]:
                return  # the snapshot this replay started from already holds it
            self._apply_topic_delete(header["n"])
            self._apply_topic_create(header["n"], header["id"], header["np"], header["c"])
        elif kind == "topic_delete":
            self._apply_topic_delete(header["n"])
        elif kind == "topic_configs":
            self._apply_topic_configs(header["n"], header["c"])
        elif kind == "topic_partitions":
            self._apply_add_partitions(header["n"], header["np"])
        elif kind == "log_start":
            plog = self.partition(header["t"], header["p"])
            if plog is not None:
                plog.delete_records(header["o"])
        elif kind == "pids":
            self.next_producer_id = self._producer_id_limit = max(
                self._producer_id_limit, header["upto"]
            )
        elif kind in PARTICIPANT_KINDS:
            self._replay_participant(kind, header)
        else:
            log.warning("unknown control record kind %r at %s", kind, record.position)

    def on_segments_deleted(self, segments: list[int]) -> None:
        self.reader.forget(segments)
        deleted = set(segments)
        for topic in self.topics.values():
            for plog in topic.partitions:
                start = plog.log_start_offset
                plog.drop_segments(deleted)
                if plog.log_start_offset != start:
                    self._partition_changed(plog)
        if self.manifest is None:
            # No object tier: the LINKs that retention just deleted were the only use of
            # their payloads, so the proxies may drop them too.
            owned = (p for t in self.topics.values() for p in t.partitions if p.owned)
            self.set_links_floor(links_floor.links_floor(owned, {}))

    # -- reassignment ------------------------------------------------------------------------

    async def take_over(
        self, header: dict[str, Any], batches: list[tuple[dict[str, Any], Buffer]]
    ) -> PartitionLog:
        """Write a `takeover` record and the taken-over batches (DATA headers and payloads,
        original offsets) to our WAL; the partition holds each as it becomes durable, so a
        snapshot opening the next segment has them (as every CONTROL record's effect)."""
        taken: list[PartitionLog] = []

        def apply_header() -> None:
            plog = self.apply_takeover(header)
            if plog is not None:
                taken.append(plog)

        tickets = [self.wal.submit(RecordType.CONTROL, header, on_durable=apply_header)]
        for data_header, payload in batches:
            ticket = self.wal.submit(RecordType.DATA, data_header, payload)
            ticket.on_durable = partial(self._replay_taken, taken, data_header, payload, ticket)
            tickets.append(ticket)
        for ticket in tickets:
            await ticket.wait()
        if not taken:
            raise KeyError(f"{header['t']}-{header['p']} is not known here")
        plog = taken[0]
        for entry in plog.entries:
            if entry.data is not None:
                self.cache.add(entry)
        self.partition_moved(plog)
        return plog

    @staticmethod
    def _replay_taken(
        taken: list[PartitionLog],
        data_header: dict[str, Any],
        payload: Buffer,
        ticket: AppendTicket,
    ) -> None:
        if taken and ticket.position is not None:
            taken[0].replay_batch(data_header, memoryview(payload), ticket.position)

    def apply_takeover(self, header: dict[str, Any]) -> PartitionLog | None:
        """A `takeover` CONTROL record (main_broker/cluster/reassignment.py): the partition restarts
        at the adopted objects' end with the previous leader's producer state; the DATA
        records after it bring the taken-over tail."""
        plog = self.partition(header["t"], header["p"])
        if plog is None:
            return None
        plog.reset_for_takeover(
            header["s"], header["e"], header["pr"], header.get("ls", 0), header.get("tx")
        )
        self.adopt_objects(plog)
        self._partition_changed(plog)
        self._aborted_changed(plog)
        return plog
