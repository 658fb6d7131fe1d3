"""ZoneMap and Topology: names and AZ ids both ways, node zones, live proxies."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zone_router import Node, Topology, Zone, ZoneMap

ZONES = ZoneMap(
    [Zone("us-east-1a", "use1-az1"), Zone("us-east-1b", "use1-az2"), Zone("us-east-1c", None)]
)


def test_names_and_az_ids_map_to_the_zone_name_case_insensitively() -> None:
    assert ZONES.canonical("us-east-1a") == "us-east-1a"
    assert ZONES.canonical("use1-az1") == "us-east-1a"
    assert ZONES.canonical("  USE1-AZ2 ") == "us-east-1b"
    assert ZONES.canonical("US-East-1C") == "us-east-1c"
    assert ZONES.az_id("us-east-1b") == "use1-az2"
    assert ZONES.az_id("use1-az2") == "use1-az2"
    assert ZONES.az_id("us-east-1c") is None
    assert ZONES.canonical("use1-az3") is None
    assert ZONES.canonical("") is None
    assert ZONES.canonical(None) is None
    assert "use1-az1" in ZONES and "eu-west-1a" not in ZONES
    assert ZONES.names == ("us-east-1a", "us-east-1b", "us-east-1c")


def test_from_mapping_matches_explicit_zones() -> None:
    zones = ZoneMap.from_mapping({"us-east-2a": "use2-az1", "us-east-2b": "use2-az3"})
    assert zones.canonical("use2-az3") == "us-east-2b"
    assert [z.name for z in zones] == ["us-east-2a", "us-east-2b"]


@pytest.mark.parametrize(
    "zones",
    [
        [Zone("a", "x"), Zone("a", "y")],  # same name twice
        [Zone("a", "x"), Zone("b", "X")],  # one AZ id for two zones
        [Zone("a", "b"), Zone("b", "c")],  # a name that is another zone's id
        [Zone("", "x")],
        [Zone("a", "")],
    ],
)
def test_ambiguous_or_empty_zone_config_is_rejected(zones: list[Zone]) -> None:
    with pytest.raises(ValueError):
        ZoneMap(zones)


def _nodes() -> list[Node]:
    return [
        Node(1, "use1-az1", "main", "m1", 9092),
        Node(2, "us-east-1b", "main", "m2", 9092),
        Node(101, "US-EAST-1A", "proxy", "p1", 9092),
        Node(102, "use1-az2", "proxy", "p2", 9092),
    ]


def test_topology_canonicalises_node_zones_and_finds_proxies_by_name_or_id() -> None:
    topo = Topology(ZONES, _nodes())
    n1 = topo.node(1)
    assert n1 is not None and n1.zone == "us-east-1a"
    assert topo.zone_of(102) == "us-east-1b"
    assert topo.zone_of(999) is None and topo.node(999) is None
    p = topo.proxy_for("use1-az1")
    assert p is not None and p.node_id == 101
    p = topo.proxy_for("us-east-1b")
    assert p is not None and p.node_id == 102
    assert topo.proxy_for("us-east-1c") is None
    assert topo.proxy_for("nowhere") is None
    assert topo.proxy_for(None) is None
    assert [n.node_id for n in topo.mains] == [1, 2]
    assert [n.node_id for n in topo.mains_in("use1-az2")] == [2]
    assert topo.mains_in("us-east-1c") == ()


def test_only_live_proxies_are_used() -> None:
    topo = Topology(ZONES, _nodes(), live_proxies={102, 1, 555})
    assert topo.proxy_for("us-east-1a") is None
    assert [p.node_id for p in topo.live_proxies] == [102]
    assert topo.is_live(1) and topo.is_live(102) and not topo.is_live(101)
    assert not topo.is_live(555)
    again = topo.with_live_proxies(None)
    p = again.proxy_for("us-east-1a")
    assert p is not None and p.node_id == 101
    assert topo.with_live_proxies(set()).live_proxies == ()


def test_with_two_live_proxies_in_a_zone_the_lowest_id_serves() -> None:
    nodes = [*_nodes(), Node(100, "us-east-1a", "proxy", "p0", 9092)]
    p = Topology(ZONES, nodes).proxy_for("us-east-1a")
    assert p is not None and p.node_id == 100
    p = Topology(ZONES, nodes, live_proxies={101}).proxy_for("us-east-1a")
    assert p is not None and p.node_id == 101


@pytest.mark.parametrize(
    "extra",
    [
        Node(9, "eu-west-1a", "main", "h", 1),  # unknown zone
        Node(1, "us-east-1a", "main", "h", 1),  # duplicate id
        Node(9, "us-east-1a", "leader", "h", 1),  # type: ignore[arg-type]
    ],
)
def test_bad_nodes_are_rejected(extra: Node) -> None:
    with pytest.raises(ValueError):
        Topology(ZONES, [*_nodes(), extra])


def test_zone_router_imports_no_other_zonefleet_package() -> None:
    ours = {
        "kafka_wire", "main_broker", "proxy_broker", "shared_wal", "s3_commit",
        "telemetry", "cost_report", "fleet",
    }  # fmt: skip
    package = Path(__file__).resolve().parent.parent / "zone_router"
    imported: set[str] = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "zone_router" in imported  # the scan sees the package's own imports
    assert not imported & ours
