"""Server-side partition assignors of KIP-848 consumer groups ("uniform" and "range").

Pure functions: given each member's subscribed topics, the partition count of every topic and
the previous target assignment, they compute the next target assignment. Every partition of a
subscribed topic goes to exactly one member subscribed to that topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["ASSIGNORS", "DEFAULT_ASSIGNOR", "Assignment", "TopicPartition", "assign"]

TopicPartition = tuple[str, int]
# topic name -> partitions, per member
Assignment = dict[str, frozenset[int]]

Assignor = Callable[
    [Mapping[str, frozenset[str]], Mapping[str, int], Mapping[str, Assignment]],
    dict[str, Assignment],
]


def _pack(owned: Mapping[str, set[TopicPartition]]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {}
    for member, tps in owned.items():
        by_topic: dict[str, set[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, set()).add(partition)
        out[member] = {t: frozenset(ps) for t, ps in sorted(by_topic.items())}
    return out


def uniform(
    subscriptions: Mapping[str, frozenset[str]],
    topics: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Balanced and sticky: members keep what they had as long as that keeps the group
    balanced; the rest goes to the least loaded subscribed member."""
    members = sorted(subscriptions)
    eligible: dict[TopicPartition, list[str]] = {}
    for topic in sorted({t for subs in subscriptions.values() for t in subs}):
        subscribers = [m for m in members if topic in subscriptions[m]]
        for p in range(topics.get(topic, 0)):
            eligible[(topic, p)] = subscribers
    # Each member's fair share of the partitions it could take: with identical subscriptions
    # this is N/M, rounded up for only as many members as the remainder allows.
    share: dict[str, float] = dict.fromkeys(members, 0.0)
    for subscribers in eligible.values():
        for m in subscribers:
            share[m] += 1 / len(subscribers)
    floor = {m: int(share[m] + 1e-9) for m in members}
    extra = len(eligible) - sum(floor.values())
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    # Sticky pass: previous owners keep partitions up to their floor first ...
    kept: dict[str, list[TopicPartition]] = {}
    for m in members:
        mine = sorted(
            (t, p)
            for t, ps in previous.get(m, {}).items()
            for p in ps
            if (t, p) in eligible and m in eligible[(t, p)]
        )
        kept[m] = mine
        for tp in mine[: floor[m]]:
            owned[m].add(tp)
            taken.add(tp)
    # ... and one more each while the remainder lasts, biggest previous holders first.
    for m in sorted(members, key=lambda m: (-len(kept[m]), m)):
        if extra <= 0:
            break
        rest = [tp for tp in kept[m][floor[m] :] if tp not in taken]
        if rest:
            owned[m].add(rest[0])
            taken.add(rest[0])
            extra -= 1
    # The rest: partitions with the fewest candidates first, each to its least loaded one.
    free = sorted((tp for tp in eligible if tp not in taken), key=lambda tp: len(eligible[tp]))
    for tp in free:
        target = min(eligible[tp], key=lambda m: (len(owned[m]) - floor[m], len(owned[m]), m))
        owned[target].add(tp)
    return _pack(owned)


def range_assignor(
    subscriptions: Mapping[str, frozenset[str]],
    topics: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges over its subscribers in member id order (the first
    N mod M members get one more)."""
    members = sorted(subscriptions)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for topic in sorted({t for subs in subscriptions.values() for t in subs}):
        subscribers = [m for m in members if topic in subscriptions[m]]
        count = topics.get(topic, 0)
        base, remainder = divmod(count, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = base + (1 if i < remainder else 0)
            owned[m].update((topic, p) for p in range(start, start + size))
            start += size
    return _pack(owned)


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_assignor}
DEFAULT_ASSIGNOR = "uniform"


def assign(
    name: str,
    subscriptions: Mapping[str, frozenset[str]],
    topics: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """The target assignment by assignor ``name`` (a KeyError for an unknown one)."""
    return ASSIGNORS[name](subscriptions, topics, previous)
