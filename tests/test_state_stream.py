"""The state stream's pacing: an idle stream sends a change at once, a busy one at most one
delta per DELTA_INTERVAL_S carrying everything that changed meanwhile."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from main_broker.state_stream import DELTA_INTERVAL_S, StateWatcher, publish_state


class FakeStore:
    """What publish_state reads of a LogStore: topics, the WAL end, and watchers."""

    def __init__(self) -> None:
        self.topics: dict[str, Any] = {}
        self.wal = SimpleNamespace(end_offset=0)
        self.wal_writer_id = "main-1"
        self.watchers: list[StateWatcher] = []

    def watch(self) -> StateWatcher:
        watcher = StateWatcher()
        self.watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: StateWatcher) -> None:
        self.watchers.remove(watcher)

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
        sent.append((trio.current_time(), frame))

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
        assert sent[1][0] == changed_at and sent[1][1] == {"wal_end": 100}

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
