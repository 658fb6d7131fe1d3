"""KIP-848 consumer groups on a main's WAL (main_broker.groups.consumer_persistence): a coordinator
restarted on the same WAL (replay, or the snapshot once old segments are trimmed) keeps every
group's epochs, members and partitions, with no restart hold; plain heartbeats write nothing;
a member that does not come back expires one session after recovery; a heartbeat whose record
cannot be written is answered COORDINATOR_NOT_AVAILABLE. Real WAL files, real log store."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from main_broker.group_config import GroupConfig
from main_broker.groups import admin as group_admin
from main_broker.groups.consumer_record import consumer_header
from shared_wal import RecordType, WalConfig, WalReader, open_wal_fs, storage
from shared_wal import broker_records as wal_records
from tests.test_group_deletion import _heartbeat
from tests.test_group_persistence import Main, running_main

NONE = int(ErrorCode.none)
UNKNOWN_MEMBER_ID = int(ErrorCode.unknown_member_id)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)
SESSION_MS = 1_000
CONFIG = GroupConfig(consumer_session_timeout_ms=SESSION_MS, consumer_heartbeat_interval_ms=100)


async def _beat(main: Main, member: str, epoch: int, *topics: str, **kw: Any) -> dict[str, Any]:
    """A heartbeat; once answered, the group's records add up to the group as it is (the
    records hold only the members that changed)."""
    req = _heartbeat("g", member, epoch, list(topics) if topics else None, **kw)
    resp = await main.consumer.heartbeat(req, "client-" + member, "/127.0.0.1")
    group = main.consumer.groups.get("g")
    if group is not None and resp["error_code"] == NONE:
        assert main.consumer_records.durable["g"].header() == consumer_header(group)
    return resp


def _owned(resp: dict[str, Any]) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(topic_id=tp["topic_id"], partitions=tp["partitions"])
        for tp in resp["assignment"]["topic_partitions"]
    ]


def _parts(resp_or_owned: Any) -> set[int]:
    tps = resp_or_owned["assignment"]["topic_partitions"]
    return {p for tp in tps for p in tp["partitions"]}


async def _stable_pair(main: Main) -> tuple[int, int]:
    """Members A and B of group g on topic t (4 partitions), both stable: (their epochs)."""
    await main.store.create_topic("t", 4, {})
    a = await _beat(main, "A", 0, "t")
    assert a["error_code"] == NONE and _parts(a) == {0, 1, 2, 3}
    b = await _beat(main, "B", 0, "t")
    assert b["error_code"] == NONE and b["member_epoch"] == 2
    revoke = await _beat(main, "A", 1)  # told to give two partitions up
    kept = _owned(revoke)
    assert len(_parts(revoke)) == 2
    assert (await _beat(main, "A", 1, topic_partitions=kept))["member_epoch"] == 2
    got = await _beat(main, "B", 2)
    assert _parts(got) == {0, 1, 2, 3} - _parts(revoke)
    assert main.consumer.groups["g"].state == "Stable"
    return 2, 2


def _described(main: Main) -> dict[str, Any]:
    return dict(main.consumer.describe(["g"], False)["groups"][0])


def _consumer_records(url: str) -> list[dict[str, Any]]:
    fs = open_wal_fs(url)
    first = storage.list_segment_ids(fs, "main-1")[0]
    return [
        dict(r.header)
        for r in WalReader(fs, "main-1").iter_records(first)
        if r.type == RecordType.CONTROL and r.header.get("k") == "consumer_group"
    ]


async def test_a_restarted_coordinator_keeps_epochs_members_and_partitions(
    tmp_path: Path,
) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url, groups=CONFIG) as main:
        await _stable_pair(main)
        before = _described(main)
        written = _consumer_records(url)
        assert [r["f"] for r in written] == [True] + [False] * (len(written) - 1)
        # A heartbeat that moved one member on wrote that member only.
        assert all(len(r["m"]) == 1 for r in written[2:])
        for _ in range(3):  # plain heartbeats write nothing
            assert (await _beat(main, "A", 2))["assignment"] is None
            assert (await _beat(main, "B", 2))["assignment"] is None
        assert _consumer_records(url) == written
    assert before["group_state"] == "Stable" and before["group_epoch"] == 2

    async with running_main(url, groups=CONFIG) as main:
        assert main.consumer_restored == 1
        assert _described(main) == before
        # The members of before carry on with their epochs: no reset, no new assignment,
        # and no restart hold (a joiner gets partitions at once).
        for member in ("A", "B"):
            resp = await _beat(main, member, 2)
            assert (resp["error_code"], resp["member_epoch"], resp["assignment"]) == (NONE, 2, None)
        full = await _beat(main, "A", 2, "t", rebalance_timeout=30_000, topic_partitions=[])
        assert full["error_code"] == NONE and full["member_epoch"] == 2
        assert _described(main)["group_epoch"] == 2
        assert _consumer_records(url) == written


async def test_the_snapshot_keeps_the_group_once_its_records_are_trimmed(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=2048, max_group_bytes=1024)
    async with running_main(url, config, groups=CONFIG) as main:
        await _stable_pair(main)
        big = main.wal.submit(RecordType.CONTROL, wal_records.producer_ids_header(0), bytes(3000))
        await big.wait()
        before = _described(main)
    fs = open_wal_fs(url)
    segments = storage.list_segment_ids(fs, "main-1")
    assert len(segments) == 2
    fs.remove(storage.segment_path("main-1", segments[0]))  # as a trim would
    assert _consumer_records(url) == []  # only the snapshot holds the group now
    async with running_main(url, config, groups=CONFIG) as main:
        assert main.consumer_restored == 1
        assert _described(main) == before
        assert (await _beat(main, "A", 2))["error_code"] == NONE


async def test_a_member_that_does_not_come_back_expires_and_the_other_takes_over(
    tmp_path: Path,
) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url, groups=CONFIG) as main:
        await _stable_pair(main)
        a_parts = {m["member_id"]: m for m in _described(main)["members"]}["A"]
    a_had = {p for tp in a_parts["assignment"]["topic_partitions"] for p in tp["partitions"]}

    async with running_main(url, groups=CONFIG) as main:
        started = trio.current_time()
        # Only B comes back; A's session, which starts at recovery, runs out.
        while "A" in main.consumer.groups["g"].members:
            assert (await _beat(main, "B", 2))["error_code"] == NONE
            assert trio.current_time() - started < 5.0, "A never expired"
            await trio.sleep(0.1)
        assert trio.current_time() - started >= SESSION_MS / 1000
        got = await _beat(main, "B", 2)
        assert got["member_epoch"] == 3 and _parts(got) == {0, 1, 2, 3}
        assert (await _beat(main, "A", 2))["error_code"] == UNKNOWN_MEMBER_ID
    assert a_had and a_had < {0, 1, 2, 3}

    async with running_main(url, groups=CONFIG) as main:  # the expiry was recorded too
        members = _described(main)["members"]
        assert [m["member_id"] for m in members] == ["B"]
        assert members[0]["member_epoch"] == 3


async def test_sessions_of_restored_members_run_from_when_the_main_serves(tmp_path: Path) -> None:
    """A main slow to open its Kafka port after recovery renews the restored members'
    sessions then (ConsumerCoordinator.renew_sessions): A is not expired for the silence."""
    url = f"osfs://{tmp_path}"
    async with running_main(url, groups=CONFIG) as main:
        await _stable_pair(main)

    async with running_main(url, groups=CONFIG) as main:
        await trio.sleep(0.8)  # the start-up between recovery and the port opening
        main.consumer.renew_sessions(trio.current_time())
        await trio.sleep(0.5)  # 1.3 s after recovery (session 1 s), 0.5 s after the port
        assert set(main.consumer.groups["g"].members) == {"A", "B"}
        assert (await _beat(main, "A", 2))["error_code"] == NONE


async def test_left_and_deleted_groups(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    async with running_main(url, groups=CONFIG) as main:
        await _stable_pair(main)
        assert (await _beat(main, "A", -1))["member_epoch"] == -1
        assert (await _beat(main, "B", -1))["member_epoch"] == -1
    async with running_main(url, groups=CONFIG) as main:
        g = main.consumer.groups["g"]
        assert g.state == "Empty" and g.group_epoch == 4
        joined = await _beat(main, "C", 0, "t")
        assert joined["member_epoch"] == 5 and _parts(joined) == {0, 1, 2, 3}
        assert (await _beat(main, "C", -1))["member_epoch"] == -1
        resp = await group_admin.delete_groups(main.coord, main.consumer, ["g"])
        assert resp["results"][0]["error_code"] == NONE
    async with running_main(url, groups=CONFIG) as main:
        assert main.consumer_restored == 0 and "g" not in main.consumer.groups


async def test_a_heartbeat_whose_record_cannot_be_written(tmp_path: Path) -> None:
    """The member is not told the assignment: COORDINATOR_NOT_AVAILABLE, as Kafka answers when
    it cannot write the group; a restart brings back the group as last recorded."""
    url = f"osfs://{tmp_path}"
    async with running_main(url, groups=CONFIG) as main:
        await main.store.create_topic("t", 2, {})
        assert (await _beat(main, "A", 0, "t"))["member_epoch"] == 1
        await main.wal.aclose()  # every WAL write fails from here on
        resp = await _beat(main, "B", 0, "t")
        assert resp["error_code"] == COORDINATOR_NOT_AVAILABLE and resp["assignment"] is None
        # B is in the group in memory: A's answer would tell it to revoke, which is not written.
        assert (await _beat(main, "A", 1))["error_code"] == COORDINATOR_NOT_AVAILABLE
    async with running_main(url, groups=CONFIG) as main:
        assert set(main.consumer.groups["g"].members) == {"A"}
        assert main.consumer.groups["g"].group_epoch == 1
