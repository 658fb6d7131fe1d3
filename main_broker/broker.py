"""The main broker process: opens and replays its WAL, then serves Kafka clients."""

from __future__ import annotations

import gc
import logging
import math
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from internal_rpc import RpcPeer, RpcServer
from internal_rpc.messages import (
    LIVENESS_VERSION,
    AllowTxn,
    MainUnreachable,
    MetaChanged,
    Probe,
    RelayParams,
    RelayResult,
    WriteTxnMarkers,
)
from internal_rpc.state_frames import StateSubscription
from kafka_wire.codec import (
    KIO_VERSION_RANGES,
    MalformedRequest,
    RequestHeader,
    api_versions_unsupported,
    build_response,
    decode_request,
    encode_response,
    parse_request_header,
    warm_up,
)
from kafka_wire.leader_hints import Endpoint, HintSource, PartitionKey
from kafka_wire.quotas.enforcer import EXPIRY_INTERVAL_S, QUOTA_REFRESH_S, QuotaEnforcer
from kafka_wire.quotas.manager import QuotaType
from kafka_wire.secure_listeners import SCRAM_REFRESH_S, SecureListeners
from kafka_wire.security_docs import SecurityDocError
from kafka_wire.server_loop import (
    ANONYMOUS_PRINCIPAL,
    Buffer,
    ClientServing,
    CloseConnection,
    ConnectionIdentity,
    ConnectionInfo,
    Finish,
)
from kafka_wire.topic_bytes import TopicFinish
from main_broker.accounting import MainTraffic
from main_broker.api import cluster as api_cluster
from main_broker.api import configs as api_configs
from main_broker.api import describe as api_describe
from main_broker.api import fetch as api_fetch
from main_broker.api import groups as group_handlers
from main_broker.api import quotas as api_quotas
from main_broker.api import security as api_security
from main_broker.api import topics_admin as api_topics_admin
from main_broker.api import txn as api_txn
from main_broker.api.confirm import ConfirmSequencer, handle_confirm
from main_broker.api.produce import begin_produce
from main_broker.api.reassign import REASSIGN_APIS, REASSIGN_HANDLERS
from main_broker.api.services import Handler
from main_broker.api.txn import TXN_APIS, TXN_HANDLERS
from main_broker.appender import Appender
from main_broker.cluster.role import ClusterRole, TopicExists
from main_broker.cluster.view import ClusterView, LoneMain
from main_broker.cluster.zone_view import RELAY_LISTENER_PREFIX, ROUTED_APIS, MainZoneView
from main_broker.config import BrokerConfig
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.coordinator import GroupCoordinator
from main_broker.groups.txn_offsets import PendingTxnOffsets
from main_broker.groups.wiring import (
    consumer_groups,
    persist_consumer_groups,
    persist_membership,
    persist_offsets,
)
from main_broker.log_store import LogStore
from main_broker.objects.retention import ObjectRetention
from main_broker.objects.tier import ObjectTier
from main_broker.partition_log import PartitionLog
from main_broker.request import RequestContext
from main_broker.security.state import SecurityState
from main_broker.state_stream import publish_state
from main_broker.txn.coordinator import TxnCoordinator
from main_broker.txn.markers import allow, write_markers
from s3_commit import ObjectStoreError
from shared_wal import WalError, WalReader, WalWriter, open_wal_fs
from telemetry import UNKNOWN_ZONE, BadInputLog, BrokerMetrics, MetricsRegistry
from telemetry.audit import AuditLog

log = logging.getLogger("zonefleet.main_broker")

API_PRODUCE = 0
API_FETCH = 1
API_VERSIONS = 18

