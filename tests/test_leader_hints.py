"""KIP-951 leader hints (current_leader, node_endpoints) in Produce and Fetch responses, in the
client's zone view, from mains and from zone proxies.

The fleet is `zonefleet up --zones 2` run in this process: main 1 and proxy 101 in az1, main 2
and proxy 102 in az2, partitions placed across the mains. Responses are decoded with kio.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from fleet.config import FleetConfig
from internal_rpc import RpcClient
from kafka_wire.codec import build_request, decode_response, encode_request
from kafka_wire.hot_codecs import FetchPartitionResult, ProducePartitionResult
from kafka_wire.leader_hints import fill_fetch_hints, fill_produce_hints
from kafka_wire.record_batch import build_batch
from main_broker.broker import MainBroker
from main_broker.cluster.doc import ClusterDoc
from proxy_broker.broker import ProxyBroker
from tests.raw_kafka import RawKafka
from tests.zone_fleet import write_zones_toml

NOT_LEADER = ErrorCode.not_leader_or_follower
FENCED = ErrorCode.fenced_leader_epoch
PARTITIONS = 4

# -- the pure part ----------------------------------------------------------------------------


def _source(calls: list[list[tuple[str, int]]]) -> Any:
    def source(partitions: list[tuple[str, int]]) -> tuple[dict[Any, Any], list[Any]]:
        calls.append(list(partitions))
        leaders = {key: (7, 3) for key in partitions if key[1] != 9}  # partition 9: unknown
        return leaders, [(7, "h", 1, "az1")]

    return source


def test_only_failed_partitions_of_hint_versions_ask_for_hints() -> None:
    calls: list[list[tuple[str, int]]] = []
    ok = ProducePartitionResult(0)
    moved = ProducePartitionResult(1, error_code=NOT_LEADER)
    lost = ProducePartitionResult(9, error_code=NOT_LEADER)
    other = ProducePartitionResult(2, error_code=ErrorCode.unknown_topic_or_partition)
    topics = [("t", [ok, moved, lost, other])]
    assert fill_produce_hints(9, topics, _source(calls)) is None and calls == []
    assert fill_produce_hints(11, [("t", [ok, other])], _source(calls)) is None and calls == []
    assert fill_produce_hints(11, topics, _source(calls)) == [(7, "h", 1, "az1")]
    assert calls == [[("t", 1), ("t", 9)]]
    assert (ok.current_leader, moved.current_leader, lost.current_leader) == (None, (7, 3), None)

    fenced = FetchPartitionResult(1, error_code=FENCED)
    fetch_topics = [("t", bytes(16), [FetchPartitionResult(0), fenced])]
    assert fill_fetch_hints(11, fetch_topics, _source(calls)) is None
    assert fenced.current_leader is None
    # v12-15 carry current_leader but no node_endpoints; v16 both.
    assert fill_fetch_hints(12, fetch_topics, _source(calls)) is None
    assert fenced.current_leader == (7, 3)
    assert fill_fetch_hints(16, fetch_topics, _source(calls)) == [(7, "h", 1, "az1")]


# -- a two-zone fleet in this process ----------------------------------------------------------


@dataclass
class Fleet:
    config: FleetConfig
    mains: dict[int, MainBroker]
    proxies: dict[int, ProxyBroker]

    def bootstrap(self, node_id: int) -> str:
        node = self.mains.get(node_id) or self.proxies[node_id]
        host, port = node.config.advertised
        return f"{host}:{port}"

    def endpoint(self, node_id: int) -> tuple[int, str, int, str]:
        node = self.mains.get(node_id) or self.proxies[node_id]
        host, port = node.config.advertised
        return (node_id, host, port, node.config.zone)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    _, config = write_zones_toml(tmp_path / "fleet", zones=2)
    mains = {m.broker.node_id: MainBroker(m.broker) for m in config.mains}
    proxies = {p.proxy.node_id: ProxyBroker(p.proxy) for p in config.proxies}
    async with trio.open_nursery() as nursery:
        for main in mains.values():
            await nursery.start(main.run)
        for proxy in proxies.values():  # after the mains: a proxy syncs its mirrors first
            await nursery.start(proxy.run)
        yield Fleet(config, mains, proxies)
        nursery.cancel_scope.cancel()


async def _until(condition: Callable[[], bool], changed: Callable[[], trio.Event]) -> None:
    """Wait for `condition`, re-checking whenever the event `changed()` names is set."""
    with trio.fail_after(10):
        while True:
            event = changed()  # taken first, so a change between check and wait still wakes us
            if condition():
                return
            await event.wait()


async def _until_proxy(proxy: ProxyBroker, condition: Callable[[ProxyBroker], bool]) -> None:
    await _until(lambda: condition(proxy), lambda: proxy.data_arrived)


async def _topic(fleet: Fleet) -> tuple[str, int, int]:
    """A new topic every node knows; returns (name, a partition of main 1, one of main 2)."""
    name = f"hints-{uuid.uuid4().hex[:8]}"
    await fleet.mains[1].create_topic(name, PARTITIONS, {})
    main2 = fleet.mains[2]
    await _until(
        lambda: main2.store.partition(name, 0) is not None, lambda: main2.store.data_arrived
    )
    for proxy in fleet.proxies.values():
        await _until_proxy(
            proxy, lambda proxy: all(proxy.partition(name, p) for p in range(PARTITIONS))
        )
    leaders = [p.leader_id for p in fleet.mains[1].store.topics[name].partitions]
    return name, leaders.index(None), leaders.index(2)


def _call(bootstrap: str, api_key: int, version: int, data: dict[str, Any], client_id: str) -> Any:
    """One raw request (blocking: run it in a thread, the brokers share this process)."""
    raw = RawKafka(bootstrap)
    try:
        request = build_request(api_key, version, data)
        raw.send_frame(encode_request(api_key, version, 1, client_id, request))
        frame = raw.recv_frame()
        assert frame is not None, "connection closed"
        return decode_response(api_key, version, frame)[1]
    finally:
        raw.close()


async def _request(
    fleet: Fleet, node: int, api_key: int, version: int, data: dict[str, Any], client_id: str
) -> Any:
    call = partial(_call, fleet.bootstrap(node), api_key, version, data, client_id)
    return await trio.to_thread.run_sync(call)


def _produce_body(topic: str, partitions: list[int]) -> dict[str, Any]:
    batch = build_batch([(None, b"v")], timestamp_ms=int(time.time() * 1000))
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [{"index": p, "records": batch} for p in partitions],
            }
        ],
    }


def _fetch_body(
    fleet: Fleet, version: int, topic: str, partitions: list[int], epoch: int = -1
) -> dict[str, Any]:
    topic_id = uuid.UUID(bytes=fleet.mains[1].store.topics[topic].topic_id)
    return {
        "max_wait": 0,
        "min_bytes": 1,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": p,
                        "fetch_offset": 0,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": epoch,
                    }
                    for p in partitions
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def _produce_parts(resp: Any) -> dict[int, Any]:
    return {p.index: p for t in resp.responses for p in t.partition_responses}


def _fetch_parts(resp: Any) -> dict[int, Any]:
    return {p.partition_index: p for t in resp.responses for p in t.partitions}


def _leader(part: Any) -> tuple[int, int]:
    return (part.current_leader.leader_id, part.current_leader.leader_epoch)


def _endpoints(resp: Any) -> list[tuple[int, str, int, str | None]]:
    return [(n.node_id, n.host, n.port, n.rack) for n in resp.node_endpoints]


# -- mains --------------------------------------------------------------------------------------

# A direct client of main 1 (az1): tagged az1, untagged (kept in main 1's zone, as its Metadata
# is), or tagged az2 by AZ id. A partition main 2 leads is in az2: az1 clients go to proxy 101.
# An az2 client whose zone has a live proxy is sent there for main 1's own partition too (a
# client back from a fallback: main_broker/api/zone_redirect.py).
MAIN1_CLIENTS = [
    ("zone=az1", None, 101),
    ("rdkafka", None, 101),
    ("diskless_az=use1-az2", 102, 2),
]


async def test_main_hints_name_the_leader_of_the_clients_zone(fleet: Fleet) -> None:
    topic, own, other = await _topic(fleet)
    for client_id, own_elsewhere, expected in MAIN1_CLIENTS:
        hinted = sorted({expected, own_elsewhere or expected})
        resp = await _request(fleet, 1, 0, 11, _produce_body(topic, [own, other]), client_id)
        parts = _produce_parts(resp)
        if own_elsewhere is None:
            assert parts[own].error_code == ErrorCode.none
            assert _leader(parts[own]) == (-1, -1)  # a success carries no hint
        else:
            assert parts[own].error_code == NOT_LEADER
            assert _leader(parts[own]) == (own_elsewhere, 0), client_id
        assert parts[other].error_code == NOT_LEADER
        assert _leader(parts[other]) == (expected, 0), client_id
        assert _endpoints(resp) == [fleet.endpoint(n) for n in hinted], client_id

        resp = await _request(
            fleet, 1, 1, 16, _fetch_body(fleet, 16, topic, [own, other]), client_id
        )
        parts = _fetch_parts(resp)
        if own_elsewhere is None:
            assert parts[own].error_code == ErrorCode.none and _leader(parts[own]) == (-1, -1)
        else:
            assert parts[own].error_code == NOT_LEADER
            assert _leader(parts[own]) == (own_elsewhere, 0), client_id
        assert parts[other].error_code == NOT_LEADER
        assert _leader(parts[other]) == (expected, 0), client_id
        assert _endpoints(resp) == [fleet.endpoint(n) for n in hinted], client_id

    # Its Metadata agrees: for an untagged client, the same leader as the hint.
    meta = await _request(fleet, 1, 3, 12, {"topics": [{"name": topic}]}, "rdkafka")
    leaders = {p.partition_index: p.leader_id for p in meta.topics[0].partitions}
    assert (leaders[own], leaders[other]) == (1, 101)


async def test_main_hints_fenced_leader_epoch_with_the_current_epoch(fleet: Fleet) -> None:
    topic, own, _ = await _topic(fleet)
    plog = fleet.mains[1].store.partition(topic, own)
    assert plog is not None
    plog.leader_epoch = 3  # as after two leader changes
    # An az2 client is sent to its zone's proxy whatever its epoch (NOT_LEADER_OR_FOLLOWER):
    # main 1 is not in its zone view.
    for client_id, error, expected in (("zone=az1", FENCED, 1), ("zone=az2", NOT_LEADER, 102)):
        body = _fetch_body(fleet, 16, topic, [own], epoch=1)
        part = _fetch_parts(await _request(fleet, 1, 1, 16, body, client_id))[own]
        assert part.error_code == error
        assert _leader(part) == (expected, 3), client_id


async def test_older_versions_carry_no_hints(fleet: Fleet) -> None:
    topic, _, other = await _topic(fleet)
    resp = await _request(fleet, 1, 0, 9, _produce_body(topic, [other]), "zone=az1")
    part = _produce_parts(resp)[other]
    assert part.error_code == NOT_LEADER
    assert not hasattr(part, "current_leader") and not hasattr(resp, "node_endpoints")

    resp = await _request(fleet, 1, 1, 11, _fetch_body(fleet, 11, topic, [other]), "zone=az1")
    assert _fetch_parts(resp)[other].error_code == NOT_LEADER
    assert not hasattr(_fetch_parts(resp)[other], "current_leader")
    # v12 has current_leader, node_endpoints only came with v16.
    resp = await _request(fleet, 1, 1, 12, _fetch_body(fleet, 12, topic, [other]), "zone=az1")
    assert _leader(_fetch_parts(resp)[other]) == (101, 0)
    assert not hasattr(resp, "node_endpoints")


async def test_relayed_requests_get_the_real_leader(fleet: Fleet) -> None:
    """A proxy rewrites what it relays, so the main answers a relay with its own view."""
    topic, _, other = await _topic(fleet)
    main = fleet.mains[1]
    request = build_request(0, 11, _produce_body(topic, [other]))
    frame = encode_request(0, 11, 5, "zone=az1", request)
    assert main.config.rpc_port is not None and main.config.rpc_secret is not None
    rpc = RpcClient(101, main.config.rpc_secret, main.config.host, main.config.rpc_port)
    try:
        result = await rpc.call("relay", {"frame": frame}, timeout=10, retries=0, idempotent=True)
    finally:
        await rpc.aclose()
    resp = decode_response(0, 11, result["frame"])[1]
    assert _leader(_produce_parts(resp)[other]) == (2, 0)
    assert _endpoints(resp) == [fleet.endpoint(2)]


# -- proxies ------------------------------------------------------------------------------------


async def test_proxy_produce_not_leader_hints_stay_in_its_zone(fleet: Fleet) -> None:
    topic, own, _ = await _topic(fleet)
    # Main 1 hands the partition to main 2, which has not heard of it yet: whichever main a
    # proxy confirms to answers NOT_LEADER_OR_FOLLOWER.
    store = fleet.mains[1].store
    leaders = [p.leader_id for p in store.topics[topic].partitions]
    leaders[own] = 2
    store.set_leaders(topic, leaders)
    for proxy in fleet.proxies.values():
        await _until_proxy(proxy, lambda proxy: proxy.owner_of(topic, own) == 2)

    # The proxies now take main 2 as the leader: az1's client is sent back to its proxy, az2's
    # to its own zone's main, never to the other zone.
    for proxy_id, expected in ((101, 101), (102, 2)):
        resp = await _request(fleet, proxy_id, 0, 11, _produce_body(topic, [own]), "c")
        part = _produce_parts(resp)[own]
        assert part.error_code == NOT_LEADER
        assert _leader(part) == (expected, 0)
        assert _endpoints(resp) == [fleet.endpoint(expected)]
        assert fleet.endpoint(expected)[3] == fleet.proxies[proxy_id].config.zone

        resp = await _request(fleet, proxy_id, 0, 9, _produce_body(topic, [own]), "c")
        assert _produce_parts(resp)[own].error_code == NOT_LEADER
        assert not hasattr(_produce_parts(resp)[own], "current_leader")


async def test_proxy_fetch_not_leader_hints_stay_in_its_zone(fleet: Fleet) -> None:
    topic, own, other = await _topic(fleet)
    # The leader's own state stream has not shown the topic yet (as right after a create).
    for proxy in fleet.proxies.values():
        proxy.mirrors[1].topics.pop(topic)
    for proxy_id, expected in ((101, 1), (102, 102)):
        body = _fetch_body(fleet, 16, topic, [own, other])
        resp = await _request(fleet, proxy_id, 1, 16, body, "c")
        parts = _fetch_parts(resp)
        assert parts[other].error_code == ErrorCode.none and _leader(parts[other]) == (-1, -1)
        assert parts[own].error_code == NOT_LEADER
        assert _leader(parts[own]) == (expected, 0)
        assert _endpoints(resp) == [fleet.endpoint(expected)]

        resp = await _request(fleet, proxy_id, 1, 11, _fetch_body(fleet, 11, topic, [own]), "c")
        assert _fetch_parts(resp)[own].error_code == NOT_LEADER
        assert not hasattr(_fetch_parts(resp)[own], "current_leader")


# -- a real client across a leader change ----------------------------------------------------


def _produce_all(producer: Producer, topic: str, partition: int, count: int) -> list[Any]:
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), partition=partition, on_delivery=report)
    assert producer.flush(30) == 0
    return errors


async def test_confluent_producer_follows_a_leader_change(fleet: Fleet) -> None:
    topic, _, other = await _topic(fleet)
    # An az2 client straight at main 2, writing to a partition main 2 leads.
    producer = Producer(
        {
            "bootstrap.servers": fleet.bootstrap(2),
            "client.id": "zone=az2",
            "acks": "all",
            "linger.ms": 1,
            "retries": 50,
            "retry.backoff.ms": 50,
        }
    )
    produce = partial(_produce_all, producer, topic, other, 100)
    assert await trio.to_thread.run_sync(produce) == []
    assert fleet.mains[2].store.partition(topic, other).high_watermark == 100  # type: ignore[union-attr]

    def move(doc: ClusterDoc) -> ClusterDoc:
        meta = doc.topics[topic]
        leaders = list(meta.leaders)
        leaders[other] = 1
        moved = dataclasses.replace(meta, leaders=tuple(leaders))
        return dataclasses.replace(
            doc, version=doc.version + 1, topics={**doc.topics, topic: moved}
        )

    cluster1, cluster2 = fleet.mains[1].cluster, fleet.mains[2].cluster
    assert cluster1 is not None and cluster2 is not None
    await cluster1.meta.update(move)
    await cluster2.refresh()
    # Main 2 now answers NOT_LEADER_OR_FOLLOWER with a hint to proxy 102 (main 1 is in az1),
    # and the producer carries on through it, never reaching a node in az1 itself.
    refused = fleet.mains[2].metrics.request_errors.labels("Produce", NOT_LEADER.name)
    assert refused.value == 0
    assert await trio.to_thread.run_sync(produce) == []
    assert refused.value >= 1
    assert fleet.proxies[102].metrics.bytes_in.labels(topic).value > 0
    assert fleet.proxies[101].metrics.bytes_in.labels(topic).value == 0
    assert fleet.mains[1].metrics.requests.labels("Produce").value == 0
    assert fleet.mains[1].store.partition(topic, other).high_watermark == 100  # type: ignore[union-attr]
    assert fleet.mains[2].store.partition(topic, other).high_watermark == 100  # type: ignore[union-attr]
