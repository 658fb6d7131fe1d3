"""The state stream's typed frames (internal_rpc/state_frames.py): golden bytes of a full frame
and a delta, the shapes of the previous release (no `mv`, older rows) still read, strict
decoding that names the field at fault, and a proxy that logs a malformed frame and subscribes
again instead of crashing (docs/formats.md, "State stream")."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from internal_rpc.messages import MalformedMessage, UnsupportedMessageVersion
from internal_rpc.state_frames import (
    ObjectRangeRow,
    ObjectStreamRow,
    PartitionRow,
    StateFrame,
    StateSubscription,
    TopicRow,
)
from proxy_broker import mirror as mirror_module
from proxy_broker.config import MainEndpoint
from proxy_broker.mirror import MainMirror, MirrorCache
from shared_wal import open_wal_fs
from shared_wal.batch_reader import BatchReader

TOPIC_ID = bytes(range(16))
SSO = "data/sso/0000018c0f0070000000000000000001"

FULL = StateFrame(
    wal_end=4096,
    full=True,
    node=1,
    writer="main-1",
    topics=(TopicRow("orders", TOPIC_ID, 2, {"retention.ms": "60000"}, (1, 2)),),
    parts=(PartitionRow("orders", 0, 0, 120, 120, 0, 125),),
    objects=(
        ObjectStreamRow(
            TOPIC_ID, 0, (ObjectRangeRow(0, 100, SSO, 5000, 1700000000000, 4096),), (), 0
        ),
    ),
    links={"proxy-101": 8192},
)
FULL_GOLDEN = (
    "8a"  # fixmap(10)
    "a26d76"
    "01"  # "mv": 1
    "a466756c6c"
    "c3"  # "full": true
    "a46e6f6465"
    "01"  # "node": 1
    "a6777269746572"
    "a66d61696e2d31"  # "writer": "main-1"
    "a777616c5f656e64"
    "cd1000"  # "wal_end": 4096
    "a6746f70696373"
    "81"  # "topics": fixmap(1)
    "a66f7264657273"
    "94"  # "orders": [4 elements]
    "c410000102030405060708090a0b0c0d0e0f"  # topic id (bin 16)
    "02"  # partition count
    "81ac726574656e74696f6e2e6d73a53630303030"  # configs {"retention.ms": "60000"}
    "920102"  # leaders [1, 2]
    "a764656c65746564"
    "90"  # "deleted": []
    "a5706172747391"  # "parts": [1 row]
    "97a66f7264657273"
    "00"  # ["orders", partition 0,
    "00787800"  # leader epoch 0, high watermark 120, last stable 120, log start 0,
    "7d"  # log end 125]
    "a76f626a6563747391"  # "objects": [1 stream]
    "95c410000102030405060708090a0b0c0d0e0f00"  # [topic id, partition 0,
    "9196"
    "0064"  # [[start 0, end 100,
    "d929646174612f73736f2f3030303030313863306630303730303030303030303030303030303030303031"
    "cd1388"  # object key, object size 5000,
    "cf0000018bcfe56800"  # max timestamp 1700000000000,
    "cd1000"  # bytes 4096]],
    "90"  # removed [],
    "00"  # log start 0]
    "a56c696e6b73"
    "81a970726f78792d313031cd2000"  # "links": {"proxy-101": 8192}
)
# A delta: only what changed (two partitions moved, nothing else).
DELTA = StateFrame(
    wal_end=8192,
    parts=(
        PartitionRow("orders", 0, 0, 130, 130, 0, 130),
        PartitionRow("orders", 1, 0, 7, 7, 0, 7),
    ),
)
DELTA_GOLDEN = (
    "83"  # fixmap(3)
    "a26d76"
    "01"  # "mv": 1
    "a777616c5f656e64"
    "cd2000"  # "wal_end": 8192
    "a5706172747392"  # "parts": [2 rows]
    "97a66f72646572730000cc82cc8200cc82"  # ["orders", 0, 0, 130, 130, 0, 130]
    "97a66f7264657273010007070007"  # ["orders", 1, 0, 7, 7, 0, 7]
)

# The same delta in version 2 (what a proxy of this release subscribes to): one-letter keys, and
# rows whose last stable offset and log end equal the high watermark leave them out.
DELTA_V2_GOLDEN = (
    "83"  # fixmap(3)
    "a26d76"
    "02"  # "mv": 2
    "a27765"
    "cd2000"  # "we": 8192
    "a17092"  # "p": [2 rows]
    "95a66f72646572730000cc8200"  # ["orders", 0, 0, 130, 0]
    "95a66f726465727301000700"  # ["orders", 1, 0, 7, 0]
)


def _pack(msg: Any) -> bytes:
    return bytes(msgpack.packb(msg, use_bin_type=True))


def _unpack(data: bytes) -> Any:
    # As internal_rpc/frames.py decodes an RPC frame's body.
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)


@pytest.mark.parametrize(
    ("frame", "version", "golden", "size"),
    [(FULL, 1, FULL_GOLDEN, 243), (DELTA, 1, DELTA_GOLDEN, 54), (DELTA, 2, DELTA_V2_GOLDEN, 39)],
)
def test_golden_frames(frame: StateFrame, version: int, golden: str, size: int) -> None:
    data = _pack(frame.to_wire(version))
    assert data.hex() == golden
    assert len(data) == size
    assert StateFrame.from_wire(_unpack(bytes.fromhex(golden))) == frame


def test_a_delta_that_only_moves_the_wal_end() -> None:
    data = _pack(StateFrame(wal_end=100).to_wire(1))
    # {"mv": 1, "wal_end": 100}: 4 bytes more than the previous release's delta.
    assert data.hex() == "82a26d7601a777616c5f656e6464"
    assert _pack(StateFrame(wal_end=100).to_wire(2)).hex() == "82a26d7602a2776564"
    links = StateFrame(wal_end=100, links={}).to_wire(1)
    assert links == {"mv": 1, "wal_end": 100, "links": {}}  # an empty floor still goes out


def test_every_frame_survives_version_2() -> None:
    """Rows with an open transaction or uncommitted records keep all seven fields."""
    open_txn = PartitionRow("orders", 2, 3, 50, 40, 10, 55)
    frame = StateFrame(wal_end=9, parts=(*DELTA.parts, open_txn))
    wire = frame.to_wire(2)
    assert [len(row) for row in wire["p"]] == [5, 5, 7]
    for version in (1, 2):
        assert StateFrame.from_wire(_unpack(_pack(frame.to_wire(version)))) == frame
        assert StateFrame.from_wire(_unpack(_pack(FULL.to_wire(version)))) == FULL


@pytest.mark.parametrize(
    ("params", "frames"),
    [({}, 1), ({"mv": 1, "frames": 1}, 1), ({"mv": 1, "frames": 2}, 2), ({"frames": 9}, 2)],
)
def test_a_subscriber_gets_the_frames_it_asked_for(params: dict[str, Any], frames: int) -> None:
    """`{}` is what a proxy of an earlier release sends; a later proxy gets this main's newest."""
    assert StateSubscription.from_wire(params).frames == frames


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"frames": 0}, "at least 1"),
        ({"frames": "2"}, r"state subscription\.frames must be an integer"),
        ({"mv": 2, "frames": 2}, "state subscription version 2"),
        ([], "must be a map"),
    ],
)
def test_a_malformed_subscription_is_refused(params: Any, match: str) -> None:
    with pytest.raises(MalformedMessage, match=match):
        StateSubscription.from_wire(params)


