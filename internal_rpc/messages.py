"""Typed messages between nodes: one frozen dataclass per message, with its explicit msgpack
shape (`to_wire()` builds the value that goes in a call's params or result, `from_wire()`
checks one strictly and raises `MalformedMessage` naming the field at fault).

Every message map carries `mv`, the version of its shape. A decoder accepts every version it
knows, and a map without `mv` as version 1, the shape nodes sent before messages had a version
(their confirms also carry an `acks` that nothing ever read: accepted and ignored). An unknown
version is refused with `UnsupportedMessageVersion`. docs/formats.md, "Confirm", has the byte
layouts and says what a mixed-version fleet can do.

Confirm (proxy -> the partition's main, method ``confirm``): `ConfirmParams` in,
`ConfirmResult` out, one `PartitionOutcome` per `ConfirmPart`, in request order.
Relay (proxy -> a main, method ``relay``): `RelayParams` in, `RelayResult` out.
Metadata poke (main -> main, method ``meta_changed``): `MetaChanged` in, `MetaChanged` out.
Transaction markers (coordinator main -> leader main, method ``write_txn_markers``):
`WriteTxnMarkers` in, `WriteTxnMarkersResult` out. A transaction's partitions and groups
(coordinator main -> leader main, method ``allow_txn``): `AllowTxn` in, `AllowTxnResult` out.
The state stream's frames (main -> each proxy) are in `internal_rpc.state_frames`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from kafka_wire.hot_codecs import ProducePartitionResult
from kafka_wire.record_batch import MAGIC_V2, BatchInfo

__all__ = [
    "CONFIRM_RESULT_VERSION",
    "CONFIRM_VERSION",
    "LIVENESS_VERSION",
    "META_CHANGED_VERSION",
    "RELAY_VERSION",
    "TXN_ALLOW_VERSION",
    "TXN_MARKERS_VERSION",
    "AllowTxn",
    "AllowTxnResult",
    "BatchSummary",
    "ConfirmParams",
    "ConfirmPart",
    "ConfirmResult",
    "MainUnreachable",
    "MalformedMessage",
    "MetaChanged",
    "PartitionOutcome",
    "Probe",
    "RelayParams",
    "RelayResult",
    "TxnMarker",
    "TxnMarkerResult",
    "UnsupportedMessageVersion",
    "WriteTxnMarkers",
    "WriteTxnMarkersResult",
]

# 2: each part carries its batch's header summary (`BatchSummary`), so the main decides
# without reading the payload back. 3: the same fields, packed tighter (the call's fields in one
# array, the max timestamp relative to the first): a confirm crosses zones
# for every batch a proxy takes. The result's shape did not change.
CONFIRM_VERSION: Final = 3
CONFIRM_RESULT_VERSION: Final = 1
RELAY_VERSION: Final = 1
META_CHANGED_VERSION: Final = 1
LIVENESS_VERSION: Final = 1
TXN_MARKERS_VERSION: Final = 1
TXN_ALLOW_VERSION: Final = 1
_DEFAULT_PRODUCE_VERSION: Final = 9
_DEFAULT_TIMEOUT_MS: Final = 30_000


class MalformedMessage(ValueError):
    """A message that does not have the shape its type and version require."""


class UnsupportedMessageVersion(MalformedMessage):
    """A message of a version this node does not know (a newer node sent it)."""


def _int(value: object, what: str) -> int:
    if type(value) is not int:  # msgpack never decodes an integer to a bool
        raise MalformedMessage(f"{what} must be an integer, not {type(value).__name__}")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedMessage(f"{what} must be a string, not {type(value).__name__}")
    return value


def _opt_str(value: object, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _bytes(value: object, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise MalformedMessage(f"{what} must be binary, not {type(value).__name__}")
    return value


def _list(value: object, what: str, sizes: tuple[int, ...] | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedMessage(f"{what} must be an array, not {type(value).__name__}")
    if sizes is not None and len(value) not in sizes:
        raise MalformedMessage(f"{what} must have {' or '.join(map(str, sizes))} elements")
    return value


def _map(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedMessage(f"{what} must be a map, not {type(value).__name__}")
    return value


def _version(msg: dict[str, Any], what: str, known: int) -> int:
    version = _int(msg.get("mv", 1), f"{what}.mv")
    if not 1 <= version <= known:
        raise UnsupportedMessageVersion(f"{what} version {version}; this node knows 1 to {known}")
    return version


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """What the append decision needs of a batch, from its v2 header: the zone proxy, which
    holds the bytes, checked its framing and CRC; the main checks limits, producer sequence
    and epoch on these fields alone (main_broker/appender.py). `size` is the batch's bytes
    (the PREPARED record around it is longer: its WAL header)."""

    size: int
    attributes: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @classmethod
    def of(cls, batch: BatchInfo) -> BatchSummary:
        return cls(
            batch.size,
            batch.attributes,
            batch.record_count,
            batch.base_timestamp,
            batch.max_timestamp,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
        )

    def batch_info(self) -> BatchInfo:
        """The header as the main sees it: offsets unassigned, CRC unknown (0)."""
        return BatchInfo(
            position=0,
            size=self.size,
            base_offset=0,
            partition_leader_epoch=-1,
            magic=MAGIC_V2,
            crc=0,
            attributes=self.attributes,
            last_offset_delta=self.record_count - 1,
            base_timestamp=self.base_timestamp,
            max_timestamp=self.max_timestamp,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=self.base_sequence,
            record_count=self.record_count,
        )

    def to_wire(self, version: int = CONFIRM_VERSION) -> list[int]:
        return [
            self.size,
            self.attributes,
            self.record_count,
            self.base_timestamp,
            # Version 3: relative to the first timestamp (a few bytes, not nine).
            self.max_timestamp - self.base_timestamp if version >= 3 else self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
        ]

    @classmethod
    def from_wire(
        cls, row: object, what: str = "batch", version: int = CONFIRM_VERSION
    ) -> BatchSummary:
        fields = _list(row, what, (8,))
        names = ("size", "attributes", "count", "first_ts", "max_ts", "pid", "epoch", "seq")
        values = [_int(v, f"{what}.{n}") for v, n in zip(fields, names, strict=True)]
        if version >= 3:
            values[4] += values[3]
        return cls(*values)


@dataclass(frozen=True, slots=True)
class ConfirmPart:
    """One partition to append: where its PREPARED record lies in the proxy's WAL and, from
    version 2, the summary of its batch header (None in a version 1 confirm: the main then
    reads the payload to learn it)."""

    topic: str
    partition: int
    writer: str
    segment: int
    position: int
    length: int
    batch: BatchSummary | None = None

    def to_wire(self, version: int = CONFIRM_VERSION) -> list[Any]:
        row = [self.topic, self.partition, self.writer, self.segment, self.position, self.length]
        if self.batch is not None and version >= 2:
            row.append(self.batch.to_wire(version))
        return row

    @classmethod
    def from_wire(
        cls, row: object, what: str = "part", version: int = CONFIRM_VERSION
    ) -> ConfirmPart:
        fields = _list(row, what, (6,) if version == 1 else (7,))
        topic, partition, writer, segment, position, length = fields[:6]
        return cls(
            _str(topic, f"{what}.topic"),
            _int(partition, f"{what}.partition"),
            _str(writer, f"{what}.writer"),
            _int(segment, f"{what}.segment"),
            _int(position, f"{what}.position"),
            _int(length, f"{what}.length"),
            BatchSummary.from_wire(fields[6], f"{what}.batch", version)
            if len(fields) == 7
            else None,
        )


@dataclass(frozen=True, slots=True)
class ConfirmParams:
    """A confirm call. `session` and `seq` are both set or both None: a caller with one
    confirm in flight per main may leave them out; the proxy's pipe numbers its calls per
    session so the main applies them in order (main_broker/api/confirm.py)."""

    produce_version: int
    timeout_ms: int
    parts: tuple[ConfirmPart, ...]
    session: str | None = None
    seq: int | None = None

    def __post_init__(self) -> None:
        if (self.session is None) != (self.seq is None):
            raise MalformedMessage("confirm: sess and seq go together")

    def to_wire(self, version: int = CONFIRM_VERSION) -> dict[str, Any]:
        """The params in `version` (a main of an earlier release reads only its own); version
        1 whenever a part has no batch summary (what a node of that release sent)."""
        if any(p.batch is None for p in self.parts):
            if any(p.batch is not None for p in self.parts):
                raise MalformedMessage("confirm: every part of a version 2 confirm has a batch")
            version = 1
        parts = [part.to_wire(version) for part in self.parts]
        if version >= 3:
            return {
                "mv": version,
                "h": [self.session, self.seq, self.timeout_ms, self.produce_version],
                "parts": parts,
            }
        msg: dict[str, Any] = {"mv": version}
        if self.session is not None:
            msg["sess"] = self.session
            msg["seq"] = self.seq
        msg["tmo"] = self.timeout_ms
        msg["v"] = self.produce_version
        msg["parts"] = parts
        return msg

    @classmethod
    def from_wire(cls, msg: object) -> ConfirmParams:
        params = _map(msg, "confirm")
        version = _version(params, "confirm", CONFIRM_VERSION)
        rows = _list(params.get("parts"), "confirm.parts")
        parts = tuple(
            ConfirmPart.from_wire(row, f"confirm.parts[{i}]", version) for i, row in enumerate(rows)
        )
        if version >= 3:
            session, seq, timeout_ms, produce_version = _list(params.get("h"), "confirm.h", (4,))
            return cls(
                produce_version=_int(produce_version, "confirm.h.v"),
                timeout_ms=_int(timeout_ms, "confirm.h.tmo"),
                parts=parts,
                session=None if session is None else _str(session, "confirm.h.sess"),
                seq=None if seq is None else _int(seq, "confirm.h.seq"),
            )
        session = params.get("sess")
        seq = params.get("seq")
        return cls(
            produce_version=_int(params.get("v", _DEFAULT_PRODUCE_VERSION), "confirm.v"),
            timeout_ms=_int(params.get("tmo", _DEFAULT_TIMEOUT_MS), "confirm.tmo"),
            parts=parts,
            session=None if session is None else _str(session, "confirm.sess"),
            seq=None if seq is None else _int(seq, "confirm.seq"),
        )


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """What the main made of one confirmed partition: the Produce response's partition
    fields. `record_errors` are (index of the record in its batch, message) pairs."""

    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: tuple[tuple[int, str | None], ...] = ()

    @classmethod
    def of(cls, result: ProducePartitionResult) -> PartitionOutcome:
        return cls(
            int(result.error_code),
            result.base_offset,
            result.log_append_time_ms,
            result.log_start_offset,
            result.error_message,
            tuple(result.record_errors),
        )

    def apply_to(self, result: ProducePartitionResult) -> None:
        result.error_code = self.error_code
        result.base_offset = self.base_offset
        result.log_append_time_ms = self.log_append_time_ms
        result.log_start_offset = self.log_start_offset
        result.error_message = self.error_message
        if self.record_errors:
            result.record_errors = list(self.record_errors)

    def to_wire(self) -> list[Any]:
        row: list[Any] = [
            self.error_code,
            self.base_offset,
            self.log_append_time_ms,
            self.log_start_offset,
            self.error_message,
        ]
        if self.record_errors:  # the 6th element only when there are any
            row.append([[index, message] for index, message in self.record_errors])
        return row

    @classmethod
    def from_wire(cls, row: object, what: str = "outcome") -> PartitionOutcome:
        fields = _list(row, what, (5, 6))
        errors = _list(fields[5], f"{what}.record_errors") if len(fields) == 6 else []
        record_errors = []
        for i, pair in enumerate(errors):
            index, message = _list(pair, f"{what}.record_errors[{i}]", (2,))
            record_errors.append(
                (
                    _int(index, f"{what}.record_errors[{i}].index"),
                    _opt_str(message, f"{what}.record_errors[{i}].message"),
                )
            )
        return cls(
            _int(fields[0], f"{what}.error_code"),
            _int(fields[1], f"{what}.base_offset"),
            _int(fields[2], f"{what}.log_append_time_ms"),
            _int(fields[3], f"{what}.log_start_offset"),
            _opt_str(fields[4], f"{what}.error_message"),
            tuple(record_errors),
        )


@dataclass(frozen=True, slots=True)
class ConfirmResult:
    """The answer to a confirm: one outcome per part, in request order."""

    parts: tuple[PartitionOutcome, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"mv": CONFIRM_RESULT_VERSION, "parts": [part.to_wire() for part in self.parts]}

    @classmethod
    def from_wire(cls, msg: object, expected_parts: int | None = None) -> ConfirmResult:
        result = _map(msg, "confirm result")
        _version(result, "confirm result", CONFIRM_RESULT_VERSION)
        rows = _list(result.get("parts"), "confirm result.parts")
        if expected_parts is not None and len(rows) != expected_parts:
            raise MalformedMessage(
                f"confirm result has {len(rows)} parts for the {expected_parts} confirmed"
            )
        return cls(
            tuple(
                PartitionOutcome.from_wire(row, f"confirm result.parts[{i}]")
                for i, row in enumerate(rows)
            )
        )


@dataclass(frozen=True, slots=True)
class RelayParams:
    """A Kafka request a proxy relays to a main for one of its clients: the whole request
    frame (header and body, no size prefix), the client's address, when known, and the
    principal the proxy authenticated it as (absent from proxies before it was sent:
    User:ANONYMOUS)."""

    frame: bytes
    host: str | None = None
    principal: str | None = None

    def to_wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"mv": RELAY_VERSION, "frame": self.frame}
        if self.host is not None:
            msg["host"] = self.host
        if self.principal is not None:
            msg["principal"] = self.principal
        return msg

    @classmethod
    def from_wire(cls, msg: object) -> RelayParams:
        params = _map(msg, "relay")
        _version(params, "relay", RELAY_VERSION)
        host, principal = params.get("host"), params.get("principal")
        return cls(
            _bytes(params.get("frame"), "relay.frame"),
            None if host is None else _str(host, "relay.host"),
            None if principal is None else _str(principal, "relay.principal"),
        )


@dataclass(frozen=True, slots=True)
class RelayResult:
    """The main's response frame (no size prefix), or None when the request gets no
    response (a Produce with acks=0)."""

    frame: bytes | None

    def to_wire(self) -> dict[str, Any]:
        return {"mv": RELAY_VERSION, "frame": self.frame}

    @classmethod
    def from_wire(cls, msg: object) -> RelayResult:
        result = _map(msg, "relay result")
        _version(result, "relay result", RELAY_VERSION)
        if "frame" not in result:
            raise MalformedMessage("relay result.frame is missing")
        frame = result["frame"]
        return cls(None if frame is None else _bytes(frame, "relay result.frame"))


@dataclass(frozen=True, slots=True)
class MetaChanged:
    """A main changed the cluster document; the one it tells re-reads it now rather than at
    its next poll. It carries nothing, and the answer is the same empty message."""

    def to_wire(self) -> dict[str, Any]:
        return {"mv": META_CHANGED_VERSION}

    @classmethod
    def from_wire(cls, msg: object) -> MetaChanged:
        _version(_map(msg, "meta_changed"), "meta_changed", META_CHANGED_VERSION)
        return cls()


@dataclass(frozen=True, slots=True)
class Probe:
    """Main -> main (method ``probe``): are you there? The answer is a `Probe` naming the
    answering node, so a probe that reached another process on the port does not count."""

    node: int

    def to_wire(self) -> dict[str, Any]:
        return {"mv": LIVENESS_VERSION, "node": self.node}

    @classmethod
    def from_wire(cls, msg: object) -> Probe:
        params = _map(msg, "probe")
        _version(params, "probe", LIVENESS_VERSION)
        return cls(_int(params.get("node"), "probe.node"))


@dataclass(frozen=True, slots=True)
class MainUnreachable:
    """Proxy or main -> every other main (method ``main_unreachable``): this node lost its
    connection to main `node` (`reason` for the log). Only the controller acts on it, and only
    after its own probes confirm it (main_broker/cluster/watch.py). The answer says whether
    the receiver is the controller."""

    node: int
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"mv": LIVENESS_VERSION, "node": self.node, "reason": self.reason}

    @classmethod
    def from_wire(cls, msg: object) -> MainUnreachable:
        params = _map(msg, "main_unreachable")
        _version(params, "main_unreachable", LIVENESS_VERSION)
        return cls(
            _int(params.get("node"), "main_unreachable.node"),
            _str(params.get("reason", ""), "main_unreachable.reason")[:200],
        )


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """One transaction's end, for the partitions and groups a main leads or coordinates
    (Kafka's WritableTxnMarker). Wire: [producer id, epoch, commit, coordinator epoch,
    [[topic, partition], ...], [group, ...]]."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[tuple[str, int], ...]
    groups: tuple[str, ...] = ()

    def to_wire(self) -> list[Any]:
        return [
            self.producer_id,
            self.producer_epoch,
            self.commit,
            self.coordinator_epoch,
            [[t, p] for t, p in self.partitions],
            list(self.groups),
        ]

    @classmethod
    def from_wire(cls, row: object, what: str = "marker") -> TxnMarker:
        fields = _list(row, what, (6,))
        if type(fields[2]) is not bool:
            raise MalformedMessage(f"{what}.commit must be a bool")
        partitions = tuple(
            (_str(tp[0], f"{what}.partitions[{i}].topic"), _int(tp[1], f"{what}.partitions[{i}]"))
            for i, tp in enumerate(
                _list(p, f"{what}.partitions[]", (2,)) for p in _list(fields[4], f"{what}.parts")
            )
        )
        groups = tuple(_str(g, f"{what}.groups[]") for g in _list(fields[5], f"{what}.groups"))
        return cls(
            _int(fields[0], f"{what}.producer_id"),
            _int(fields[1], f"{what}.producer_epoch"),
            fields[2],
            _int(fields[3], f"{what}.coordinator_epoch"),
            partitions,
            groups,
        )


