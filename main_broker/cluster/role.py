"""A main broker's part in a fleet of several mains.

Topics and the partition-to-main assignment live in the cluster metadata document in the
object store. Every main holds every topic's partition logs, but appends only to the
partitions it leads; the others answer NOT_LEADER_OR_FOLLOWER. Group coordination is split by
a hash of the group id that proxies compute the same way (zone_router.placement).

`ClusterRole` is the clustered `ClusterView` (main_broker/cluster/view.py); a main without a
metadata store has a `LoneMain` instead.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from internal_rpc import RpcClient, RpcError, RpcUnavailable
from internal_rpc.messages import MainUnreachable, MetaChanged
from internal_rpc.reports import report_unreachable
from main_broker.cluster.controller import Controller, Membership
from main_broker.cluster.doc import ClusterDoc, TopicExists, TopicMeta, UnknownTopic
from main_broker.cluster.handoff import Handoff, HandoffHost
from main_broker.cluster.reassignment import evacuate
from main_broker.cluster.sync import ClusterMetadata
from main_broker.cluster.watch import MainWatch
from main_broker.config import MainPeer
from main_broker.log_store import TopicState
from main_broker.partition_log import PartitionLog
from main_broker.security.doc_store import DocumentStore, ObjectDocuments
from s3_commit import AsyncObjectStore, open_object_store
from s3_commit.node_registry import NodeRegistrar, NodeRegistration
from shared_wal.fence import is_fenced, lift_fence
from zone_router import group_coordinator

if TYPE_CHECKING:
    from main_broker.accounting import MainTraffic
    from main_broker.config import BrokerConfig

log = logging.getLogger("zonefleet.main_broker.cluster")

# Producer ids are striped by node id so that mains never hand out the same one.
PRODUCER_ID_STRIDE = 4096
POKE_TIMEOUT_S = 2.0
FENCE_LIFT_POLL_S = 0.5


class RoleHost(HandoffHost, Protocol):
    """What a main's cluster role uses of its broker (`main_broker.broker.MainBroker` is
    one); it hands the same broker to its `Handoff`."""

    @property
    def commit_nursery(self) -> trio.Nursery: ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def rpc_port(self) -> int | None: ...

    @property
    def traffic(self) -> MainTraffic: ...

    def on_partitions_changed(self) -> None: ...


class ClusterRole:
    """This main's part in a fleet of several (a `ClusterView`): the shared metadata document,
    the controller lease, registration, partition hand-offs and pokes to the other mains."""

    def __init__(self, broker: RoleHost) -> None:
        cfg = broker.config
        if cfg.metadata_url is None:
            raise ValueError("a clustered main broker needs metadata_url")
        self.broker = broker
        self.node_id = cfg.node_id
        peers = {m.node_id: m for m in cfg.mains}
        if self.node_id not in peers:
            host, port = cfg.advertised
            peers[self.node_id] = MainPeer(cfg.node_id, cfg.zone, host, port, cfg.rpc_port)
        if any(not 0 <= n < PRODUCER_ID_STRIDE for n in peers):
            raise ValueError(f"main broker node ids must be in 0..{PRODUCER_ID_STRIDE - 1}")
        self.mains = [peers[n] for n in sorted(peers)]
        self.main_ids = [m.node_id for m in self.mains]
        store = open_object_store(cfg.metadata_url)
        # Metadata polls, registrations and the lease are S3 requests the cost report prices.
        store.traffic_hook = broker.traffic.s3_request
        self.meta = ClusterMetadata(store, cfg.cluster_id, self._on_doc, cfg.metadata_poll_s)
        self.session_timeout_s = cfg.session_timeout_s
        self.handoff = Handoff(broker, self)
        self.astore = AsyncObjectStore(store, max_threads=2)
        self.controller = Controller(
            self.astore,
            cfg.node_id,
            broker.registry,
            lease_s=cfg.controller_lease_s,
            interval_s=cfg.registration_interval_s,
            session_timeout_s=cfg.session_timeout_s,
            on_members=self._evacuate if cfg.reassign_dead_mains else None,
        )
        self.registrar: NodeRegistrar | None = None
        self.reassign_dead_mains = cfg.reassign_dead_mains
        # With one main nothing is ever taken over from it: no probes, no fence.
        self.watch = MainWatch(self, cfg.wal_writer_id) if len(self.main_ids) > 1 else None
        if self.watch is not None:
            watch = self.watch
            self.controller.lease.eligible = lambda: not watch.in_minority()
        self._apply_lock = trio.Lock()
        # Metered like every other RPC client: the pokes' frames cross zones and are booked by
        # their sender (tests/test_netns_cost_report.py found them missing from the ledger).
        self._peer_rpcs = {
            m.node_id: RpcClient(
                cfg.node_id,
                cfg.rpc_secret,
                m.host,
                m.rpc_port,
                meter=broker.traffic.rpc,
                tls=cfg.rpc_tls,
            )
            for m in self.mains
            if m.node_id != self.node_id and m.rpc_port is not None and cfg.rpc_secret
        }

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the document (adopting topics only this WAL knows when there is none yet)."""
        await self.meta.refresh()
        store = self.broker.store
        if not self.meta.exists and store.topics:
            local = {n: (t.topic_id, len(t.partitions), t.configs) for n, t in store.topics.items()}

            def adopt(doc: ClusterDoc) -> ClusterDoc:
                for name, (topic_id, count, configs) in local.items():
                    if name not in doc.topics:
                        doc = doc.with_topic(name, topic_id, count, configs, [self.node_id])
                return doc

            await self.meta.update(adopt)
        await self._apply(self.meta.doc)
        if self.watch is not None:
            await self._lift_own_fence()
            self.broker.store.wal.fence_check = True
            await self.watch.check_fence()

    async def _lift_own_fence(self) -> None:
        """A fence left on this main's WAL (shared_wal/fence.py) by a main that took its
        partitions over while a previous incarnation was dead or paused: lifted once no move
        from this main is under way (a takeover reads the WAL with the fence up)."""
        fs = self.broker.store.reader.fs
        writer = self.broker.config.wal_writer_id
        waiting = False
        while await trio.to_thread.run_sync(is_fenced, fs, writer):
            moving = sorted(
                f"{m.topic}-{m.partition}" for m in self.meta.doc.moves.values()
                if m.source == self.node_id
            )  # fmt: skip
            if not moving:
                await trio.to_thread.run_sync(lift_fence, fs, writer)
                log.warning("lifted the fence on WAL %s: nothing is taken over from it", writer)
                return
            if not waiting:
                waiting = True
                log.warning(
                    "WAL %s is fenced while %s are taken over from it: waiting for them",
                    writer,
                    ", ".join(moving),
                )
            await trio.sleep(FENCE_LIFT_POLL_S)
            await self.meta.refresh()

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.controller.run)
                nursery.start_soon(self.handoff.run)
                if self.watch is not None:
                    nursery.start_soon(self.watch.run)
                await self.meta.run()
        finally:
            with trio.CancelScope(shield=True):
                await self.controller.stop()
                for rpc in self._peer_rpcs.values():
                    await rpc.aclose()

    async def run_registration(self) -> None:
        """Register this main (once it serves, so the endpoints are known) and heartbeat;
        another process registering with this node id stops this one."""
        cfg = self.broker.config
        host, port = cfg.advertised
        me = NodeRegistration.new("main", cfg.node_id, cfg.zone, host, port, self.broker.rpc_port)
        self.registrar = registrar = NodeRegistrar(
            self.astore, me, cfg.registration_interval_s, cfg.session_timeout_s
        )
        await registrar.run()

    def status(self) -> dict[str, Any]:
        reg = self.registrar
        return {
            "controller": self.controller.status(),
            "reassignment": self.handoff.status(),
            "registration": None
            if reg is None
            else {
                "key": reg.me.key,
                "heartbeats": reg.heartbeats,
                "failures": reg.failures,
                "last_error": reg.last_error,
            },
        }

    # -- reassignment ------------------------------------------------------------------------

    async def _on_doc(self, doc: ClusterDoc) -> None:
        await self._apply(doc)
        self.handoff.on_doc(doc)

    def reads_fresh(self) -> bool:
        """Whether this main may serve reads now (liveness.reads_fresh): after a pause it
        waits for a look at its WAL's fence first."""
        return self.watch is None or self.watch.reads_fresh()

    async def wait_reads_fresh(self, timeout_s: float) -> bool:
        return self.watch is None or await self.watch.wait_reads_fresh(timeout_s)

    def may_acknowledge(self, plog: PartitionLog) -> bool:
        """Always: the WAL writer looked for a fence after the group commit (shared_wal/fence.py),
        so an append another main may have missed never gets here."""
        return True

    def poke_peers(self) -> None:
        self._poke_peers()

    async def _evacuate(self, members: Membership) -> None:
        """The controller found the registrations: move dead mains' partitions to live ones
        (a main that stopped cleanly keeps its partitions: it is being restarted)."""
        mains = set(self.main_ids)
        dead = {r.node_id for r in members.dead if r.role == "main"} & mains
        live = {r.node_id for r in members.alive if r.role == "main"} & mains
        if self.watch is not None:
            # A heartbeat is a write to the object store: one that went stale while the main
            # answers its probes means the store stalled, not the main (and this main is
            # plainly up).
            answering = {n for n in dead if self.watch.answering(n)} | {self.node_id}
            dead -= answering
            live |= answering & mains
        await self.evacuate_dead(dead, sorted(live), dict.fromkeys(dead, "no heartbeat"))

    async def evacuate_dead(self, dead: set[int], live: list[int], why: dict[int, str]) -> int:
        """Move the partitions of the `dead` mains to the `live` ones (marked source_dead: the
        targets fence the dead mains' WALs); the number of partitions newly moving."""
        now = int(time.time() * 1000)
        before = self.meta.doc
        if evacuate(before, dead, live, now) is before:
            return 0
        doc = await self.meta.update(lambda d: evacuate(d, dead, live, now))
        moving = sorted(
            f"{m.topic}-{m.partition}->{m.target}" for m in doc.moves.values() if m.source in dead
        )
        log.warning(
            "moving dead mains' partitions (%s): %s",
            "; ".join(f"main {n}: {why.get(n, 'dead')}" for n in sorted(dead)),
            ", ".join(moving),
        )
        self.poke_peers()
        return len(moving)

    # -- the document -> local state ---------------------------------------------------------

    async def _apply(self, doc: ClusterDoc) -> None:
        async with self._apply_lock:
            store = self.broker.store
            changed = False
            for name, meta in doc.topics.items():
                local = store.topics.get(name)
                if local is not None and (
                    local.topic_id != meta.topic_id or len(local.partitions) > len(meta.leaders)
                ):
                    await store.delete_topic(name)  # recreated under another id meanwhile
                    local = None
                if local is not None:
                    changed |= await self._apply_topic_changes(local, meta)
                leaders: list[int | None] = [None if n == self.node_id else n for n in meta.leaders]
                if local is None:
                    await store.create_topic(
                        name, len(meta.leaders), meta.configs, meta.topic_id, leaders
                    )
                    changed = True
                else:
                    store.set_leaders(name, leaders)
            for name in [n for n in store.topics if n not in doc.topics]:
                await store.delete_topic(name)
                changed = True
            if changed:
                self.broker.on_partitions_changed()

    async def _apply_topic_changes(self, local: TopicState, meta: TopicMeta) -> bool:
        """CreatePartitions and config changes of a topic this main holds; True when it
        gained partitions."""
        store = self.broker.store
        if meta.configs != local.configs:
            await store.alter_topic_configs(local.name, meta.configs)
        if len(meta.leaders) > len(local.partitions):
            await store.add_partitions(local.name, len(meta.leaders))
            return True  # the caller sets the leaders of all
        return False

    # -- what requests need ------------------------------------------------------------------

    def peer(self, node_id: int) -> MainPeer | None:
        for m in self.mains:
            if m.node_id == node_id:
                return m
        return None

    def coordinator_for(self, group_id: str) -> MainPeer:
        node = group_coordinator(group_id, self.main_ids)
        peer = self.peer(node)
        assert peer is not None
        return peer

    def owns_group(self, group_id: str) -> bool:
        return group_coordinator(group_id, self.main_ids) == self.node_id

    def topic_exists(self, name: str) -> bool:
        return name in self.meta.doc.topics

    async def refresh(self) -> None:
        await self.meta.refresh()

    def poke(self) -> None:
        self.meta.poke()

    def main_unreachable(self, report: MainUnreachable, reporter: int) -> None:
        if self.watch is not None:
            self.watch.report(report, reporter)

    def documents(self) -> DocumentStore:
        return ObjectDocuments(self.astore)  # next to the metadata document

    def live_topic_ids(self) -> set[bytes] | None:
        if not self.meta.exists:
            return None
        return {t.topic_id for t in self.meta.doc.topics.values()}

    def document(self) -> ClusterDoc:
        return self.meta.doc

    async def change_document(self, change: Callable[[ClusterDoc], ClusterDoc]) -> None:
        await self.meta.update(change)
        self.poke_peers()

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicState:
        """Raises TopicExists when another main (or client) created it first."""
        topic_id = uuid.uuid4().bytes
        await self.meta.update(
            lambda doc: doc.with_topic(name, topic_id, partitions, configs, self.main_ids)
        )
        self._poke_peers()
        return self.broker.store.topics[name]

    async def delete_topic(self, name: str) -> None:
        await self.meta.update(lambda doc: doc.without_topic(name) if name in doc.topics else doc)
        self._poke_peers()

    async def alter_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]:
        """Apply `change` to the topic's explicit configs (by CAS, so on the latest set), for
        every main; returns the new set. Raises UnknownTopic or what `change` raises."""
        result: dict[str, str] = {}

        def update(doc: ClusterDoc) -> ClusterDoc:
            meta = doc.topics.get(name)
            if meta is None:
                raise UnknownTopic(name)
            result.clear()
            result.update(change(dict(meta.configs)))
            return doc.with_topic_configs(name, result)

        await self.meta.update(update)
        self._poke_peers()
        return result

    async def create_partitions(
        self, name: str, count: int, preferred: list[int] | None = None
    ) -> None:
        """Grow the topic to `count` partitions, placed on the mains (`preferred`: a leader
        wish per new partition); raises UnknownTopic, or ValueError when it has `count` or
        more already."""
        await self.meta.update(
            lambda doc: doc.with_partitions(name, count, self.main_ids, preferred)
        )
        self._poke_peers()

    def producer_id(self, local_id: int) -> int:
        return local_id * PRODUCER_ID_STRIDE + self.node_id

    def peer_rpc(self, node_id: int) -> RpcClient | None:
        return self._peer_rpcs.get(node_id)

    def _poke_peers(self) -> None:
        for node, rpc in self._peer_rpcs.items():
            self.broker.commit_nursery.start_soon(self._poke, node, rpc)

    async def _poke(self, node: int, rpc: RpcClient) -> None:
        try:
            await rpc.call(
                "meta_changed", MetaChanged().to_wire(), timeout=POKE_TIMEOUT_S, retries=0
            )
        except RpcError as exc:
            log.debug("main %d did not take the metadata poke (it polls anyway): %s", node, exc)
            if isinstance(exc, RpcUnavailable):  # the controller probes it at once
                reason = f"metadata poke failed: {exc}"
                self.main_unreachable(MainUnreachable(node, reason), self.node_id)
                await report_unreachable(self._peer_rpcs, node, reason)


__all__ = ["ClusterRole", "TopicExists"]
