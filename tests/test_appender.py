"""The sans-I/O appender, driven directly: admission, validation, dedup, offsets and the WAL
intent it emits, and property tests of the idempotent producer's sequence and epoch rules."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from internal_rpc.messages import BatchSummary
from kafka_wire.produce_admission import Refusal
from kafka_wire.record_batch import COMPRESSION_ZSTD, build_batch, parse_batch_header
from main_broker.appender import Appended, Appender, Decision, Duplicate
from main_broker.partition_log import PartitionLog
from main_broker.topic_config import EffectiveTopicConfig
from shared_wal import WalPosition

NOW = 1_764_201_600_000
PREPARED = WalPosition("proxy-102", 3, 4096, 0)


@dataclass
class Node:
    """The broker facts the appender asks for, set by each test."""

    logs: dict[tuple[str, int], PartitionLog] = field(default_factory=dict)
    leads: bool = True
    storage_failure: str | None = None
    wal_full: bool = False

    def appender(self) -> Appender:
        return Appender(
            lambda t, p: self.logs.get((t, p)),
            lambda plog: self.leads,
            lambda: self.storage_failure,
            lambda: self.wal_full,
        )

    def topic(self, name: str = "t", **configs: str) -> PartitionLog:
        effective = EffectiveTopicConfig.from_explicit(configs, {})
        plog = self.logs[(name, 0)] = PartitionLog(name, 0, b"\x01" * 16, effective)
        return plog


def _records(
    count: int = 1,
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    keyed: bool = True,
    ts: int = NOW,
    compression: int = 0,
) -> memoryview:
    records = [(b"k%d" % i if keyed else None, b"v%d" % i) for i in range(count)]
    batch = build_batch(
        records,
        timestamp_ms=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        compression=compression,
    )
    return memoryview(bytearray(batch))


def _direct(appender: Appender, records: memoryview, api_version: int = 9) -> Decision:
    return appender.decide(
        "t", 0, acks=-1, records_size=len(records), now_ms=NOW, api_version=api_version,
        records=records,
    )  # fmt: skip


def _confirmed(appender: Appender, records: memoryview, api_version: int = 9) -> Decision:
    """What the main decides for a proxy's confirm: the header summary, no bytes."""
    summary = BatchSummary.of(parse_batch_header(records))
    return appender.decide(
        "t",
        0,
        acks=-1,
        records_size=len(records),
        now_ms=NOW,
        api_version=api_version,
        batch=summary.batch_info(),
        prepared=PREPARED,
    )


def test_a_direct_batch_gets_offsets_in_its_bytes_and_a_data_intent() -> None:
    node = Node()
    plog = node.topic()
    appender = node.appender()
    first, second = _records(3), _records(2)
    a, b = _direct(appender, first), _direct(appender, second)
    assert isinstance(a, Appended) and isinstance(b, Appended)
    assert (a.base_offset, b.base_offset, plog.next_offset) == (0, 3, 5)
    assert a.intent.prepared is None and a.intent.entry.data is not None
    assert parse_batch_header(second).base_offset == 3  # patched in place
    assert a.log_append_time_ms == -1 and a.intent.producer is None
    assert plog.high_watermark == 0  # nothing is durable until the shell says so


def test_a_confirmed_batch_is_decided_without_its_bytes_and_linked() -> None:
    node = Node()
    plog = node.topic("t", **{"message.timestamp.type": "LogAppendTime"})
    appender = node.appender()
    records = _records(4, pid=9, epoch=0, seq=0, ts=NOW - 10**9)
    decision = _confirmed(appender, records)
    assert isinstance(decision, Appended)
    entry = decision.intent.entry
    assert decision.intent.prepared == PREPARED and entry.data is None
    assert (entry.base_offset, entry.last_offset, entry.size) == (0, 3, len(records))
    assert entry.max_timestamp == NOW == decision.log_append_time_ms
    assert decision.intent.producer == (9, 0, 0, 3, NOW)
    assert parse_batch_header(records).base_offset == 0  # the proxy's bytes are untouched
    assert plog.next_offset == 4


@pytest.mark.parametrize("decide", [_direct, _confirmed])
def test_limits_apply_to_both_paths(decide: object) -> None:
    node = Node()
    node.topic("t", **{"max.message.bytes": "200", "message.timestamp.before.max.ms": "60000"})
    appender = node.appender()

    def code(records: memoryview, api_version: int = 9) -> ErrorCode:
        decision = decide(appender, records, api_version)  # type: ignore[operator]
        assert isinstance(decision, Refusal), decision
        return decision.error_code

    assert code(_records(40)) == ErrorCode.message_too_large
    assert code(_records(1, ts=NOW - 3_600_000)) == ErrorCode.invalid_timestamp
    zstd = _records(1, compression=COMPRESSION_ZSTD)
    assert code(zstd, api_version=6) == ErrorCode.unsupported_compression_type


def test_a_compacted_topic_needs_the_records_and_refuses_keyless_ones() -> None:
    node = Node()
    node.topic("t", **{"cleanup.policy": "compact"})
    appender = node.appender()
    keyless = _records(3, keyed=False)
    with pytest.raises(ValueError, match="keyless"):
        _confirmed(appender, keyless)
    decision = _direct(appender, keyless)
    assert isinstance(decision, Refusal)
    assert decision.error_code == ErrorCode.invalid_record
    assert [index for index, _ in decision.record_errors] == [0, 1, 2]
    assert isinstance(_direct(appender, _records(2)), Appended)


