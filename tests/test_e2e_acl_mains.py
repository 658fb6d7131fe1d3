"""With the authorizer on, no client reaches a main around its proxy's ACL checks (issue 15).

The fleet of tests/test_e2e_acl_proxies.py (SASL listeners on the proxies, `authorizer =
true`, super user admin). A main enforces no ACLs itself, so: a proxy lists every main of
its zone at its own address, on every listener, the plaintext one included (a client sends
everything through the proxy, which checks it); and a main's own Kafka port answers
ApiVersions but closes anything else from a principal that is not a super user (here
User:ANONYMOUS on its plaintext port). Relayed requests, which the proxy checked, still work
(the module fixture creates its topics and ACLs through a proxy).
"""

from __future__ import annotations

from kafka_wire.codec import build_request, encode_request
from tests.fleet_process import FleetProcess
from tests.group_members import wait_until
from tests.raw_kafka import RawKafka
from tests.test_e2e_acl_proxies import ORDERS, acl_fleet
from tests.zone_fleet import ZoneFleet, raw_metadata

__all__ = ["acl_fleet"]  # the module fixture, shared with its own module's tests


def test_a_proxy_lists_its_zone_mains_at_its_own_address(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    for zone in fleet.zones:
        bootstrap = fleet.bootstrap(zone)
        raw = RawKafka(bootstrap)
        try:
            meta = raw_metadata(raw, ORDERS)
        finally:
            raw.close()
        addresses = {f"{b.host}:{b.port}" for b in meta.brokers}
        assert addresses == {bootstrap}, f"{zone}: {addresses}"
        zone_mains = {m.broker.node_id for m in fleet.config.mains if m.broker.zone == zone}
        assert zone_mains <= {int(b.node_id) for b in meta.brokers}


def test_a_mains_plaintext_port_serves_anonymous_nothing_but_api_versions(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = acl_fleet
    main = fleet.config.mains[0].broker
    raw = RawKafka(f"{main.host}:{main.port}")
    try:
        versions = raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == 0 and versions.api_keys
        raw.correlation_id += 1
        body = {
            "topics": None,
            "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False,
        }
        raw.send_frame(encode_request(3, 9, raw.correlation_id, "anon", build_request(3, 9, body)))
        assert raw.is_closed(), "a main answered Metadata to User:ANONYMOUS with the authorizer on"
    finally:
        raw.close()
    # The fleet's output is read by a thread: the line may come a moment after the close.
    wait_until(
        lambda: "a main's own listeners are for super users only" in "".join(proc.output),
        30,
        lambda: "the main did not log why it closed the connection",
    )
