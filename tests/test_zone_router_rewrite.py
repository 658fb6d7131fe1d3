"""Response rewrites: each client sees its own zone, unknown zones get KIP-392 replicas, and a
zone without a live proxy falls back to the real mains."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from kafka_wire.codec import RequestHeader, build_response, decode_response, encode_response
from zone_router import (
    Node,
    Topology,
    Zone,
    ZoneMap,
    client_view,
    preferred_read_replica,
    rewrite_describe_cluster,
    rewrite_describe_topic_partitions,
    rewrite_find_coordinator,
    rewrite_leader_hints,
    rewrite_metadata,
)

A, B, C = "us-east-1a", "us-east-1b", "us-east-1c"
ZONES = ZoneMap([Zone(A, "use1-az1"), Zone(B, "use1-az2"), Zone(C, "use1-az3")])
NODES = [
    Node(1, A, "main", "m1.a", 9001),
    Node(2, B, "main", "m2.b", 9002),
    Node(3, "use1-az3", "main", "m3.c", 9003),
    Node(4, A, "main", "m4.a", 9004),
    Node(101, A, "proxy", "p1.a", 9101),
    Node(102, B, "proxy", "p2.b", 9102),
    Node(103, C, "proxy", "p3.c", 9103),
]
OWNERS = {0: 1, 1: 2, 2: 3, 3: 4}  # partition -> owning main
TOPIC_ID = uuid.UUID("6f1c1f4e-3b9a-4bb1-9c55-1d7c1a0f2e11")


def topology(live: set[int] | None = None, nodes: list[Node] = NODES) -> Topology:
    return Topology(ZONES, nodes, live)


def metadata() -> dict[str, Any]:
    """What the mains answer: real leaders, stale hosts that the rewrite must not trust."""
    return {
        "throttle_time": 0,
        "brokers": [
            {"node_id": n, "host": f"stale-{n}", "port": 1, "rack": None} for n in (1, 2, 3, 4)
        ],
        "cluster_id": "zf",
        "controller_id": 2,
        "topics": [
            {
                "error_code": 0,
                "name": "t",
                "topic_id": TOPIC_ID,
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": 0,
                        "partition_index": p,
                        "leader_id": owner,
                        "leader_epoch": 10 + p,
                        "replica_nodes": [owner],
                        "isr_nodes": [owner],
                        "offline_replicas": [99],
                    }
                    for p, owner in OWNERS.items()
                ],
            },
            {"error_code": 3, "name": "missing", "partitions": []},
        ],
    }


def brokers(data: dict[str, Any]) -> list[tuple[int, str, int, str | None]]:
    return [(b["node_id"], b["host"], b["port"], b["rack"]) for b in data["brokers"]]


def partitions(data: dict[str, Any]) -> dict[int, tuple[int, int, list[int], list[int], list[int]]]:
    return {
        p["partition_index"]: (
            p["leader_id"],
            p["leader_epoch"],
            p["replica_nodes"],
            p["isr_nodes"],
            p["offline_replicas"],
        )
        for p in data["topics"][0]["partitions"]
    }


@pytest.mark.parametrize("zone", [A, "use1-az1", "US-EAST-1A"])
def test_client_in_zone_sees_only_its_zone(zone: str) -> None:
    original = metadata()
    before = copy.deepcopy(original)
    result = rewrite_metadata(original, zone, topology())
    assert original == before  # the input (maybe a cached main answer) is untouched
    assert not result.fallback_cross_zone and result.mode == "zone"
    assert brokers(result.data) == [
        (1, "m1.a", 9001, A),
        (4, "m4.a", 9004, A),
        (101, "p1.a", 9101, A),
    ]
    assert partitions(result.data) == {
        0: (1, 10, [1], [1], []),  # main in A keeps its partition
        1: (101, 11, [101], [101], []),  # B's partition goes through A's proxy
        2: (101, 12, [101], [101], []),
        3: (4, 13, [4], [4], []),
    }
    assert result.data["controller_id"] == 101  # the controller (2) is in B
    assert result.data["topics"][1] == before["topics"][1]
    assert result.data["cluster_id"] == "zf"


def test_a_zone_main_that_is_down_is_reached_through_the_zone_proxy() -> None:
    """The zone proxy lost its state stream from main 1 (killed): A's clients get 1's
    partitions from the proxy, which answers NOT_LEADER_OR_FOLLOWER with hints until another
    main takes them over, instead of retrying a dead address until a refresh. Main 1 stays
    listed, leading nothing: librdkafka would otherwise drop its broker while a cached
    coordinator still points at it, and wait on it forever."""
    down = topology().with_down_mains([1])
    assert not down.main_up(1) and down.main_up(4)
    assert topology().main_up(1)
    result = rewrite_metadata(metadata(), A, down)
    assert brokers(result.data) == [
        (1, "p1.a", 9101, A),  # at the proxy's address while it is down
        (4, "m4.a", 9004, A),
        (101, "p1.a", 9101, A),
    ]
    assert {p: v[0] for p, v in partitions(result.data).items()} == {0: 101, 1: 101, 2: 101, 3: 4}
    as_controller = {**metadata(), "controller_id": 1}
    assert rewrite_metadata(as_controller, A, down).data["controller_id"] == 101
    assert rewrite_metadata(as_controller, A, topology()).data["controller_id"] == 1
    # Other zones never listed main 1; once it is back, A sees it again.
    assert (
        rewrite_metadata(metadata(), B, down).data
        == rewrite_metadata(metadata(), B, topology()).data
    )
    back = down.with_down_mains([])
    assert (
        rewrite_metadata(metadata(), A, back).data
        == rewrite_metadata(metadata(), A, topology()).data
    )
    assert down.with_live_proxies([101]).down_mains == {1}


def test_an_answer_without_brokers_stays_without_brokers() -> None:
    # The main's error answer to a refused Metadata request (topic ids before v12) lists no
    # brokers, as Kafka's does; the proxy must not add its zone's.
    refused = {
        "brokers": [],
        "cluster_id": None,
        "controller_id": -1,
        "topics": [{"error_code": 42, "name": "", "topic_id": TOPIC_ID, "partitions": []}],
    }
    for zone in (A, None):
        assert rewrite_metadata(refused, zone, topology()).data == refused


def test_controller_in_zone_is_kept_and_rewrite_is_idempotent() -> None:
    once = rewrite_metadata(metadata(), B, topology())
    assert brokers(once.data) == [(2, "m2.b", 9002, B), (102, "p2.b", 9102, B)]
    assert once.data["controller_id"] == 2
    assert {p: v[0] for p, v in partitions(once.data).items()} == {0: 102, 1: 2, 2: 102, 3: 102}
    # The proxy's own answer may come back through the router; nothing moves.
    twice = rewrite_metadata(once.data, B, topology(), lambda _t, p: OWNERS[p])
    assert twice.data == once.data


def test_zone_with_a_proxy_and_no_main_routes_everything_to_the_proxy() -> None:
    nodes = [n for n in NODES if n.node_id != 3]
    result = rewrite_metadata(metadata(), C, topology(nodes=nodes))
    assert brokers(result.data) == [(103, "p3.c", 9103, C)]
    assert {p: v[:3] for p, v in partitions(result.data).items()} == {
        p: (103, 10 + p, [103]) for p in OWNERS
    }


def test_unknown_zone_keeps_real_leaders_and_lists_live_proxies_as_replicas() -> None:
    for zone in (None, "eu-west-1a"):  # no zone, or one the fleet does not know
        result = rewrite_metadata(metadata(), zone, topology())
        assert not result.fallback_cross_zone and result.mode == "unknown"
        assert brokers(result.data) == [
            (1, "m1.a", 9001, A),
            (2, "m2.b", 9002, B),
            (3, "m3.c", 9003, C),
            (4, "m4.a", 9004, A),
            (101, "p1.a", 9101, A),
            (102, "p2.b", 9102, B),
            (103, "p3.c", 9103, C),
        ]
        assert partitions(result.data) == {
            p: (owner, 10 + p, [owner, 101, 102, 103], [owner], []) for p, owner in OWNERS.items()
        }
        assert result.data["controller_id"] == 2


def test_unknown_zone_lists_only_live_proxies() -> None:
    result = rewrite_metadata(metadata(), None, topology(live={101, 103}))
    assert [b[0] for b in brokers(result.data)] == [1, 2, 3, 4, 101, 103]
    assert partitions(result.data)[1][2] == [2, 101, 103]
    none_live = rewrite_metadata(metadata(), None, topology(live=set()))
    assert [b[0] for b in brokers(none_live.data)] == [1, 2, 3, 4]
    assert partitions(none_live.data)[1][2] == [2]


@pytest.mark.parametrize("zone", [B, "use1-az2"])
def test_zone_without_live_proxy_falls_back_to_every_main(zone: str) -> None:
    result = rewrite_metadata(metadata(), zone, topology(live={101, 103}))
    assert result.fallback_cross_zone and result.mode == "fallback"
    assert brokers(result.data) == [
        (1, "m1.a", 9001, A),
        (2, "m2.b", 9002, B),
        (3, "m3.c", 9003, C),
        (4, "m4.a", 9004, A),
    ]
    assert partitions(result.data) == {
        p: (owner, 10 + p, [owner], [owner], []) for p, owner in OWNERS.items()
    }
    assert result.data["controller_id"] == 2


def test_partition_owner_overrides_the_leader_in_the_data() -> None:
    data = metadata()
    for part in data["topics"][0]["partitions"]:
        part["leader_id"] = 1  # one main answered and named itself for everything
    owners = {0: 2, 1: 1, 2: -1, 3: 4}
    seen: list[tuple[str, int]] = []

    def owner(topic: str, partition: int) -> int:
        seen.append((topic, partition))
        return owners[partition]

    result = rewrite_metadata(data, A, topology(), owner)
    assert seen == [("t", 0), ("t", 1), ("t", 2), ("t", 3)]
    assert {p: v[:4] for p, v in partitions(result.data).items()} == {
        0: (101, 10, [101], [101]),
        1: (1, 11, [1], [1]),
        2: (-1, 12, [], []),  # no owner: leader not available
        3: (4, 13, [4], [4]),
    }
    unknown = rewrite_metadata(data, None, topology(), owner)
    assert partitions(unknown.data)[2][:3] == (-1, 12, [])


def test_nodes_the_topology_does_not_know_pass_through_only_outside_the_zone_view() -> None:
    data = metadata()
    data["brokers"].append({"node_id": 9, "host": "new.b", "port": 9009, "rack": B})
    data["topics"][0]["partitions"][1]["leader_id"] = 9
    unknown = rewrite_metadata(data, None, topology())
    assert (9, "new.b", 9009, B) in brokers(unknown.data)
    assert partitions(unknown.data)[1][0] == 9
    zoned = rewrite_metadata(data, A, topology())
    assert 9 not in [b[0] for b in brokers(zoned.data)]
    assert partitions(zoned.data)[1][0] == 101


def coordinators() -> dict[str, Any]:
    entry = {"error_code": 0, "error_message": None}
    return {
        "throttle_time": 0,
        "coordinators": [
            {"key": "g1", "node_id": 1, "host": "stale", "port": 1, **entry},
            {"key": "g2", "node_id": 2, "host": "stale", "port": 1, **entry},
            {"key": "tx", "node_id": -1, "host": "", "port": -1, "error_code": 15,
             "error_message": "not available"},
        ],
    }  # fmt: skip


def test_find_coordinator_points_into_the_client_zone() -> None:
    original = coordinators()
    result = rewrite_find_coordinator(original, "use1-az1", topology())
    got = [(c["key"], c["node_id"], c["host"], c["port"]) for c in result.data["coordinators"]]
    assert got == [
        ("g1", 1, "m1.a", 9001),  # coordinator main in A: direct, in-zone
        ("g2", 101, "p1.a", 9101),  # B's coordinator: through A's proxy
        ("tx", -1, "", -1),  # errors are left alone
    ]
    assert result.data["coordinators"][2] == original["coordinators"][2]
    assert original == coordinators()
    assert not result.fallback_cross_zone


def test_find_coordinator_unknown_zone_and_fallback() -> None:
    unknown = rewrite_find_coordinator(coordinators(), None, topology())
    got = [(c["node_id"], c["host"]) for c in unknown.data["coordinators"]]
    assert got == [(1, "m1.a"), (2, "m2.b"), (-1, "")]
    assert not unknown.fallback_cross_zone
    fallback = rewrite_find_coordinator(coordinators(), A, topology(live={102}))
    assert [c["node_id"] for c in fallback.data["coordinators"]] == [1, 2, -1]
    assert fallback.fallback_cross_zone


def test_find_coordinator_v0_to_v3_top_level() -> None:
    old = {"error_code": 0, "error_message": None, "node_id": 3, "host": "stale", "port": 1}
    result = rewrite_find_coordinator(old, B, topology())
    assert (result.data["node_id"], result.data["host"], result.data["port"]) == (
        102,
        "p2.b",
        9102,
    )
    failed = {"error_code": 15, "node_id": -1, "host": "", "port": -1}
    assert rewrite_find_coordinator(failed, B, topology()).data == failed


def describe_cluster() -> dict[str, Any]:
    return {
        "error_code": 0,
        "error_message": None,
        "endpoint_type": 1,
        "cluster_id": "zf",
        "controller_id": 1,
        "brokers": [{"broker_id": n, "host": "stale", "port": 1, "rack": None} for n in (1, 2, 3)],
        "cluster_authorized_operations": -(2**31),
    }


def test_describe_cluster_lists_the_client_zone() -> None:
    result = rewrite_describe_cluster(describe_cluster(), C, topology())
    assert result.data["brokers"] == [
        {"broker_id": 3, "host": "m3.c", "port": 9003, "rack": C, "is_fenced": False},
        {"broker_id": 103, "host": "p3.c", "port": 9103, "rack": C, "is_fenced": False},
    ]
    assert result.data["controller_id"] == 103
    a = rewrite_describe_cluster(describe_cluster(), A, topology())
    assert [b["broker_id"] for b in a.data["brokers"]] == [1, 4, 101]
    assert a.data["controller_id"] == 1
    unknown = rewrite_describe_cluster(describe_cluster(), None, topology())
    assert [b["broker_id"] for b in unknown.data["brokers"]] == [1, 2, 3, 4, 101, 102, 103]
    fallback = rewrite_describe_cluster(describe_cluster(), C, topology(live={101}))
    assert fallback.fallback_cross_zone
    assert [b["broker_id"] for b in fallback.data["brokers"]] == [1, 2, 3, 4]
    error = {**describe_cluster(), "error_code": 120, "brokers": []}
    assert rewrite_describe_cluster(error, C, topology()).data == error


def test_kip951_leader_hints() -> None:
    leaders = {("t", 0): (2, 9), ("t", 1): (4, 3), ("t", 2): (-1, -1), ("u", 0): (9, 1)}
    original = [(2, "stale", 1, None), (4, "stale", 1, None), (9, "new.x", 9009, "x")]
    zoned = rewrite_leader_hints(leaders, original, A, topology())
    assert zoned.current_leader == {
        ("t", 0): (101, 9),  # epochs are kept
        ("t", 1): (4, 3),
        ("t", 2): (-1, -1),
        ("u", 0): (101, 1),
    }
    assert zoned.node_endpoints == [(4, "m4.a", 9004, A), (101, "p1.a", 9101, A)]
    assert not zoned.fallback_cross_zone
    unknown = rewrite_leader_hints(leaders, original, None, topology())
    assert unknown.current_leader == leaders
    assert unknown.node_endpoints == [
        (2, "m2.b", 9002, B),
        (4, "m4.a", 9004, A),
        (9, "new.x", 9009, "x"),  # unknown to the topology: the main's own endpoint
    ]
    fallback = rewrite_leader_hints(leaders, original, B, topology(live=set()))
    assert fallback.current_leader == leaders and fallback.fallback_cross_zone


def test_preferred_read_replica_is_the_client_zone_proxy() -> None:
    topo = topology()
    assert preferred_read_replica(2, A, topo) == 101
    assert preferred_read_replica(2, "use1-az3", topo) == 103
    assert preferred_read_replica(1, A, topo) == -1  # the leader is already in-zone
    assert preferred_read_replica(2, None, topo) == -1
    assert preferred_read_replica(2, "eu-west-1a", topo) == -1
    assert preferred_read_replica(2, A, topology(live={102})) == -1
    # Whatever it names is listed in replicas for an unknown-zone client (KIP-392 check).
    replicas = partitions(rewrite_metadata(metadata(), None, topo).data)[1][2]
    assert preferred_read_replica(2, C, topo) in replicas


def test_client_view_modes() -> None:
    topo = topology(live={101})
    assert client_view(A, topo).mode == "zone"
    assert client_view(B, topo).mode == "fallback"
    assert client_view(None, topo).mode == "unknown"
    assert client_view("use1-az9", topo).mode == "unknown"


def _round_trip(api_key: int, version: int, data: dict[str, Any]) -> Any:
    header = RequestHeader(api_key, version, 7, "c", 0)
    frame = encode_response(header, build_response(api_key, version, data))
    correlation_id, entity = decode_response(api_key, version, frame)
    assert correlation_id == 7
    return entity


@pytest.mark.parametrize("version", [1, 9, 12])
def test_rewritten_metadata_encodes_through_kio(version: int) -> None:
    entity = _round_trip(3, version, rewrite_metadata(metadata(), A, topology()).data)
    assert [(b.node_id, b.host, b.port, b.rack) for b in entity.brokers] == [
        (1, "m1.a", 9001, A),
        (4, "m4.a", 9004, A),
        (101, "p1.a", 9101, A),
    ]
    assert entity.controller_id == 101
    parts = {p.partition_index: (p.leader_id, tuple(p.replica_nodes)) for p in
             entity.topics[0].partitions}  # fmt: skip
    assert parts == {0: (1, (1,)), 1: (101, (101,)), 2: (101, (101,)), 3: (4, (4,))}


def test_rewritten_cluster_and_coordinator_responses_encode_through_kio() -> None:
    dc = _round_trip(60, 1, rewrite_describe_cluster(describe_cluster(), B, topology()).data)
    assert [(b.broker_id, b.host, b.rack) for b in dc.brokers] == [
        (2, "m2.b", B),
        (102, "p2.b", B),
    ]
    fc = _round_trip(10, 4, rewrite_find_coordinator(coordinators(), C, topology()).data)
    assert [(c.key, c.node_id, c.host, c.port) for c in fc.coordinators] == [
        ("g1", 103, "p3.c", 9103),
        ("g2", 103, "p3.c", 9103),
        ("tx", -1, "", -1),
    ]
    old = {"error_code": 0, "error_message": None, "node_id": 3, "host": "stale", "port": 1}
    fc3 = _round_trip(10, 3, rewrite_find_coordinator(old, C, topology()).data)
    assert (fc3.node_id, fc3.host, fc3.port) == (3, "m3.c", 9003)


def test_describe_topic_partitions_is_rewritten_like_metadata_topics() -> None:
    original = metadata()
    for topic in original["topics"]:
        for part in topic["partitions"]:
            part["eligible_leader_replicas"] = [part["leader_id"], 7]
            part["last_known_elr"] = [8]
    data = {"throttle_time": 0, "topics": original["topics"], "next_cursor": None}
    before = copy.deepcopy(data)
    result = rewrite_describe_topic_partitions(data, A, topology())
    assert data == before
    assert partitions(result.data) == partitions(rewrite_metadata(metadata(), A, topology()).data)
    for part in result.data["topics"][0]["partitions"]:
        assert part["eligible_leader_replicas"] == [] and part["last_known_elr"] == []
    assert result.data["topics"][1] == before["topics"][1]
    entity = _round_trip(75, 0, result.data)
    assert [p.leader_id for p in entity.topics[0].partitions] == [1, 101, 101, 4]


def test_mains_behind_a_node_of_a_zone_view() -> None:
    # A main stands for itself; a proxy for the other zones' mains (it poses as their leader).
    topo = topology()
    assert topo.mains_behind(1) == (1,)
    assert topo.mains_behind(101) == (2, 3)
    assert topo.mains_behind(102) == (1, 3, 4)
    assert topo.mains_behind(999) == ()


def test_a_replica_id_of_a_zone_view_names_a_main() -> None:
    from main_broker.cluster.zone_view import NotAMain, main_for_replica

    topo = topology()
    mains = [1, 2, 3, 4]
    assert main_for_replica(topo, 4, mains, "t", 0) == 4
    assert main_for_replica(topo, 999, mains, "t", 0) == 999  # left to the caller's check
    # The proxy keeps a partition that another zone's main leads already ...
    assert main_for_replica(topo, 101, mains, "t", 0, current=3) == 3
    # ... and places one its zone's main leads over the mains it stands for.
    placed = {main_for_replica(topo, 101, mains, "t", p, current=1) for p in range(4)}
    assert placed == {2, 3}
    alone = Topology(ZONES, [NODES[0], NODES[4]])
    with pytest.raises(NotAMain, match=r"name a main broker \(one of \[1\]\)"):
        main_for_replica(alone, 101, [1], "t", 0)


def test_a_named_listener_lists_its_own_addresses_and_routes_mains_without_it() -> None:
    """A client of listener SECURE sees SECURE's addresses. Main 4 has no SECURE listener, so
    it is listed to nobody there and its partition goes through the zone proxy; on the
    default listener nothing changes."""
    secure = [
        Node(1, A, "main", "m1.a", 9001, (("SECURE", "m1.a", 9501),)),
        Node(2, B, "main", "m2.b", 9002, (("SECURE", "m2.b", 9502),)),
        Node(3, "use1-az3", "main", "m3.c", 9003, (("SECURE", "m3.c", 9503),)),
        Node(4, A, "main", "m4.a", 9004),
        Node(101, A, "proxy", "p1.a", 9101, (("SECURE", "p1.a", 9601),)),
        Node(102, B, "proxy", "p2.b", 9102, (("SECURE", "p2.b", 9602),)),
        Node(103, C, "proxy", "p3.c", 9103, (("SECURE", "p3.c", 9603),)),
    ]
    topo = topology(nodes=secure)
    on_secure = topo.for_listener("SECURE")
    assert topo.for_listener("SECURE") is on_secure  # cached
    assert topo.for_listener("kafka") is topo  # not a named listener: the default one
    result = rewrite_metadata(metadata(), A, on_secure).data
    assert brokers(result) == [(1, "m1.a", 9501, A), (101, "p1.a", 9601, A)]
    assert {p: v[0] for p, v in partitions(result).items()} == {0: 1, 1: 101, 2: 101, 3: 101}
    plain = rewrite_metadata(metadata(), A, topo).data
    assert brokers(plain) == [(1, "m1.a", 9001, A), (4, "m4.a", 9004, A), (101, "p1.a", 9101, A)]
    # Down mains carry over to the listener's view.
    down = topo.with_down_mains([1]).for_listener("SECURE")
    assert not down.main_up(1) and not down.main_up(4)
