"""A main broker's access lists and SCRAM credentials: read and changed through its document
store (`main_broker.security.doc_store`), so every main of a fleet sees the same ones.

Reads go to the store each time (an admin request is rare, and a main must see what another
main wrote a moment ago); the last copy read stays in `acls` / `scram` for whoever enforces
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from kafka_wire.security_docs import ACLS_DOC, SCRAM_DOC, AclsDoc, ScramDoc
from main_broker.security.doc_store import DocumentStore
from s3_commit import ObjectStoreError

if TYPE_CHECKING:
    from main_broker.config import BrokerConfig
    from main_broker.log_store import LogStore

__all__ = ["SecurityState"]

T = TypeVar("T")


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
        data = await self.docs.load(ACLS_DOC)
        self.acls = AclsDoc() if data is None else AclsDoc.from_bytes(data)
        return self.acls

    async def read_scram(self) -> ScramDoc:
        data = await self.docs.load(SCRAM_DOC)
        self.scram = ScramDoc() if data is None else ScramDoc.from_bytes(data)
        return self.scram

    async def change_acls(self, change: Callable[[AclsDoc], tuple[AclsDoc, T]]) -> T:
        """Apply `change` to the stored ACLs (it may run again after a conflict); returns what
        the applied run returned."""
        out: list[tuple[AclsDoc, T]] = []

        def apply(data: bytes | None) -> bytes | None:
            doc = AclsDoc() if data is None else AclsDoc.from_bytes(data)
            new, result = change(doc)
            out.append((new, result))
            return None if new == doc else new.to_bytes()

        await self.docs.update(ACLS_DOC, apply)
        self.acls, result = out[-1]
        return result

    async def change_scram(self, change: Callable[[ScramDoc], tuple[ScramDoc, T]]) -> T:
        out: list[tuple[ScramDoc, T]] = []

        def apply(data: bytes | None) -> bytes | None:
            doc = ScramDoc() if data is None else ScramDoc.from_bytes(data)
            new, result = change(doc)
            out.append((new, result))
            return None if new == doc else new.to_bytes()

        await self.docs.update(SCRAM_DOC, apply)
        self.scram, result = out[-1]
        return result
