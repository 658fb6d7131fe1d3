"""OffsetForLeaderEpoch's answers (kafka_wire/leader_epochs.py), on a stand-in store."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_wire.leader_epochs import offsets_for_leader_epochs


@dataclass
class _Part:
    owned: bool = True
    leader_epoch: int = 3
    next_offset: int = 120


@dataclass
class _Topic:
    partitions: list[_Part] = field(default_factory=list)


class _Source:
    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics

    def topic_by_name(self, name: str) -> Any:
        return self.topics.get(name)


def _request(*wants: tuple[str, int, int, int]) -> Any:
    topics: dict[str, list[Any]] = {}
    for topic, partition, current, epoch in wants:
        topics.setdefault(topic, []).append(
            SimpleNamespace(partition=partition, current_leader_epoch=current, leader_epoch=epoch)
        )
    return SimpleNamespace(
        topics=[SimpleNamespace(topic=t, partitions=ps) for t, ps in topics.items()]
    )


def test_every_epoch_up_to_the_current_one_ends_at_the_log_end() -> None:
    source = _Source({"t": _Topic([_Part(), _Part(owned=False)])})
    answer = offsets_for_leader_epochs(
        source,  # type: ignore[arg-type]
        _request(
            ("t", 0, -1, 3),  # the current epoch
            ("t", 0, 3, 1),  # an older one: its log is a prefix of today's
            ("t", 0, -1, 7),  # one not reached yet: undefined
            ("t", 0, 2, 3),  # the consumer's current epoch is behind: fenced
            ("t", 0, 4, 3),  # ahead: unknown
            ("t", 1, -1, 3),  # led elsewhere
            ("t", 9, -1, 3),
        ),
    )
    rows = [
        (p["error_code"], p["leader_epoch"], p["end_offset"])
        for p in answer["topics"][0]["partitions"]
    ]
    assert rows == [
        (ErrorCode.none, 3, 120),
        (ErrorCode.none, 1, 120),
        (ErrorCode.none, -1, -1),
        (ErrorCode.fenced_leader_epoch, -1, -1),
        (ErrorCode.unknown_leader_epoch, -1, -1),
        (ErrorCode.not_leader_or_follower, -1, -1),
        (ErrorCode.unknown_topic_or_partition, -1, -1),
    ]
    unknown = offsets_for_leader_epochs(source, _request(("nope", 0, -1, 0)))  # type: ignore[arg-type]
    assert unknown["topics"][0]["partitions"][0]["error_code"] == (
        ErrorCode.unknown_topic_or_partition
    )
