"""Several main brokers sharing one cluster metadata document: placement, leadership,
group coordinators and producer ids, checked in the pure parts and on `zonefleet up --zones 3`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from fleet.config import load_fleet_config
from main_broker.cluster.doc import ClusterDoc, DocFormatError, TopicExists
from s3_commit import FileObjectStore, PreconditionFailed
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.raw_kafka import RawKafka
from zone_router import group_coordinator, place_partitions

ZONES = 3

# -- pure parts -------------------------------------------------------------------------------


def test_cluster_doc_golden_bytes_and_round_trip() -> None:
    doc = ClusterDoc("c1").with_topic(
        "orders", bytes(range(16)), 3, {"retention.ms": "1"}, [3, 1, 2]
    )
    assert doc.to_bytes() == (
        b'{"format":1,"cluster_id":"c1","version":1,"topics":{"orders":{"id":'
        b'"000102030405060708090a0b0c0d0e0f","configs":{"retention.ms":"1"},'
        b'"leaders":'
        + str(list(doc.topics["orders"].leaders)).replace(" ", "").encode()
        + b',"epochs":[0,0,0]}}}'
    )
    assert ClusterDoc.from_bytes(doc.to_bytes()) == doc
    assert sorted(doc.topics["orders"].leaders) == [1, 2, 3]  # one partition per main
    with pytest.raises(TopicExists):
        doc.with_topic("orders", bytes(16), 1, {}, [1])
    assert doc.without_topic("orders").topics == {} and doc.without_topic("orders").version == 2
    for bad in (
        b"{",
        b'{"format":9}',
        b'{"format":1,"cluster_id":"c","version":1,"topics":{"t":{}}}',
    ):
        with pytest.raises(DocFormatError):
            ClusterDoc.from_bytes(bad)


def test_placement_and_coordinators_are_deterministic_and_spread() -> None:
    leaders = place_partitions("t", 6, [3, 1, 2])
    assert leaders == place_partitions("t", 6, [1, 2, 3])  # order of the input does not matter
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    starts = {place_partitions(f"topic-{i}", 1, [1, 2, 3])[0] for i in range(30)}
    assert starts == {1, 2, 3}  # single-partition topics do not all land on one main
    owners = {group_coordinator(f"g{i}", [1, 2, 3]) for i in range(30)}
    assert owners == {1, 2, 3}
    assert group_coordinator("g", [2, 1]) == group_coordinator("g", [1, 2])


def test_file_object_store_compare_and_swap(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    etag = store.put("a/doc", b"1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("a/doc", b"x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("a/doc", b"x", if_match="stale")
    assert store.get("a/doc") == (b"1", etag)
    assert store.get("missing") is None

    # Concurrent read-modify-write loops lose no increment.
    def bump(times: int) -> None:
        for _ in range(times):
            while True:
                data, tag = store.get("a/doc") or (b"0", "")
                try:
                    store.put("a/doc", str(int(data) + 1).encode(), if_match=tag)
                    break
                except PreconditionFailed:
                    continue

    threads = [threading.Thread(target=bump, args=(25,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("a/doc") is not None and store.get("a/doc")[0] == b"101"  # type: ignore[index]


# -- a fleet of three mains -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    data = tmp_path_factory.mktemp("cluster")
    fleet = FleetProcess(data, free_port_block(10 * ZONES + 5), extra=["--zones", str(ZONES)])
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()


def _mains(fleet: FleetProcess) -> dict[int, str]:
    config = load_fleet_config(fleet.data_dir / "fleet.toml")
    return {m.broker.node_id: f"127.0.0.1:{m.broker.port}" for m in config.mains}


def _list_offsets(raw: RawKafka, topic: str, partitions: list[int], timestamp: int) -> dict:
    resp = raw.request(
        2,
        5,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {"partition_index": p, "timestamp": timestamp, "current_leader_epoch": -1}
                        for p in partitions
                    ],
                }
            ],
        },
    )
    return {p.partition_index: (p.error_code, p.offset) for t in resp.topics for p in t.partitions}


def test_topics_are_placed_across_mains_and_every_main_knows_them(cluster: FleetProcess) -> None:
    mains = _mains(cluster)
    topic = f"spread-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.zones["az1"], "client.id": "zone=az1"})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(timeout=20)
    leaders_seen = []
    for node, bootstrap in mains.items():
        raw = RawKafka(bootstrap)
        try:
            meta = raw.request(
                3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
            )
        finally:
            raw.close()
        # An untagged client at main K is taken to be in azK: it sees main K and proxy 100+K.
        racks = {b.node_id: b.rack for b in meta.brokers}
        assert racks == {node: f"az{node}", 100 + node: f"az{node}"}
        (t,) = meta.topics
        assert t.error_code == ErrorCode.none, f"main {node} does not know {topic}"
        # Partitions led by another zone's main are shown led by this zone's proxy.
        leaders_seen.append(
            {p.partition_index: p.leader_id if p.leader_id < 100 else None for p in t.partitions}
        )
    true_leaders = {
        p: leaders_seen[n - 1][p]
        for n in (1, 2, 3)
        for p in range(6)
        if leaders_seen[n - 1][p] is not None
    }
    for n in (1, 2, 3):
        assert {p for p, leader in leaders_seen[n - 1].items() if leader == n} == {
            p for p, leader in true_leaders.items() if leader == n
        }
    assert sorted(true_leaders.values()) == [1, 1, 2, 2, 3, 3]

    # A second create of the same topic, on another main, loses.
    admin3 = AdminClient({"bootstrap.servers": mains[3]})
    with pytest.raises(Exception, match=r"TOPIC_ALREADY_EXISTS|already exists"):
        admin3.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)


def test_only_the_leader_serves_a_partition_and_proxies_route_to_it(cluster: FleetProcess) -> None:
    mains = _mains(cluster)
    topic = f"lead-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.zones["az2"], "client.id": "zone=az2"})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(timeout=20)
    producer = Producer(
        {
            "bootstrap.servers": cluster.zones["az2"],
            "client.id": "zone=az2",
            "enable.idempotence": True,
        }
    )
    for i in range(60):
        producer.produce(topic, b"x" * 100, partition=i % 6)
    assert producer.flush(30) == 0

    raw = RawKafka(mains[1])
    try:
        meta = raw.request(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
        leaders = {p.partition_index: p.leader_id for p in meta.topics[0].partitions}
        answers = _list_offsets(raw, topic, list(range(6)), -1)
    finally:
        raw.close()
    for p, leader in leaders.items():
        code, offset = answers[p]
        if leader == 1:
            assert (code, offset) == (ErrorCode.none, 10)
        else:
            assert code == ErrorCode.not_leader_or_follower

    # Through a proxy, one ListOffsets spanning all three leaders is split and merged.
    for zone in ("az1", "az3"):
        raw = RawKafka(cluster.zones[zone])
        try:
            assert _list_offsets(raw, topic, list(range(6)), -1) == {
                p: (ErrorCode.none, 10) for p in range(6)
            }
            assert _list_offsets(raw, topic, [5, 0], -2) == {5: (0, 0), 0: (0, 0)}
        finally:
            raw.close()


def test_group_coordinators_and_producer_ids_are_split_across_mains(cluster: FleetProcess) -> None:
    mains = _mains(cluster)
    group = "cluster-group-x"
    expected = group_coordinator(group, list(mains))
    pids = set()
    for node, bootstrap in mains.items():
        raw = RawKafka(bootstrap)
        try:
            found = raw.request(10, 3, {"key": group, "key_type": 0})
            # Main K shows its (untagged) client azK's view: the coordinator itself when it is
            # in azK, else azK's proxy, which relays group requests to the coordinator.
            assert found.error_code == ErrorCode.none
            assert found.node_id == (expected if expected == node else 100 + node)
            hb = raw.request(
                12,
                3,
                {
                    "group_id": group,
                    "generation_id": 1,
                    "member_id": "m",
                    "group_instance_id": None,
                },
            )
            if node == expected:
                assert hb.error_code != ErrorCode.not_coordinator
            else:
                assert hb.error_code == ErrorCode.not_coordinator
            init = raw.request(
                22,
                3,
                {
                    "transactional_id": None,
                    "transaction_timeout_ms": 60000,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            )
            assert init.error_code == ErrorCode.none
            pids.add(init.producer_id)
        finally:
            raw.close()
    assert len(pids) == 3  # mains never hand out the same producer id