# api_key -> (name, min, max). The intersection with what kio can decode is advertised.
SUPPORTED_APIS: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 13),
    1: ("Fetch", 4, 18),
    2: ("ListOffsets", 1, 10),
    23: ("OffsetForLeaderEpoch", 2, 4),
    3: ("Metadata", 0, 13),
    8: ("OffsetCommit", 2, 10),
    9: ("OffsetFetch", 1, 10),
    10: ("FindCoordinator", 0, 6),
    11: ("JoinGroup", 0, 9),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 5),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 6),
    16: ("ListGroups", 0, 5),
    # Answered by a SASL listener's gate (kafka_wire/sasl/gate.py). v0 is listed because
    # librdkafka 2.0 (Debian's kcat) looks for it before it uses v1, but a v0 client's raw
    # tokens after the handshake are not Kafka frames and close the connection.
    17: ("SaslHandshake", 0, 1),
    18: ("ApiVersions", 0, 4),
    19: ("CreateTopics", 2, 7),
    20: ("DeleteTopics", 1, 6),
    21: ("DeleteRecords", 0, 2),
    22: ("InitProducerId", 0, 5),
    29: ("DescribeAcls", 1, 3),
    30: ("CreateAcls", 1, 3),
    31: ("DeleteAcls", 1, 3),
    32: ("DescribeConfigs", 1, 4),
    33: ("AlterConfigs", 0, 2),
    34: ("AlterReplicaLogDirs", 1, 2),
    35: ("DescribeLogDirs", 1, 4),
    36: ("SaslAuthenticate", 0, 2),
    37: ("CreatePartitions", 0, 3),
    44: ("IncrementalAlterConfigs", 0, 1),
    48: ("DescribeClientQuotas", 0, 1),
    49: ("AlterClientQuotas", 0, 1),
    50: ("DescribeUserScramCredentials", 0, 0),
    51: ("AlterUserScramCredentials", 0, 0),
    60: ("DescribeCluster", 0, 2),
    42: ("DeleteGroups", 0, 2),
    47: ("OffsetDelete", 0, 0),
    61: ("DescribeProducers", 0, 0),
    68: ("ConsumerGroupHeartbeat", 0, 1),
    69: ("ConsumerGroupDescribe", 0, 1),
    71: ("GetTelemetrySubscriptions", 0, 0),
    75: ("DescribeTopicPartitions", 0, 0),
}
SUPPORTED_APIS.update(REASSIGN_APIS)  # ElectLeaders and partition reassignment
SUPPORTED_APIS.update(TXN_APIS)  # the transaction coordinator's
GROUP_APIS = {8, 9, 11, 12, 13, 14, 15, 16}


def advertised_versions() -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for key, (_, lo, hi) in SUPPORTED_APIS.items():
        kio_lo, kio_hi = KIO_VERSION_RANGES.get(key, (lo, hi))
        lo, hi = max(lo, kio_lo), min(hi, kio_hi)
        if lo <= hi:
            out[key] = (lo, hi)
    return out


