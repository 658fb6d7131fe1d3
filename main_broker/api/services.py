"""What the request handlers use of their broker: `BrokerServices`, which
`main_broker.broker.MainBroker` satisfies (mypy checks it where broker.py hands the handlers
`self`), so no handler imports main_broker.broker; and `Handler`, the shape of a handler in
the broker's dispatch table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from main_broker.append import AppendHost
from main_broker.request import RequestContext

if TYPE_CHECKING:
    from kafka_wire.leader_hints import HintSource
    from kafka_wire.quotas.enforcer import QuotaEnforcer
    from main_broker.api.confirm import ConfirmSequencer
    from main_broker.appender import Appender
    from main_broker.cluster.view import ClusterView
    from main_broker.config import BrokerConfig
    from main_broker.groups.coordinator import GroupCoordinator
    from main_broker.groups.txn_offsets import PendingTxnOffsets
    from main_broker.log_store import LogStore
    from main_broker.objects.retention import ObjectRetention
    from main_broker.partition_log import PartitionLog
    from main_broker.security.state import SecurityState
    from main_broker.txn.coordinator import TxnCoordinator
    from telemetry import BrokerMetrics
    from telemetry.audit import AuditLog


class BrokerServices(AppendHost, Protocol):
    """The broker as its request handlers see it (read-only attributes and the topic
    operations that also notify the store)."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def store(self) -> LogStore: ...
    @property
    def appender(self) -> Appender: ...
    @property
    def metrics(self) -> BrokerMetrics: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def security(self) -> SecurityState: ...
    @property
    def quotas(self) -> QuotaEnforcer: ...
    @property
    def audit(self) -> AuditLog: ...
    @property
    def retention(self) -> ObjectRetention | None: ...
    @property
    def confirms(self) -> ConfirmSequencer: ...
    @property
    def coordinator(self) -> GroupCoordinator: ...
    @property
    def txn(self) -> TxnCoordinator: ...
    @property
    def txn_offsets(self) -> PendingTxnOffsets: ...

    def may_append(self, plog: PartitionLog) -> bool: ...

    def direct_client(self, ctx: RequestContext) -> bool: ...
    def leader_hints(self, ctx: RequestContext) -> HintSource: ...
    def topic_exists(self, name: str) -> bool: ...
    async def auto_create_topic(self, name: str) -> None: ...
    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> Any: ...
    async def delete_topic(self, name: str) -> None: ...
    async def alter_topic_configs(
        self, name: str, change: Callable[[dict[str, str]], dict[str, str]]
    ) -> dict[str, str]: ...
    async def create_partitions(
        self, name: str, count: int, preferred: list[int] | None = None
    ) -> None: ...


Handler = Callable[[BrokerServices, RequestContext, Any], Awaitable[Any]]
