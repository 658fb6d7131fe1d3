"""Client zone resolution: listener, client.id markers, CIDR map, Fetch rack_id."""

from __future__ import annotations

import logging

import pytest

from zone_router import (
    OTHER_UNKNOWN,
    CidrZoneMap,
    Zone,
    ZoneDecision,
    ZoneMap,
    ZoneResolver,
    parse_client_id_markers,
    parse_client_id_zone,
)

ZONES = ZoneMap(
    [Zone("us-east-1a", "use1-az1"), Zone("us-east-1b", "use1-az2"), Zone("us-east-1c", "use1-az3")]
)
CIDRS = {
    "10.0.0.0/16": "us-east-1a",
    "10.0.1.0/24": "use1-az2",  # an AZ id works too
    "10.0.1.128/25": "us-east-1c",
    "2600:1f18:1000::/40": "us-east-1a",
    "2600:1f18:1010::/48": "us-east-1b",
}


@pytest.mark.parametrize(
    ("client_id", "expected"),
    [
        ("zone=az1", "az1"),
        ("zone=us-east-1a", "us-east-1a"),
        ("my-app,zone=us-east-1b", "us-east-1b"),
        ("my-app&zone=us-east-1b&x=1", "us-east-1b"),
        ("my-app;zone=use1-az1;x=1", "use1-az1"),
        ("automq_type=producer&automq_az=us-east-1a&automq_role=x", "us-east-1a"),
        ("automq_az=us-east-1a%20", "us-east-1a"),  # percent-encoded, URI-query style
        ("app,warpstream_az=use1-az2,ws_si=abc", "use1-az2"),
        ("ws_az=us-east-1c,warpstream_proxy_target=x", "us-east-1c"),
        ("diskless_az=use1-az3", "use1-az3"),
        ("ZONE=US-EAST-1A", "US-EAST-1A"),
        ("Automq_AZ=use1-az1", "use1-az1"),
        ("app zone=us-east-1a", "us-east-1a"),
        # the first marker in the string wins
        ("ws_az=us-east-1b,zone=us-east-1a", "us-east-1b"),
        # no marker
        ("connector-producer-x-0", None),
        ("connect-worker-1-consumer-group-sink", None),
        ("consumer-my-group-1", None),
        ("myapp_zone=us-east-1a", None),  # not a whole key
        ("zone_id=us-east-1a", None),
        ("zone=", None),
        ("zone", None),
        ("", None),
        (None, None),
    ],
)
def test_client_id_markers(client_id: str | None, expected: str | None) -> None:
    assert parse_client_id_zone(client_id) == expected


def test_all_markers_are_listed_in_order() -> None:
    assert parse_client_id_markers("zone=bogus,x=1,diskless_az=use1-az1&ws_az=b") == [
        ("zone", "bogus"),
        ("diskless_az", "use1-az1"),
        ("ws_az", "b"),
    ]


def _resolve(r: ZoneResolver, **kw: str | None) -> ZoneDecision:
    args: dict[str, str | None] = {"listener_zone": None, "client_id": None, "client_host": None}
    args.update(kw)
    return r.resolve(
        listener_zone=args["listener_zone"],
        client_id=args["client_id"],
        client_host=args["client_host"],
        rack_id=args.get("rack_id"),
    )


def test_resolution_order_listener_client_id_cidr_rack() -> None:
    r = ZoneResolver(ZONES, CIDRS)
    everything: dict[str, str | None] = {
        "listener_zone": "use1-az3",
        "client_id": "app,ws_az=us-east-1b",
        "client_host": "10.0.0.5",
        "rack_id": "us-east-1a",
    }
    assert _resolve(r, **everything) == ZoneDecision("us-east-1c", "listener")
    everything["listener_zone"] = None
    assert _resolve(r, **everything) == ZoneDecision("us-east-1b", "client_id")
    everything["client_id"] = "connector-producer-x-0"
    assert _resolve(r, **everything) == ZoneDecision("us-east-1a", "cidr")
    everything["client_host"] = "192.168.1.1"
    everything["rack_id"] = "use1-az2"
    assert _resolve(r, **everything) == ZoneDecision("us-east-1b", "rack")
    everything["rack_id"] = None
    assert _resolve(r, **everything) == ZoneDecision(None, "unknown")
    assert r.unknown_values == {}  # nothing unknown was ever offered


