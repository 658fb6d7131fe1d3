"""The transaction coordinator of a main: `TxnCoordinatorState` made durable and acted on.

Every change of a transactional id's metadata is a `txn` CONTROL record on the main's WAL
(the part Kafka's `__transaction_state` plays), applied when durable; SNAPSHOTs carry the
whole table (section `transactions`). A main coordinates the transactional ids that hash to
it (zone_router.placement, as groups: every node computes the same owner).

Ending a transaction: EndTxn writes PREPARE_COMMIT or PREPARE_ABORT, then the markers go
to every partition's leader and every group's coordinator (main_broker/txn/markers.py,
locally or over the internal RPC), retried until each is written; then COMPLETE_COMMIT or
COMPLETE_ABORT is written. EndTxn answers once the markers are written (at most
END_TXN_WAIT_S; they go on in the background after that). After a restart, every
transaction replay leaves in a PREPARE state has its markers sent again: PREPARE_COMMIT
always ends in a commit. An ONGOING transaction past its timeout is aborted with the
producer's epoch bumped, which fences the producer that let it time out.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

import trio

from internal_rpc import RpcError
from internal_rpc.messages import (
    AllowTxn,
    AllowTxnResult,
    MalformedMessage,
    TxnMarker,
    TxnMarkerResult,
    WriteTxnMarkers,
    WriteTxnMarkersResult,
)
from kafka_wire.errors import ErrorCode
from main_broker.txn.markers import TxnHost, allow, write_markers
from main_broker.txn.state import NeedProducerId, TxnCoordinatorState, TxnMetadata, TxnState
from shared_wal import AppendTicket, RecordType, WalError

log = logging.getLogger("zonefleet.main_broker.txn")

TXN_KIND = "txn"
END_TXN_WAIT_S = 10.0
MARKER_RPC_TIMEOUT_S = 10.0
MARKER_RETRY_S = (0.05, 1.0)
TIMEOUT_SCAN_S = 1.0
# Marker answers that end a partition's part: written, or there is nothing to write to (the
# topic is gone, or the partition's producer epoch is past this transaction's).
_DONE = {int(ErrorCode.none), int(ErrorCode.unknown_topic_or_partition)}
_DONE |= {int(ErrorCode.invalid_producer_epoch)}


def now_ms() -> int:
    return int(time.time() * 1000)


Parts = tuple[tuple[str, int], ...]
T = TypeVar("T")


class Missed(NamedTuple):
    partitions: frozenset[tuple[str, int]]
    groups: frozenset[str]


def _decoded(decode: Callable[[object], T], reply: object, node: int) -> T | None:
    try:
        return decode(reply)
    except MalformedMessage as exc:
        log.warning("main %d answered a transaction call with a malformed message: %s", node, exc)
        return None


class InitResult:
    __slots__ = ("error", "producer_epoch", "producer_id")

    def __init__(self, error: ErrorCode, producer_id: int = -1, producer_epoch: int = -1) -> None:
        self.error = error
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch


class TxnCoordinator:
    """A `StoreParticipant` (section `transactions`, records `txn`) and the coordinator's
    request handling and background work (`run`)."""

    snapshot_section = "transactions"
    record_kinds = frozenset({TXN_KIND})

    def __init__(
        self,
        host: TxnHost,
        max_timeout_ms: int,
        allocate_producer_id: Callable[[], Any],
        expiration_ms: int = 7 * 24 * 3600 * 1000,
    ) -> None:
        self.host = host
        self.state = TxnCoordinatorState(max_timeout_ms)
        self.expiration_ms = expiration_ms
        self._allocate = allocate_producer_id
        self._locks: dict[str, trio.Lock] = {}
        self._in_flight: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()

    # -- StoreParticipant ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"t": self.state.snapshot()}

    def restore(self, section: dict[str, Any]) -> None:
        self.state.restore(section.get("t", []))

    def replay(self, header: dict[str, Any]) -> None:
        self.state.apply(TxnMetadata.from_record(header["x"]))

    async def _persist(self, meta: TxnMetadata) -> None:
        header = {"k": TXN_KIND, "x": meta.to_record()}
        await self.host.store.wal.append(
            RecordType.CONTROL, header, on_durable=lambda: self.state.apply(meta)
        )

    def _lock(self, tid: str) -> trio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = trio.Lock()
        return lock

    def owns(self, tid: str) -> bool:
        return self.host.cluster.owns_group(tid)

    # -- requests ------------------------------------------------------------------------------

    async def init_producer_id(
        self, tid: str, timeout_ms: int, expected_pid: int, expected_epoch: int
    ) -> InitResult:
        if not self.owns(tid):
            return InitResult(ErrorCode.not_coordinator)
        async with self._lock(tid):
            decided = self.state.init_producer_id(
                tid, timeout_ms, expected_pid, expected_epoch, now_ms()
            )
            if isinstance(decided, ErrorCode):
                return InitResult(decided)
            if isinstance(decided, NeedProducerId):
                pid = await self._allocate()
                decided = self.state.init_with(tid, pid, timeout_ms, decided.previous, now_ms())
            if decided is self.state.get(tid):  # KIP-360: a retry of a bump already made
                return InitResult(ErrorCode.none, decided.producer_id, decided.producer_epoch)
            await self._persist(decided)
            if decided.state == TxnState.PREPARE_ABORT:
                # The producer's open transaction is aborted first (fencing its old epoch);
                # it retries and gets its new epoch once the abort is complete.
                self._start_markers(decided)
                return InitResult(ErrorCode.concurrent_transactions)
            return InitResult(ErrorCode.none, decided.producer_id, decided.producer_epoch)

    async def add_partitions(
        self,
        tid: str,
        pid: int,
        epoch: int,
        partitions: frozenset[tuple[str, int]],
        groups: frozenset[str] = frozenset(),
    ) -> tuple[ErrorCode, frozenset[tuple[str, int]]]:
        """The answer, and the partitions whose leaders could not be told (answered
        CONCURRENT_TRANSACTIONS: the client retries; a group not told fails the whole
        AddOffsetsToTxn that way)."""
        if not self.owns(tid):
            return ErrorCode.not_coordinator, frozenset()
        async with self._lock(tid):
            decided = self.state.add_partitions(tid, pid, epoch, partitions, groups, now_ms())
            if isinstance(decided, ErrorCode):
                return decided, frozenset()
            if decided is not self.state.get(tid):
                await self._persist(decided)
                self._wake.set()  # a new deadline
            # Every time, not only for what is new: a retry after a leader was not reachable
            # must tell it, and telling twice is harmless.
            missed = await self._allow(decided, partitions, groups)
            if groups & missed.groups:
                return ErrorCode.concurrent_transactions, frozenset()
            return ErrorCode.none, missed.partitions

    async def _allow(
        self, meta: TxnMetadata, partitions: frozenset[tuple[str, int]], groups: frozenset[str]
    ) -> Missed:
        """Tell each leader and group coordinator that this transaction holds its partitions
        and groups; returns those that could not be told."""

        async def tell(node: int, parts: Parts, gids: tuple[str, ...]) -> TxnMarkerResult | None:
            request = AllowTxn(meta.producer_id, meta.producer_epoch, parts, gids)
            result = await self._send_allow(node, request)
            return None if result is None else result.result

        part_codes, group_codes = await self._fan_out(partitions, groups, tell)
        missed = Missed(
            frozenset(tp for tp, code in part_codes.items() if code != ErrorCode.none),
            frozenset(g for g, code in group_codes.items() if code != ErrorCode.none),
        )
        if missed.partitions or missed.groups:
            log.info(
                "transaction %s: %d partitions and %d groups not told of it yet",
                meta.transactional_id,
                len(missed.partitions),
                len(missed.groups),
            )
            self.host.cluster.poke()  # a leader may have moved: re-read the document
        return missed

    async def _fan_out(
        self,
        partitions: AbstractSet[tuple[str, int]],
        groups: AbstractSet[str],
        call: Callable[[int, Parts, tuple[str, ...]], Awaitable[TxnMarkerResult | None]],
    ) -> tuple[dict[tuple[str, int], int | None], dict[str, int | None]]:
        """Call each partition's leader and each group's coordinator (this main directly, the
        others over the RPC) at once; every partition's and group's error code, None where
        no answer came. A partition of a topic gone is UNKNOWN_TOPIC_OR_PARTITION."""
        host = self.host
        part_codes: dict[tuple[str, int], int | None] = dict.fromkeys(partitions)
        group_codes: dict[str, int | None] = dict.fromkeys(groups)
        by_node: dict[int, tuple[list[tuple[str, int]], list[str]]] = {}
        for topic, index in sorted(partitions):
            plog = host.store.partition(topic, index)
            if plog is None:
                part_codes[(topic, index)] = int(ErrorCode.unknown_topic_or_partition)
                continue
            node = host.node_id if plog.owned else plog.leader_id
            assert node is not None
            by_node.setdefault(node, ([], []))[0].append((topic, index))
        for group_id in sorted(groups):
            node = host.cluster.coordinator_for(group_id).node_id
            by_node.setdefault(node, ([], []))[1].append(group_id)

        async def ask(node: int, parts: list[tuple[str, int]], gids: list[str]) -> None:
            result = await call(node, tuple(parts), tuple(gids))
            if result is not None:
                for topic, index, code in result.partitions:
                    part_codes[(topic, index)] = code
                for group_id, code in result.groups:
                    group_codes[group_id] = code

        async with trio.open_nursery() as nursery:
            for node, (parts, gids) in by_node.items():
                nursery.start_soon(ask, node, parts, gids)
        return part_codes, group_codes

    async def _send_allow(self, node: int, request: AllowTxn) -> AllowTxnResult | None:
        if node == self.host.node_id:
            return allow(self.host, request)
        reply = await self._peer_call(node, "allow_txn", request.to_wire())
        return None if reply is None else _decoded(AllowTxnResult.from_wire, reply, node)

    async def _peer_call(self, node: int, method: str, params: dict[str, Any]) -> Any:
        """Another main's answer to one of the coordinator's calls; None when none came."""
        rpc = self.host.cluster.peer_rpc(node)
        if rpc is None:
            log.warning("no RPC to main %d for %s", node, method)
            return None
        try:
            return await rpc.call(method, params, timeout=MARKER_RPC_TIMEOUT_S, retries=1)
        except RpcError as exc:
            log.info("main %d did not answer %s: %s", node, method, exc)
            return None

    def verify_partitions(
        self, tid: str, pid: int, epoch: int, partitions: frozenset[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        if not self.owns(tid):
            return dict.fromkeys(partitions, ErrorCode.not_coordinator)
        return self.state.verify_partitions(tid, pid, epoch, partitions)

    async def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
        if not self.owns(tid):
            return ErrorCode.not_coordinator
        async with self._lock(tid):
            decided = self.state.end_txn(tid, pid, epoch, commit, now_ms())
            if isinstance(decided, ErrorCode):
                return decided
            await self._persist(decided)
            done = self._start_markers(decided)
        with trio.move_on_after(END_TXN_WAIT_S):
            await done.wait()
        return ErrorCode.none

    # -- markers -------------------------------------------------------------------------------

    def _start_markers(self, meta: TxnMetadata) -> trio.Event:
        done = self._in_flight.get(meta.transactional_id)
        if done is not None:
            return done
        done = self._in_flight[meta.transactional_id] = trio.Event()
        self._nursery_start(self._send_markers, meta, done)
        return done

    async def _send_markers(self, meta: TxnMetadata, done: trio.Event) -> None:
        try:
            await self._write_all_markers(meta)
            async with self._lock(meta.transactional_id):
                if self.state.get(meta.transactional_id) == meta:
                    # Applied at once, made durable behind: the id's next record comes after
                    # it in the WAL, and a crash before it lands leaves the PREPARE state,
                    # whose markers go out again (they are idempotent). Nobody waits on it.
                    complete = self.state.complete(meta, now_ms())
                    self.state.apply(complete)
                    ticket = self.host.store.wal.submit(
                        RecordType.CONTROL, {"k": TXN_KIND, "x": complete.to_record()}
                    )
                    self._nursery_start(self._land, meta.transactional_id, ticket)
        except WalError as exc:
            log.error("transaction %s: cannot complete: %s", meta.transactional_id, exc)
        finally:
            self._in_flight.pop(meta.transactional_id, None)
            done.set()

    def _nursery_start(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None, "the coordinator is not running"
        self._nursery.start_soon(fn, *args)

    @staticmethod
    async def _land(tid: str, ticket: AppendTicket) -> None:
        try:
            await ticket.wait()
        except WalError as exc:
            log.error("transaction %s: its completion was not written: %s", tid, exc)

    async def _write_all_markers(self, meta: TxnMetadata) -> None:
        commit = meta.state == TxnState.PREPARE_COMMIT
        partitions = set(meta.partitions)
        groups = set(meta.groups)
        delay = MARKER_RETRY_S[0]

        async def send(node: int, parts: Parts, gids: tuple[str, ...]) -> TxnMarkerResult | None:
            marker = TxnMarker(meta.producer_id, meta.producer_epoch, commit, 0, parts, gids)
            result = await self._send(node, WriteTxnMarkers((marker,)))
            return None if result is None else result.results[0]

        while partitions or groups:
            # Every main at once: the transaction ends as fast as its slowest leader.
            part_codes, group_codes = await self._fan_out(partitions, groups, send)
            partitions -= {tp for tp, code in part_codes.items() if code in _DONE}
            groups -= {g for g, code in group_codes.items() if code == ErrorCode.none}
            if partitions or groups:
                log.info(
                    "transaction %s: markers for %d partitions and %d groups not written yet",
                    meta.transactional_id,
                    len(partitions),
                    len(groups),
                )
                await trio.sleep(delay)
                delay = min(delay * 2, MARKER_RETRY_S[1])
                await self.host.cluster.refresh()

    async def _send(self, node: int, request: WriteTxnMarkers) -> WriteTxnMarkersResult | None:
        if node == self.host.node_id:
            return await write_markers(self.host, request)
        reply = await self._peer_call(node, "write_txn_markers", request.to_wire())
        return None if reply is None else _decoded(WriteTxnMarkersResult.from_wire, reply, node)

    # -- background ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for meta in self.state.pending_markers():
                # Left in a PREPARE state by a crash or a restart: finish it.
                log.info(
                    "transaction %s: resuming %s after a restart",
                    meta.transactional_id,
                    meta.state.name,
                )
                self._start_markers(meta)
            task_status.started()
            while True:
                await self._abort_timed_out()
                await self._expire_idle()
                deadline = self.state.next_deadline_ms()
                wait_s = TIMEOUT_SCAN_S
                if deadline is not None:
                    wait_s = min(wait_s, max((deadline - now_ms()) / 1000 + 0.01, 0.01))
                self._wake = trio.Event()
                with trio.move_on_after(wait_s if math.isfinite(wait_s) else TIMEOUT_SCAN_S):
                    await self._wake.wait()

    async def _abort_timed_out(self) -> None:
        for aborted in self.state.timed_out(now_ms()):
            tid = aborted.transactional_id
            async with self._lock(tid):
                current = self.state.get(tid)
                if current is None or current.state != TxnState.ONGOING:
                    continue
                if current.producer_epoch + 1 != aborted.producer_epoch:
                    continue
                log.info(
                    "transaction %s of producer %d timed out after %d ms: aborting",
                    tid,
                    aborted.producer_id,
                    aborted.timeout_ms,
                )
                try:
                    await self._persist(aborted)
                except WalError as exc:
                    log.error("transaction %s: cannot abort: %s", tid, exc)
                    continue
                self._start_markers(aborted)

    async def _expire_idle(self) -> None:
        for dead in self.state.expired(now_ms(), self.expiration_ms):
            tid = dead.transactional_id
            async with self._lock(tid):
                current = self.state.get(tid)
                if (
                    current is None
                    or replace(current, state=dead.state, update_ms=dead.update_ms) != dead
                ):
                    continue  # used again meanwhile
                log.info("transactional id %s expired (unused for %d ms)", tid, self.expiration_ms)
                try:
                    await self._persist(dead)
                except WalError as exc:
                    log.error("transactional id %s: cannot expire: %s", tid, exc)
                    continue
            self._locks.pop(tid, None)

    # -- Describe/ListTransactions ---------------------------------------------------------------

    def describe(self, tid: str) -> TxnMetadata | ErrorCode:
        if not self.owns(tid):
            return ErrorCode.not_coordinator
        meta = self.state.get(tid)
        return ErrorCode.transactional_id_not_found if meta is None else meta

    def list(self) -> list[TxnMetadata]:
        return [m for m in self.state.txns.values() if self.owns(m.transactional_id)]