class MainBroker:
    """One main broker process: it owns the lifecycle (open the WAL, replay it into the
    `LogStore`, serve Kafka clients and the internal RPC, close down), the Kafka listener and
    the request dispatch, the metrics and traffic accounting, and what this node tells zone
    proxies (their state stream subscriptions, the zone view).

    It delegates: durable state (topics, partition logs, producer ids, documents) to `store`;
    produce admission to `appender`; groups to `coordinator` (classic) and `consumer_groups`
    (KIP-848); the other mains, and every topic change, to `cluster` (a `ClusterView`: a
    `LoneMain` or a `ClusterRole`); objects to `objects` and `retention` (with an object
    store); ACLs and SCRAM credentials to `security`; each API to its handler module.
    """

    def __init__(
        self,
        config: BrokerConfig,
        registry: MetricsRegistry | None = None,
        *,
        audit: AuditLog | None = None,  # security events (telemetry/audit.py); None: off
    ) -> None:
        self.config = config
        self.audit = audit or AuditLog.off(f"main-{config.node_id}")
        self.registry = registry or MetricsRegistry()
        self.metrics = BrokerMetrics.create(self.registry)
        # Warnings about what peers send, rate-limited per peer and counted by kind.
        self.bad_input = BadInputLog(log, lambda kind: self.metrics.bad_input.labels(kind).inc())
        self.traffic = MainTraffic(config, self.registry, self._topic_name)
        self.clients = ClientServing.for_node(
            self, config, self.traffic.kafka, self.metrics.connections, self.bad_input
        )
        self.versions = advertised_versions()
        self.storage_failed = False
        self.ready = False
        self.bound_port: int | None = None
        self.started_at = time.time()
        self._handlers: dict[int, Handler] = {
            2: api_fetch.list_offsets,
            23: api_fetch.offset_for_leader_epoch,
            3: api_cluster.metadata,
            10: api_cluster.find_coordinator,
            19: api_topics_admin.create_topics,
            20: api_topics_admin.delete_topics,
            21: api_topics_admin.delete_records,
            22: api_txn.init_producer_id,
            29: api_security.describe_acls,
            30: api_security.create_acls,
            31: api_security.delete_acls,
            48: api_quotas.describe_client_quotas,
            49: api_quotas.alter_client_quotas,
            50: api_security.describe_user_scram_credentials,
            51: api_security.alter_user_scram_credentials,
            17: api_security.sasl_handshake,
            36: api_security.sasl_authenticate,
            32: api_configs.describe_configs,
            33: api_configs.alter_configs,
            37: api_topics_admin.create_partitions,
            44: api_configs.incremental_alter_configs,
            60: api_cluster.describe_cluster,
            34: api_describe.alter_replica_log_dirs,
            35: api_describe.describe_log_dirs,
            61: api_describe.describe_producers,
            71: api_describe.get_telemetry_subscriptions,
            75: api_describe.describe_topic_partitions,
        }
        self._handlers.update(REASSIGN_HANDLERS)
        self._handlers.update(TXN_HANDLERS)
        self._auto_create_lock = trio.Lock()
        self.confirms = ConfirmSequencer()
        self.rpc_port: int | None = None
        # The fleet as this main sees it (main_broker/cluster/view.py): set in `run`, a
        # LoneMain once the store is open, or the ClusterRole once it has read the document.
        self.cluster: ClusterView
        self._state_subscribers: Counter[int] = Counter()
        self._proxies_subscribed: set[int] = set()
        self._proxy_grace_until = -math.inf
        self.zone_view = MainZoneView(config)
        self.store: LogStore
        self.objects: ObjectTier | None = None
        self.retention: ObjectRetention | None = None
        self.consumer_groups: ConsumerCoordinator  # KIP-848 groups
        self.coordinator: GroupCoordinator
        self.txn: TxnCoordinator
        self.txn_offsets: PendingTxnOffsets
        self.security = SecurityState(self)
        self.quotas = QuotaEnforcer()  # for the clients that reach this main directly
        # Named listeners (SASL_SSL, ...) besides `port`, served as the proxies serve theirs;
        # SCRAM logins check `security.scram`, which `_keep_scram_fresh` keeps current.
        self.secure = SecureListeners(
            config.listeners,
            config.sasl,
            # Unknown users' fake salts derive from it: without a fleet secret (a lone main
            # with no RPC) they are stable for the life of the process only.
            config.rpc_secret or secrets.token_bytes(32),
            self.metrics,
            self.bad_input,
            config.tls,
            config.ssl_principal_mapping_rules,
            audit=self.audit,
            scram=lambda: self.security.scram,
        )
        self._named_listeners = self.secure.names()
        self.commit_nursery: trio.Nursery
        self.appender: Appender

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        fs = open_wal_fs(cfg.wal_url)
        self.traffic.attach_wal(fs)
        store_ref: list[LogStore] = []
        wal = await WalWriter.open(
            fs, cfg.wal_writer_id, cfg.wal, snapshot_provider=lambda: store_ref[0].snapshot()
        )
        self.store = store = LogStore(
            wal, WalReader(fs, cfg.wal_writer_id), cfg.wal_cache_bytes, cfg.topic_defaults
        )
        store_ref.append(store)
        if cfg.metadata_url is None:
            self.cluster = LoneMain(cfg, store)
        self.appender = Appender(
            store.partition, self.may_append, self.storage_failure, lambda: wal.full
        )
        # Everything with state on the WAL registers with the store before it replays (the
        # store refuses later registrations), in no particular order.
        self.coordinator = GroupCoordinator(cfg.groups, _OffsetStore(store))
        self.consumer_groups = consumer_groups(cfg.groups, self.coordinator, store)
        persist_offsets(self.coordinator, store)
        self.membership = persist_membership(self.coordinator, store)
        self.consumer_records = persist_consumer_groups(self.consumer_groups, store)
        self.txn_offsets = PendingTxnOffsets(
            store, self.coordinator.offsets, cfg.groups.offset_metadata_max_bytes
        )
        store.register(self.txn_offsets)
        self.coordinator.unstable_offsets = self.txn_offsets.unstable_partitions
        self.txn = TxnCoordinator(
            self,
            cfg.transaction_max_timeout_ms,
            self._allocate_producer_id,
            cfg.transactional_id_expiration_ms,
        )
        store.register(self.txn)
        if cfg.object_store_url is not None:
            # Partitions learn their committed objects as replay makes them.
            self.objects = await ObjectTier.open(self)
            # A topic deletion replay brings still removes the topic's objects.
            self.retention = ObjectRetention(self, self.objects)
            store.listen_topic_deletions(self.retention)
        started = time.monotonic()
        count = await trio.to_thread.run_sync(lambda: store.replay(wal.replay()))
        restored = self.membership.restore(self.coordinator)
        restored_consumer = self.consumer_records.restore(self.consumer_groups)
        warm_up(self.versions)
        wal.on_segments_deleted = store.on_segments_deleted
        wal.on_group_commit = self._observe_group_commit
        log.info(
            "recovered %d WAL records, %d topics, %d partitions, %d classic groups, %d consumer "
            "groups in %.2fs",
            count,
            len(store.topics),
            store.partition_count(),
            restored,
            restored_consumer,
            time.monotonic() - started,
            extra={"node": cfg.node_id},
        )
        self.metrics.partitions.set_function(lambda: float(store.partition_count()))
        # Replay leaves a large, long-lived heap; freezing it keeps the cyclic GC from
        # rescanning it on every full collection, which shows up as produce tail latency.
        gc.collect()
        gc.freeze()
        try:
            async with trio.open_nursery() as nursery:
                self.commit_nursery = nursery
                await nursery.start(wal.run)
                nursery.start_soon(store.linked_payloads.run)
                await nursery.start(self.traffic.run)
                # Only a clustered main has background work of its own (the metadata poll,
                # the controller lease, hand-offs, registration); a lone one has none.
                role: ClusterRole | None = None
                if cfg.metadata_url is not None:
                    self.cluster = role = ClusterRole(self)
                    await role.start()
                    nursery.start_soon(role.run)
                nursery.start_soon(self._keep_quotas_fresh)
                self.coordinator.owns = self.cluster.owns_group
                self.consumer_groups.owns = self.cluster.owns_group
                await nursery.start(self.membership.run)
                await nursery.start(self.consumer_records.run)
                await nursery.start(self.coordinator.run)
                await nursery.start(self.consumer_groups.run)
                await nursery.start(self.txn.run)
                if self.objects is not None:
                    nursery.start_soon(self.objects.run)
                if self.retention is not None:
                    nursery.start_soon(self.retention.run)
                if cfg.rpc_port is not None:
                    self.rpc_port = await nursery.start(self._serve_rpc)
                self._proxy_grace_until = trio.current_time() + cfg.proxy_resubscribe_grace_s
                self.zone_view.set_live_proxies(self._live_proxies())
                nursery.start_soon(self._end_proxy_grace)
                listeners = await nursery.start(
                    partial(trio.serve_tcp, self.clients.serve, cfg.port, host=cfg.host)
                )
                # Restored group members' sessions run from now: they could not heartbeat
                # while the main was starting (seconds, under load).
                self.coordinator.renew_sessions(trio.current_time())
                self.consumer_groups.renew_sessions(trio.current_time())
                self.bound_port = listeners[0].socket.getsockname()[1]
                if self.secure.sasl is not None:
                    nursery.start_soon(self._keep_scram_fresh)
                await self.secure.serve(nursery, self.clients.serve)
                if cfg.advertised_port is None or self.secure.listeners:
                    cfg.advertised_port = cfg.advertised_port or self.bound_port
                    # It names this node by its ports.
                    self.zone_view = MainZoneView(
                        cfg, self._live_proxies(), self.secure.advertised()
                    )
                self.ready = True
                if role is not None:  # see above: registration is a clustered main's task
                    nursery.start_soon(role.run_registration)
                log.info(
                    "main broker %d serving on %s:%d (zone %s)",
                    cfg.node_id,
                    cfg.host,
                    self.bound_port,
                    cfg.zone,
                    extra={"node": cfg.node_id},
                )
                task_status.started(self.bound_port)
        finally:
            self.ready = False
            with trio.CancelScope(shield=True):
                await wal.aclose()
                await self.traffic.aclose()

    async def _serve_rpc(self, *, task_status: trio.TaskStatus[int]) -> None:
        cfg = self.config
        if not cfg.rpc_secret:
            raise ValueError("rpc_port is set but rpc_secret is empty")
        server = RpcServer(
            cfg.node_id,
            cfg.rpc_secret,
            {
                "confirm": self._rpc_confirm,
                "relay": self._rpc_relay,
                "meta_changed": self._rpc_meta_changed,
                "write_txn_markers": self._rpc_write_txn_markers,
                "allow_txn": self._rpc_allow_txn,
                "probe": self._rpc_probe,
                "main_unreachable": self._rpc_main_unreachable,
            },
            {"state": self._rpc_state},
            meter=self.traffic.rpc,
            # A relayed request a proxy let through malformed (one of a previous release,
            # which relayed without decoding) is refused in one line, not a traceback.
            refusals=(MalformedRequest, CloseConnection),
            bad_input=self.bad_input,
            tls=cfg.rpc_tls,
        )
        await server.serve(cfg.host, cfg.rpc_port or 0, task_status=task_status)

    async def _rpc_confirm(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        return await handle_confirm(self, params)

    async def _rpc_write_txn_markers(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        result = await write_markers(self, WriteTxnMarkers.from_wire(params))
        return result.to_wire()

    async def _rpc_allow_txn(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        return allow(self, AllowTxn.from_wire(params)).to_wire()

    async def _rpc_probe(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        Probe.from_wire(params)
        return Probe(self.config.node_id).to_wire()

    async def _rpc_main_unreachable(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        self.cluster.main_unreachable(MainUnreachable.from_wire(params), peer.node_id)
        return {"mv": LIVENESS_VERSION}

    async def _allocate_producer_id(self) -> int:
        return self.cluster.producer_id(await self.store.allocate_producer_id())

    @property
    def node_id(self) -> int:
        return self.config.node_id

    async def _rpc_meta_changed(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        MetaChanged.from_wire(params)
        self.cluster.poke()
        return MetaChanged().to_wire()

    async def _rpc_state(
        self, peer: RpcPeer, params: dict[str, Any], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        subscription = StateSubscription.from_wire(params)
        # A zone proxy is live for this main while it holds a state subscription.
        self._state_subscribers[peer.node_id] += 1
        self._proxies_subscribed.add(peer.node_id)
        self.zone_view.set_live_proxies(self._live_proxies())
        try:
            await publish_state(self.store, self.config.node_id, send, subscription.frames)
        finally:
            self._state_subscribers[peer.node_id] -= 1
            self.zone_view.set_live_proxies(self._live_proxies())

    def _live_proxies(self) -> list[int]:
        live = {node for node, count in self._state_subscribers.items() if count > 0}
        if trio.current_time() < self._proxy_grace_until:
            # Just started: a proxy not heard from yet is on its way back, not gone.
            live |= {p.node_id for p in self.config.zone_proxies} - self._proxies_subscribed
        return sorted(live)

    async def _end_proxy_grace(self) -> None:
        await trio.sleep_until(self._proxy_grace_until)
        self.zone_view.set_live_proxies(self._live_proxies())

    async def _keep_quotas_fresh(self) -> None:
        """The client quotas this main enforces for the clients that reach it directly (a
        proxy's clients are its proxy's to throttle), read every QUOTA_REFRESH_S."""
        last_expiry = trio.current_time()
        while True:
            try:
                self.quotas.update(await self.security.read_quotas())
            except (ObjectStoreError, SecurityDocError, WalError, OSError) as exc:
                log.warning("client quotas not refreshed: %s", exc)
            if trio.current_time() - last_expiry >= EXPIRY_INTERVAL_S:
                self.quotas.expire_idle()
                last_expiry = trio.current_time()
            await trio.sleep(QUOTA_REFRESH_S)

    async def _keep_scram_fresh(self) -> None:
        """The SCRAM credentials the named SASL listeners check, read every SCRAM_REFRESH_S
        (a change made through this main is in `security.scram` at once)."""
        while True:
            try:
                await self.security.read_scram()
            except (ObjectStoreError, SecurityDocError, WalError, OSError) as exc:
                log.warning("SCRAM credentials not refreshed: %s", exc)
            await trio.sleep(SCRAM_REFRESH_S)

    def named_listener(self, conn: ConnectionInfo) -> str | None:
        """The named listener (SASL_SSL, ...) of this main the client came in on, if any."""
        return conn.listener if conn.listener in self._named_listeners else None

    def direct_client(self, ctx: RequestContext) -> bool:
        """A client connected to this main itself, not one a proxy relays for."""
        return not ctx.conn.listener.startswith(RELAY_LISTENER_PREFIX)

    async def _rpc_relay(self, peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        """A Kafka request a proxy relays for one of its clients; answers the response frame."""
        relay = RelayParams.from_wire(params)
        frame = bytearray(relay.frame)
        header = parse_request_header(frame)
        host = relay.host if relay.host is not None else "?"
        # The principal is the proxy's word: trusted because the proxy is an authenticated
        # fleet peer (the RPC's HMAC handshake, and its TLS when on).
        identity = ConnectionIdentity(relay.principal or ANONYMOUS_PRINCIPAL)
        conn = ConnectionInfo(
            host, 0, 0, f"{RELAY_LISTENER_PREFIX}{peer.node_id}", identity=identity
        )
        parts = await self.begin(header, frame, conn)()
        return RelayResult(b"".join(parts) if parts is not None else None).to_wire()

    def _observe_group_commit(self, nbytes: int, seconds: float) -> None:
        self.metrics.wal_fsync_latency.observe(seconds)
        self.metrics.wal_group_bytes.observe(nbytes)

    def may_append(self, plog: PartitionLog) -> bool:
        """Whether this main appends to the partition: it leads it, no reassignment is moving
        it away. (Another main that takes it over without this one's seal fences this main's
        WAL first: main_broker/cluster/handoff.py.)"""
        return plog.owned and not plog.fenced

    def storage_failure(self) -> str | None:
        """Why the WAL takes no writes (None while it does). Both answers are the retriable
        KAFKA_STORAGE_ERROR: a failed WAL (an fsync error, a fence) stays failed until
        restart; a stalled one (its file system full, or NFS unreachable: the writer holds
        the group and writes it again, shared_wal/writer.py) takes writes again by itself."""
        wal = self.store.wal
        failed = wal.failed
        if failed is not None:
            self.mark_storage_failed(failed)
        if self.storage_failed:
            return "the broker's WAL failed; restart it to recover"
        if wal.stalled is not None:
            return "the broker's WAL cannot write now (storage full or unreachable); retrying"
        return None

    def mark_storage_failed(self, exc: BaseException) -> None:
        if not self.storage_failed:
            log.critical("WAL failure, refusing writes until restart: %s", exc)
        self.storage_failed = True

    def status(self) -> dict[str, Any]:
        store = getattr(self, "store", None)
        cluster: ClusterView | None = getattr(self, "cluster", None)  # None before `run`
        return {
            "role": "main",
            "node_id": self.config.node_id,
            "zone": self.config.zone,
            "ready": self.ready,
            "storage_failed": self.storage_failed,
            "bootstrap": ":".join(map(str, self.config.advertised)) if self.bound_port else None,
            "topics": len(store.topics) if store else 0,
            # The partitions this main leads (with several mains each holds every topic).
            "partitions": store.led_partition_count() if store else 0,
            "wal_end_offset": store.wal.end_offset if store else 0,
            "objects": self.objects.status() if self.objects is not None else None,
            "retention": self.retention.status() if self.retention is not None else None,
            "cluster": cluster.status() if cluster is not None else None,
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def health(self) -> tuple[bool, str]:
        if self.storage_failed:
            return False, "WAL failed"
        if not self.ready:
            return False, "starting"
        return True, "ok"

    # -- topics ------------------------------------------------------------------------------

    async def auto_create_topic(self, name: str) -> None:
        async with self._auto_create_lock:
            if name in self.store.topics:
                return
            try:
                await self.cluster.create_topic(name, self.config.num_partitions, {})
            except TopicExists:
                return  # another main created it meanwhile; we now hold it too
            log.info("auto-created topic %s", name, extra={"topic": name})
            self.on_partitions_changed()

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> Any:
        """Create a topic in this broker (or, clustered, in the fleet); may raise TopicExists."""
        state = await self.cluster.create_topic(name, partitions, configs)
        self.on_partitions_changed()
        return state

    def topic_exists(self, name: str) -> bool:
        return self.cluster.topic_exists(name)

    async def delete_topic(self, name: str) -> None:
        await self.cluster.delete_topic(name)
        log.info("deleted topic %s", name, extra={"topic": name})
        self.on_partitions_changed()

    async def alter_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]:
        """Apply `change` to the topic's explicit configs (in the fleet: by CAS on the cluster
        document); returns the new set. May raise UnknownTopic or what `change` raises."""
        return await self.cluster.alter_topic_configs(name, change)

    async def create_partitions(
        self, name: str, count: int, preferred: list[int] | None = None
    ) -> None:
        """Grow the topic to `count` partitions (`preferred`: a leader wish per new one); may
        raise UnknownTopic or PartitionCountChanged."""
        await self.cluster.create_partitions(name, count, preferred)
        self.on_partitions_changed()

    def on_partitions_changed(self) -> None:
        self.store.notify_data()

    # -- requests ----------------------------------------------------------------------------

    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        key, version = header.api_key, header.api_version
        supported = self.versions.get(key)
        name = SUPPORTED_APIS[key][0] if key in SUPPORTED_APIS else f"api{key}"
        if supported is None or not supported[0] <= version <= supported[1]:
            if key == API_VERSIONS:
                body = api_versions_unsupported(header.correlation_id, self.versions)
                return _ready([body])
            raise CloseConnection(
                f"unsupported API {name} (key {key}) version {version} "
                f"from {conn.peer_host}:{conn.peer_port} client_id={header.client_id!r}"
            )
        supers = self.config.listener_super_users
        if (
            supers is not None
            and key != API_VERSIONS
            and conn.principal not in supers
            and not conn.listener.startswith(RELAY_LISTENER_PREFIX)
        ):
            # With the authorizer on, a main serves its own clients (on any of its listeners,
            # its plaintext port included) for super users only: the main enforces no ACLs,
            # and the proxies, which do, send every client through themselves. Relayed
            # requests were checked by their proxy.
            raise CloseConnection(
                f"{name} from {conn.principal} on listener {conn.listener}: a main's own "
                "listeners are for super users only while the authorizer is on"
            )
        ctx = RequestContext(header, conn)
        if not self.quotas.manager.enabled(QuotaType.REQUEST) or not self.direct_client(ctx):
            return self._begin(ctx, name, frame)
        started = time.perf_counter_ns()
        try:
            return self._begin(ctx, name, frame)
        finally:
            spent = time.perf_counter_ns() - started
            conn.mute.mute_for(self.quotas.request_throttle_ms(conn, header.client_id, spent))

    def _begin(self, ctx: RequestContext, name: str, frame: bytearray) -> Finish:
        header = ctx.header
        key, version = header.api_key, header.api_version
        self.metrics.requests.labels(name).inc()
        started = time.perf_counter()
        latency = self.metrics.request_latency.labels(name)
        if key == API_PRODUCE:
            finish = begin_produce(self, ctx, frame)

            async def timed_produce() -> Sequence[Buffer] | None:
                try:
                    return await finish()
                finally:
                    latency.observe(time.perf_counter() - started)

            return TopicFinish(timed_produce, finish.request_topics)
        try:
            request = decode_request(header, frame)
        except MalformedRequest as exc:
            raise CloseConnection(f"malformed {name} v{version}: {exc}") from None

        async def run() -> Sequence[Buffer] | None:
            try:
                return await self._dispatch(ctx, name, request)
            except WalError as exc:
                # The WAL failed (or was fenced) under a request that writes to it: logged
                # where it failed; the client's connection closes and it retries elsewhere.
                raise CloseConnection(f"{name} needs the WAL, which failed: {exc}") from None
            finally:
                latency.observe(time.perf_counter() - started)

        return run

    async def _dispatch(self, ctx: RequestContext, name: str, request: Any) -> Sequence[Buffer]:
        header = ctx.header
        key = header.api_key
        if key == API_FETCH:
            return await api_fetch.fetch(self, ctx, request)
        if key == API_VERSIONS:
            data: dict[str, Any] = self._api_versions_body()
        elif key in group_handlers.GROUP_API_KEYS:
            data = await group_handlers.handle(
                key,
                header.api_version,
                request,
                self.coordinator,
                header.client_id or "",
                ctx.conn.peer_host,
                self.consumer_groups,
            )
        else:
            data = await self._handlers[key](self, ctx, request)
            if key in ROUTED_APIS:
                zone, listener = self.client_zone(ctx), self.named_listener(ctx.conn)
                if zone is not None or listener is not None:
                    data = self.zone_view.rewrite(key, data, zone, listener)
        response = build_response(key, header.api_version, data)
        return [encode_response(header, response)]

    def _topic_name(self, topic_id: bytes) -> str | None:
        """The name of the topic with this id, if this main holds it (traffic accounting)."""
        state = self.store.topics_by_id.get(topic_id)
        return state.name if state is not None else None

    def client_zone(self, ctx: RequestContext) -> str | None:
        """The zone whose view a client gets, or None for the untouched view: without zone
        proxies, and for requests a proxy relays (it rewrites for its own zone)."""
        if not self.zone_view.routes or ctx.conn.listener.startswith(RELAY_LISTENER_PREFIX):
            return None
        zone = self.traffic.client_zones(ctx.header, ctx.conn)
        if zone == UNKNOWN_ZONE:
            # No tag and no CIDR: the client most likely got here from zone-aware metadata
            # (its proxy lists only its own zone's main), so keep it in this main's zone.
            zone = self.config.zone
        return zone

    def leader_hints(self, ctx: RequestContext) -> HintSource:
        """KIP-951 hints for this client: the leader as its zone's Metadata shows it."""

        def source(
            partitions: Sequence[PartitionKey],
        ) -> tuple[Mapping[PartitionKey, tuple[int, int]], list[Endpoint]]:
            current: dict[PartitionKey, tuple[int, int]] = {}
            for topic, index in partitions:
                plog = self.store.partition(topic, index)
                if plog is None:
                    continue
                leader = self.config.node_id if plog.leader_id is None else plog.leader_id
                current[(topic, index)] = (leader, plog.leader_epoch)
            hints = self.zone_view.leader_hints(
                current, self.client_zone(ctx), self.named_listener(ctx.conn)
            )
            return hints.current_leader, hints.node_endpoints

        return source

    def _api_versions_body(self) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.none,
            "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in sorted(self.versions.items())
            ],
            "throttle_time_ms": 0,
        }


def _ready(parts: Sequence[bytes]) -> Finish:
    async def done() -> Sequence[bytes]:
        return parts

    return done


class _OffsetStore:
    """Adapts the log store to the coordinator's durability hook."""

    def __init__(self, store: LogStore) -> None:
        self._store = store

    async def persist_offsets(
        self,
        group_id: str,
        offsets: list[tuple[str, int, int, int, str]],
        applied: Callable[[], None],
    ) -> None:
        await self._store.persist_offsets(group_id, offsets, applied)

    async def persist_offsets_delete(
        self,
        group_id: str,
        partitions: list[tuple[str, int]] | None,
        applied: Callable[[], None],
    ) -> None:
        await self._store.persist_offsets_delete(group_id, partitions, applied)

    def partition_exists(self, topic: str, partition: int) -> bool:
        return self._store.partition(topic, partition) is not None

    # OffsetCommit and OffsetFetch v10 name topics by id (main_broker/api/groups.py).
    def topic_name_for_id(self, topic_id: uuid.UUID) -> str | None:
        state = self._store.topics_by_id.get(topic_id.bytes)
        return state.name if state is not None else None

    def topic_id_for_name(self, name: str) -> uuid.UUID | None:
        state = self._store.topics.get(name)
        return uuid.UUID(bytes=state.topic_id) if state is not None else None
