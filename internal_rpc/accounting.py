"""Traffic accounting of internal RPC: which channel and api each call is booked to.

Channels by method: ``confirm`` -> ``confirm-rpc`` (requests = partitions confirmed, so
bytes/requests reads as bytes per confirmed partition), ``state`` -> ``state-stream`` (one
request per frame: the subscribe, each pushed delta, the end), ``relay`` -> ``relay`` (api = the
Kafka API name of the relayed request, so group and admin relays can be told apart), anything
else -> ``rpc`` with the method as api (``_handshake``, ``cancel``, control calls). Zones come
from the peer's node id; a node the map does not know is booked to ``unknown``.

Each frame is booked once in the fleet, by the node that sends it: both ends of a connection
run a meter, and the receiving end ignores what it reads. Summing every node's ledger then
gives the bytes on the wire, and each node's ledger is its own egress.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kafka_wire.server_loop import RecordTraffic, api_name

__all__ = ["RPC_CHANNELS", "CallTag", "RpcTrafficMeter"]

CallTag = tuple[str, str, int]  # (channel, api, requests per frame)

RPC_CHANNELS: Final[dict[str, str]] = {
    "confirm": "confirm-rpc",
    "state": "state-stream",
    "relay": "relay",
}
_OTHER: Final = "rpc"
_UNKNOWN_ZONE: Final = "unknown"
_CANCEL: Final[CallTag] = (_OTHER, "cancel", 1)


def _relay_api(params: dict[str, Any]) -> str:
    frame = params.get("frame")
    if isinstance(frame, bytes | bytearray | memoryview) and len(frame) >= 2:
        return api_name(int.from_bytes(frame[:2], "big", signed=True))
    return "relay"


def _confirm_parts(params: dict[str, Any]) -> int:
    parts = params.get("parts")
    return len(parts) if isinstance(parts, list) else 0


class RpcTrafficMeter:
    """An `internal_rpc.RpcMeter` that books frames between `zone` and each peer's zone."""

    def __init__(
        self, record: RecordTraffic, zone: str, node_zones: Mapping[int, str] | None = None
    ) -> None:
        self._record = record
        self.zone = zone
        self.node_zones: dict[int, str] = dict(node_zones or {})

    def classify(self, method: str, params: dict[str, Any]) -> CallTag:
        if method == "confirm":
            return ("confirm-rpc", method, _confirm_parts(params))
        if method == "relay":
            return ("relay", _relay_api(params), 1)
        channel = RPC_CHANNELS.get(method)
        return (channel, method, 1) if channel is not None else (_OTHER, method, 1)

    def count(self, tag: CallTag | None, direction: str, nbytes: int, peer_node: int) -> None:
        if direction != "out":
            return  # the sender books it
        channel, api, requests = tag if tag is not None else _CANCEL
        self._record(
            self.zone, self.node_zones.get(peer_node, _UNKNOWN_ZONE), channel, api, nbytes, requests
        )