def test_unknown_values_fall_through_and_are_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = ZoneResolver(ZONES, CIDRS)
    caplog.set_level(logging.WARNING, logger="zonefleet.zone_router")
    for _ in range(3):
        d = _resolve(
            r,
            listener_zone="eu-west-1a",
            client_id="zone=Mars,ws_az=use1-az2",
            client_host="10.0.0.1",
        )
        assert d == ZoneDecision("us-east-1b", "client_id")
    d = _resolve(r, client_id="zone=mars", rack_id="use1-az9")
    assert d == ZoneDecision(None, "unknown")
    assert r.unknown_values == {"eu-west-1a": 3, "mars": 4, "use1-az9": 1}
    assert r.unknown_by_source == {"listener": 3, "client_id": 4, "rack": 1}
    messages = [rec.getMessage() for rec in caplog.records if rec.name == "zonefleet.zone_router"]
    assert len(messages) == 3
    assert sum("'mars'" in m for m in messages) == 1


def test_unknown_values_are_reported_to_a_hook_by_source() -> None:
    seen: list[str] = []
    r = ZoneResolver(ZONES, CIDRS, on_unknown=seen.append)
    _resolve(r, listener_zone="eu-west-1a", client_id="zone=mars", rack_id="use1-az9")
    _resolve(r, client_id="zone=us-east-1a")
    assert seen == ["listener", "client_id", "rack"]


def test_unknown_value_tracking_is_bounded() -> None:
    r = ZoneResolver(ZONES, max_tracked_unknown=4)
    for i in range(50):
        _resolve(r, client_id=f"zone=nowhere-{i}")
    assert len(r.unknown_values) == 5
    assert r.unknown_values[OTHER_UNKNOWN] == 46
    assert sum(r.unknown_values.values()) == 50
    # A very long value is tracked under a bounded key.
    r2 = ZoneResolver(ZONES)
    _resolve(r2, rack_id="x" * 5000)
    assert [len(k) for k in r2.unknown_values] == [64]


@pytest.mark.parametrize(
    ("host", "zone"),
    [
        ("10.0.0.1", "us-east-1a"),
        ("10.0.1.1", "us-east-1b"),  # /24 beats /16
        ("10.0.1.200", "us-east-1c"),  # /25 beats /24
        ("10.0.1.127", "us-east-1b"),
        ("10.1.0.1", None),
        ("::ffff:10.0.1.129", "us-east-1c"),  # IPv4 peer on a dual-stack socket
        ("2600:1f18:1000::1", "us-east-1a"),
        ("2600:1f18:1010:ab::1", "us-east-1b"),
        ("[2600:1f18:1010::7]", "us-east-1b"),
        ("2600:1f18:1010::7%eth0", "us-east-1b"),
        ("2600:1f19::1", None),
        ("::1", None),
        ("not-an-ip", None),
        ("10.0.0.1:9092", None),
        ("10.0.0", None),
        ("", None),
        (None, None),
    ],
)
def test_cidr_longest_prefix_ipv4_and_ipv6(host: str | None, zone: str | None) -> None:
    r = ZoneResolver(ZONES, CIDRS)
    expected = ZoneDecision(zone, "cidr") if zone else ZoneDecision(None, "unknown")
    assert _resolve(r, client_host=host) == expected
    assert r.unknown_values == {}  # malformed hosts are ignored, not counted


def test_cidr_order_in_config_does_not_matter() -> None:
    reversed_map = dict(reversed(list(CIDRS.items())))
    a, b = CidrZoneMap(ZONES, CIDRS), CidrZoneMap(ZONES, reversed_map)
    for host in ("10.0.0.1", "10.0.1.1", "10.0.1.200", "2600:1f18:1010::1"):
        assert a.lookup(host) == b.lookup(host)
    assert len(a) == 5


def test_default_route_catches_everything_else() -> None:
    m = CidrZoneMap(ZONES, {"0.0.0.0/0": "us-east-1c", "10.0.0.0/8": "us-east-1a"})
    assert m.lookup("10.9.9.9") == "us-east-1a"
    assert m.lookup("8.8.8.8") == "us-east-1c"
    assert m.lookup("2001:db8::1") is None


@pytest.mark.parametrize(
    "cidrs",
    [
        {"10.0.0.0/33": "us-east-1a"},
        {"10.0.0.1/24": "us-east-1a"},  # host bits set: almost always a typo
        {"banana": "us-east-1a"},
        {"10.0.0.0/24": "eu-west-1a"},
        {"10.0.0.0/24": "us-east-1a", " 10.0.0.0/24": "us-east-1b"},
    ],
)
def test_bad_cidr_config_is_rejected(cidrs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        ZoneResolver(ZONES, cidrs)
