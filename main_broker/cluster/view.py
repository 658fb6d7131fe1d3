"""What a main knows of the fleet of mains it serves in, one interface for one main or several.

`ClusterView` is what request handlers and the broker ask: which mains there are and how
clients reach them, who coordinates a group, whose producer ids these are, whether this main
may append and acknowledge, and how a topic change reaches every main. Two implementations:

- `LoneMain` (this module): no metadata store; the fleet is this main. It is the controller
  and every group's coordinator, hands out producer ids as its store allocates them, is
  always fresh, and a topic change is a change of its own store (its WAL).
- `ClusterRole` (main_broker/cluster/role.py): several mains sharing the cluster metadata
  document in an object store; topic changes go through that document by compare-and-swap.

`MainBroker.cluster` holds one of them once the broker runs, so callers never branch on
which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from main_broker.cluster.doc import ClusterDoc, PartitionCountChanged, TopicMeta, UnknownTopic
from main_broker.config import BrokerConfig, MainPeer
from main_broker.security.doc_store import DocumentStore, WalDocuments

if TYPE_CHECKING:
    from internal_rpc import RpcClient
    from internal_rpc.messages import MainUnreachable
    from main_broker.log_store import LogStore, TopicState
    from main_broker.partition_log import PartitionLog

__all__ = ["ClusterView", "LoneMain"]

DocChange = Callable[[ClusterDoc], ClusterDoc]


class ClusterView(Protocol):
    """The fleet of mains as this main sees it (see the module docstring)."""

    @property
    def mains(self) -> list[MainPeer]:
        """Every main, by node id, as clients and peers reach it."""
        ...

    @property
    def main_ids(self) -> list[int]:
        """Every main's node id, ascending; the first is the controller clients are told."""
        ...

    def coordinator_for(self, group_id: str) -> MainPeer:
        """The main that coordinates this group."""
        ...

    def owns_group(self, group_id: str) -> bool:
        """Whether this main coordinates this group."""
        ...

    def producer_id(self, local_id: int) -> int:
        """The fleet-wide producer id of one this main's store allocated."""
        ...

    def peer_rpc(self, node_id: int) -> RpcClient | None:
        """The internal RPC client to another main (None: no such main, or no RPC)."""
        ...

    def reads_fresh(self) -> bool:
        """Whether this main may serve reads now: no other main can have taken a partition
        over from it unnoticed (main_broker/cluster/liveness.py)."""
        ...

    async def wait_reads_fresh(self, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until `reads_fresh`; what it is then."""
        ...

    def may_acknowledge(self, plog: PartitionLog) -> bool:
        """Whether an append that just became durable may be acknowledged."""
        ...

    async def refresh(self) -> None:
        """Read what other mains may have changed moments ago (topics, partition counts)."""
        ...

    def poke(self) -> None:
        """Another main says the shared metadata changed: read it soon."""
        ...

    def main_unreachable(self, report: MainUnreachable, reporter: int) -> None:
        """A proxy or main lost its connection to a main (main_broker/cluster/watch.py)."""
        ...

    def documents(self) -> DocumentStore:
        """Where the cluster's small documents (ACLs, SCRAM credentials) live."""
        ...

    def live_topic_ids(self) -> set[bytes] | None:
        """Every topic id of an authoritative shared topic list, or None without one (a main's
        own WAL is none: it may have been wiped)."""
        ...

    def status(self) -> dict[str, Any] | None:
        """The admin status of the fleet role (None for a lone main)."""
        ...

    # -- topic changes: made for every main; the store follows -------------------------------

    def topic_exists(self, name: str) -> bool: ...

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicState:
        """The new topic (as this main's store holds it); may raise TopicExists."""
        ...

    async def delete_topic(self, name: str) -> None: ...

    async def alter_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]:
        """Apply `change` to the topic's explicit configs; the new set. May raise UnknownTopic
        or what `change` raises."""
        ...

    async def create_partitions(
        self, name: str, count: int, preferred: list[int] | None = None
    ) -> None:
        """Grow the topic to `count` partitions; may raise UnknownTopic, or
        PartitionCountChanged / ValueError when it has `count` or more already."""
        ...

    # -- partition reassignment (main_broker/cluster/reassignment.py)
    # ---------------------------------

    def document(self) -> ClusterDoc:
        """The cluster metadata document as this main last read it."""
        ...

    async def change_document(self, change: DocChange) -> None:
        """Apply `change` to the document (it may run again under contention) and tell the
        other mains. Raises ObjectStoreError or OSError when the store did not take it."""
        ...


class LoneMain:
    """The fleet of one: a main without a metadata store (see the module docstring)."""

    def __init__(self, config: BrokerConfig, store: LogStore) -> None:
        self._config = config
        self._store = store

    @property
    def mains(self) -> list[MainPeer]:
        cfg = self._config
        host, port = cfg.advertised  # read each time: the port is known once bound
        return [MainPeer(cfg.node_id, cfg.zone, host, port, cfg.rpc_port)]

    @property
    def main_ids(self) -> list[int]:
        return [self._config.node_id]

    def coordinator_for(self, group_id: str) -> MainPeer:
        return self.mains[0]

    def owns_group(self, group_id: str) -> bool:
        return True

    def producer_id(self, local_id: int) -> int:
        return local_id

    def peer_rpc(self, node_id: int) -> RpcClient | None:
        return None

    def reads_fresh(self) -> bool:
        return True  # no other main can take a partition over

    async def wait_reads_fresh(self, timeout_s: float) -> bool:
        return True

    def may_acknowledge(self, plog: PartitionLog) -> bool:
        return True

    async def refresh(self) -> None:
        pass  # no one else changes its topics

    def poke(self) -> None:
        pass

    def main_unreachable(self, report: MainUnreachable, reporter: int) -> None:
        pass  # no other main to lose

    def documents(self) -> DocumentStore:
        return WalDocuments(self._store)

    def live_topic_ids(self) -> set[bytes] | None:
        return None

    def status(self) -> dict[str, Any] | None:
        return None

    def topic_exists(self, name: str) -> bool:
        return name in self._store.topics

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicState:
        return await self._store.create_topic(name, partitions, configs)

    async def delete_topic(self, name: str) -> None:
        await self._store.delete_topic(name)

    async def alter_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]:
        state = self._store.topics.get(name)
        if state is None:
            raise UnknownTopic(name)
        configs = change(dict(state.configs))
        await self._store.alter_topic_configs(name, configs)
        return configs

    async def create_partitions(
        self, name: str, count: int, preferred: list[int] | None = None
    ) -> None:
        state = self._store.topics.get(name)
        if state is None:
            raise UnknownTopic(name)
        if count <= len(state.partitions):
            raise PartitionCountChanged(name, len(state.partitions))
        await self._store.add_partitions(name, count)

    def document(self) -> ClusterDoc:
        """The document a fleet of this main alone would have: every partition led by it, no
        reassignment under way."""
        node = self._config.node_id
        topics = {
            n: TopicMeta(t.topic_id, {}, (node,) * len(t.partitions), (0,) * len(t.partitions))
            for n, t in self._store.topics.items()
        }
        return ClusterDoc(self._config.cluster_id, 0, topics)

    async def change_document(self, change: DocChange) -> None:
        """Decides on `document()` and records nothing: the only replica list that stands is
        the one naming this main, which it already is."""
        change(self.document())
