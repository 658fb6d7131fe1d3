"""The I/O shell around `main_broker.appender.Appender`: it submits each decision's WAL intent
and answers once the intent is durable.

`append_partition` runs synchronously, in arrival order (a connection's read loop for a
direct produce, the confirm handler for a zone proxy's): decide, then submit the WAL record.
The record's durability is applied by the WAL writer itself, as the group commit lands
(`LogStore.submit_intent` sets the ticket's `on_durable`): a caller that goes away cannot stop
the high watermark from advancing over data already written, and no task sits between the
group commit and the waiting request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import ProducePartitionResult
from kafka_wire.produce_admission import Refusal
from main_broker.appender import Appended, Decision, Duplicate
from main_broker.partition_log import PartitionLog
from shared_wal import AppendTicket, WalError

if TYPE_CHECKING:
    from main_broker.log_store import LogStore

DUPLICATE_WAIT_SECONDS = 30.0


class Acknowledger(Protocol):
    """Whether a durable append may be acknowledged (`main_broker.cluster.view.ClusterView`
    is one)."""

    def may_acknowledge(self, plog: PartitionLog) -> bool: ...


class AppendHost(Protocol):
    """What appending uses of its broker (`main_broker.broker.MainBroker` is one, through
    `main_broker.api.services.BrokerServices`)."""

    @property
    def store(self) -> LogStore: ...
    @property
    def cluster(self) -> Acknowledger: ...
    @property
    def storage_failed(self) -> bool: ...

    def mark_storage_failed(self, exc: BaseException) -> None: ...


class PendingAppends:
    """The appends of one request that wait for their WAL group commit."""

    __slots__ = ("appends", "duplicates")

    def __init__(self) -> None:
        self.appends: list[tuple[ProducePartitionResult, PartitionLog, AppendTicket]] = []
        self.duplicates: list[tuple[ProducePartitionResult, Duplicate]] = []

    async def wait(self, broker: AppendHost, timeout_s: float) -> None:
        """Wait for durability; appends still pending after the timeout get REQUEST_TIMED_OUT."""
        answered = 0
        with trio.move_on_after(max(timeout_s, 0.0) + DUPLICATE_WAIT_SECONDS):
            for result, plog, ticket in self.appends:
                try:
                    await ticket.wait()
                except WalError as exc:
                    broker.mark_storage_failed(exc)
                    result.error_code = ErrorCode.kafka_storage_error
                    result.error_message = "WAL write failed"
                else:
                    if not broker.cluster.may_acknowledge(plog):
                        # Durable, but another main may already have taken the partition over
                        # from a WAL read before this landed: the client must not count on it.
                        result.error_code = ErrorCode.not_leader_or_follower
                answered += 1
            for _result, duplicate in self.duplicates:
                # A retried duplicate is answered only once its original is durable.
                plog = duplicate.plog
                while plog.high_watermark <= duplicate.last_offset and not broker.storage_failed:
                    await broker.store.data_arrived.wait()
        for result, _plog, _ticket in self.appends[answered:]:
            result.error_code = ErrorCode.request_timed_out
        for result, duplicate in self.duplicates:
            if duplicate.plog.high_watermark <= duplicate.last_offset:
                result.error_code = ErrorCode.request_timed_out


def append_partition(
    broker: AppendHost, decision: Decision, result: ProducePartitionResult, pending: PendingAppends
) -> None:
    """Carry out one decision of the appender: fill `result` and, for an append, submit its
    WAL record (sync, no checkpoint)."""
    if isinstance(decision, Refusal):
        result.error_code = decision.error_code
        result.error_message = decision.message
        if decision.record_errors:
            result.record_errors = list(decision.record_errors)
        return
    result.base_offset = decision.base_offset
    result.log_start_offset = decision.log_start_offset
    if isinstance(decision, Duplicate):
        pending.duplicates.append((result, decision))
        return
    assert isinstance(decision, Appended)
    result.log_append_time_ms = decision.log_append_time_ms
    ticket = broker.store.submit_intent(decision.intent)
    pending.appends.append((result, decision.intent.plog, ticket))
