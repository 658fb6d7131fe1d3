"""The cluster metadata document: every topic, its configs and which main leads each partition.

Pure data and transitions; `cluster_sync` keeps it in the object store by compare-and-swap.
The bytes are JSON (see docs/formats.md, "Cluster metadata document"):

    {"format": 1, "cluster_id": str, "version": int,
     "topics": {name: {"id": 32 hex digits, "configs": {key: value},
                       "leaders": [main node id per partition],
                       "epochs": [leader epoch per partition]}},
     "reassignments": [partition moves under way (main_broker/cluster/reassignment.py)]}

"reassignments" is written only when a move is under way, so documents without one keep
their bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from main_broker.cluster.reassignment import Move, PartitionKey, moves_from_json, moves_to_json
from zone_router import place_partitions

__all__ = ["ClusterDoc", "DocFormatError", "TopicExists", "TopicMeta", "UnknownTopic"]

FORMAT = 1


class DocFormatError(ValueError):
    pass


class TopicExists(Exception):
    pass


class UnknownTopic(Exception):
    pass


class PartitionCountChanged(ValueError):
    """CreatePartitions met a topic whose count is not what the request was checked
    against (another client grew it meanwhile): `current` is the count it has."""

    def __init__(self, name: str, current: int) -> None:
        super().__init__(f"topic {name} has {current} partitions")
        self.current = current


@dataclass(frozen=True)
class TopicMeta:
    topic_id: bytes
    configs: dict[str, str]
    leaders: tuple[int, ...]
    epochs: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.topic_id.hex(),
            "configs": dict(sorted(self.configs.items())),
            "leaders": list(self.leaders),
            "epochs": list(self.epochs),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> TopicMeta:
        topic_id = bytes.fromhex(raw["id"])
        leaders = tuple(int(x) for x in raw["leaders"])
        epochs = tuple(int(x) for x in raw["epochs"])
        if len(topic_id) != 16 or len(leaders) != len(epochs) or not leaders:
            raise DocFormatError(f"bad topic entry {raw!r}")
        configs = {str(k): str(v) for k, v in raw["configs"].items()}
        return cls(topic_id, configs, leaders, epochs)


@dataclass(frozen=True)
class ClusterDoc:
    cluster_id: str
    version: int = 0
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    # Partition reassignments under way, by (topic, partition).
    moves: dict[PartitionKey, Move] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "format": FORMAT,
            "cluster_id": self.cluster_id,
            "version": self.version,
            "topics": {name: t.to_json() for name, t in sorted(self.topics.items())},
        }
        if self.moves:
            body["reassignments"] = moves_to_json(self.moves)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ClusterDoc:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise DocFormatError(f"unknown cluster document format {raw.get('format')!r}")
            topics = {str(n): TopicMeta.from_json(t) for n, t in raw["topics"].items()}
            moves = moves_from_json(raw.get("reassignments", ()))
            return cls(str(raw["cluster_id"]), int(raw["version"]), topics, moves)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DocFormatError(f"corrupt cluster metadata document: {exc}") from exc

    def with_topic(
        self,
        name: str,
        topic_id: bytes,
        partitions: int,
        configs: dict[str, str],
        mains: Sequence[int],
    ) -> ClusterDoc:
        if name in self.topics:
            raise TopicExists(name)
        leaders = tuple(place_partitions(name, partitions, mains))
        meta = TopicMeta(topic_id, dict(configs), leaders, (0,) * partitions)
        return replace(self, version=self.version + 1, topics={**self.topics, name: meta})

    def without_topic(self, name: str) -> ClusterDoc:
        if name not in self.topics:
            raise UnknownTopic(name)
        topics = {n: t for n, t in self.topics.items() if n != name}
        return replace(self, version=self.version + 1, topics=topics)

    def with_topic_configs(self, name: str, configs: dict[str, str]) -> ClusterDoc:
        """AlterConfigs/IncrementalAlterConfigs: the topic's whole explicit config set."""
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopic(name)
        topics = {**self.topics, name: replace(meta, configs=dict(configs))}
        return replace(self, version=self.version + 1, topics=topics)

    def with_partitions(
        self,
        name: str,
        count: int,
        mains: Sequence[int],
        preferred: Sequence[int] | None = None,
    ) -> ClusterDoc:
        """CreatePartitions: the topic grows to `count` partitions, the new ones placed on
        the mains as a topic created with `count` would have them (epoch 0), except where
        `preferred` (one node id per new partition) names a main."""
        meta = self.topics.get(name)
        if meta is None:
            raise UnknownTopic(name)
        current = len(meta.leaders)
        if count <= current or (preferred is not None and len(preferred) != count - current):
            raise PartitionCountChanged(name, current)
        added = place_partitions(name, count - current, mains, first=current)
        if preferred is not None:
            added = [p if p in mains else a for p, a in zip(preferred, added, strict=True)]
        grown = replace(
            meta,
            leaders=(*meta.leaders, *added),
            epochs=(*meta.epochs, *(0,) * (count - current)),
        )
        return replace(self, version=self.version + 1, topics={**self.topics, name: grown})
