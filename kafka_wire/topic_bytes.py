"""Which topic the bytes of a Produce or Fetch frame belong to (per-topic traffic accounting).

A topic's share of a frame is the bytes of its own entry in the frame's topics array (its name
or id, its partitions and their records, its tagged fields). The rest of the frame (the 4-byte
size prefix, the header, the top-level fields, Fetch's forgotten topics) belongs to no entry
and is shared out among the topics in proportion to their entries, rounded to whole bytes by
largest remainder, so that the shares of a frame add up to exactly its size. A frame without
topics is booked whole to the empty topic (docs/formats.md, "Traffic accounting").

The sizes come from whoever reads or writes the frame anyway, so no byte is parsed twice
on the hot path: a Produce request's decoder (`kafka_wire.hot_codecs`) measures each topic
entry and the request processor hands the sizes over with its `Finish` as a `TopicFinish`;
the response encoders measure each topic they write and hand the frame back as `TopicParts`.
Fetch requests, which the brokers decode with kio, are measured by `fetch_request_entries`,
a walk over their fixed-size fields (a few dozen bytes per partition, no records).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final, TypeAlias

from kafka_wire.varint import read_uvarint, skip_tagged_fields_at

__all__ = [
    "NO_TOPIC",
    "TopicBytes",
    "TopicFinish",
    "TopicParts",
    "fetch_request_entries",
    "split_frame",
]

Buffer: TypeAlias = bytes | bytearray | memoryview
#: (topic name, bytes) per topic entry, in frame order.
TopicBytes: TypeAlias = list[tuple[str, int]]

#: The topic of bytes that belong to no topic (a frame without topics, an unknown topic id).
NO_TOPIC: Final = ""

_FETCH_FIRST_FLEXIBLE: Final = 12
_FETCH_TOPIC_IDS: Final = 13

_unpack_i16 = struct.Struct(">h").unpack_from
_unpack_i32 = struct.Struct(">i").unpack_from


class TopicParts(list[Buffer]):
    """A response frame's parts (what a request's `Finish` returns) together with the bytes of
    each topic entry in it; the meter splits the frame's size by them."""

    __slots__ = ("topic_bytes",)

    def __init__(self, parts: Iterable[Buffer], topic_bytes: TopicBytes) -> None:
        super().__init__(parts)
        self.topic_bytes = topic_bytes


class TopicFinish:
    """A started request's `Finish` (`kafka_wire.server_loop`) that also tells how its request
    frame splits by topic: the bytes of each topic entry, as its processor measured them while
    decoding it. Calling it is calling `finish`."""

    __slots__ = ("finish", "request_topics")

    def __init__(
        self,
        finish: Callable[[], Awaitable[Sequence[Buffer] | None]],
        request_topics: TopicBytes,
    ) -> None:
        self.finish = finish
        self.request_topics = request_topics

    def __call__(self) -> Awaitable[Sequence[Buffer] | None]:
        return self.finish()


def split_frame(total: int, entries: Sequence[tuple[str, int]]) -> Sequence[tuple[str, int]]:
    """The `total` bytes of a frame, split among its topic `entries` (topic, entry bytes).

    Each topic gets its entry's bytes plus its share of the bytes outside every entry,
    proportional to its entry; whole bytes left over by rounding down go one each to the
    largest remainders (ties: the earlier entry). The shares sum to exactly `total`. No
    entries: everything goes to `NO_TOPIC`. Raises ValueError when the entries add up to
    more than the frame.
    """
    count = len(entries)
    if count == 0:
        return ((NO_TOPIC, total),)
    if count == 1:
        return ((entries[0][0], total),)
    covered = 0
    for _, size in entries:
        if size < 0:
            raise ValueError(f"negative topic entry size {size}")
        covered += size
    rest = total - covered
    if rest < 0:
        raise ValueError(f"topic entries of {covered} bytes in a frame of {total}")
    weights = [size for _, size in entries]
    if covered == 0:  # not for a well-formed frame (an entry has a name): share evenly
        weights = [1] * count
        covered = count
    shares: list[int] = []
    remainders: list[int] = []
    given = 0
    for weight in weights:
        quotient, remainder = divmod(rest * weight, covered)
        shares.append(quotient)
        remainders.append(remainder)
        given += quotient
    left = rest - given  # fewer than `count`: each remainder is below one byte
    if left:
        # A stable sort, so equal remainders keep frame order even reversed.
        for i in sorted(range(count), key=remainders.__getitem__, reverse=True)[:left]:
            shares[i] += 1
    return [(topic, size + share) for (topic, size), share in zip(entries, shares, strict=True)]


def _check_end(pos: int, end: int) -> None:
    if pos > end:
        raise ValueError(f"topic entry runs past the end of the frame ({pos} > {end})")


def fetch_request_entries(
    version: int, frame: Buffer, offset: int, topic_name: Callable[[bytes], str | None]
) -> TopicBytes:
    """The topic entries of a Fetch request (v4+) whose body starts at `offset`.

    v13+ name topics by id: `topic_name(id)` gives the name, an unknown id books to
    `NO_TOPIC`. Raises ValueError (or IndexError, struct.error) on a malformed frame.
    """
    buf = memoryview(frame)
    end = len(buf)
    flexible = version >= _FETCH_FIRST_FLEXIBLE
    # replica_id (v4-14), max_wait_ms, min_bytes, max_bytes, isolation_level,
    # session_id and session_epoch (v7+)
    pos = offset + (4 if version < 15 else 0) + 13 + (8 if version >= 7 else 0)
    # partition, current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+),
    # log_start_offset (v5+), partition_max_bytes
    fixed = 16 + (4 if version >= 9 else 0) + (4 if flexible else 0) + (8 if version >= 5 else 0)
    out: TopicBytes = []
    if flexible:
        count, pos = read_uvarint(buf, pos, end)
        count -= 1
    else:
        count = _unpack_i32(buf, pos)[0]
        pos += 4
    for _ in range(count):
        start = pos
        if version >= _FETCH_TOPIC_IDS:
            topic_id = bytes(buf[pos : pos + 16])
            pos += 16
            name = topic_name(topic_id) or NO_TOPIC
        elif flexible:
            n, pos = read_uvarint(buf, pos, end)
            if not n:
                raise ValueError("null topic name")
            name = str(buf[pos : pos + n - 1], "utf-8", "replace")
            pos += n - 1
        else:
            n = _unpack_i16(buf, pos)[0]
            if n < 0:
                raise ValueError(f"invalid topic name length {n}")
            name = str(buf[pos + 2 : pos + 2 + n], "utf-8", "replace")
            pos += 2 + n
        if flexible:
            parts, pos = read_uvarint(buf, pos, end)
            for _ in range(parts - 1):
                pos = skip_tagged_fields_at(buf, pos + fixed, end)
            pos = skip_tagged_fields_at(buf, pos, end)
        else:
            parts = _unpack_i32(buf, pos)[0]
            if parts < 0:
                raise ValueError(f"invalid partition array length {parts}")
            pos += 4 + parts * fixed
        _check_end(pos, end)
        out.append((name, pos - start))
    return out