@dataclass(frozen=True, slots=True)
class WriteTxnMarkers:
    """Coordinator main -> partition leader or group coordinator main (method
    ``write_txn_markers``): append these markers, complete these groups' offsets."""

    markers: tuple[TxnMarker, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"mv": TXN_MARKERS_VERSION, "markers": [m.to_wire() for m in self.markers]}

    @classmethod
    def from_wire(cls, msg: object) -> WriteTxnMarkers:
        params = _map(msg, "write_txn_markers")
        _version(params, "write_txn_markers", TXN_MARKERS_VERSION)
        rows = _list(params.get("markers"), "write_txn_markers.markers")
        return cls(tuple(TxnMarker.from_wire(r, f"markers[{i}]") for i, r in enumerate(rows)))


@dataclass(frozen=True, slots=True)
class TxnMarkerResult:
    """Per marker (in request order): the error code of each partition and group. Wire:
    [[[topic, partition, code], ...], [[group, code], ...]]."""

    partitions: tuple[tuple[str, int, int], ...]
    groups: tuple[tuple[str, int], ...] = ()

    def to_wire(self) -> list[Any]:
        return [[list(p) for p in self.partitions], [list(g) for g in self.groups]]

    @classmethod
    def from_wire(cls, row: object, what: str = "result") -> TxnMarkerResult:
        fields = _list(row, what, (2,))
        parts = []
        for p in _list(fields[0], f"{what}.partitions"):
            t, i, c = _list(p, f"{what}.partitions[]", (3,))
            parts.append((_str(t, f"{what}.topic"), _int(i, f"{what}.partition"), _int(c, "code")))
        groups = []
        for g in _list(fields[1], f"{what}.groups"):
            name, code = _list(g, f"{what}.groups[]", (2,))
            groups.append((_str(name, f"{what}.group"), _int(code, f"{what}.code")))
        return cls(tuple(parts), tuple(groups))


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersResult:
    results: tuple[TxnMarkerResult, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"mv": TXN_MARKERS_VERSION, "results": [r.to_wire() for r in self.results]}

    @classmethod
    def from_wire(cls, msg: object) -> WriteTxnMarkersResult:
        result = _map(msg, "write_txn_markers result")
        _version(result, "write_txn_markers result", TXN_MARKERS_VERSION)
        rows = _list(result.get("results"), "write_txn_markers result.results")
        return cls(tuple(TxnMarkerResult.from_wire(r, f"results[{i}]") for i, r in enumerate(rows)))


