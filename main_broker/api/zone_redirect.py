"""A client that reaches a main outside its zone while its zone has a live proxy is sent back
to that proxy.

While a zone has no live proxy, the mains show its clients the real mains (the fallback), and
they produce and fetch across zones, straight to each partition's main. A client keeps the
brokers of its last Metadata until an error makes it ask again (librdkafka refreshes every
5 minutes otherwise), so once the proxy is back, a Produce or Fetch of such a client for a
partition whose leader its zone view names differently (its zone's proxy) is answered
NOT_LEADER_OR_FOLLOWER, with the proxy as the KIP-951 current leader and its endpoint: the
client moves there at once, or asks Metadata again (older clients), which shows its zone's
view. Nothing is appended for those partitions (a retriable refusal, so an idempotent
producer's sequence is untouched). A client whose zone view includes this main (its own zone,
a zone without a live proxy, an unknown zone, a proxy's relay) is served as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kafka_wire.leader_hints import PartitionKey

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext


def misplaced(
    broker: BrokerServices, ctx: RequestContext, partitions: Sequence[PartitionKey]
) -> frozenset[PartitionKey]:
    """The partitions of `partitions` that the client's zone view gives to another node than
    this main (those another main leads included: they are refused anyway)."""
    if not broker.config.zone_proxies or not partitions:
        return frozenset()
    own = broker.config.node_id
    leaders, _ = broker.leader_hints(ctx)(partitions)
    return frozenset(key for key, (leader, _) in leaders.items() if leader != own)