def test_version_2_rows_are_checked_by_name() -> None:
    bad = {"mv": 2, "we": 1, "p": [["orders", 0, 0, "130", 0]]}
    with pytest.raises(MalformedMessage, match=r"state\.p\[0\]\.high_watermark"):
        StateFrame.from_wire(bad)
    with pytest.raises(MalformedMessage, match=r"state\.p\[0\] must have 5 or 7"):
        StateFrame.from_wire({"mv": 2, "we": 1, "p": [["orders", 0, 0, 1, 0, 0]]})
    with pytest.raises(MalformedMessage, match=r"state\.we is missing"):
        StateFrame.from_wire({"mv": 2, "wal_end": 1})


def test_previous_release_frames_still_decode() -> None:
    """The frames a main of the previous release sent: this shape without `mv`, as its
    state_stream._frame built them (lists), byte for byte."""
    full = {
        "full": True,
        "node": 1,
        "writer": "main-1",
        "wal_end": 4096,
        "topics": {"orders": [TOPIC_ID, 2, {"retention.ms": "60000"}, [1, 2]]},
        "deleted": [],
        "parts": [["orders", 0, 0, 120, 120, 0, 125]],
        "objects": [[TOPIC_ID, 0, [[0, 100, SSO, 5000, 1700000000000, 4096]], [], 0]],
        "links": {"proxy-101": 8192},
    }
    old_bytes = _pack(full)
    # Only `mv` (first, 4 bytes) was added: a previous-release proxy reads the new frames.
    assert "8a" + "a26d7601" + old_bytes.hex()[2:] == FULL_GOLDEN
    assert StateFrame.from_wire(_unpack(old_bytes)) == FULL
    delta = {
        "wal_end": 8192,
        "parts": [["orders", 0, 0, 130, 130, 0, 130], ["orders", 1, 0, 7, 7, 0, 7]],
    }
    assert StateFrame.from_wire(_unpack(_pack(delta))) == DELTA


