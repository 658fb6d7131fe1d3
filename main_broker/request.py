"""What the main broker knows of one Kafka request besides its body: its header and the
connection it came on (the request handlers in main_broker/api get it with every request)."""

from __future__ import annotations

from dataclasses import dataclass

from kafka_wire.codec import RequestHeader
from kafka_wire.server_loop import ConnectionInfo


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    conn: ConnectionInfo
