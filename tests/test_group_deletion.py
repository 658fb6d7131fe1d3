"""DeleteGroups and OffsetDelete over classic and KIP-848 groups (main_broker.groups.admin), and
the consumer coordinator's edge (topic ids, session timers) on the trio clock."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from kio.schema.errors import ErrorCode

from main_broker.group_config import GroupConfig
from main_broker.groups import admin as group_admin
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.coordinator import GroupCoordinator
from tests.test_group_coordinator import join_known, sync

TOPIC_IDS = {"t": uuid.UUID(int=1), "u": uuid.UUID(int=2)}


class Store:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.fail = False

    async def persist_offsets(
        self, group_id: str, offsets: list[Any], applied: Callable[[], None]
    ) -> None:
        await trio.sleep(0.001)
        self.log.append((group_id, list(offsets)))
        applied()

    async def persist_offsets_delete(
        self, group_id: str, partitions: list[Any] | None, applied: Callable[[], None]
    ) -> None:
        await trio.sleep(0.001)
        if self.fail:
            raise OSError("disk gone")
        self.log.append((group_id, ("delete", partitions)))
        applied()

    def partition_exists(self, topic: str, partition: int) -> bool:
        return topic in TOPIC_IDS and partition in (0, 1)


class Topics:
    def __init__(self) -> None:
        self.counts = {"t": 2, "u": 2}

    def topic_partition_counts(self) -> dict[str, int]:
        return self.counts

    def topic_id(self, name: str) -> uuid.UUID | None:
        return TOPIC_IDS.get(name)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return next((n for n, i in TOPIC_IDS.items() if i == topic_id), None)


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
async def coords(
    nursery: trio.Nursery, store: Store
) -> tuple[GroupCoordinator, ConsumerCoordinator]:
    config = GroupConfig(consumer_session_timeout_ms=10_000, empty_group_retention_ms=60_000)
    classic = GroupCoordinator(config, store)
    topics = Topics()
    consumer = ConsumerCoordinator(config, topics)
    consumer.classic_in_use = classic.in_use
    consumer.drop_classic = classic.remove_group
    consumer.has_offsets = classic.offsets.has_offsets
    classic.consumer_in_use = consumer.in_use
    classic.drop_consumer = consumer.remove_group
    await nursery.start(classic.run)
    topics.counts = {}  # a fresh cluster: no topics yet when the coordinator starts
    await nursery.start(consumer.run)
    topics.counts = {"t": 2, "u": 2}
    return classic, consumer


def _subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def _heartbeat(group: str, member: str, epoch: int, topics: list[str] | None = None, **kw: Any):
    fields = {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": 30_000 if epoch == 0 else -1,
        "subscribed_topic_names": topics,
        "subscribed_topic_regex": None,
        "server_assignor": None,
        "topic_partitions": [] if epoch == 0 else None,
    }
    fields.update(kw)
    return SimpleNamespace(**fields)


async def _commit(classic: GroupCoordinator, group: str, *keys: tuple[str, int]) -> None:
    resp = await classic.commit_offsets(
        group_id=group,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[(t, p, 5, 0, "m") for t, p in keys],
    )
    assert all(p["error_code"] == 0 for t in resp["topics"] for p in t["partitions"])


async def test_delete_groups_errors_and_success(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
    store: Store,
) -> None:
    classic, consumer = coords
    await _commit(classic, "idle", ("t", 0), ("u", 1))
    member = await join_known(classic, "a", group="busy", protocols=[("range", _subscription("t"))])
    await sync(classic, member, [(member["member_id"], b"x")], group="busy")
    beat = await consumer.heartbeat(_heartbeat("k848", "m1", 0, ["t"]), "c", "h")
    assert beat["error_code"] == 0 and beat["member_epoch"] == 1
    resp = await group_admin.delete_groups(
        classic, consumer, ["idle", "busy", "k848", "missing", "", "idle", "busy"]
    )
    # A group named twice gets its answer twice, as in Kafka (checked before any deletion).
    assert [(r["group_id"], r["error_code"]) for r in resp["results"]] == [
        ("idle", ErrorCode.none),
        ("busy", ErrorCode.non_empty_group),
        ("k848", ErrorCode.non_empty_group),
        ("missing", ErrorCode.group_id_not_found),
        ("", ErrorCode.invalid_group_id),
        ("idle", ErrorCode.none),
        ("busy", ErrorCode.non_empty_group),
    ]
    assert store.log.count(("idle", ("delete", None))) == 1
    assert classic.fetch_offsets("idle", None)["topics"] == []
    # The KIP-848 group empties (its member leaves) and can go too.
    assert (await consumer.heartbeat(_heartbeat("k848", "m1", -1), "c", "h"))["member_epoch"] == -1
    resp = await group_admin.delete_groups(classic, consumer, ["k848"])
    assert resp["results"][0]["error_code"] == ErrorCode.none
    assert not consumer.in_use("k848") and "k848" not in consumer.groups
    classic.owns = lambda g: g != "elsewhere"
    resp = await group_admin.delete_groups(classic, consumer, ["elsewhere"])
    assert resp["results"][0]["error_code"] == ErrorCode.not_coordinator


async def test_delete_that_cannot_be_persisted_keeps_the_offsets(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
    store: Store,
) -> None:
    classic, consumer = coords
    await _commit(classic, "g", ("t", 0))
    store.fail = True
    resp = await group_admin.delete_groups(classic, consumer, ["g"])
    assert resp["results"][0]["error_code"] == ErrorCode.coordinator_not_available
    assert classic.offsets.partitions("g") == {("t", 0)}
    resp = await group_admin.delete_offsets(classic, consumer, "g", [("t", [0])])
    assert resp["error_code"] == ErrorCode.coordinator_not_available
    assert classic.offsets.partitions("g") == {("t", 0)}


async def test_offset_delete_rules(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
    store: Store,
) -> None:
    classic, consumer = coords
    # A classic "consumer" group subscribed to t: t is refused, u's offsets go.
    await _commit(classic, "cg", ("t", 0), ("u", 0), ("u", 1))
    m = await join_known(classic, "a", group="cg", protocols=[("range", _subscription("t"))])
    await sync(classic, m, [(m["member_id"], b"x")], group="cg")
    resp = await group_admin.delete_offsets(classic, consumer, "cg", [("t", [0]), ("u", [0, 1])])
    assert resp["error_code"] == ErrorCode.none
    codes = {
        (t["name"], p["partition_index"]): p["error_code"]
        for t in resp["topics"]
        for p in t["partitions"]
    }
    assert codes == {
        ("t", 0): ErrorCode.group_subscribed_to_topic,
        ("u", 0): ErrorCode.none,
        ("u", 1): ErrorCode.none,
    }
    assert store.log[-1] == ("cg", ("delete", [("u", 0), ("u", 1)]))
    assert classic.offsets.partitions("cg") == {("t", 0)}
    # A group of another protocol with members: NON_EMPTY_GROUP.
    other = await join_known(classic, "b", group="connect", protocols=[("x", b"")])
    await sync(classic, other, [(other["member_id"], b"")], group="connect")
    classic.group("connect").protocol_type = "connect"  # type: ignore[union-attr]
    resp = await group_admin.delete_offsets(classic, consumer, "connect", [("t", [0])])
    assert resp["error_code"] == ErrorCode.non_empty_group
    # KIP-848 group: its members' subscriptions count.
    await _commit(classic, "k", ("t", 1), ("u", 1))
    assert (await consumer.heartbeat(_heartbeat("k", "m", 0, ["u"]), "c", "h"))["error_code"] == 0
    resp = await group_admin.delete_offsets(classic, consumer, "k", [("t", [1]), ("u", [1])])
    codes = {t["name"]: t["partitions"][0]["error_code"] for t in resp["topics"]}
    assert codes == {"t": ErrorCode.none, "u": ErrorCode.group_subscribed_to_topic}
    resp = await group_admin.delete_offsets(classic, consumer, "nope", [("t", [0])])
    assert resp["error_code"] == ErrorCode.group_id_not_found


async def test_a_commit_submitted_before_a_group_deletion_does_not_bring_it_back(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
) -> None:
    classic, consumer = coords
    await _commit(classic, "g", ("t", 0))
    async with trio.open_nursery() as n:
        n.start_soon(_commit, classic, "g", ("t", 1))  # persisting when the deletion starts
        await trio.testing.wait_all_tasks_blocked()
        n.start_soon(group_admin.delete_groups, classic, consumer, ["g"])
    assert classic.offsets.partitions("g") == set()


async def test_consumer_coordinator_topic_ids_and_session_expiry(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
) -> None:
    classic, consumer = coords
    a = await consumer.heartbeat(_heartbeat("g", "A", 0, ["t", "u"]), "ca", "ha")
    assert a["error_code"] == 0 and a["heartbeat_interval"] == 5000
    got = {
        (tp["topic_id"], p) for tp in a["assignment"]["topic_partitions"] for p in tp["partitions"]
    }
    assert got == {(TOPIC_IDS[t], p) for t in "tu" for p in (0, 1)}
    b = await consumer.heartbeat(_heartbeat("g", "B", 0, ["t", "u"]), "cb", "hb")
    assert b["assignment"] == {"topic_partitions": []}
    # A revokes by heartbeating what it still owns (topic ids in, topic ids out).
    kept = (await consumer.heartbeat(_heartbeat("g", "A", 1), "ca", "ha"))["assignment"][
        "topic_partitions"
    ]
    owned = [SimpleNamespace(topic_id=tp["topic_id"], partitions=tp["partitions"]) for tp in kept]
    assert (await consumer.heartbeat(_heartbeat("g", "A", 1, topic_partitions=owned), "ca", "ha"))[
        "member_epoch"
    ] == 2
    described = consumer.describe(["g"], include_authorized_operations=True)["groups"][0]
    assert described["group_state"] in ("Reconciling", "Stable")
    assert {m["member_id"] for m in described["members"]} == {"A", "B"}
    assert described["authorized_operations"] == (1 << 3) | (1 << 6) | (1 << 8)
    # B keeps heartbeating, A goes silent: after the session timeout B holds everything.
    told: dict[str, Any] | None = None
    for _ in range(5):
        await trio.sleep(3)
        epoch = consumer.groups["g"].members["B"].member_epoch
        resp = await consumer.heartbeat(_heartbeat("g", "B", epoch), "cb", "hb")
        assert resp["error_code"] == 0
        told = resp["assignment"] or told
    assert set(consumer.groups["g"].members) == {"B"}
    assert told is not None and consumer.groups["g"].members["B"].member_epoch > 2
    owned_b = {(tp["topic_id"], p) for tp in told["topic_partitions"] for p in tp["partitions"]}
    assert owned_b == {(TOPIC_IDS[t], p) for t in "tu" for p in (0, 1)}
    # Classic and consumer groups share one id space.
    m = await join_known(classic, "c", group="classic-one")
    assert (await consumer.heartbeat(_heartbeat("classic-one", "X", 0, ["t"]), "c", "h"))[
        "error_code"
    ] == ErrorCode.group_id_not_found
    assert m["error_code"] == 0


async def test_after_a_restart_new_groups_wait_out_the_old_members_sessions(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """A group that was not restored (its records predate them, or it was coordinated
    elsewhere): a coordinator that starts with topics (a restart) hands it no partitions for
    one session timeout, while members of before may still read."""
    consumer = ConsumerCoordinator(GroupConfig(consumer_session_timeout_ms=10_000), Topics())
    await nursery.start(consumer.run)
    started = trio.current_time()
    first = await consumer.heartbeat(_heartbeat("g", "A", 0, ["t"]), "c", "h")
    assert first["member_epoch"] == 1 and first["assignment"] == {"topic_partitions": []}
    await trio.sleep(9.0)
    assert (await consumer.heartbeat(_heartbeat("g", "A", 1), "c", "h"))["assignment"] is None
    await trio.sleep_until(started + 11.0)
    late = await consumer.heartbeat(_heartbeat("g", "A", 1), "c", "h")
    assert late["assignment"] == {
        "topic_partitions": [{"topic_id": TOPIC_IDS["t"], "partitions": [0, 1]}]
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"member_id": ""}, "MemberId can't be empty."),
        ({"group_id": " "}, "GroupId can't be empty."),
        ({"instance_id": ""}, "InstanceId can't be empty."),
        ({"rack_id": " "}, "RackId can't be empty."),
        ({"rebalance_timeout": -1}, "RebalanceTimeoutMs must be provided in first request."),
        ({"topic_partitions": None}, "TopicPartitions must be empty when (re-)joining."),
        (
            {"subscribed_topic_names": None},
            "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
            "(re-)joining.",
        ),
        ({"member_epoch": -2}, "InstanceId can't be null."),
        ({"member_epoch": -3}, "MemberEpoch is invalid."),
    ],
)
async def test_invalid_heartbeats_get_invalid_request(
    coords: tuple[GroupCoordinator, ConsumerCoordinator], fields: dict[str, Any], message: str
) -> None:
    _, consumer = coords
    request = _heartbeat("g", "A", 0, ["t"])
    for k, v in fields.items():
        setattr(request, k, v)
    resp = await consumer.heartbeat(request, "c", "h")
    assert (resp["error_code"], resp["error_message"]) == (ErrorCode.invalid_request, message)
    assert "g" not in consumer.groups


async def test_an_empty_consumer_group_without_offsets_is_forgotten(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
) -> None:
    classic, consumer = coords
    for group in ("plain", "kept"):
        assert (await consumer.heartbeat(_heartbeat(group, "A", 0, ["t"]), "c", "h"))[
            "error_code"
        ] == 0
    await _commit(classic, "kept", ("t", 0))
    for group in ("plain", "kept"):
        assert (await consumer.heartbeat(_heartbeat(group, "A", -1), "c", "h"))[
            "member_epoch"
        ] == -1
    assert {g["group_id"]: g["group_state"] for g in consumer.listed()} == {
        "plain": "Empty",
        "kept": "Empty",
    }
    await trio.sleep(59)
    assert set(consumer.groups) == {"plain", "kept"}
    await trio.sleep(2)
    assert set(consumer.groups) == {"kept"}  # its offsets keep it


async def test_a_classic_join_takes_over_an_empty_consumer_group(
    autojump_clock: trio.testing.MockClock,
    coords: tuple[GroupCoordinator, ConsumerCoordinator],
) -> None:
    classic, consumer = coords
    assert (await consumer.heartbeat(_heartbeat("g", "A", 0, ["t"]), "c", "h"))["error_code"] == 0
    # While the KIP-848 group has a member, a classic JoinGroup is refused.
    refused = await classic.join_group(
        group_id="g",
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[("range", _subscription("t"))],
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        client_id="c",
        client_host="h",
        require_known_member_id=True,
    )
    assert refused["error_code"] == ErrorCode.inconsistent_group_protocol
    assert (await consumer.heartbeat(_heartbeat("g", "A", -1), "c", "h"))["member_epoch"] == -1
    member = await join_known(classic, "b", protocols=[("range", _subscription("t"))])
    assert member["error_code"] == 0
    assert "g" not in consumer.groups
    assert [g["group_type"] for g in classic.list_groups()["groups"]] == ["classic"]