def test_older_rows_still_decode() -> None:
    """A topic entry without leaders (a main that led all its partitions), a manifest row
    without the log start and a range without its bytes; a full frame without `deleted`,
    `objects` or `links` (the last: a main that sends none blocks the proxy's trim)."""
    msg = {
        "full": True,
        "node": 1,
        "writer": "main-1",
        "wal_end": 0,
        "topics": {"t": [TOPIC_ID, 3, {}]},
        "parts": [],
    }
    frame = StateFrame.from_wire(_unpack(_pack(msg)))
    assert frame.topics == (TopicRow("t", TOPIC_ID, 3, {}, None),)
    assert (frame.deleted, frame.objects, frame.links) == ((), (), None)
    # Re-encoded, the entry keeps its 3 elements.
    assert frame.to_wire()["topics"] == {"t": [TOPIC_ID, 3, {}]}
    row = [TOPIC_ID, 0, [[0, 100, SSO, 5000, 1700]], []]
    delta = StateFrame.from_wire({"wal_end": 1, "objects": [row]})
    (stream,) = delta.objects
    assert stream.log_start is None and stream.added == (ObjectRangeRow(0, 100, SSO, 5000, 1700),)
    assert stream.added[0].nbytes == -1
    assert stream.to_wire() == [TOPIC_ID, 0, ((0, 100, SSO, 5000, 1700, -1),), ()]


def _full() -> dict[str, Any]:
    msg: dict[str, Any] = _unpack(bytes.fromhex(FULL_GOLDEN))
    return msg


def _set(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    msg = _full()
    target: Any = msg
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msg


def _drop(key: str) -> dict[str, Any]:
    msg = _full()
    del msg[key]
    return msg


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ([1, 2], "state must be a map"),
        (_set(("mv",), "1"), "state.mv"),
        (_drop("wal_end"), "state.wal_end"),
        (_set(("wal_end",), -1.5), "state.wal_end"),
        (_set(("full",), 1), "state.full"),
        (_drop("writer"), "state.writer"),
        (_drop("topics"), "state.topics"),
        (_set(("node",), "1"), "state.node"),
        (_set(("topics",), []), "state.topics"),
        (_set(("topics", "orders"), [TOPIC_ID, 2]), "state.topics['orders']"),
        (_set(("topics", "orders", 0), "00"), "state.topics['orders'].topic_id"),
        (_set(("topics", "orders", 1), None), "state.topics['orders'].partition_count"),
        (
            _set(("topics", "orders", 2, "retention.ms"), 60000),
            "['orders'].configs['retention.ms']",
        ),
        (_set(("topics", "orders", 3, 1), "2"), "state.topics['orders'].leaders[1]"),
        (_set(("deleted",), [7]), "state.deleted[0]"),
        (_set(("parts",), {}), "state.parts"),
        (_set(("parts", 0), ["orders", 0, 0, 120, 120, 0]), "state.parts[0]"),
        (_set(("parts", 0, 0), b"orders"), "state.parts[0].topic"),
        (_set(("parts", 0, 3), "120"), "state.parts[0].high_watermark"),
        (_set(("parts", 0, 2), True), "state.parts[0].leader_epoch"),  # a bool is no integer
        (_set(("parts", 0, 6), None), "state.parts[0].log_end_offset"),
        (_set(("objects", 0, 0), "t"), "state.objects[0].topic_id"),
        (_set(("objects", 0, 2, 0), [0, 100, SSO]), "state.objects[0].added[0]"),
        (_set(("objects", 0, 2, 0, 2), 5), "state.objects[0].added[0].key"),
        (_set(("objects", 0, 3), [1]), "state.objects[0].removed[0]"),
        (_set(("objects", 0, 4), "0"), "state.objects[0].log_start"),
        (_set(("links", "proxy-101"), "8192"), "state.links['proxy-101']"),
    ],
)
def test_malformed_frames_name_the_field(msg: Any, field: str) -> None:
    with pytest.raises(MalformedMessage, match=field.replace("[", r"\[").replace("(", r"\(")):
        StateFrame.from_wire(msg)


