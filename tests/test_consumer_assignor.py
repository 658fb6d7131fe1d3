"""KIP-848 server-side assignors and the consumer group's reconciliation (pure, no I/O)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from main_broker.groups.consumer_assignor import Assignment, assign
from main_broker.groups.consumer_group import (
    FENCED_INSTANCE_ID,
    FENCED_MEMBER_EPOCH,
    INVALID_REGULAR_EXPRESSION,
    NONE,
    STALE_MEMBER_EPOCH,
    UNKNOWN_MEMBER_ID,
    UNRELEASED_INSTANCE_ID,
    UNSUPPORTED_ASSIGNOR,
    UNSUPPORTED_VERSION,
    ConsumerGroup,
    HeartbeatInput,
    HeartbeatResult,
    MemberState,
)


def _owners(result: dict[str, Assignment]) -> Counter[tuple[str, int]]:
    return Counter((t, p) for a in result.values() for t, ps in a.items() for p in ps)


def _sizes(result: dict[str, Assignment]) -> list[int]:
    return sorted(sum(len(ps) for ps in a.values()) for a in result.values())


# -- assignors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["uniform", "range"])
def test_every_partition_once_and_balanced(name: str) -> None:
    subs = {m: frozenset({"a", "b"}) for m in ("m1", "m2", "m3")}
    result = assign(name, subs, {"a": 4, "b": 3}, {})
    owners = _owners(result)
    assert set(owners) == {("a", p) for p in range(4)} | {("b", p) for p in range(3)}
    assert set(owners.values()) == {1}
    if name == "uniform":
        assert _sizes(result) == [2, 2, 3]


def test_range_gives_contiguous_ranges_in_member_order() -> None:
    subs = {m: frozenset({"t"}) for m in ("b", "a", "c")}
    result = assign("range", subs, {"t": 7}, {})
    assert result == {
        "a": {"t": frozenset({0, 1, 2})},
        "b": {"t": frozenset({3, 4})},
        "c": {"t": frozenset({5, 6})},
    }


def test_uniform_is_sticky_when_a_member_joins_and_leaves() -> None:
    two = {m: frozenset({"t"}) for m in ("m1", "m2")}
    first = assign("uniform", two, {"t": 6}, {})
    assert _sizes(first) == [3, 3]
    three = {**two, "m3": frozenset({"t"})}
    second = assign("uniform", three, {"t": 6}, first)
    assert _sizes(second) == [2, 2, 2]
    # m1 and m2 only gave partitions away: nothing moved between them.
    for m in ("m1", "m2"):
        assert second[m]["t"] <= first[m]["t"]
    back = assign("uniform", two, {"t": 6}, second)
    for m in ("m1", "m2"):
        assert second[m]["t"] <= back[m]["t"]
    assert _sizes(back) == [3, 3]


def test_uniform_heterogeneous_subscriptions_only_to_subscribers() -> None:
    rng = random.Random(5)
    topics = {"a": 5, "b": 2, "c": 9}
    for _ in range(50):
        members = {
            f"m{i}": frozenset(rng.sample(sorted(topics), rng.randint(1, 3))) for i in range(4)
        }
        result = assign("uniform", members, topics, {})
        owners = _owners(result)
        wanted = {(t, p) for subs in members.values() for t in subs for p in range(topics[t])}
        assert set(owners) == wanted and set(owners.values()) <= {1}
        for m, a in result.items():
            assert set(a) <= members[m]


# -- the group's reconciliation ----------------------------------------------------------------

TOPICS = {"t": 6}


def _join(g: ConsumerGroup, mid: str, now: float = 0.0, **kw: object) -> HeartbeatResult:
    req = HeartbeatInput(
        member_id=mid, member_epoch=0, rebalance_timeout_ms=10_000, subscribed_topic_names=["t"]
    )
    for k, v in kw.items():
        setattr(req, k, v)
    return g.heartbeat(req, TOPICS, now)


def _beat(
    g: ConsumerGroup, mid: str, epoch: int, owned: Assignment | None = None, now: float = 1.0
) -> HeartbeatResult:
    return g.heartbeat(HeartbeatInput(member_id=mid, member_epoch=epoch, owned=owned), TOPICS, now)


def _parts(r: HeartbeatResult) -> set[int]:
    assert r.assignment is not None
    return set(r.assignment.get("t", ()))


def _no_double_ownership(g: ConsumerGroup) -> None:
    held: Counter[tuple[str, int]] = Counter()
    for m in g.members.values():
        for a in (m.assigned, m.revoking):
            held.update((t, p) for t, ps in a.items() for p in ps)
    assert all(c == 1 for c in held.values()), held


def test_partition_moves_only_after_the_old_owner_revoked_it() -> None:
    g = ConsumerGroup("g", 45_000)
    a = _join(g, "A")
    assert a.error_code == NONE and a.member_epoch == 1 and _parts(a) == set(range(6))
    assert g.state == "Stable"
    b = _join(g, "B")
    # B is in the target at epoch 2, but A still holds everything: B gets nothing yet.
    assert b.member_epoch == 2 and _parts(b) == set()
    assert g.state == "Reconciling"
    _no_double_ownership(g)
    # A is told to keep only its half (and stays at epoch 1 until it revokes).
    a2 = _beat(g, "A", 1)
    kept = _parts(a2)
    assert len(kept) == 3 and a2.member_epoch == 1
    assert g.members["A"].state is MemberState.UNREVOKED_PARTITIONS
    # Without acknowledging, B still gets nothing.
    assert _beat(g, "B", 2).assignment is None
    _no_double_ownership(g)
    # A acknowledges: owns only `kept`; it moves to epoch 2, B then gets the rest.
    a3 = _beat(g, "A", 1, owned={"t": frozenset(kept)})
    assert a3.member_epoch == 2
    b2 = _beat(g, "B", 2)
    assert _parts(b2) == set(range(6)) - kept
    assert g.state == "Stable"
    _no_double_ownership(g)
    # A heartbeat with nothing new carries no assignment.
    assert _beat(g, "B", 2).assignment is None


def test_leave_and_session_expiry_give_partitions_to_the_others() -> None:
    g = ConsumerGroup("g", 10_000)
    _join(g, "A")
    _join(g, "B")
    a = _beat(g, "A", 1)
    _beat(g, "A", 1, owned={"t": frozenset(_parts(a))})
    _beat(g, "B", 2)
    left = _beat(g, "B", -1)
    assert left.member_epoch == -1 and "B" not in g.members
    a2 = _beat(g, "A", 2)
    assert a2.member_epoch == 3 and _parts(a2) == set(range(6))
    c = _join(g, "C", now=2.0)
    assert c.error_code == NONE
    # A stops heartbeating: after the session timeout C takes everything.
    assert g.expire(11.5, TOPICS) == ["A"]
    c2 = _beat(g, "C", c.member_epoch, now=11.6)
    assert _parts(c2) == set(range(6))


def test_revocation_timeout_fences_a_member_that_never_revokes() -> None:
    g = ConsumerGroup("g", 45_000)
    _join(g, "A", rebalance_timeout_ms=5_000)
    _join(g, "B")
    _beat(g, "A", 1, now=1.0)
    assert g.members["A"].revoke_deadline == pytest.approx(6.0)
    assert g.expire(6.0, TOPICS) == ["A"]
    assert _parts(_beat(g, "B", 2, now=6.1)) == set(range(6))


def test_epoch_errors() -> None:
    g = ConsumerGroup("g", 45_000)
    _join(g, "A")
    assert _beat(g, "A", 5).error_code == FENCED_MEMBER_EPOCH
    assert _beat(g, "nobody", 1).error_code == UNKNOWN_MEMBER_ID
    _join(g, "B")
    _beat(g, "A", 1, owned={"t": frozenset(range(6))})
    # A at epoch 1 revoking; B at 2. An old epoch that is not the previous one is fenced.
    assert _beat(g, "B", 1).error_code == FENCED_MEMBER_EPOCH
    assert g.validate_commit("B", 2) == NONE
    assert g.validate_commit("B", 1) == STALE_MEMBER_EPOCH
    assert g.validate_commit("Z", 1) == UNKNOWN_MEMBER_ID
    # OffsetCommit below v9 from a KIP-848 member: refused once the member is known, before
    # its epoch is looked at (Kafka's order).
    assert g.validate_commit("B", 1, commit_version=8) == UNSUPPORTED_VERSION
    assert g.validate_commit("Z", 1, commit_version=8) == UNKNOWN_MEMBER_ID
    assert g.validate_commit("B", 2, commit_version=9) == NONE
    assert _join(g, "C", server_assignor="nope").error_code == UNSUPPORTED_ASSIGNOR
    assert _join(g, "D", subscribed_topic_regex="(").error_code == INVALID_REGULAR_EXPRESSION


def test_static_member_rejoins_with_its_assignment_and_duplicate_is_refused() -> None:
    g = ConsumerGroup("g", 45_000)
    a = _join(g, "A", instance_id="i-a")
    b = _join(g, "B", instance_id="i-b")
    a_parts = _parts(_beat(g, "A", a.member_epoch, owned={"t": frozenset(range(6))}))
    a_ack = _beat(g, "A", a.member_epoch, owned={"t": frozenset(a_parts)})
    b_parts = _parts(_beat(g, "B", b.member_epoch))
    assert a_parts | b_parts == set(range(6)) and not a_parts & b_parts
    epoch = g.group_epoch
    # A duplicate of a live instance id is refused.
    assert _join(g, "A2", instance_id="i-a").error_code == UNRELEASED_INSTANCE_ID
    # A leaves temporarily (-2) and comes back as a new process with a new member id.
    gone = g.heartbeat(
        HeartbeatInput(member_id="A", member_epoch=-2, instance_id="i-a"), TOPICS, 2.0
    )
    assert gone.error_code == NONE and gone.member_epoch == -2
    back = _join(g, "A3", instance_id="i-a", now=3.0)
    assert back.error_code == NONE
    assert back.member_epoch == a_ack.member_epoch and _parts(back) == a_parts
    assert g.group_epoch == epoch  # nobody else rebalances
    assert _beat(g, "B", b.member_epoch).assignment is None
    # The old member id is fenced.
    old = g.heartbeat(
        HeartbeatInput(member_id="A", member_epoch=a_ack.member_epoch, instance_id="i-a"),
        TOPICS,
        3.0,
    )
    assert old.error_code in (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID)


def test_regex_subscription_and_new_topics_bump_the_epoch() -> None:
    g = ConsumerGroup("g", 45_000)
    r = g.heartbeat(
        HeartbeatInput(
            member_id="A", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_regex="o.*"
        ),
        {"orders": 2, "other": 1, "x": 3},
        0.0,
    )
    assert r.assignment == {"orders": frozenset({0, 1}), "other": frozenset({0})}
    r2 = g.heartbeat(
        HeartbeatInput(member_id="A", member_epoch=r.member_epoch),
        {"orders": 2, "other": 1, "x": 3, "ops": 1},
        1.0,
    )
    assert r2.member_epoch > r.member_epoch and r2.assignment is not None
    assert r2.assignment["ops"] == frozenset({0})


def test_regex_is_re2_linear_time_and_refuses_what_re2_refuses() -> None:
    """Kafka compiles SubscribedTopicRegex with RE2J: a pattern that backtracks exponentially
    in Python's `re` ((a+)+b against 40 a's takes hours there) matches at once, and one RE2
    cannot parse (a backreference) is INVALID_REGULAR_EXPRESSION with Kafka's message."""
    g = ConsumerGroup("g", 45_000)
    topics = {"a" * 40: 1, "aab": 2}
    start = time.monotonic()
    r = g.heartbeat(
        HeartbeatInput(
            member_id="A",
            member_epoch=0,
            rebalance_timeout_ms=1000,
            subscribed_topic_regex="(a+)+b",
        ),
        topics,
        0.0,
    )
    assert time.monotonic() - start < 1.0
    assert r.error_code == NONE and r.assignment == {"aab": frozenset({0, 1})}
    bad = _join(g, "B", subscribed_topic_regex=r"(a)\1")
    assert bad.error_code == INVALID_REGULAR_EXPRESSION
    assert bad.error_message is not None
    assert bad.error_message.startswith(r"SubscribedTopicRegex `(a)\1` is not a valid regular")


def test_a_held_group_hands_out_nothing_until_the_hold_ends() -> None:
    """After a coordinator restart, members of before may still read: wait them out."""
    g = ConsumerGroup("g", 45_000)
    g.hold_until = 5.0
    a = _join(g, "A", now=1.0)
    assert a.member_epoch == 1 and _parts(a) == set()
    assert g.members["A"].state is MemberState.UNRELEASED_PARTITIONS
    assert _beat(g, "A", 1, now=4.9).assignment is None
    assert _parts(_beat(g, "A", 1, now=5.0)) == set(range(6))
    assert g.state == "Stable"
