"""The zone proxy process: one per AZ, the only broker its zone's clients talk to.

Produce: prepared in the shared WAL, confirmed with the owning main. Fetch: served from the
mirror of each main, and below it from the mains' committed objects (with an object store).
Metadata, FindCoordinator and DescribeCluster: relayed to a main and rewritten by the zone
router so clients see only their zone. Everything else: relayed as is.

A Produce or Fetch partition the proxy answers NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH
(the leader's mirror has not shown it yet, the main is unreachable, or the main said so)
carries a KIP-951 leader hint in the same zone view as Metadata: the partition's main when it
is in this zone, else this proxy. A client is never sent to another zone's node by a hint.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import trio

from internal_rpc import RpcClient
from internal_rpc.reports import report_unreachable
from kafka_wire.acl import Operation, ResourceType
from kafka_wire.codec import (
    MalformedRequest,
    RequestHeader,
    build_response,
    decode_request,
    encode_response,
)
from kafka_wire.fetch_serving import read_failures_fail_the_partition, serve_fetch
from kafka_wire.leader_epochs import API_OFFSET_FOR_LEADER_EPOCH, offsets_for_leader_epochs
from kafka_wire.leader_hints import Endpoint, PartitionKey
from kafka_wire.listeners import ListenerError
from kafka_wire.quotas.enforcer import QuotaEnforcer
from kafka_wire.quotas.manager import QuotaType
from kafka_wire.server_loop import (
    Buffer,
    ClientServing,
    CloseConnection,
    ConnectionInfo,
    Finish,
)
from proxy_broker.access import ProxyAccess
from proxy_broker.accounting import ProxyTraffic
from proxy_broker.config import ProxyConfig
from proxy_broker.confirm_pipe import ConfirmPipe, PreparedPart
from proxy_broker.mirror import MainMirror, MirrorCache, MirrorPartition, MirrorTopic
from proxy_broker.object_reads import ObjectSpan, ProxyObjects
from proxy_broker.prepared_trim import prepared_floor
from proxy_broker.produce import begin_produce
from proxy_broker.quotas import keep_quotas_fresh
from proxy_broker.relay import authorize_relay, relay_request
from proxy_broker.secure_listeners import ProxyListeners
from proxy_broker.sequence_guard import SequenceGuard
from s3_commit import AsyncObjectStore, open_object_store
from s3_commit.manifest import StreamManifest
from s3_commit.node_registry import NodeRegistrar, NodeRegistration
from shared_wal import PreparedTrim, WalPosition, WalWriter, open_wal_fs
from shared_wal.batch_index import BatchEntry
from shared_wal.batch_reader import BatchReader
from telemetry import BadInputLog, BrokerMetrics, MetricsRegistry
from telemetry.audit import AuditLog
from zone_router import (
    Node,
    Topology,
    Zone,
    ZoneMap,
    rewrite_leader_hints,
)

log = logging.getLogger("zonefleet.proxy")

API_PRODUCE, API_FETCH, API_VERSIONS = 0, 1, 18
MAX_REMEMBERED_PREPARED = 100_000


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    conn: ConnectionInfo
    request: Any = None  # the decoded body, when it was decoded (relayed requests)
    throttle_ms: int = 0  # the client is over a quota: its response says so


class ProxyBroker:
    """One zone's proxy. It owns its own WAL writer (the PREPARED records of its clients'
    produce), one RPC client and one confirm pipe per main, one mirror per main (that main's
    partitions, WAL tail and committed objects, from its state stream), the recent PREPARED
    payloads its mirrors serve from memory, the zone topology the router rewrites Metadata
    with, and its traffic ledger. It holds no partition state of its own: every decision
    about a partition (offsets, producer state, leadership) is its main's."""

    def __init__(
        self,
        config: ProxyConfig,
        registry: MetricsRegistry | None = None,
        *,
        audit: AuditLog | None = None,  # security events (telemetry/audit.py); None: off
    ) -> None:
        self.config = config
        self.registry = registry or MetricsRegistry()
        self.metrics = BrokerMetrics.create(self.registry)
        # Warnings about what peers send, rate-limited per peer and counted by kind.
        self.bad_input = BadInputLog(log, lambda kind: self.metrics.bad_input.labels(kind).inc())
        self.traffic = ProxyTraffic(config, self.registry, self.topic_name)
        self.clients = ClientServing.for_node(
            self, config, self.traffic.kafka, self.metrics.connections, self.bad_input
        )
        self.ready = False
        self.bound_port: int | None = None
        self.started_at = time.time()
        self.data_arrived = trio.Event()
        self.rpcs = {
            m.node_id: RpcClient(
                config.node_id,
                config.rpc_secret,
                m.host,
                m.rpc_port,
                meter=self.traffic.rpc,
                tls=config.rpc_tls,
            )
            for m in config.mains
        }
        self.sequence_guard = SequenceGuard()
        # One line per partition now and then while batches are held back (a client retrying
        # against a batch in doubt would otherwise log one per attempt).
        self.held_log = BadInputLog(logging.getLogger("zonefleet.proxy.produce"), interval_s=5.0)
        self.pipes = {
            node: ConfirmPipe(
                rpc,
                node,
                config.confirm_timeout_s,
                config.confirm_max_in_flight,
                on_prepared=self.remember_prepared,
                on_outcome=self._confirm_outcome,
            )
            for node, rpc in self.rpcs.items()
        }
        self.mirrors: dict[int, MainMirror] = {}
        self.objects: ProxyObjects | None = None
        self.registrar: NodeRegistrar | None = None
        self._prepared: OrderedDict[tuple[int, int], memoryview] = OrderedDict()
        self.secure = ProxyListeners(
            config.listeners,
            config.sasl,
            config.rpc_secret,
            self.metrics,
            self.bad_input,
            config.tls,
            config.ssl_principal_mapping_rules,
            audit=audit,
        )
        self.access = ProxyAccess(config.acl, audit)
        self.quotas = QuotaEnforcer()
        self.topology = self._topology()
        self.wal: WalWriter
        self.batches: BatchReader
        self.background: trio.Nursery

    def _topology(self) -> Topology:
        cfg = self.config
        zones = dict(cfg.zones) or {}
        for zone in [m.zone for m in cfg.mains] + [p.zone for p in cfg.peers]:
            zones.setdefault(zone, None)
        zones.setdefault(cfg.zone, None)
        host, port = cfg.advertised
        nodes = [
            Node(m.node_id, m.zone, "main", m.host, m.kafka_port, m.listeners) for m in cfg.mains
        ]
        nodes.append(Node(cfg.node_id, cfg.zone, "proxy", host, port, self.secure.advertised()))
        nodes += [
            Node(p.node_id, p.zone, "proxy", p.host, p.kafka_port, p.listeners) for p in cfg.peers
        ]
        return Topology(ZoneMap(Zone(name, az) for name, az in zones.items()), nodes)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        fs = open_wal_fs(cfg.wal_url)
        self.traffic.attach_wal(fs)
        self.wal = await WalWriter.open(fs, cfg.writer_id, cfg.wal)
        self.wal.prepared_trim = PreparedTrim(
            lambda: prepared_floor(cfg.writer_id, self.mirrors.values(), self.wal.end_offset),
            cfg.prepared_min_age_s,
            cfg.prepared_retention_s,
        )
        self.batches = BatchReader(fs)
        cache = MirrorCache(cfg.mirror_cache_bytes)
        if cfg.object_store_url is not None:
            self.objects = await self._open_objects(cfg.object_store_url)
        for main in cfg.mains:
            self.mirrors[main.node_id] = MainMirror(
                main,
                self.rpcs[main.node_id],
                self.batches,
                cache,
                cfg.writer_id,
                self.take_prepared,
                self._notify_data,
                self.objects,
            )
            self.mirrors[main.node_id].on_lost = self._main_lost
            self.mirrors[main.node_id].on_connected = self._mains_changed
        try:
            async with trio.open_nursery() as nursery:
                self.background = nursery
                await nursery.start(self.wal.run)
                await nursery.start(self.traffic.run)
                if self.objects is not None:
                    nursery.start_soon(self.objects.run)
                for node, mirror in self.mirrors.items():
                    nursery.start_soon(mirror.run)
                    nursery.start_soon(self.pipes[node].run)
                listeners = await nursery.start(
                    partial(trio.serve_tcp, self.clients.serve, cfg.port, host=cfg.host)
                )
                self.bound_port = listeners[0].socket.getsockname()[1]
                await self.secure.serve(nursery, self.clients.serve)
                if cfg.advertised_port is None or self.secure.listeners:
                    cfg.advertised_port = cfg.advertised_port or self.bound_port
                    self.topology = self._topology().with_down_mains(self.topology.down_mains)
                if self.secure.sasl is not None:
                    if cfg.metadata_url is None:
                        raise ListenerError(
                            "SASL listeners on a proxy need the fleet's metadata store, where "
                            "the SCRAM credentials are"
                        )
                    nursery.start_soon(self._keep_scram_fresh, cfg.metadata_url)
                if self.access.enabled:
                    if cfg.metadata_url is None:
                        raise ListenerError(
                            "the authorizer on a proxy needs the fleet's metadata store, where "
                            "the ACLs are"
                        )
                    nursery.start_soon(self._keep_acls_fresh, cfg.metadata_url)
                if cfg.metadata_url is not None:
                    nursery.start_soon(self._keep_quotas_fresh, cfg.metadata_url)
                with trio.move_on_after(10):
                    for mirror in self.mirrors.values():
                        await mirror.synced.wait()
                self.ready = True
                if cfg.metadata_url is not None:
                    nursery.start_soon(self._keep_registered, cfg.metadata_url)
                log.info(
                    "proxy %d serving zone %s on %s:%d",
                    cfg.node_id,
                    cfg.zone,
                    cfg.host,
                    self.bound_port,
                    extra={"node": cfg.node_id},
                )
                task_status.started(self.bound_port)
        finally:
            self.ready = False
            with trio.CancelScope(shield=True):
                await self.wal.aclose()
                for rpc in self.rpcs.values():
                    await rpc.aclose()
                await self.traffic.aclose()

    def _confirm_outcome(self, part: PreparedPart, doubt: bool) -> None:
        if doubt:
            self.sequence_guard.in_doubt(part.batch_ref(), trio.current_time())
        else:
            self.sequence_guard.settled(part.batch_ref())

    def _mains_changed(self) -> None:
        # Only once synced: a main not heard from yet at start is not down.
        down = [n for n, m in self.mirrors.items() if not m.connected and m.synced.is_set()]
        self.topology = self.topology.with_down_mains(down)

    def _main_lost(self, node: int, reason: str) -> None:
        self.background.start_soon(report_unreachable, self.rpcs, node, reason)

    async def _keep_registered(self, url: str) -> None:
        cfg = self.config
        store = await self._document_store(url)  # heartbeats are billed S3 requests too
        host, port = cfg.advertised
        me = NodeRegistration.new("proxy", cfg.node_id, cfg.zone, host, port, None)
        self.registrar = NodeRegistrar(
            store, me, cfg.registration_interval_s, cfg.session_timeout_s
        )
        await self.registrar.run()

    async def _keep_scram_fresh(self, url: str) -> None:
        await self.secure.keep_scram_fresh(await self._document_store(url))

    async def _keep_acls_fresh(self, url: str) -> None:
        await self.access.keep_fresh(await self._document_store(url))

    async def _keep_quotas_fresh(self, url: str) -> None:
        await keep_quotas_fresh(self.quotas, await self._document_store(url))

    async def _document_store(self, url: str) -> AsyncObjectStore:
        raw = await trio.to_thread.run_sync(open_object_store, url)
        raw.traffic_hook = self.traffic.s3_request
        return AsyncObjectStore(raw, max_threads=1)

    async def _open_objects(self, url: str) -> ProxyObjects:
        store = await trio.to_thread.run_sync(open_object_store, url)
        store.traffic_hook = self.traffic.s3_request
        return ProxyObjects(store, self.config.object_cache_bytes, self.registry)

    def status(self) -> dict[str, Any]:
        return {
            "role": "proxy",
            "node_id": self.config.node_id,
            "zone": self.config.zone,
            "ready": self.ready,
            "mains": {node: m.connected for node, m in self.mirrors.items()},
            "partitions": len(
                {
                    (n, p)
                    for m in self.mirrors.values()
                    for n, t in m.topics.items()
                    for p in range(len(t.partitions))
                }
            ),
            "uptime_s": round(time.time() - self.started_at, 1),
            # The documents in force (-1: not read yet), for operators and tests.
            "documents": {"acls": self.access.version, "quotas": self.quotas.version},
            **self._wal_status(),
        }

    def _wal_status(self) -> dict[str, Any]:
        wal = getattr(self, "wal", None)  # not yet opened
        if wal is None or wal.prepared_trim is None:
            return {}
        floor, complete = wal.prepared_trim.floor()
        # Why PREPARED segments stay: the mains' floor, or a main not reporting one.
        return {
            "wal_bytes": wal.total_bytes,
            "wal_full": wal.full,
            "wal_start_offset": wal.start_offset,
            "prepared_floor": floor,
            "prepared_floor_complete": complete,
        }

    def health(self) -> tuple[bool, str]:
        if not self.ready:
            return False, "starting"
        down = [node for node, m in self.mirrors.items() if not m.connected]
        if down:
            return False, f"no state stream from mains {down}"
        return True, "ok"

    # -- mirror plumbing -----------------------------------------------------------------------

    def owner_of(self, topic: str, partition: int) -> int | None:
        """The main that leads the partition, as the mains published it. After a
        reassignment the mains' views differ until each has read the cluster document (and
        a dead main's mirror keeps its last view): the highest leader epoch wins, then a
        connected mirror's view."""
        best: tuple[int, bool] | None = None
        found: int | None = None
        for node, mirror in self.mirrors.items():
            mt = mirror.topics.get(topic)
            if mt is not None and 0 <= partition < len(mt.partitions):
                rank = (mt.partitions[partition].leader_epoch, mirror.connected)
                if best is None or rank > best:
                    best = rank
                    found = mt.leaders[partition] if partition < len(mt.leaders) else node
        return found if found in self.mirrors else None

    def client_topology(self, conn: ConnectionInfo, client_id: str | None) -> Topology:
        """The zone view as this client sees it: its listener's addresses, and every main
        behind this proxy when a quota applies to it (this proxy meters all it does) or the
        authorizer is on (this proxy checks all it does: a main enforces no ACLs)."""
        topology = self.topology.for_listener(conn.listener)
        if self.access.enabled or self.quotas.limits(conn, client_id):
            return topology.proxied()
        return topology

    def leader_hints(
        self, partitions: Sequence[PartitionKey], topology: Topology | None = None
    ) -> tuple[Mapping[PartitionKey, tuple[int, int]], list[Endpoint]]:
        """KIP-951 hints (a `kafka_wire.leader_hints.HintSource`) for this proxy's clients: the
        leader as the mains published it, seen from this zone as Metadata shows it."""
        current: dict[PartitionKey, tuple[int, int]] = {}
        for topic, index in partitions:
            owner = self.owner_of(topic, index)
            if owner is None:
                continue
            # The leader's own mirror has the epoch; until it shows the partition, any other
            # main's copy of the cluster metadata does.
            part = self.partition(topic, index) or self._any_partition(topic, index)
            current[(topic, index)] = (owner, part.leader_epoch if part is not None else -1)
        topology = topology or self.topology
        hints = rewrite_leader_hints(current, (), self.config.zone, topology)
        return hints.current_leader, hints.node_endpoints

    def _any_partition(self, topic: str, partition: int) -> MirrorPartition | None:
        for mirror in self.mirrors.values():
            mt = mirror.topics.get(topic)
            if mt is not None and 0 <= partition < len(mt.partitions):
                return mt.partitions[partition]
        return None

    def _leader_view(self, mt: MirrorTopic) -> MirrorTopic:
        """The topic with each partition taken from its leader's mirror."""
        view = MirrorTopic(mt.name, mt.topic_id, mt.configs)
        for p, part in enumerate(mt.partitions):
            owner = self.owner_of(mt.name, p)
            leader = owner if owner is not None else part.owner
            view.leaders.append(leader)
            lt = self.mirrors[leader].topics.get(mt.name) if leader in self.mirrors else None
            if (
                lt is not None
                and lt.topic_id == mt.topic_id
                and p < len(lt.partitions)
                # After a reassignment another main's stream may name the new leader first:
                # until the leader's own does (with its partition state in the same frame),
                # its mirror's state is not the leader's.
                and (p >= len(lt.leaders) or lt.leaders[p] == leader)
            ):
                view.partitions.append(lt.partitions[p])
            else:
                # The leader's own stream has not shown it yet: a retriable error meanwhile.
                missing = MirrorPartition(mt.name, p, leader)
                missing.owned = False
                view.partitions.append(missing)
        return view

    def remember_prepared(self, position: WalPosition, payload: memoryview) -> None:
        self._prepared[(position.segment, position.position)] = payload
        while len(self._prepared) > MAX_REMEMBERED_PREPARED:
            self._prepared.popitem(last=False)

    def take_prepared(self, segment: int, position: int) -> memoryview | None:
        """The payload we prepared at that WAL position: a writable view of the request frame."""
        return self._prepared.pop((segment, position), None)

    def _notify_data(self) -> None:
        self.data_arrived.set()
        self.data_arrived = trio.Event()

    # -- FetchSource -------------------------------------------------------------------------

    def topic_by_name(self, name: str) -> MirrorTopic | None:
        for mirror in self.mirrors.values():
            topic = mirror.topics.get(name)
            if topic is not None:
                return self._leader_view(topic)
        return None

    def topic_name(self, topic_id: bytes) -> str | None:
        """The name of the topic with this id in any mirror (traffic accounting caches it)."""
        for mirror in self.mirrors.values():
            for topic in mirror.topics.values():
                if topic.topic_id == topic_id:
                    return topic.name
        return None

    def topic_by_id(self, topic_id: bytes) -> MirrorTopic | None:
        for mirror in self.mirrors.values():
            for topic in mirror.topics.values():
                if topic.topic_id == topic_id:
                    return self._leader_view(topic)
        return None

    async def batches_bytes(self, entries: Sequence[BatchEntry]) -> list[Buffer]:
        """The entries' bytes; a partition whose bytes cannot be read gets an error code (the
        fetch's other partitions are answered as usual)."""
        if entries and isinstance(entries[0], ObjectSpan):
            # A mirror partition answers a fetch from objects with one span and nothing else;
            # it makes spans only when the proxy has an object store.
            assert self.objects is not None
            out: list[Buffer] = []
            for entry in entries:
                out.extend(await self.objects.read(cast(ObjectSpan[StreamManifest], entry)))
            return out
        what = f"{len(entries)} batches from {entries[0].base_offset} on the shared WAL"
        with read_failures_fail_the_partition(log, what):
            return await self.batches.batches_bytes(entries)

    def on_bytes_out(self, topic: str, nbytes: int) -> None:
        self.metrics.bytes_out.labels(topic).inc(nbytes)

    def partition(self, topic: str, partition: int) -> MirrorPartition | None:
        leader = self.owner_of(topic, partition)
        mt = self.mirrors[leader].topics.get(topic) if leader is not None else None
        if mt is None or not 0 <= partition < len(mt.partitions):
            return None
        return mt.partitions[partition]

    # -- requests ----------------------------------------------------------------------------

    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        ctx = RequestContext(header, conn)
        if not self.quotas.manager.enabled(QuotaType.REQUEST):
            return self._begin(ctx, frame)
        started = time.perf_counter_ns()
        try:
            return self._begin(ctx, frame)
        finally:
            spent = time.perf_counter_ns() - started
            throttle = self.quotas.request_throttle_ms(conn, header.client_id, spent)
            ctx.throttle_ms = max(ctx.throttle_ms, throttle)
            conn.mute.mute_for(throttle)

    def _begin(self, ctx: RequestContext, frame: bytearray) -> Finish:
        header, conn = ctx.header, ctx.conn
        key = header.api_key
        name = f"api{key}"
        self.metrics.requests.labels(name).inc()
        if key == API_PRODUCE:
            return begin_produce(self, ctx, frame)
        if key == API_FETCH:
            request = decode_request(header, frame)

            async def fetch() -> Sequence[Buffer]:
                hints = partial(
                    self.leader_hints, topology=self.client_topology(conn, header.client_id)
                )
                may_read = partial(self.access.allows, conn, Operation.READ, ResourceType.TOPIC)
                return await serve_fetch(
                    self,
                    header.api_version,
                    header.correlation_id,
                    request,
                    hints,
                    authorized=may_read if self.access.enabled else None,
                    quota=self.quotas.fetch_quota(conn, header.client_id),
                )

            return fetch
        if key == API_OFFSET_FOR_LEADER_EPOCH:  # answered in the zone, from the mirrors
            request = decode_request(header, frame)
            names = [t.topic for t in request.topics]
            if self.access.enabled and len(self.access.visible_topics(conn, names)) < len(names):
                raise CloseConnection(
                    f"OffsetForLeaderEpoch for topics {conn.principal} may not describe"
                )

            async def epochs() -> Sequence[Buffer]:
                data = offsets_for_leader_epochs(self, request)
                return [encode_response(header, build_response(key, header.api_version, data))]

            return epochs

        # Decoded here before it is relayed: a malformed request is refused in its zone (one
        # line, rate-limited) and never crosses to a main in another. ApiVersions is the
        # exception: one of a version too new is answered (UNSUPPORTED_VERSION, our ranges).
        if key != API_VERSIONS:
            try:
                request = decode_request(header, frame)
            except MalformedRequest as exc:
                raise CloseConnection(f"malformed api {key} v{header.api_version}: {exc}") from None
            ctx.request = request
            if self.access.enabled:
                authorize_relay(self, ctx)

        async def relay() -> Sequence[Buffer] | None:
            return await relay_request(self, ctx, bytes(frame))

        return relay
