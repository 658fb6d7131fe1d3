"""serve_fetch over a tiny in-memory FetchSource: long poll, byte limits, errors, topic ids."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as v4
from kio.schema.fetch.v13 import request as v13
from kio.schema.types import TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from kafka_wire.codec import (
    build_request,
    decode_request,
    decode_response,
    encode_request,
    parse_request_header,
)
from kafka_wire.fetch_serving import MAX_WAIT_CAP_SECONDS, serve_fetch
from kafka_wire.record_batch import build_batch
from kafka_wire.server_loop import Buffer
from shared_wal.batch_index import BatchEntry, BatchIndex

API_FETCH = 1


class MemPartition:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.leader_epoch = 0
        self.high_watermark = 0
        self.last_stable_offset = 0
        self.log_start_offset = 0
        self.owned = True
        self.index = BatchIndex()
        self.aborted: list[tuple[int, int, int]] = []  # producer id, first, last offset

    @property
    def next_offset(self) -> int:
        return self.index.end_offset

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return [(pid, first) for pid, first, last in self.aborted if last >= start and first < end]

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> tuple[int, list[BatchEntry]]:
        if offset < self.log_start_offset or offset > self.next_offset:
            return ErrorCode.offset_out_of_range, []
        return ErrorCode.none, self.index.fetch_slice(offset, max_bytes, upper, must_return_one)


class MemTopic:
    def __init__(self, name: str, partitions: int) -> None:
        self.name = name
        self.topic_id = uuid.uuid4().bytes
        self.partitions = [MemPartition(name, p) for p in range(partitions)]


class MemSource:
    def __init__(self, *topics: MemTopic) -> None:
        self.topics = {t.name: t for t in topics}
        self.data_arrived = trio.Event()
        self.bytes_out: dict[str, int] = {}

    def topic_by_name(self, name: str) -> MemTopic | None:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: bytes) -> MemTopic | None:
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)

    async def batches_bytes(self, entries: Sequence[BatchEntry]) -> list[Buffer]:
        assert all(e.data is not None for e in entries)
        return [e.data for e in entries if e.data is not None]

    def on_bytes_out(self, topic: str, nbytes: int) -> None:
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + nbytes

    def append(self, topic: str, partition: int, value_size: int, commit: bool = True) -> bytes:
        """Add a one-record batch; commit moves HW and LSO to it and wakes long polls."""
        part = self.topics[topic].partitions[partition]
        base = part.next_offset
        data = build_batch(
            [(None, bytes([base % 256]) * value_size)], base_offset=base, timestamp_ms=1
        )
        part.index.add(BatchEntry(base, base, 1, len(data), data, None))
        if commit:
            part.high_watermark = part.last_stable_offset = part.next_offset
            self.data_arrived.set()
            self.data_arrived = trio.Event()
        return data


def _ms(seconds: float) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(seconds=seconds))


def _id_of(topic: MemTopic | bytes | str) -> bytes:
    if isinstance(topic, MemTopic):
        return topic.topic_id
    assert isinstance(topic, bytes)
    return topic


def _request(
    version: int,
    topics: list[tuple[MemTopic | bytes | str, list[tuple[int, int, int, int]]]],
    *,
    max_wait: float = 0.0,
    min_bytes: int = 1,
    max_bytes: int = 2**31 - 1,
    isolation_level: int = 0,
    session_id: int = 0,
) -> Any:
    """topics: (topic, or raw id / name for unknown ones, [(partition, offset, partition
    max bytes, current leader epoch)])."""
    if version >= 13:
        return v13.FetchRequest(
            max_wait=_ms(max_wait),
            min_bytes=i32(min_bytes),
            max_bytes=i32(max_bytes),
            isolation_level=i8(isolation_level),
            session_id=i32(session_id),
            topics=tuple(
                v13.FetchTopic(
                    topic_id=uuid.UUID(bytes=_id_of(t)),
                    partitions=tuple(
                        v13.FetchPartition(
                            partition=i32(p),
                            fetch_offset=i64(o),
                            partition_max_bytes=i32(pmb),
                            current_leader_epoch=i32(e),
                        )
                        for p, o, pmb, e in parts
                    ),
                )
                for t, parts in topics
            ),
            forgotten_topics_data=(),
        )
    assert version == 4
    return v4.FetchRequest(
        max_wait=_ms(max_wait),
        min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes),
        isolation_level=i8(isolation_level),
        topics=tuple(
            v4.FetchTopic(
                topic=TopicName(t.name if isinstance(t, MemTopic) else str(t)),
                partitions=tuple(
                    v4.FetchPartition(
                        partition=i32(p), fetch_offset=i64(o), partition_max_bytes=i32(pmb)
                    )
                    for p, o, pmb, _ in parts
                ),
            )
            for t, parts in topics
        ),
    )


async def _fetch(source: MemSource, version: int, req: Any) -> Any:
    pieces = await serve_fetch(source, version, 77, req)
    correlation_id, resp = decode_response(API_FETCH, version, b"".join(pieces))
    assert correlation_id == 77
    return resp


def _parts(resp: Any) -> dict[tuple[Any, int], Any]:
    """{(topic name or id, partition): partition data}."""
    return {
        (t.topic_id if hasattr(t, "topic_id") else t.topic, p.partition_index): p
        for t in resp.responses
        for p in t.partitions
    }


@pytest.mark.parametrize("version", [4, 13])
async def test_serves_batches_and_topic_names_or_ids(version: int) -> None:
    topic = MemTopic("orders", 2)
    source = MemSource(topic)
    b0 = source.append("orders", 0, 10)
    b1 = source.append("orders", 0, 10)
    source.append("orders", 0, 10, commit=False)  # above the HW: never served
    resp = await _fetch(source, version, _request(version, [(topic, [(0, 0, 1 << 20, -1)])]))
    [t] = resp.responses
    if version >= 13:
        assert t.topic_id == uuid.UUID(bytes=topic.topic_id)
    else:
        assert t.topic == "orders"
    [p] = t.partitions
    assert (p.error_code, p.high_watermark, p.last_stable_offset) == (ErrorCode.none, 2, 2)
    assert p.records == b0 + b1
    assert p.aborted_transactions is None
    assert source.bytes_out == {"orders": len(b0) + len(b1)}
    # Fetching from inside the log serves the rest.
    resp = await _fetch(source, version, _request(version, [(topic, [(0, 1, 1 << 20, -1)])]))
    assert _parts(resp)[next(iter(_parts(resp)))].records == b1


async def test_unknown_topics_and_partitions() -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    resp = await _fetch(
        source,
        4,
        _request(4, [("nope", [(0, 0, 100, -1)]), (topic, [(0, 0, 100, -1), (5, 0, 100, -1)])]),
    )
    parts = _parts(resp)
    assert parts[("nope", 0)].error_code == ErrorCode.unknown_topic_or_partition
    assert parts[("t", 5)].error_code == ErrorCode.unknown_topic_or_partition
    assert parts[("t", 0)].error_code == ErrorCode.none
    unknown_id = uuid.uuid4().bytes
    resp = await _fetch(
        source, 13, _request(13, [(unknown_id, [(0, 0, 100, -1)]), (topic, [(3, 0, 100, -1)])])
    )
    parts = _parts(resp)
    assert parts[(uuid.UUID(bytes=unknown_id), 0)].error_code == ErrorCode.unknown_topic_id
    assert parts[(uuid.UUID(bytes=topic.topic_id), 3)].error_code == (
        ErrorCode.unknown_topic_or_partition
    )


async def test_the_zero_topic_id_is_an_unknown_topic_id() -> None:
    # kio reads the zero UUID off the wire as None; Kafka answers UNKNOWN_TOPIC_ID for it.
    data = {"max_wait": 0, "topics": [{"topic_id": None, "partitions": [{"partition": 0}]}]}
    frame = encode_request(API_FETCH, 13, 5, "t", build_request(API_FETCH, 13, data))
    req = decode_request(parse_request_header(frame), frame)
    assert req.topics[0].topic_id is None
    resp = await _fetch(MemSource(MemTopic("t", 1)), 13, req)
    [t] = resp.responses
    assert t.topic_id is None
    assert [p.error_code for p in t.partitions] == [ErrorCode.unknown_topic_id]


async def test_a_partition_led_elsewhere_is_not_served() -> None:
    topic = MemTopic("t", 2)
    topic.partitions[1].owned = False
    resp = await _fetch(
        MemSource(topic), 13, _request(13, [(topic, [(0, 0, 100, -1), (1, 0, 100, -1)])])
    )
    parts = _parts(resp)
    key = uuid.UUID(bytes=topic.topic_id)
    assert parts[(key, 0)].error_code == ErrorCode.none
    assert parts[(key, 1)].error_code == ErrorCode.not_leader_or_follower


async def test_long_poll_wakes_when_data_arrives(autojump_clock: trio.abc.Clock) -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    req = _request(13, [(topic, [(0, 0, 1 << 20, -1)])], max_wait=10, min_bytes=1)
    got: list[Any] = []

    async def consumer() -> None:
        got.append(await _fetch(source, 13, req))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.sleep(2)
        assert not got  # still waiting: nothing to read yet
        data = source.append("t", 0, 20)
    assert trio.current_time() - start == pytest.approx(2)
    [p] = _parts(got[0]).values()
    assert p.records == data


async def test_long_poll_waits_for_min_bytes_then_times_out(autojump_clock: trio.abc.Clock) -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    req = _request(13, [(topic, [(0, 0, 1 << 20, -1)])], max_wait=5, min_bytes=10_000)
    got: list[Any] = []

    async def consumer() -> None:
        got.append(await _fetch(source, 13, req))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.sleep(1)
        data = source.append("t", 0, 20)  # below min_bytes: keeps waiting
        await trio.sleep(1)
        assert not got
    # At max_wait the response carries whatever there is.
    assert trio.current_time() - start == pytest.approx(5)
    [p] = _parts(got[0]).values()
    assert p.records == data


async def test_max_wait_is_capped(autojump_clock: trio.abc.Clock) -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    start = trio.current_time()
    resp = await _fetch(source, 4, _request(4, [(topic, [(0, 0, 100, -1)])], max_wait=600))
    assert trio.current_time() - start == pytest.approx(MAX_WAIT_CAP_SECONDS)
    [p] = _parts(resp).values()
    assert (p.error_code, p.records) == (ErrorCode.none, b"")


async def test_kip74_first_batch_exceeds_max_bytes() -> None:
    topic = MemTopic("t", 2)
    source = MemSource(topic)
    big = source.append("t", 0, 500)
    source.append("t", 0, 10)
    source.append("t", 1, 10)
    req = _request(13, [(topic, [(0, 0, 1 << 20, -1), (1, 0, 1 << 20, -1)])], max_bytes=100)
    parts = _parts(await _fetch(source, 13, req))
    tid = uuid.UUID(bytes=topic.topic_id)
    # The first partition with data gets its first batch even over max_bytes; nothing else fits.
    assert parts[(tid, 0)].records == big
    assert parts[(tid, 1)].records in (b"", None)
    assert parts[(tid, 1)].error_code == ErrorCode.none


async def test_partition_max_bytes_limits_each_partition() -> None:
    topic = MemTopic("t", 2)
    source = MemSource(topic)
    a = [source.append("t", 0, 100) for _ in range(3)]
    b = [source.append("t", 1, 100) for _ in range(3)]
    per_partition = len(a[0]) + len(a[1]) + 10  # two batches and a bit
    req = _request(13, [(topic, [(0, 0, per_partition, -1), (1, 0, per_partition, -1)])])
    parts = _parts(await _fetch(source, 13, req))
    tid = uuid.UUID(bytes=topic.topic_id)
    assert parts[(tid, 0)].records == a[0] + a[1]
    assert parts[(tid, 1)].records == b[0] + b[1]
    # Below one batch: the first partition still gets one (KIP-74), the next one gets none.
    req = _request(13, [(topic, [(0, 0, 10, -1), (1, 0, 10, -1)])])
    parts = _parts(await _fetch(source, 13, req))
    assert parts[(tid, 0)].records == a[0]
    assert parts[(tid, 1)].records in (b"", None)
    # max_bytes caps the sum across partitions.
    req = _request(
        13,
        [(topic, [(0, 0, 1 << 20, -1), (1, 0, 1 << 20, -1)])],
        max_bytes=len(a[0]) * 3 + len(b[0]) + 5,
    )
    parts = _parts(await _fetch(source, 13, req))
    assert parts[(tid, 0)].records == a[0] + a[1] + a[2]
    assert parts[(tid, 1)].records == b[0]


async def test_offset_out_of_range_answers_without_waiting(autojump_clock: trio.abc.Clock) -> None:
    topic = MemTopic("t", 2)
    source = MemSource(topic)
    source.append("t", 0, 10)
    source.append("t", 0, 10)
    topic.partitions[0].log_start_offset = 1
    start = trio.current_time()
    req = _request(4, [(topic, [(0, 0, 100, -1), (1, 5, 100, -1)])], max_wait=10, min_bytes=1 << 20)
    parts = _parts(await _fetch(source, 4, req))
    assert trio.current_time() == start
    assert parts[("t", 0)].error_code == ErrorCode.offset_out_of_range  # below the log start
    assert parts[("t", 1)].error_code == ErrorCode.offset_out_of_range  # past the log end
    parts = _parts(await _fetch(source, 13, _request(13, [(topic, [(0, 0, 100, -1)])])))
    assert parts[(uuid.UUID(bytes=topic.topic_id), 0)].log_start_offset == 1
    # Fetching exactly at the log end is fine (and empty).
    parts = _parts(await _fetch(source, 4, _request(4, [(topic, [(0, 2, 100, -1)])])))
    assert (parts[("t", 0)].error_code, parts[("t", 0)].records) == (ErrorCode.none, b"")


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (-1, ErrorCode.none),
        (3, ErrorCode.none),
        (2, ErrorCode.fenced_leader_epoch),
        (4, ErrorCode.unknown_leader_epoch),
    ],
)
async def test_current_leader_epoch(requested: int, expected: ErrorCode) -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    data = source.append("t", 0, 10)
    topic.partitions[0].leader_epoch = 3
    req = _request(13, [(topic, [(0, 0, 100, requested)])])
    [p] = _parts(await _fetch(source, 13, req)).values()
    assert p.error_code == expected
    assert p.high_watermark == 1
    assert p.records == (data if expected == ErrorCode.none else b"")


async def test_read_committed_stops_at_the_last_stable_offset() -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    b0 = source.append("t", 0, 10)
    b1 = source.append("t", 0, 10)
    topic.partitions[0].last_stable_offset = 1
    [p] = _parts(
        await _fetch(source, 13, _request(13, [(topic, [(0, 0, 1 << 20, -1)])], isolation_level=1))
    ).values()
    assert (p.high_watermark, p.last_stable_offset, p.records) == (2, 1, b0)
    assert p.aborted_transactions == ()
    [p] = _parts(await _fetch(source, 13, _request(13, [(topic, [(0, 0, 1 << 20, -1)])]))).values()
    assert p.records == b0 + b1


async def test_read_committed_names_the_aborted_transactions_in_range() -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    for _ in range(4):
        source.append("t", 0, 10)
    part = topic.partitions[0]
    part.last_stable_offset = 4
    # (producer 7: offsets 0..1, ABORT at 2), (producer 8: 5.., ABORT at 9): only the first
    # has records below the LSO.
    part.aborted = [(7, 0, 2), (8, 5, 9)]
    committed = _request(13, [(topic, [(0, 0, 1 << 20, -1)])], isolation_level=1)
    [p] = _parts(await _fetch(source, 13, committed)).values()
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(7, 0)]
    # From offset 3 on, producer 7's transaction is over: nothing to name.
    later = _request(13, [(topic, [(0, 3, 1 << 20, -1)])], isolation_level=1)
    [p] = _parts(await _fetch(source, 13, later)).values()
    assert p.aborted_transactions == ()
    # read_uncommitted: no list at all (null on the wire).
    [p] = _parts(await _fetch(source, 13, _request(13, [(topic, [(0, 0, 1 << 20, -1)])]))).values()
    assert p.aborted_transactions is None


async def test_fetch_sessions_are_refused() -> None:
    topic = MemTopic("t", 1)
    source = MemSource(topic)
    source.append("t", 0, 10)
    req = _request(13, [(topic, [(0, 0, 100, -1)])], session_id=42)
    resp = await _fetch(source, 13, req)
    assert (resp.error_code, resp.session_id, resp.responses) == (
        ErrorCode.fetch_session_id_not_found,
        0,
        (),
    )
    assert source.bytes_out == {}


class CatchingUpPartition(MemPartition):
    """A zone proxy's mirror: the main published a high watermark its WAL tail has not
    reached yet (what it can serve ends at `readable_end`)."""

    @property
    def readable_end(self) -> int:
        return self.index.end_offset


async def test_waits_for_a_partition_catching_up_to_its_high_watermark(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Another partition's data meets min_bytes, but one is still catching up to the high
    watermark it reports: the answer waits (within max_wait) for what lies below it, as a
    Kafka leader, which holds it all, would have answered."""
    topic = MemTopic("t", 2)
    topic.partitions[1] = CatchingUpPartition("t", 1)
    source = MemSource(topic)
    first = source.append("t", 0, 20)
    topic.partitions[1].high_watermark = topic.partitions[1].last_stable_offset = 1
    req = _request(13, [(topic, [(0, 0, 1 << 20, -1), (1, 0, 1 << 20, -1)])], max_wait=10)
    got: list[Any] = []

    async def consumer() -> None:
        got.append(await _fetch(source, 13, req))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.sleep(0.05)
        assert not got  # partition 1's data is on its way
        second = source.append("t", 1, 20)
    assert trio.current_time() - start == pytest.approx(0.05)
    parts = {k[1]: v for k, v in _parts(got[0]).items()}
    assert (parts[0].records, parts[1].records) == (first, second)
    # It never waits past max_wait: what is readable by then goes out.
    topic.partitions[1].high_watermark = 5
    req = _request(13, [(topic, [(0, 0, 1 << 20, -1), (1, 1, 1 << 20, -1)])], max_wait=1)
    start = trio.current_time()
    parts = {k[1]: v for k, v in _parts(await _fetch(source, 13, req)).items()}
    assert trio.current_time() - start == pytest.approx(1)
    assert parts[0].records == first and not parts[1].records
