"""A main broker's access lists, SCRAM credentials and client quotas: read and changed
through its document store (`main_broker.security.doc_store`), so every main of a fleet sees
the same ones.

Reads go to the store each time (an admin request is rare, and a main must see what another
main wrote a moment ago); the last copy read stays in `acls` / `scram` for whoever enforces
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from kafka_wire.security_docs import (
    ACLS_DOC,
    QUOTAS_DOC,
    SCRAM_DOC,
    AclsDoc,
    QuotasDoc,
    ScramDoc,
)
from main_broker.security.doc_store import DocumentStore
from s3_commit import ObjectStoreError

if TYPE_CHECKING:
    from main_broker.config import BrokerConfig
    from main_broker.log_store import LogStore

__all__ = ["SecurityState"]

T = TypeVar("T")
D = TypeVar("D", AclsDoc, ScramDoc, QuotasDoc)


class DocumentsHolder(Protocol):
    """Where the fleet keeps its small documents (`main_broker.cluster.view.ClusterView`):
    the cluster metadata store, or a lone main's own WAL."""

    def documents(self) -> DocumentStore: ...


class SecurityHost(Protocol):
    """What `SecurityState` uses of its broker (`main_broker.broker.MainBroker` is one)."""

    @property
    def cluster(self) -> DocumentsHolder: ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> LogStore: ...


class SecurityState:
    def __init__(self, broker: SecurityHost) -> None:
        self._broker = broker
        self._docs: DocumentStore | None = None
        self.acls = AclsDoc()
        self.scram = ScramDoc()
        self.quotas = QuotasDoc()

    @property
    def docs(self) -> DocumentStore:
        """Chosen on first use (requests come only once the broker runs): the metadata store
        the main's cluster role opened, or without one the main's own WAL."""
        if self._docs is None:
            cluster = getattr(self._broker, "cluster", None)  # set once the broker runs
            if cluster is None:
                raise ObjectStoreError("the cluster metadata store is not open yet")
            self._docs = cluster.documents()
        return self._docs

    async def read_acls(self) -> AclsDoc:
        self.acls = await self._read(ACLS_DOC, AclsDoc)
        return self.acls

    async def read_scram(self) -> ScramDoc:
        self.scram = await self._read(SCRAM_DOC, ScramDoc)
        return self.scram

    async def read_quotas(self) -> QuotasDoc:
        self.quotas = await self._read(QUOTAS_DOC, QuotasDoc)
        return self.quotas

    async def change_acls(self, change: Callable[[AclsDoc], tuple[AclsDoc, T]]) -> T:
        """Apply `change` to the stored ACLs (it may run again after a conflict); returns what
        the applied run returned."""
        self.acls, result = await self._change(ACLS_DOC, AclsDoc, change)
        return result

    async def change_scram(self, change: Callable[[ScramDoc], tuple[ScramDoc, T]]) -> T:
        self.scram, result = await self._change(SCRAM_DOC, ScramDoc, change)
        return result

    async def change_quotas(self, change: Callable[[QuotasDoc], tuple[QuotasDoc, T]]) -> T:
        self.quotas, result = await self._change(QUOTAS_DOC, QuotasDoc, change)
        return result

    async def _read(self, name: str, kind: type[D]) -> D:
        data = await self.docs.load(name)
        return kind() if data is None else kind.from_bytes(data)

    async def _change(
        self, name: str, kind: type[D], change: Callable[[D], tuple[D, T]]
    ) -> tuple[D, T]:
        out: list[tuple[D, T]] = []

        def apply(data: bytes | None) -> bytes | None:
            doc = kind() if data is None else kind.from_bytes(data)
            new, result = change(doc)
            out.append((new, result))
            return None if new == doc else new.to_bytes()

        await self.docs.update(name, apply)
        return out[-1]
