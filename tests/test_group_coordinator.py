"""Classic consumer-group coordinator: rebalances, sessions, static members, offsets, handlers."""

from __future__ import annotations

import datetime
import importlib
import io
import types
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32, i32Timedelta

from kafka_wire.codec import build_response
from main_broker.api import groups as group_handlers
from main_broker.groups.coordinator import CommittedOffset, GroupConfig, GroupCoordinator

E_NONE = int(ErrorCode.none)
E_MEMBER_ID_REQUIRED = int(ErrorCode.member_id_required)
E_ILLEGAL_GENERATION = int(ErrorCode.illegal_generation)
E_UNKNOWN_MEMBER = int(ErrorCode.unknown_member_id)
E_REBALANCE = int(ErrorCode.rebalance_in_progress)
E_FENCED = int(ErrorCode.fenced_instance_id)
E_INCONSISTENT = int(ErrorCode.inconsistent_group_protocol)
E_SESSION_TIMEOUT = int(ErrorCode.invalid_session_timeout)
E_UNKNOWN_TP = int(ErrorCode.unknown_topic_or_partition)
E_METADATA_TOO_LARGE = int(ErrorCode.offset_metadata_too_large)


class FakeStore:
    def __init__(self) -> None:
        self.partitions = {("t", 0), ("t", 1), ("u", 0)}
        self.persisted: list[tuple[str, list[tuple[str, int, int, int, str]]]] = []

    async def persist_offsets(
        self,
        group_id: str,
        offsets: list[tuple[str, int, int, int, str]],
        applied: Callable[[], None],
    ) -> None:
        await trio.sleep(0.001)  # a durable write takes a moment
        self.persisted.append((group_id, list(offsets)))
        applied()

    def partition_exists(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.partitions


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
async def coord(nursery: trio.Nursery, store: FakeStore) -> GroupCoordinator:
    """A running coordinator; tests also take ``autojump_clock`` so that pytest-trio uses it."""
    c = GroupCoordinator(GroupConfig(), store)
    await nursery.start(c.run)
    return c


async def join(
    c: GroupCoordinator,
    member_id: str = "",
    *,
    group: str = "g",
    instance: str | None = None,
    protocols: list[tuple[str, bytes]] | None = None,
    session_ms: int = 10_000,
    rebalance_ms: int = 20_000,
    client: str = "cli",
) -> dict[str, Any]:
    return await c.join_group(
        group_id=group,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=protocols or [("range", f"meta-{client}".encode())],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        client_id=client,
        client_host="/127.0.0.1",
        require_known_member_id=True,
    )


async def join_known(c: GroupCoordinator, client: str, **kw: Any) -> dict[str, Any]:
    """KIP-394 dance: get a member id, then join with it."""
    first = await join(c, client=client, **kw)
    assert first["error_code"] == E_MEMBER_ID_REQUIRED
    assert first["member_id"].startswith(f"{client}-")
    return await join(c, first["member_id"], client=client, **kw)


async def join_all(c: GroupCoordinator, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Run (member_id, kwargs) joins concurrently; results in call order."""
    results: list[dict[str, Any]] = [{} for _ in calls]

    async def one(i: int, member_id: str, kw: dict[str, Any]) -> None:
        results[i] = await join(c, member_id, **kw)

    async with trio.open_nursery() as n:
        for i, (mid, kw) in enumerate(calls):
            n.start_soon(one, i, mid, kw)
    return results


async def sync(c: GroupCoordinator, resp: dict[str, Any], assignments=(), **kw: Any):
    return await c.sync_group(
        group_id=kw.pop("group", "g"),
        generation_id=kw.pop("generation_id", resp["generation_id"]),
        member_id=resp["member_id"],
        assignments=list(assignments),
        **kw,
    )


async def stable_pair(c: GroupCoordinator) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two members A and B in a Stable group; returns their join responses (A is the leader)."""
    a_id = (await join(c, client="a"))["member_id"]
    b_id = (await join(c, client="b"))["member_id"]
    a, b = await join_all(c, (a_id, {"client": "a"}), (b_id, {"client": "b"}))
    leader, follower = (a, b) if a["leader"] == a["member_id"] else (b, a)
    async with trio.open_nursery() as n:
        n.start_soon(sync, c, follower)
        await trio.sleep(0.01)
        plan = [(leader["member_id"], b"L"), (follower["member_id"], b"F")]
        assert (await sync(c, leader, plan))["assignment"] == b"L"
    return leader, follower


async def test_two_members_join_concurrently_one_generation_one_leader(
    autojump_clock: trio.testing.MockClock,
    coord: GroupCoordinator,
) -> None:
    a_id = (await join(coord, client="a"))["member_id"]
    b_id = (await join(coord, client="b"))["member_id"]
    assert a_id != b_id
    start = trio.current_time()
    a, b = await join_all(coord, (a_id, {"client": "a"}), (b_id, {"client": "b"}))
    # A brand-new group waits the initial delay (300 ms) before completing,
    # Both joined at once, so the delay was extended once (Kafka's InitialDelayedJoin).
    assert trio.current_time() - start == pytest.approx(0.6, abs=0.01)
    assert a["error_code"] == b["error_code"] == E_NONE
    assert a["generation_id"] == b["generation_id"] == 1
    assert a["leader"] == b["leader"]
    leader, follower = (a, b) if a["leader"] == a_id else (b, a)
    assert leader["member_id"] == leader["leader"]
    assert a["protocol_name"] == "range" and a["protocol_type"] == "consumer"
    assert {m["member_id"]: m["metadata"] for m in leader["members"]} == {
        a_id: b"meta-a",
        b_id: b"meta-b",
    }
    assert follower["members"] == []
    desc = coord.describe_groups(["g"])["groups"][0]
    assert desc["group_state"] == "CompletingRebalance"


async def test_initial_delay_extends_while_members_arrive(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    a_id = (await join(coord, client="a"))["member_id"]
    b_id = (await join(coord, client="b"))["member_id"]
    results: dict[str, dict[str, Any]] = {}

    async def late_b() -> None:
        await trio.sleep(0.2)
        results["b"] = await join(coord, b_id, client="b")

    start = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(late_b)
        results["a"] = await join(coord, a_id, client="a")
    assert trio.current_time() - start == pytest.approx(0.6, abs=0.01)
    assert results["a"]["generation_id"] == results["b"]["generation_id"] == 1
    assert results["a"]["leader"] == a_id  # the first member to join leads
    assert len(results["a"]["members"]) == 2


async def test_leader_sync_gives_each_member_its_assignment(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    leader, follower = await stable_pair(coord)
    # A follower syncing again once the group is Stable gets its stored assignment directly.
    again = await sync(coord, follower)
    assert again == {
        "error_code": E_NONE,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "assignment": b"F",
    }
    desc = coord.describe_groups(["g"])["groups"][0]
    assert desc["group_state"] == "Stable" and desc["protocol_data"] == "range"
    assert {m["member_id"]: m["member_assignment"] for m in desc["members"]} == {
        leader["member_id"]: b"L",
        follower["member_id"]: b"F",
    }
    hb = await coord.heartbeat(group_id="g", generation_id=1, member_id=follower["member_id"])
    assert hb["error_code"] == E_NONE


async def test_follower_waits_for_leader_then_new_rebalance_cancels_sync(
    autojump_clock: trio.testing.MockClock,
    coord: GroupCoordinator,
) -> None:
    leader, follower = await stable_pair(coord)
    # The follower rejoins with new metadata: rebalance to generation 2.
    f2, l2 = await join_all(
        coord,
        (follower["member_id"], {"client": "b", "protocols": [("range", b"new")]}),
        (leader["member_id"], {"client": "a"}),
    )
    assert f2["generation_id"] == l2["generation_id"] == 2
    got: dict[str, Any] = {}

    async def follower_sync() -> None:
        got["f"] = await sync(coord, f2)

    async with trio.open_nursery() as n:
        n.start_soon(follower_sync)
        await trio.sleep(0.05)
        assert "f" not in got  # still waiting for the leader
        # A third member arrives before the leader syncs: the waiting follower is told to rejoin.
        c_id = (await join(coord, client="c"))["member_id"]
        n.start_soon(join, coord, c_id)
        await trio.sleep(0.05)
        assert got["f"]["error_code"] == E_REBALANCE
        hb = await coord.heartbeat(group_id="g", generation_id=2, member_id=l2["member_id"])
        assert hb["error_code"] == E_REBALANCE
        gen3 = await join_all(coord, (l2["member_id"], {}), (f2["member_id"], {}))
    assert [r["generation_id"] for r in gen3] == [3, 3]
    assert len(gen3[0]["members"]) == 3


async def test_member_leaves_and_other_rejoins_alone_with_everything(
    autojump_clock: trio.testing.MockClock,
    coord: GroupCoordinator,
) -> None:
    leader, follower = await stable_pair(coord)
    resp = await coord.leave_group(group_id="g", members=[(leader["member_id"], None)])
    assert resp["members"][0]["error_code"] == E_NONE
    assert coord.describe_groups(["g"])["groups"][0]["group_state"] == "PreparingRebalance"
    hb = await coord.heartbeat(group_id="g", generation_id=1, member_id=follower["member_id"])
    assert hb["error_code"] == E_REBALANCE
    alone = await join(coord, follower["member_id"], client="b")
    assert alone["generation_id"] == 2
    assert alone["leader"] == follower["member_id"]
    assert [m["member_id"] for m in alone["members"]] == [follower["member_id"]]
    s = await sync(coord, alone, [(follower["member_id"], b"ALL")])
    assert s["assignment"] == b"ALL"
    # The last member leaving empties the group.
    await coord.leave_group(group_id="g", members=[(follower["member_id"], None)])
    assert coord.describe_groups(["g"])["groups"][0]["group_state"] == "Empty"


async def test_session_expiry_evicts_silent_member(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    leader, follower = await stable_pair(coord)
    lid = leader["member_id"]
    # Only the leader heartbeats; the follower's 10 s session runs out.
    for _ in range(4):
        await trio.sleep(3)
        hb = await coord.heartbeat(group_id="g", generation_id=1, member_id=lid)
        if hb["error_code"] != E_NONE:
            break
    assert hb["error_code"] == E_REBALANCE
    members = coord.describe_groups(["g"])["groups"][0]["members"]
    assert [m["member_id"] for m in members] == [lid]
    rejoined = await join(coord, lid, client="a")
    assert rejoined["generation_id"] == 2 and len(rejoined["members"]) == 1
    hb = await coord.heartbeat(group_id="g", generation_id=1, member_id=follower["member_id"])
    assert hb["error_code"] == E_UNKNOWN_MEMBER


async def test_rebalance_timeout_drops_members_that_do_not_rejoin(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    leader, follower = await stable_pair(coord)
    start = trio.current_time()

    async def heartbeat_forever() -> None:
        while True:
            await coord.heartbeat(group_id="g", generation_id=1, member_id=follower["member_id"])
            await trio.sleep(3)

    async with trio.open_nursery() as n:
        n.start_soon(heartbeat_forever)
        resp = await join(coord, leader["member_id"], client="a", protocols=[("range", b"x")])
        n.cancel_scope.cancel()
    # The follower kept its session but never rejoined within the 20 s rebalance timeout.
    assert trio.current_time() - start == pytest.approx(20, abs=0.1)
    assert resp["generation_id"] == 2
    assert [m["member_id"] for m in resp["members"]] == [leader["member_id"]]


async def test_leader_that_never_syncs_is_dropped_after_rebalance_timeout(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    # Sessions outlast the 20 s rebalance timeout, so only the pending-sync timer can act.
    kw_a: dict[str, Any] = {"client": "a", "session_ms": 60_000}
    kw_b: dict[str, Any] = {"client": "b", "session_ms": 60_000}
    a_id = (await join(coord, **kw_a))["member_id"]
    b_id = (await join(coord, **kw_b))["member_id"]
    a, b = await join_all(coord, (a_id, kw_a), (b_id, kw_b))
    follower = b if a["leader"] == a_id else a
    start = trio.current_time()
    waited = await sync(coord, follower)  # the leader never sends its assignment
    assert waited["error_code"] == E_REBALANCE
    assert trio.current_time() - start == pytest.approx(20, abs=0.1)
    members = coord.describe_groups(["g"])["groups"][0]["members"]
    assert [m["member_id"] for m in members] == [follower["member_id"]]
    alone = await join(coord, follower["member_id"], client=follower["member_id"][0])
    assert alone["generation_id"] == 2 and alone["leader"] == follower["member_id"]


async def test_cancelled_join_still_counts_and_member_id_required_expires(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    a_id = (await join(coord, client="a"))["member_id"]
    with trio.move_on_after(0.1):  # the client disconnects while its join is parked
        await join(coord, a_id, client="a")
    await trio.sleep(1)
    desc = coord.describe_groups(["g"])["groups"][0]
    assert desc["group_state"] == "CompletingRebalance" and len(desc["members"]) == 1
    # A member id handed out but never used is forgotten after the session timeout and
    # does not hold up a rebalance for longer than that.
    pending = (await join(coord, client="p"))["member_id"]
    await trio.sleep(11)
    r = await join(coord, pending, client="p")
    assert r["error_code"] == E_UNKNOWN_MEMBER


async def test_error_paths(autojump_clock: trio.testing.MockClock, coord: GroupCoordinator) -> None:
    leader, follower = await stable_pair(coord)
    lid = leader["member_id"]
    hb = await coord.heartbeat(group_id="g", generation_id=7, member_id=lid)
    assert hb["error_code"] == E_ILLEGAL_GENERATION
    hb = await coord.heartbeat(group_id="g", generation_id=1, member_id="nobody")
    assert hb["error_code"] == E_UNKNOWN_MEMBER
    hb = await coord.heartbeat(group_id="other", generation_id=1, member_id=lid)
    assert hb["error_code"] == E_UNKNOWN_MEMBER
    s = await sync(coord, leader, generation_id=0)
    assert s["error_code"] == E_ILLEGAL_GENERATION and s["assignment"] == b""
    s = await coord.sync_group(group_id="g", generation_id=1, member_id="nobody")
    assert s["error_code"] == E_UNKNOWN_MEMBER
    s = await sync(coord, leader, protocol_name="roundrobin")
    assert s["error_code"] == E_INCONSISTENT
    r = await join(coord, session_ms=1000)
    assert r["error_code"] == E_SESSION_TIMEOUT
    r = await join(coord, client="x", protocols=[("roundrobin", b"")])
    assert r["error_code"] == E_INCONSISTENT
    r = await join(coord, "ghost-member", group="fresh")
    assert r["error_code"] == E_UNKNOWN_MEMBER
    # A rebalance is being prepared: SyncGroup says so.
    async with trio.open_nursery() as n:
        n.start_soon(join, coord, lid)
        await trio.sleep(0.01)
        s = await sync(coord, follower)
        assert s["error_code"] == E_REBALANCE
        await join(coord, follower["member_id"], client="b")


async def test_static_member_rejoins_without_rebalance_and_old_id_is_fenced(
    autojump_clock: trio.testing.MockClock,
    coord: GroupCoordinator,
) -> None:
    a, b = await join_all(
        coord, ("", {"client": "a", "instance": "ia"}), ("", {"client": "b", "instance": "ib"})
    )
    assert a["generation_id"] == b["generation_id"] == 1  # static members need no member id dance
    leader, follower = (a, b) if a["leader"] == a["member_id"] else (b, a)
    fi = "ib" if follower is b else "ia"
    async with trio.open_nursery() as n:
        n.start_soon(sync, coord, follower)
        await trio.sleep(0.01)
        await sync(coord, leader, [(leader["member_id"], b"L"), (follower["member_id"], b"F")])
    # The follower restarts: same instance id, no member id, same metadata.
    fclient = "b" if follower is b else "a"
    again = await join(coord, instance=fi, client=fclient)
    assert again["error_code"] == E_NONE
    assert again["generation_id"] == 1  # no rebalance
    assert again["member_id"] != follower["member_id"]
    assert again["leader"] == leader["member_id"]
    assert coord.describe_groups(["g"])["groups"][0]["group_state"] == "Stable"
    assert (await sync(coord, again))["assignment"] == b"F"
    old = await coord.heartbeat(
        group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=fi
    )
    assert old["error_code"] == E_FENCED
    s = await sync(coord, follower, group_instance_id=fi)
    assert s["error_code"] == E_FENCED
    commit = await coord.commit_offsets(
        group_id="g",
        generation_id=1,
        member_id=follower["member_id"],
        group_instance_id=fi,
        offsets=[("t", 0, 5, 0, None)],
    )
    assert commit["topics"][0]["partitions"][0]["error_code"] == E_FENCED
    new = await coord.heartbeat(
        group_id="g", generation_id=1, member_id=again["member_id"], group_instance_id=fi
    )
    assert new["error_code"] == E_NONE
    # Changed metadata from a static member does trigger a rebalance.
    async with trio.open_nursery() as n:
        n.start_soon(join, coord, leader["member_id"])
        changed = await join(coord, instance=fi, client=fclient, protocols=[("range", b"v2")])
    assert changed["generation_id"] == 2


async def test_offsets_commit_fetch_and_durability(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator, store: FakeStore
):
    # Simple (no group management) commits are allowed for an Empty/unknown group.
    resp = await coord.commit_offsets(
        group_id="simple",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[
            ("t", 0, 42, 3, "m0"),
            ("t", 1, 7, -1, None),
            ("t", 9, 1, -1, None),
            ("u", 0, 5, 1, "x" * 4097),
        ],
    )
    errors = {
        (t["name"], p["partition_index"]): p["error_code"]
        for t in resp["topics"]
        for p in t["partitions"]
    }
    assert errors == {
        ("t", 0): E_NONE,
        ("t", 1): E_NONE,
        ("t", 9): E_UNKNOWN_TP,
        ("u", 0): E_METADATA_TOO_LARGE,
    }
    assert store.persisted == [("simple", [("t", 0, 42, 3, "m0"), ("t", 1, 7, -1, "")])]
    fetched = coord.fetch_offsets("simple", [("t", [0, 1, 9]), ("u", [0])])
    parts = {
        (t["name"], p["partition_index"]): p for t in fetched["topics"] for p in t["partitions"]
    }
    assert parts[("t", 0)] == {
        "partition_index": 0,
        "committed_offset": 42,
        "committed_leader_epoch": 3,
        "metadata": "m0",
        "error_code": E_NONE,
    }
    assert parts[("t", 1)]["committed_offset"] == 7 and parts[("t", 1)]["metadata"] == ""
    assert parts[("t", 9)]["error_code"] == E_UNKNOWN_TP
    assert parts[("u", 0)]["committed_offset"] == -1 and parts[("u", 0)]["error_code"] == E_NONE
    everything = coord.fetch_offsets("simple", None)["topics"]
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in everything] == [
        ("t", [0, 1])
    ]
    assert coord.fetch_offsets("nobody", None)["topics"] == []
    assert coord.committed_offsets() == {
        "simple": {("t", 0): CommittedOffset(42, 3, "m0"), ("t", 1): CommittedOffset(7, -1, "")}
    }
    coord.load_offsets("replayed", [("u", 0, 11, 2, "r")])
    assert (
        coord.fetch_offsets("replayed", [("u", [0])])["topics"][0]["partitions"][0][
            "committed_offset"
        ]
        == 11
    )
    coord.delete_topic_offsets("t")
    assert "simple" not in coord.committed_offsets()
    assert coord.list_groups()["groups"]  # offset-only groups are listed as Empty


async def test_offset_commit_checks_member_and_generation(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator, store: FakeStore
):
    leader, follower = await stable_pair(coord)

    async def commit(member_id: str, generation: int) -> int:
        resp = await coord.commit_offsets(
            group_id="g",
            generation_id=generation,
            member_id=member_id,
            group_instance_id=None,
            offsets=[("t", 0, 10, 0, "")],
        )
        return resp["topics"][0]["partitions"][0]["error_code"]

    assert await commit("stranger", 1) == E_UNKNOWN_MEMBER
    assert await commit(leader["member_id"], 5) == E_ILLEGAL_GENERATION
    assert await commit("", -1) == E_UNKNOWN_MEMBER  # simple commits only for Empty groups
    assert store.persisted == []
    assert await commit(follower["member_id"], 1) == E_NONE
    assert store.persisted == [("g", [("t", 0, 10, 0, "")])]
    assert (
        await coord.commit_offsets(
            group_id="nogroup",
            generation_id=3,
            member_id="m",
            group_instance_id=None,
            offsets=[("t", 0, 1, 0, "")],
        )
    )["topics"][0]["partitions"][0]["error_code"] == E_ILLEGAL_GENERATION


async def test_list_and_describe_groups(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    await stable_pair(coord)
    await coord.commit_offsets(
        group_id="offsets-only",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[("t", 0, 1, -1, "")],
    )
    listed = coord.list_groups()
    assert listed["error_code"] == E_NONE
    assert {(g["group_id"], g["group_state"], g["protocol_type"]) for g in listed["groups"]} == {
        ("g", "Stable", "consumer"),
        ("offsets-only", "Empty", ""),
    }
    assert [g["group_id"] for g in coord.list_groups(states_filter=["Stable"])["groups"]] == ["g"]
    assert [g["group_id"] for g in coord.list_groups(states_filter=["empty"])["groups"]] == [
        "offsets-only"
    ]
    assert coord.list_groups(types_filter=["consumer"])["groups"] == []
    described = coord.describe_groups(["g", "missing"])["groups"]
    assert described[0]["authorized_operations"] == -2147483648
    assert len(described[0]["members"]) == 2
    assert all(m["member_metadata"].startswith(b"meta-") for m in described[0]["members"])
    assert described[1]["group_state"] == "Dead" and described[1]["members"] == []
    with_ops = coord.describe_groups(["g"], include_authorized_operations=True)["groups"][0]
    assert with_ops["authorized_operations"] > 0


# ------------------------------------------------------------------ handlers with kio entities


def _module(api: str, version: int, kind: str) -> types.ModuleType:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def _entity_class(api: str, version: int, kind: str) -> type:
    wanted = EntityType.request if kind == "request" else EntityType.response
    mod = _module(api, version, kind)
    return next(
        v
        for v in vars(mod).values()
        if isinstance(v, type) and getattr(v, "__type__", None) == wanted
    )


def _encode_response(api_key: int, version: int, data: dict[str, Any]) -> Any:
    """Build the versioned entity as the broker does, and prove that it encodes."""
    entity = build_response(api_key, version, data)
    entity_writer(type(entity))(io.BytesIO(), entity)
    return entity


def _ms(v: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=v))


async def _handle(c: GroupCoordinator, api_key: int, api: str, version: int, **fields: Any):
    req = _entity_class(api, version, "request")(**fields)
    resp = await group_handlers.handle(api_key, version, req, c, "cli", "/10.0.0.1")
    assert resp["throttle_time_ms"] == 0
    return _encode_response(api_key, version, resp)


async def test_handlers_join_v0_v5_v9_and_leave_v0_v3(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    proto = _module("join_group", 0, "request").JoinGroupRequestProtocol
    entity = await _handle(
        coord,
        11,
        "join_group",
        0,
        group_id="h0",
        session_timeout=_ms(10_000),
        member_id="",
        protocol_type="consumer",
        protocols=(proto(name="range", metadata=b"m"),),
    )
    assert entity.error_code == ErrorCode.none and entity.generation_id == 1  # no KIP-394 at v0
    assert entity.leader == entity.member_id
    v0_member = entity.member_id

    proto5 = _module("join_group", 5, "request").JoinGroupRequestProtocol
    fields5 = dict(
        group_id="h5",
        session_timeout=_ms(10_000),
        rebalance_timeout=_ms(15_000),
        protocol_type="consumer",
        protocols=(proto5(name="range", metadata=b"m"),),
    )
    entity = await _handle(coord, 11, "join_group", 5, member_id="", **fields5)
    assert entity.error_code == ErrorCode.member_id_required
    assert entity.protocol_name == ""  # non-nullable before v7
    entity = await _handle(coord, 11, "join_group", 5, member_id=entity.member_id, **fields5)
    assert entity.error_code == ErrorCode.none and len(entity.members) == 1

    proto9 = _module("join_group", 9, "request").JoinGroupRequestProtocol
    entity = await _handle(
        coord,
        11,
        "join_group",
        9,
        group_id="h9",
        session_timeout=_ms(10_000),
        rebalance_timeout=_ms(15_000),
        member_id="",
        group_instance_id="static-1",
        protocol_type="consumer",
        protocols=(proto9(name="range", metadata=b"m9"),),
        reason="test",
    )
    assert entity.error_code == ErrorCode.none and entity.protocol_type == "consumer"
    assert entity.members[0].group_instance_id == "static-1"
    assert entity.members[0].metadata == b"m9"
    static_member = entity.member_id

    entity = await _handle(coord, 13, "leave_group", 0, group_id="h0", member_id="nope")
    assert entity.error_code == ErrorCode.unknown_member_id
    entity = await _handle(coord, 13, "leave_group", 0, group_id="h0", member_id=v0_member)
    assert entity.error_code == ErrorCode.none
    assert coord.describe_groups(["h0"])["groups"][0]["group_state"] == "Empty"

    ident = _module("leave_group", 3, "request").MemberIdentity
    entity = await _handle(
        coord,
        13,
        "leave_group",
        3,
        group_id="h9",
        members=(ident(member_id="", group_instance_id="static-1"), ident(member_id="x")),
    )
    assert entity.error_code == ErrorCode.none
    assert [(m.member_id, m.error_code) for m in entity.members] == [
        ("", ErrorCode.none),
        ("x", ErrorCode.unknown_member_id),
    ]
    assert static_member not in str(coord.describe_groups(["h9"]))


async def test_handlers_offsets_v1_v8_and_lists(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator, store: FakeStore
) -> None:
    mod = _module("offset_commit", 2, "request")
    entity = await _handle(
        coord,
        8,
        "offset_commit",
        2,
        group_id="og",
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        topics=(
            mod.OffsetCommitRequestTopic(
                name="t",
                partitions=(
                    mod.OffsetCommitRequestPartition(
                        partition_index=i32(1), committed_offset=99, committed_metadata="md"
                    ),
                ),
            ),
        ),
    )
    assert entity.topics[0].partitions[0].error_code == ErrorCode.none
    assert store.persisted == [("og", [("t", 1, 99, -1, "md")])]

    fmod = _module("offset_fetch", 1, "request")
    entity = await _handle(
        coord,
        9,
        "offset_fetch",
        1,
        group_id="og",
        topics=(fmod.OffsetFetchRequestTopic(name="t", partition_indexes=(i32(0), i32(1))),),
    )
    got = {p.partition_index: (p.committed_offset, p.metadata) for p in entity.topics[0].partitions}
    assert got == {0: (-1, ""), 1: (99, "md")}

    f8 = _module("offset_fetch", 8, "request")
    entity = await _handle(
        coord,
        9,
        "offset_fetch",
        8,
        groups=(
            f8.OffsetFetchRequestGroup(group_id="og", topics=None),
            f8.OffsetFetchRequestGroup(
                group_id="empty",
                topics=(f8.OffsetFetchRequestTopics(name="u", partition_indexes=(i32(0),)),),
            ),
        ),
    )
    assert [g.group_id for g in entity.groups] == ["og", "empty"]
    assert [
        (t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
        for t in entity.groups[0].topics
    ] == [("t", [(1, 99)])]
    assert entity.groups[1].topics[0].partitions[0].committed_offset == -1

    entity = await _handle(coord, 16, "list_groups", 4, states_filter=("Empty",))
    assert [g.group_id for g in entity.groups] == ["og"]
    entity = await _handle(
        coord, 15, "describe_groups", 5, groups=("og",), include_authorized_operations=False
    )
    assert entity.groups[0].group_state == "Empty"
    assert entity.groups[0].authorized_operations == -2147483648


async def test_a_new_member_whose_join_completes_the_rebalance_gets_its_answer(
    autojump_clock: trio.testing.MockClock, coord: GroupCoordinator
) -> None:
    """The leader rejoined first; the new member's join completes the rebalance at once.
    (Its reply was cleared before it was returned: the join crashed with AttributeError.)"""
    first = await join_known(coord, "a")
    assert (await sync(coord, first, [(first["member_id"], b"A")]))["assignment"] == b"A"
    b_id = (await join(coord, client="b"))["member_id"]
    results: dict[str, dict[str, Any]] = {}

    async def rejoin_a() -> None:
        results["a"] = await join(coord, first["member_id"], client="a")

    async with trio.open_nursery() as n:
        n.start_soon(rejoin_a)
        await trio.testing.wait_all_tasks_blocked()
        results["b"] = await join(coord, b_id, client="b")
    assert results["a"]["generation_id"] == results["b"]["generation_id"] == 2
    assert results["b"]["error_code"] == E_NONE
