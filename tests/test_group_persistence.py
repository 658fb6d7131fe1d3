"""Classic group membership on a main's WAL (main_broker.groups.persistence): a coordinator
restarted on the same WAL (replay, or the snapshot once old segments are trimmed) keeps its
groups' generation and members; a member that does not come back expires; a generation that
cannot be written is answered COORDINATOR_NOT_AVAILABLE. Real WAL files, real log store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from main_broker.broker import _OffsetStore
from main_broker.group_config import GroupConfig
from main_broker.groups import admin as group_admin
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.consumer_persistence import WalConsumerGroups
from main_broker.groups.coordinator import GroupCoordinator
from main_broker.groups.persistence import WalMembership
from main_broker.groups.wiring import (
    consumer_groups,
    persist_consumer_groups,
    persist_membership,
    persist_offsets,
)
from main_broker.log_store import LogStore
from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs, storage
from shared_wal import broker_records as wal_records
from tests.test_group_coordinator import join, join_all, join_known, stable_pair, sync

NONE = int(ErrorCode.none)
REBALANCE_IN_PROGRESS = int(ErrorCode.rebalance_in_progress)
UNKNOWN_MEMBER_ID = int(ErrorCode.unknown_member_id)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)
# Kafka's initial rebalance delay (300 ms) lets concurrent joiners land in one generation.
CONFIG = GroupConfig(group_min_session_timeout_ms=100)


class Main:
    def __init__(
        self,
        store: LogStore,
        wal: WalWriter,
        coord: GroupCoordinator,
        consumer: ConsumerCoordinator,
    ) -> None:
        self.store, self.wal, self.coord, self.consumer = store, wal, coord, consumer
        self.membership: WalMembership = coord.membership  # type: ignore[assignment]
        self.consumer_records: WalConsumerGroups = consumer.records  # type: ignore[assignment]
        self.restored = 0
        self.consumer_restored = 0


@asynccontextmanager
async def running_main(
    url: str, config: WalConfig | None = None, groups: GroupConfig = CONFIG
) -> AsyncIterator[Main]:
    """A main's WAL, log store and both group coordinators wired as the broker wires them,
    recovered from whatever the WAL at ``url`` holds; the WAL is closed on exit."""
    fs = open_wal_fs(url)
    holder: list[LogStore] = []
    wal = await WalWriter.open(
        fs, "main-1", config or WalConfig(), snapshot_provider=lambda: holder[0].snapshot()
    )
    store = LogStore(wal, WalReader(fs, "main-1"), 1 << 20, {})
    holder.append(store)
    coord = GroupCoordinator(groups, _OffsetStore(store))
    consumer = consumer_groups(groups, coord, store)
    persist_offsets(coord, store)
    persist_membership(coord, store)
    persist_consumer_groups(consumer, store)
    store.replay(wal.replay())
    main = Main(store, wal, coord, consumer)
    main.restored = main.membership.restore(coord)
    main.consumer_restored = main.consumer_records.restore(consumer)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await nursery.start(main.membership.run)
        await nursery.start(main.consumer_records.run)
        await nursery.start(coord.run)
        await nursery.start(consumer.run)
        try:
            yield main
        finally:
            await wal.aclose()
            nursery.cancel_scope.cancel()


async def _heartbeat(c: GroupCoordinator, member: dict[str, Any], **kw: Any) -> int:
    resp = await c.heartbeat(
        group_id="g",
        generation_id=member["generation_id"],
        member_id=member["member_id"],
        **kw,
    )
    return int(resp["error_code"])


async def _commit(c: GroupCoordinator, member: dict[str, Any], offset: int) -> int:
    resp = await c.commit_offsets(
        group_id="g",
        generation_id=member["generation_id"],
        member_id=member["member_id"],
        group_instance_id=None,
        offsets=[("t", 0, offset, 0, None)],
    )
    return int(resp["topics"][0]["partitions"][0]["error_code"])


def _described(c: GroupCoordinator) -> dict[str, Any]:
    return dict(c.describe_groups(["g"])["groups"][0])


async def test_a_restarted_coordinator_keeps_generation_members_and_assignments(
    tmp_path: Path,
) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        await main.store.create_topic("t", 1, {})
        leader, follower = await stable_pair(main.coord)
        assert await _commit(main.coord, follower, 5) == NONE
        before = _described(main.coord)
    assert before["group_state"] == "Stable"

    async with running_main(url) as main:
        assert main.restored == 1
        c = main.coord
        assert _described(c) == before
        # Members of before carry on with the generation of before: no rebalance.
        assert await _heartbeat(c, leader) == NONE
        assert await _heartbeat(c, follower) == NONE
        assert await _commit(c, follower, 6) == NONE
        assert (
            c.fetch_offsets("g", [("t", [0])])["topics"][0]["partitions"][0]["committed_offset"]
            == 6
        )
        again = await sync(c, follower)  # a follower that asks again gets the same assignment
        assert (again["error_code"], again["assignment"]) == (NONE, b"F")
        # A follower rejoining with the same metadata stays in the same generation.
        client = follower["member_id"].split("-")[0]  # member ids are "<client id>-<uuid>"
        rejoin = await join(c, follower["member_id"], client=client)
        assert (rejoin["error_code"], rejoin["generation_id"]) == (NONE, leader["generation_id"])
        assert _described(c)["group_state"] == "Stable"
        # SyncGroup rules are unchanged: an old generation is refused.
        stale = await sync(c, follower, generation_id=leader["generation_id"] - 1)
        assert stale["error_code"] == int(ErrorCode.illegal_generation)


async def test_the_snapshot_keeps_the_group_once_its_records_are_trimmed(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=2048, max_group_bytes=1024)
    async with running_main(url, config) as main:
        leader, follower = await stable_pair(main.coord)
        # A record of its own that does not fit the first segment: the next one opens with a
        # SNAPSHOT, which must hold the group.
        big = main.wal.submit(RecordType.CONTROL, wal_records.producer_ids_header(0), bytes(3000))
        await big.wait()
        before = _described(main.coord)
    fs = open_wal_fs(url)
    segments = storage.list_segment_ids(fs, "main-1")
    assert len(segments) == 2
    fs.remove(storage.segment_path("main-1", segments[0]))  # as a trim would
    async with running_main(url, config) as main:
        assert main.restored == 1
        assert _described(main.coord) == before
        assert await _heartbeat(main.coord, leader) == NONE
        assert await _heartbeat(main.coord, follower) == NONE


async def test_a_member_that_does_not_come_back_expires_and_the_other_takes_over(
    tmp_path: Path,
) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        a_id = (await join(main.coord, client="a", session_ms=600))["member_id"]
        b_id = (await join(main.coord, client="b", session_ms=600))["member_id"]
        a, b = await join_all(
            main.coord,
            (a_id, {"client": "a", "session_ms": 600}),
            (b_id, {"client": "b", "session_ms": 600}),
        )
        leader, follower = (a, b) if a["leader"] == a["member_id"] else (b, a)
        async with trio.open_nursery() as n:
            n.start_soon(sync, main.coord, follower)
            await trio.sleep(0.01)
            await sync(main.coord, leader, [(a_id, b"A"), (b_id, b"B")])
    generation = a["generation_id"]

    async with running_main(url) as main:
        c = main.coord
        started = trio.current_time()
        # Only A comes back; B's session, which starts at recovery, runs out.
        while (code := await _heartbeat(c, a)) == NONE:
            assert trio.current_time() - started < 5.0, "B never expired"
            await trio.sleep(0.1)
        assert code == REBALANCE_IN_PROGRESS
        assert trio.current_time() - started >= 0.6
        assert await _heartbeat(c, b) == UNKNOWN_MEMBER_ID
        alone = await join(c, a_id, client="a", session_ms=600)
        assert (alone["generation_id"], alone["leader"]) == (generation + 1, a_id)
        assert (await sync(c, alone, [(a_id, b"AB")]))["assignment"] == b"AB"

    async with running_main(url) as main:  # the new generation is what a restart brings back
        desc = _described(main.coord)
        assert [m["member_id"] for m in desc["members"]] == [a_id]
        assert desc["members"][0]["member_assignment"] == b"AB"


async def test_sessions_of_restored_members_run_from_when_the_main_serves(tmp_path: Path) -> None:
    """A main that takes long to open its Kafka port after recovery (under load, seconds)
    renews the restored members' sessions then (GroupCoordinator.renew_sessions), so a
    member is not expired for a silence it could not help."""
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        a_id = (await join(main.coord, client="a", session_ms=600))["member_id"]
        (a,) = await join_all(main.coord, (a_id, {"client": "a", "session_ms": 600}))
        await sync(main.coord, a, [(a_id, b"A")])

    async with running_main(url) as main:
        c = main.coord
        await trio.sleep(0.5)  # the start-up between recovery and the port opening
        c.renew_sessions(trio.current_time())
        await trio.sleep(0.3)  # 0.8 s after recovery, 0.3 s after the port opened
        assert await _heartbeat(c, a) == NONE, "expired for the start-up's silence"


async def test_static_member_restarting_after_the_coordinator_keeps_its_assignment(
    tmp_path: Path,
) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        a, b = await join_all(
            main.coord,
            ("", {"client": "a", "instance": "ia"}),
            ("", {"client": "b", "instance": "ib"}),
        )
        leader, follower = (a, b) if a["leader"] == a["member_id"] else (b, a)
        async with trio.open_nursery() as n:
            n.start_soon(sync, main.coord, follower)
            await trio.sleep(0.01)
            await sync(
                main.coord, leader, [(leader["member_id"], b"L"), (follower["member_id"], b"F")]
            )
    fi, fclient = ("ib", "b") if follower is b else ("ia", "a")
    async with running_main(url) as main:
        assert main.coord.group("g").static_members == {  # type: ignore[union-attr]
            "ia": a["member_id"],
            "ib": b["member_id"],
        }
        # The follower's process restarted too: same instance id, a new member id.
        again = await join(main.coord, instance=fi, client=fclient)
        assert (again["error_code"], again["generation_id"]) == (NONE, a["generation_id"])
        assert (await sync(main.coord, again))["assignment"] == b"F"
        assert await _heartbeat(main.coord, follower, group_instance_id=fi) == int(
            ErrorCode.fenced_instance_id
        )
    async with running_main(url) as main:  # the replacement was recorded too
        assert main.coord.group("g").static_members[fi] == again["member_id"]  # type: ignore[union-attr]


async def test_empty_and_deleted_groups(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        leader, follower = await stable_pair(main.coord)
        await main.coord.leave_group(
            group_id="g", members=[(leader["member_id"], None), (follower["member_id"], None)]
        )
        assert _described(main.coord)["group_state"] == "Empty"
    async with running_main(url) as main:
        g = main.coord.group("g")
        assert g is not None and g.state.value == "Empty"
        assert g.generation == leader["generation_id"] + 1  # Kafka bumps it as the group empties
        resp = await group_admin.delete_groups(main.coord, None, ["g"])
        assert resp["results"][0]["error_code"] == NONE
    async with running_main(url) as main:
        assert main.restored == 0 and main.coord.group("g") is None


async def test_an_empty_group_without_offsets_expires_after_a_restart_too(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        leader, follower = await stable_pair(main.coord)
        for member in (leader, follower):
            await main.coord.leave_group(group_id="g", members=[(member["member_id"], None)])
    short = GroupConfig(group_min_session_timeout_ms=100, empty_group_retention_ms=300)
    async with running_main(url, groups=short) as main:
        assert main.restored == 1
        await trio.sleep(0.6)
        assert main.coord.group("g") is None  # forgotten, and recorded as gone
    async with running_main(url) as main:
        assert main.restored == 0 and main.coord.group("g") is None


async def test_sync_answers_coordinator_not_available_when_the_wal_fails(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url) as main:
        await main.store.create_topic("t", 1, {})
        c = main.coord
        first = await join_known(c, "a")
        assert (await sync(c, first, [(first["member_id"], b"A")]))["assignment"] == b"A"
        assert await _commit(c, first, 9) == NONE
        b_id = (await join(c, client="b"))["member_id"]
        a, b = await join_all(c, (first["member_id"], {"client": "a"}), (b_id, {"client": "b"}))
        assert a["leader"] == a["member_id"] and a["generation_id"] == 2
        await main.wal.aclose()  # every WAL write fails from here on
        results: dict[str, dict[str, Any]] = {}

        async def follower() -> None:
            results["follower"] = await sync(c, b)

        async with trio.open_nursery() as n:
            n.start_soon(follower)
            await trio.sleep(0.01)
            results["leader"] = await sync(c, a, [(a["member_id"], b"A"), (b_id, b"B")])
        assert results["leader"]["error_code"] == COORDINATOR_NOT_AVAILABLE
        assert results["follower"]["error_code"] == COORDINATOR_NOT_AVAILABLE
        assert _described(c)["group_state"] == "PreparingRebalance"
        # The offsets, durable by their own record, are untouched.
        assert (
            c.fetch_offsets("g", [("t", [0])])["topics"][0]["partitions"][0]["committed_offset"]
            == 9
        )


def test_an_unreadable_record_is_skipped_alone() -> None:
    """A record of a later version (a downgrade) neither replaces the group's last readable
    one nor stops the rest of a snapshot or replay."""
    membership = WalMembership(None)  # type: ignore[arg-type]  # replay needs no writer
    readable = {"k": "classic_group", "v": 1, "g": "g", "s": "Empty", "gen": 2}
    membership.load(readable)
    membership.load({**readable, "v": 2, "gen": 3})
    membership.load({"k": "classic_group", "v": 1, "g": "h", "s": "Stable", "gen": 1, "m": []})
    assert membership.snapshot() == {"g": readable}
    membership.load({"k": "classic_group", "v": 1, "g": "g", "s": "Dead"})
    assert membership.snapshot() == {}