def test_admission_is_one_rule_with_kafkas_order() -> None:
    node = Node()
    node.topic()
    appender = node.appender()

    def refused(topic: str = "t", acks: int = -1, size: int | None = 10, **kw: object) -> object:
        admitted = appender.admit(topic, 0, acks=acks, records_size=size, confirmed=False, **kw)  # type: ignore[arg-type]
        return admitted.error_code if isinstance(admitted, Refusal) else None

    assert refused() is None
    assert refused(acks=2) == ErrorCode.invalid_required_acks
    assert refused("other") == ErrorCode.unknown_topic_or_partition
    # A proxy believed this main leads it: it learns otherwise and refreshes its view.
    confirmed = appender.admit("other", 0, acks=-1, records_size=10, confirmed=True)
    assert isinstance(confirmed, Refusal)
    assert confirmed.error_code == ErrorCode.not_leader_or_follower
    assert refused(size=0) == ErrorCode.invalid_record
    node.wal_full = True
    assert refused() == ErrorCode.kafka_storage_error
    node.storage_failure = "fsync failed"
    assert refused() == ErrorCode.kafka_storage_error
    node.leads = False
    assert refused() == ErrorCode.not_leader_or_follower
    assert refused(acks=5) == ErrorCode.invalid_required_acks


def test_a_transactional_batch_opens_a_transaction_that_holds_back_the_last_stable_offset() -> None:
    node = Node()
    plog = node.topic()
    records = _records(1, pid=3, epoch=0, seq=0)
    info = parse_batch_header(records)
    info.attributes |= 0x10
    # Until its coordinator added the partition to the transaction, the batch is refused.
    refused_first = node.appender().decide(
        "t", 0, acks=-1, records_size=len(records), now_ms=NOW, api_version=9, batch=info,
        prepared=PREPARED,
    )  # fmt: skip
    assert isinstance(refused_first, Refusal)
    assert refused_first.error_code == ErrorCode.invalid_txn_state
    plog.txns.allow(3, 0)
    decision = node.appender().decide(
        "t", 0, acks=-1, records_size=len(records), now_ms=NOW, api_version=9, batch=info,
        prepared=PREPARED,
    )  # fmt: skip
    assert isinstance(decision, Appended)
    assert decision.intent.transactional
    plog.mark_durable(decision.intent.entry, PREPARED)
    assert plog.high_watermark == 1
    assert plog.last_stable_offset == 0
    # The producer's plain batch is refused while its transaction is open.
    plain = _records(1, pid=3, epoch=0, seq=1)
    refused = node.appender().decide(
        "t", 0, acks=-1, records_size=len(plain), now_ms=NOW, api_version=9,
        records=memoryview(bytearray(plain)),
    )  # fmt: skip
    assert isinstance(refused, Refusal)
    assert refused.error_code == ErrorCode.invalid_txn_state


# -- the idempotent producer's rules, as properties --------------------------------------------

Batch = tuple[int, int, int]  # epoch, first sequence, record count

batches = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(1, 3)),
        st.tuples(st.just(-1), st.integers(0, 30), st.just(0)),  # retry of an earlier batch
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=batches, confirmed=st.booleans())
def test_sequence_and_epoch_rules(ops: list[Batch], confirmed: bool) -> None:
    """Whatever a producer sends: offsets are contiguous; a batch of an older epoch than one
    appended is fenced; an appended batch continues its epoch's sequence (a bumped epoch
    starts at 0); a retry of one of the last five batches of the current epoch is a
    duplicate answered with the original offsets, and never appended twice."""
    node = Node()
    plog = node.topic()
    appender = node.appender()
    decide = _confirmed if confirmed else _direct
    sent: list[tuple[Batch, Decision]] = []
    appended: list[tuple[int, int, int, int]] = []  # epoch, first, last sequence, base offset
    for epoch, first, count in ops:
        if epoch < 0:
            if not sent:
                continue
            (epoch, first, count), _ = sent[first % len(sent)]
        now_epoch = max((a[0] for a in appended), default=None)
        records = _records(count, pid=7, epoch=epoch, seq=first)
        next_offset = plog.next_offset
        decision = decide(appender, records)
        sent.append(((epoch, first, count), decision))
        last = first + count - 1
        recent = [a for a in appended if a[0] == epoch][-5:]
        if now_epoch is not None and epoch < now_epoch:
            assert isinstance(decision, Refusal)
            assert decision.error_code == ErrorCode.invalid_producer_epoch
            continue
        original = [a for a in recent if (a[1], a[2]) == (first, last)]
        if now_epoch is not None and epoch == now_epoch and original:
            assert isinstance(decision, Duplicate), decision
            assert decision.base_offset == original[-1][3]
            assert plog.next_offset == next_offset  # nothing appended
            continue
        if isinstance(decision, Appended):
            assert decision.base_offset == next_offset
            assert plog.next_offset == next_offset + count
            if now_epoch is not None and epoch == now_epoch:
                assert first == appended[-1][2] + 1
            elif now_epoch is not None:
                assert first == 0  # a bumped epoch restarts its sequence
            appended.append((epoch, first, last, decision.base_offset))
        else:
            assert isinstance(decision, Refusal), decision
            assert decision.error_code == ErrorCode.out_of_order_sequence_number
            assert now_epoch is not None  # a producer without state is never out of order
    assert plog.next_offset == sum(a[2] - a[1] + 1 for a in appended)
