"""A proxy's named listeners (`kafka_wire.secure_listeners`), with its copy of the SCRAM
credentials: read from the cluster metadata store (`cluster/scram.json`, docs/formats.md)
every `SCRAM_REFRESH_S`, so an authentication never waits on a main in another zone. A
changed or removed credential takes effect within that time (plus one read).
"""

from __future__ import annotations

import trio

from kafka_wire.listeners import ListenerConfig
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.secure_listeners import SCRAM_REFRESH_S, SecureListeners
from kafka_wire.security_docs import SCRAM_DOC, ScramDoc
from kafka_wire.tls import TlsSettings
from proxy_broker.documents import follow_document
from s3_commit import AsyncObjectStore
from telemetry import BadInputLog, BrokerMetrics
from telemetry.audit import AuditLog

__all__ = ["SCRAM_REFRESH_S", "ProxyListeners"]


class ProxyListeners(SecureListeners):
    def __init__(
        self,
        listeners: list[ListenerConfig],
        settings: SaslSettings,
        fleet_secret: bytes,
        metrics: BrokerMetrics,
        bad_input: BadInputLog,
        tls: TlsSettings | None = None,
        principal_rules: str | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.scram = ScramDoc()
        self.scram_synced = trio.Event()  # the stored credentials were read once
        super().__init__(
            listeners,
            settings,
            fleet_secret,
            metrics,
            bad_input,
            tls,
            principal_rules,
            audit,
            scram=lambda: self.scram,
        )

    async def keep_scram_fresh(self, store: AsyncObjectStore) -> None:
        def parse(data: bytes | None) -> ScramDoc:
            return ScramDoc() if data is None else ScramDoc.from_bytes(data)

        def apply(doc: ScramDoc) -> None:
            self.scram = doc
            self.scram_synced.set()

        await follow_document(store, SCRAM_DOC, parse, apply, SCRAM_REFRESH_S)
