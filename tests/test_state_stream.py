"""The state stream's pacing: an idle stream sends a change at once, a busy one at most one
delta per DELTA_INTERVAL_S carrying everything that changed meanwhile. Its object manifest rows:
all of them in the full frame, then only what each commit changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from internal_rpc.state_frames import StateFrame
from main_broker.state_stream import DELTA_INTERVAL_S, StateWatcher, publish_state
from s3_commit.manifest import Manifest, StreamKey, StreamShare, UploadedObject
from s3_commit.manifest_delta import apply_manifest_rows


def _wire(frame: dict[str, Any]) -> dict[str, Any]:
    """The frame as a proxy receives it (msgpack, as the RPC frame carries it), checked as
    the proxy checks it."""
    msg: dict[str, Any] = msgpack.unpackb(
        msgpack.packb(frame, use_bin_type=True), raw=False, strict_map_key=True
    )
    StateFrame.from_wire(msg)
    return msg


class FakeStore:
    """What publish_state reads of a LogStore: topics, the WAL end, and watchers."""

    def __init__(self) -> None:
        self.topics: dict[str, Any] = {}
        self.wal = SimpleNamespace(end_offset=0)
        self.wal_writer_id = "main-1"
        self.watchers: list[StateWatcher] = []
        self.manifest: Manifest | None = None
        self.links_floor: dict[str, int] = {}

    def set_links_floor(self, floors: dict[str, int]) -> None:
        if floors != self.links_floor:
            self.links_floor = floors
            for watcher in self.watchers:
                watcher.mark_links()

    def watch(self) -> StateWatcher:
        watcher = StateWatcher()
        self.watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: StateWatcher) -> None:
        self.watchers.remove(watcher)

    def set_manifest(self, manifest: Manifest) -> None:
        self.manifest = manifest
        for watcher in self.watchers:
            watcher.mark_objects()

    def commit(self, nbytes: int) -> None:
        """A group commit: the WAL end moves and watchers are told."""
        self.wal.end_offset += nbytes
        for watcher in self.watchers:
            watcher.changed.set()


async def test_idle_change_goes_out_at_once_and_busy_ones_are_paced(
    mock_clock: trio.testing.MockClock,
) -> None:
    clock = mock_clock
    store = FakeStore()
    sent: list[tuple[float, dict[str, Any]]] = []

    async def send(frame: dict[str, Any]) -> None:
        sent.append((trio.current_time(), _wire(frame)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_state, store, 1, send)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert len(sent) == 1 and sent[0][1]["full"] is True

        # Idle for a while, then one change: sent with no delay.
        clock.jump(1.0)
        store.commit(100)
        changed_at = trio.current_time()
        await trio.testing.wait_all_tasks_blocked()
        assert len(sent) == 2
        assert sent[1][0] == changed_at and sent[1][1] == {"mv": 1, "wal_end": 100}

        # Busy: a commit every millisecond for 50 ms.
        for _ in range(50):
            clock.jump(0.001)
            store.commit(10)
            await trio.testing.wait_all_tasks_blocked()
        clock.jump(DELTA_INTERVAL_S)
        await trio.testing.wait_all_tasks_blocked()
        busy = sent[2:]
        times = [t for t, _ in busy]
        gaps = [b - a for a, b in zip([sent[1][0], *times], times, strict=False)]
        assert all(gap >= DELTA_INTERVAL_S - 1e-9 for gap in gaps), gaps
        assert len(busy) <= 50 * 0.001 / DELTA_INTERVAL_S + 1
        # Nothing is lost by coalescing: the last delta carries the final WAL end.
        assert busy[-1][1]["wal_end"] == store.wal.end_offset == 600
        nursery.cancel_scope.cancel()


async def test_links_floors_go_in_full_frames_and_in_deltas_only_when_they_change(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    store.links_floor = {"proxy-101": 4096}
    sent: list[dict[str, Any]] = []

    async def send(frame: dict[str, Any]) -> None:
        sent.append(_wire(frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_state, store, 1, send)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert sent[0]["links"] == {"proxy-101": 4096}

        mock_clock.jump(DELTA_INTERVAL_S)
        store.commit(100)  # no floor moved: the delta carries none
        await trio.testing.wait_all_tasks_blocked()
        assert sent[1] == {"mv": 1, "wal_end": 100}

        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_links_floor({"proxy-101": 4096, "proxy-102": 0})
        await trio.testing.wait_all_tasks_blocked()
        assert sent[2] == {"mv": 1, "wal_end": 100, "links": {"proxy-101": 4096, "proxy-102": 0}}

        # Everything uploaded: an empty map still goes out (no writer needed any more).
        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_links_floor({})
        await trio.testing.wait_all_tasks_blocked()
        assert sent[3] == {"mv": 1, "wal_end": 100, "links": {}}
        nursery.cancel_scope.cancel()


TOPIC_A, TOPIC_B = bytes(range(16)), bytes(range(16, 32))
SSO_1 = "data/sso/0000018c0f0070000000000000000001"
SSO_2 = "data/sso/0000018c0f0070000000000000000002"


def _upload(manifest: Manifest, key: str, shares: list[tuple[bytes, int, int, int]]) -> Manifest:
    shared = tuple(StreamShare(StreamKey(t, p), "t", s, e, 1700) for t, p, s, e in shares)
    return manifest.with_upload([UploadedObject(key, 5000, shared)])


async def test_full_frame_carries_the_manifest_and_deltas_only_what_a_commit_changed(
    mock_clock: trio.testing.MockClock,
) -> None:
    store = FakeStore()
    first = _upload(Manifest(1), SSO_1, [(TOPIC_A, 0, 0, 100), (TOPIC_B, 3, 10, 12)])
    store.manifest = first
    sent: list[dict[str, Any]] = []

    async def send(frame: dict[str, Any]) -> None:
        sent.append(_wire(frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_state, store, 1, send)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        (full,) = sent
        # Golden: one row per stream, in stream key order, every range, nothing removed.
        assert full["objects"] == [
            [TOPIC_A, 0, [[0, 100, SSO_1, 5000, 1700, -1]], [], 0],
            [TOPIC_B, 3, [[10, 12, SSO_1, 5000, 1700, -1]], [], 0],
        ]
        watcher = store.watchers[0]
        assert watcher.sent_manifest_version == first.version

        # The next upload touches partition A/0 only: the delta names that range alone.
        second = _upload(first, SSO_2, [(TOPIC_A, 0, 100, 250)])
        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_manifest(second)
        await trio.testing.wait_all_tasks_blocked()
        assert sent[1] == {
            "mv": 1,
            "wal_end": 0,
            "objects": [[TOPIC_A, 0, [[100, 250, SSO_2, 5000, 1700, -1]], [], 0]],
        }
        assert watcher.sent_manifest_version == second.version

        # Removing an object removes its ranges from every stream that had one.
        third = second.without_objects([SSO_1])
        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_manifest(third)
        await trio.testing.wait_all_tasks_blocked()
        assert sent[2]["objects"] == [[TOPIC_A, 0, [], [SSO_1], 0], [TOPIC_B, 3, [], [SSO_1], -1]]

        # Retention: A/0's log start passes its last range (the stream stays, empty); then
        # topic A is deleted (-1: the stream is gone).
        fourth = third.with_log_start(StreamKey(TOPIC_A, 0), 250)
        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_manifest(fourth)
        await trio.testing.wait_all_tasks_blocked()
        assert sent[3]["objects"] == [[TOPIC_A, 0, [], [SSO_2], 250]]
        mirror = Manifest(1)
        for frame in sent:
            mirror = apply_manifest_rows(mirror, frame["objects"])
        # A proxy following the rows has the main's manifest (topic names aside).
        assert {k: (s.ranges, s.log_start) for k, s in mirror.streams.items()} == {
            k: (s.ranges, s.log_start) for k, s in fourth.streams.items()
        }
        fifth = fourth.without_streams([StreamKey(TOPIC_A, 0)])
        mock_clock.jump(DELTA_INTERVAL_S)
        store.set_manifest(fifth)
        await trio.testing.wait_all_tasks_blocked()
        assert sent[4]["objects"] == [[TOPIC_A, 0, [], [], -1]]
        assert apply_manifest_rows(mirror, sent[4]["objects"]).streams == {}
        # Rows of a main before the log start existed (4 elements, 5-element ranges) apply.
        old_rows = [[TOPIC_A, 0, [[0, 100, SSO_1, 5000, 1700]], []]]
        (stream,) = apply_manifest_rows(Manifest(1), old_rows).streams.values()
        assert stream.ranges[0].nbytes == -1 and stream.log_start == 0
        nursery.cancel_scope.cancel()


def test_rows_that_would_overlap_are_refused() -> None:
    base = apply_manifest_rows(Manifest(1), [[TOPIC_A, 0, [[0, 100, SSO_1, 5000, -1]], []]])
    try:
        apply_manifest_rows(base, [[TOPIC_A, 0, [[50, 150, SSO_2, 5000, -1]], []]])
    except ValueError as exc:
        assert "overlaps" in str(exc)
    else:
        raise AssertionError("overlapping rows were applied")


@pytest.mark.parametrize("version", [1, 2])
async def test_frames_go_out_in_the_version_the_subscriber_asked_for(version: int) -> None:
    store = FakeStore()
    sent: list[dict[str, Any]] = []

    async def send(frame: dict[str, Any]) -> None:
        sent.append(_wire(frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_state, store, 1, send, version)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        store.commit(100)  # an idle stream sends the change at once
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    key = "we" if version == 2 else "wal_end"
    assert [frame["mv"] for frame in sent] == [version, version]
    assert sent[1] == {"mv": version, key: 100}
    assert [StateFrame.from_wire(frame).wal_end for frame in sent] == [0, 100]
