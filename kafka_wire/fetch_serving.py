"""Fetch request semantics over any partition store (main broker or zone proxy).

Long poll on min_bytes/max_wait (capped), max_bytes and partition_max_bytes with the KIP-74
first-batch rule, isolation level, leader epoch checks and topic ids (v13+), served up to the
high watermark (or the last stable offset for read_committed). The store is reached only
through the small protocols below, so this module knows nothing of WALs or logs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import FetchPartitionResult, encode_fetch_response
from kafka_wire.leader_hints import HintSource, fill_fetch_hints
from kafka_wire.server_loop import Buffer

READ_COMMITTED = 1
NO_TOPIC_ID = bytes(16)
MAX_WAIT_CAP_SECONDS = 30.0
TOPIC_IDS_VERSION = 13
DEFAULT_MAX_BYTES = 2**31 - 1


class PartitionReadError(Exception):
    """Raised by `FetchSource.batches_bytes` when a partition's bytes cannot be read (an
    object store or file system failure, a corrupt object): that partition is answered with
    `error_code` and no records, the rest of the response as usual."""

    def __init__(self, error_code: ErrorCode, message: str = "") -> None:
        super().__init__(message or error_code.name)
        self.error_code = error_code


@contextlib.contextmanager
def read_failures_fail_the_partition(log: logging.Logger, what: str) -> Iterator[None]:
    """Any failure reading `what` (a store or file system error, corrupt bytes) fails only the
    partition that read it, with KAFKA_STORAGE_ERROR, which clients retry: logged, never
    raised into the request or the broker."""
    try:
        yield
    except PartitionReadError:
        raise
    except Exception as exc:  # of any kind, by design: see the docstring
        log.warning("reading %s failed: %s: %s", what, type(exc).__name__, exc)
        raise PartitionReadError(ErrorCode.kafka_storage_error, str(exc)) from exc


class FetchEntry(Protocol):
    """One record batch as the store indexes it."""

    @property
    def size(self) -> int: ...


E = TypeVar("E", bound=FetchEntry)
E_co = TypeVar("E_co", bound=FetchEntry, covariant=True)


class FetchPartition(Protocol[E_co]):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def owned(self) -> bool:
        """False where another broker leads the partition: NOT_LEADER_OR_FOLLOWER."""
        ...

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with records in
        [start, end): a read_committed consumer drops their records."""
        ...

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> tuple[int, Sequence[E_co]]:
        """(error code, whole batches from `offset` below `upper` within max_bytes).

        Must answer OFFSET_OUT_OF_RANGE for an offset outside [log start, next offset], and
        return the first batch even past max_bytes when must_return_one (KIP-74).
        """
        ...


class FetchTopic(Protocol[E_co]):
    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> bytes: ...
    @property
    def partitions(self) -> Sequence[FetchPartition[E_co]]: ...


class FetchSource(Protocol[E]):
    def topic_by_name(self, name: str) -> FetchTopic[E] | None: ...
    def topic_by_id(self, topic_id: bytes) -> FetchTopic[E] | None: ...

    @property
    def data_arrived(self) -> trio.Event:
        """Set when any partition's readable data grows; replaced by a fresh Event each time."""
        ...

    async def batches_bytes(self, entries: Sequence[E]) -> list[Buffer]:
        """The entries' bytes; raises PartitionReadError when they cannot be read."""
        ...

    def on_bytes_out(self, topic: str, nbytes: int) -> None: ...


class FetchQuota(Protocol):
    """A client's consumer byte-rate quota, as a Fetch sees it (`proxy_broker.quotas`)."""

    def max_bytes(self, requested: int) -> int: ...

    def throttle_ms(self, response_bytes: int) -> int:
        """Records a response of this size: > 0 throttles it (and takes the record back)."""
        ...


def leader_epoch_error(leader_epoch: int, requested: int) -> ErrorCode | None:
    """The error for a request naming `requested` as the current leader epoch, if any."""
    if requested < 0 or requested == leader_epoch:
        return None
    if requested < leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


@dataclass(slots=True)
class _Want(Generic[E]):
    topic: str
    topic_id: bytes
    result: FetchPartitionResult
    partition: FetchPartition[E] | None
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    # The high watermark (or LSO) the first selection saw: what a partition still catching up
    # to it (see _catching_up) is waited for, never a later one, so a busy one cannot hold
    # the answer until max_wait.
    target: int = -1


def _catching_up(part: FetchPartition[Any], want: _Want[Any], budget: int, taken: int) -> bool:
    """A store may say it cannot serve yet all it reports (a zone proxy's mirror: the main
    published the high watermark before the proxy's WAL tail read the batches below it),
    through an optional ``readable_end``. Such a partition, with room left in its budget,
    is waited for within max_wait even once min_bytes are met: a Kafka leader holds all it
    reports and would have sent it, and clients (kafka-python's poll) return what the first
    answer holds."""
    readable_end: int | None = getattr(part, "readable_end", None)
    if readable_end is None or want.fetch_offset >= want.target:
        return False
    return readable_end < want.target and taken < budget


_TopicWants = tuple[str, bytes, list[_Want[E]]]