def test_a_later_version_is_refused() -> None:
    with pytest.raises(UnsupportedMessageVersion, match="state version 3"):
        StateFrame.from_wire(_set(("mv",), 3))


def test_a_full_frame_without_its_node_cannot_be_sent() -> None:
    with pytest.raises(MalformedMessage, match="node and writer"):
        StateFrame(0, full=True, writer="main-1").to_wire()


# -- the proxy's side ---------------------------------------------------------------------------


class FakeRpc:
    """Serves one scripted list of state pushes per subscription; the last one stays open."""

    def __init__(self, streams: list[list[Any]]) -> None:
        self.streams = streams
        self.subscriptions = 0

    @asynccontextmanager
    async def subscribe(self, stream: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        assert stream == "state" and StateSubscription.from_wire(params).frames == 2
        pushes = self.streams[self.subscriptions]
        self.subscriptions += 1

        async def frames() -> AsyncIterator[Any]:
            for push in pushes:
                yield _unpack(_pack(push))
            await trio.sleep_forever()

        yield frames()


def _mirror(rpc: Any) -> MainMirror:
    return MainMirror(
        MainEndpoint(1, "az1", "127.0.0.1", 1, 1),
        rpc,
        BatchReader(open_wal_fs("mem://")),
        MirrorCache(1 << 20),
        "proxy-102",
        lambda segment, position: None,
        lambda: None,
    )


def test_a_malformed_frame_changes_nothing() -> None:
    mirror = _mirror(None)
    mirror.apply_frame(_full())
    before = mirror.topics["orders"].partitions[0].high_watermark
    bad = {"wal_end": 9999, "deleted": ["orders"], "parts": [["orders", 0, 0, 1, 1, 0]]}
    with pytest.raises(MalformedMessage, match=r"state.parts\[0\]"):
        mirror.apply_frame(bad)
    # Decoded whole before anything applied: the topic was not deleted, nothing moved.
    assert mirror.topics["orders"].partitions[0].high_watermark == before == 120
    assert mirror.wal_end == 4096


async def test_a_malformed_frame_is_logged_once_and_the_proxy_resubscribes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(mirror_module, "RESUBSCRIBE_BACKOFF_S", (0.01, 0.01))
    bad = {"wal_end": 5000, "parts": [["orders", 0, 0, "130", 130, 0, 130]]}
    again = _set(("wal_end",), 6000)
    rpc = FakeRpc([[_full(), bad], [again]])
    mirror = _mirror(rpc)
    caplog.set_level(logging.WARNING, logger="zonefleet.proxy.mirror")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mirror._follow_state)
        with trio.fail_after(5):
            while mirror.wal_end != 6000:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    assert rpc.subscriptions == 2 and mirror.connected
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "main 1 sent a malformed state frame "
        "(state.parts[0].high_watermark must be an integer, not str); resubscribing"
    )


def test_the_golden_frames_in_the_docs() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "formats.md").read_text()
    section = doc[doc.index("### State stream") : doc.index("## Cluster metadata document")]
    block = section.split("```")[1]
    assert "".join(block.split()) == FULL_GOLDEN
    delta = section[section.index("(54 bytes):") :].split("`")[1]
    assert "".join(delta.split()) == DELTA_GOLDEN
    delta_v2 = section[section.index("(39 bytes):") :].split("`")[1]
    assert "".join(delta_v2.split()) == DELTA_V2_GOLDEN
