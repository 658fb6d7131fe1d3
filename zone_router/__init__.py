"""Zone router: works out which zone a client is in and rewrites broker-naming
responses so each client sees only its own zone. Pure logic, no I/O; both broker kinds
use it, and it imports no other zonefleet package.

Metrics are plain values the caller reads: ``ZoneResolver.unknown_values`` /
``unknown_by_source`` and each rewrite's ``fallback_cross_zone``.
"""

from zone_router.client_id import ZONE_MARKERS, parse_client_id_markers, parse_client_id_zone
from zone_router.placement import group_coordinator, place_partitions
from zone_router.resolver import OTHER_UNKNOWN, CidrZoneMap, Source, ZoneDecision, ZoneResolver
from zone_router.rewrite import (
    ClientView,
    Endpoint,
    LeaderHints,
    Mode,
    RewriteResult,
    client_view,
    preferred_read_replica,
    rewrite_describe_cluster,
    rewrite_describe_topic_partitions,
    rewrite_find_coordinator,
    rewrite_leader_hints,
    rewrite_metadata,
)
from zone_router.topology import Node, Role, Topology
from zone_router.zones import Zone, ZoneMap

__all__ = [
    "OTHER_UNKNOWN",
    "ZONE_MARKERS",
    "CidrZoneMap",
    "ClientView",
    "Endpoint",
    "LeaderHints",
    "Mode",
    "Node",
    "RewriteResult",
    "Role",
    "Source",
    "Topology",
    "Zone",
    "ZoneDecision",
    "ZoneMap",
    "ZoneResolver",
    "client_view",
    "group_coordinator",
    "parse_client_id_markers",
    "parse_client_id_zone",
    "place_partitions",
    "preferred_read_replica",
    "rewrite_describe_cluster",
    "rewrite_describe_topic_partitions",
    "rewrite_find_coordinator",
    "rewrite_leader_hints",
    "rewrite_metadata",
]