def _parse_wants(
    source: FetchSource[E],
    req: Any,
    version: int,
    authorized: Callable[[str], bool] | None = None,
) -> list[_TopicWants[E]]:
    topics: list[_TopicWants[E]] = []
    for topic in req.topics:
        if version >= TOPIC_IDS_VERSION:
            # kio reads the zero UUID as None: no topic has it (UNKNOWN_TOPIC_ID).
            topic_id = topic.topic_id.bytes if topic.topic_id is not None else NO_TOPIC_ID
            state = source.topic_by_id(topic_id)
            name = state.name if state else ""
        else:
            name = topic.topic
            state = source.topic_by_name(name)
            topic_id = state.topic_id if state else NO_TOPIC_ID
        partitions = state.partitions if state else ()
        # Checked before existence, as Kafka does: a denied name says nothing of its topic.
        denied = authorized is not None and bool(name) and not authorized(name)
        wants: list[_Want[E]] = []
        for p in topic.partitions:
            part = partitions[p.partition] if 0 <= p.partition < len(partitions) else None
            result = FetchPartitionResult(index=p.partition)
            if denied:
                part = None
                result.error_code = ErrorCode.topic_authorization_failed
            elif part is not None and not part.owned:
                part = None
                result.error_code = ErrorCode.not_leader_or_follower
            elif part is None:
                result.error_code = (
                    ErrorCode.unknown_topic_id
                    if version >= TOPIC_IDS_VERSION and state is None
                    else ErrorCode.unknown_topic_or_partition
                )
            wants.append(
                _Want(
                    name,
                    topic_id,
                    result,
                    part,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    getattr(p, "current_leader_epoch", -1),
                )
            )
        topics.append((name, topic_id, wants))
    return topics


def _select(
    wants: list[_TopicWants[E]], max_bytes: int, read_committed: bool
) -> tuple[int, list[tuple[_Want[E], Sequence[E]]], bool]:
    """Pick batches for every partition; returns (total bytes, selections, whether a
    partition is catching up to what it reports). No I/O."""
    total = 0
    catching_up = False
    chosen: list[tuple[_Want[E], Sequence[E]]] = []
    for _, _, parts in wants:
        for want in parts:
            part = want.partition
            result = want.result
            if part is None:
                continue
            epoch_error = leader_epoch_error(part.leader_epoch, want.current_leader_epoch)
            result.high_watermark = part.high_watermark
            result.last_stable_offset = part.last_stable_offset
            result.log_start_offset = part.log_start_offset
            result.aborted_transactions = [] if read_committed else None
            if epoch_error is not None:
                result.error_code = epoch_error
                continue
            upper = part.last_stable_offset if read_committed else part.high_watermark
            if want.target < 0:
                want.target = upper
            budget = min(want.partition_max_bytes, max_bytes - total)
            error, entries = part.fetch_slice(
                want.fetch_offset, max(budget, 0), upper, must_return_one=total == 0
            )
            result.error_code = error
            taken = sum(e.size for e in entries)
            if not error and _catching_up(part, want, budget, taken):
                catching_up = True
            if read_committed and entries:
                # Whole batches below the LSO are sent: the aborted transactions among them.
                result.aborted_transactions = part.aborted_transactions(want.fetch_offset, upper)
            if entries:
                chosen.append((want, entries))
                total += taken
    return total, chosen, catching_up


async def serve_fetch(
    source: FetchSource[E],
    version: int,
    correlation_id: int,
    req: Any,
    hints: HintSource | None = None,
    *,
    authorized: Callable[[str], bool] | None = None,
    quota: FetchQuota | None = None,
) -> list[Buffer]:
    """Answer a decoded Fetch request (v4+) with the encoded response pieces.

    Waits until min_bytes are available, an error is to be reported, or max_wait (at most
    MAX_WAIT_CAP_SECONDS) passes. Fetch sessions are not supported: a non-zero session_id gets
    FETCH_SESSION_ID_NOT_FOUND, which makes clients fall back to full fetches. ``hints`` names
    the leader for partitions answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH (KIP-951).
    ``authorized(topic)`` says whether the client may READ a topic; the partitions of one it
    may not are answered TOPIC_AUTHORIZATION_FAILED. ``quota`` is the client's byte-rate
    quota: it caps max_bytes, and a response that puts the client over it is answered empty
    with the throttle time, its records never read (Kafka's throttled fetch response).
    """
    max_wait = min(req.max_wait.total_seconds(), MAX_WAIT_CAP_SECONDS)
    max_bytes = req.max_bytes if getattr(req, "max_bytes", None) is not None else DEFAULT_MAX_BYTES
    if quota is not None:
        max_bytes = quota.max_bytes(max_bytes)
    read_committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
    if getattr(req, "session_id", 0) != 0:
        return encode_fetch_response(
            version,
            correlation_id,
            [],
            error_code=ErrorCode.fetch_session_id_not_found,
            session_id=0,
        )
    wants = _parse_wants(source, req, version, authorized)
    deadline = trio.current_time() + max(max_wait, 0.0)
    while True:
        # Taken before selecting, so data arriving while we select still wakes the wait.
        arrived = source.data_arrived
        total, chosen, catching_up = _select(wants, max_bytes, read_committed)
        any_error = any(w.result.error_code for _, _, parts in wants for w in parts)
        enough = total >= req.min_bytes and not catching_up
        if enough or any_error or trio.current_time() >= deadline:
            break
        with trio.move_on_at(deadline):
            await arrived.wait()
    throttle_ms = 0 if quota is None or not total else quota.throttle_ms(total)
    if throttle_ms > 0:
        return encode_fetch_response(version, correlation_id, [], throttle_ms, session_id=0)
    for want, entries in chosen:
        try:
            records = await source.batches_bytes(entries)
        except PartitionReadError as exc:
            want.result.error_code = exc.error_code
            continue
        want.result.records = records
        source.on_bytes_out(want.topic, sum(len(r) for r in records))
    out_topics = [(name, topic_id, [w.result for w in parts]) for name, topic_id, parts in wants]
    endpoints = fill_fetch_hints(version, out_topics, hints)
    return encode_fetch_response(
        version, correlation_id, out_topics, session_id=0, node_endpoints=endpoints
    )