@dataclass(frozen=True, slots=True)
class AllowTxn:
    """Coordinator main -> partition leader or group coordinator main (method
    ``allow_txn``): the producer's transaction at this epoch now holds these partitions and
    these groups' offsets, so its first batch (or TxnOffsetCommit) there may open it.
    KIP-890's verification, pushed by the coordinator before it answers AddPartitionsToTxn
    or AddOffsetsToTxn. The answer is a `AllowTxnResult`."""

    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]
    groups: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        marker = TxnMarker(self.producer_id, self.producer_epoch, True, 0, self.partitions,
                           self.groups)  # fmt: skip
        row = marker.to_wire()
        return {"mv": TXN_ALLOW_VERSION, "pid": row[0], "pe": row[1], "parts": row[4],
                "groups": row[5]}  # fmt: skip

    @classmethod
    def from_wire(cls, msg: object) -> AllowTxn:
        params = _map(msg, "allow_txn")
        _version(params, "allow_txn", TXN_ALLOW_VERSION)
        row = [params.get("pid"), params.get("pe"), True, 0, params.get("parts"),
               params.get("groups")]  # fmt: skip
        marker = TxnMarker.from_wire(row, "allow_txn")
        return cls(marker.producer_id, marker.producer_epoch, marker.partitions, marker.groups)


@dataclass(frozen=True, slots=True)
class AllowTxnResult:
    """The error code of each partition and group of an `AllowTxn`."""

    result: TxnMarkerResult

    def to_wire(self) -> dict[str, Any]:
        return {"mv": TXN_ALLOW_VERSION, "result": self.result.to_wire()}

    @classmethod
    def from_wire(cls, msg: object) -> AllowTxnResult:
        params = _map(msg, "allow_txn result")
        _version(params, "allow_txn result", TXN_ALLOW_VERSION)
        return cls(TxnMarkerResult.from_wire(params.get("result"), "allow_txn result"))
