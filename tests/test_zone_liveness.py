"""A main shows a zone's clients that zone's proxy only while the proxy is live (holds a state
subscription to it); without it they get the real mains, and the view comes back with it.

The fleet is `zonefleet up --zones 2` run in this process: main 1 and proxy 101 in az1, main 2
and proxy 102 in az2.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import trio

from kafka_wire.codec import build_request, decode_response, encode_request
from main_broker.broker import MainBroker
from proxy_broker.broker import ProxyBroker
from tests.raw_kafka import RawKafka
from tests.zone_fleet import write_zones_toml


def _metadata(bootstrap: str, client_id: str) -> Any:
    raw = RawKafka(bootstrap)
    try:
        request = build_request(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        raw.send_frame(encode_request(3, 12, 1, client_id, request))
        frame = raw.recv_frame()
        assert frame is not None, "connection closed"
        return decode_response(3, 12, frame)[1]
    finally:
        raw.close()


async def _brokers_seen(main: MainBroker, client_id: str) -> set[int]:
    host, port = main.config.advertised
    meta = await trio.to_thread.run_sync(partial(_metadata, f"{host}:{port}", client_id))
    return {b.node_id for b in meta.brokers}


async def _until_live(main: MainBroker, live: set[int]) -> None:
    with trio.fail_after(10):
        while {p.node_id for p in main.zone_view.topology.live_proxies} != live:
            await trio.sleep(0.02)


async def test_a_zone_without_its_proxy_falls_back_to_the_mains(tmp_path: Path) -> None:
    _, config = write_zones_toml(tmp_path / "fleet", zones=2)
    mains = {m.broker.node_id: MainBroker(m.broker) for m in config.mains}
    proxy_nodes = {p.proxy.node_id: p.proxy for p in config.proxies}
    async with trio.open_nursery() as nursery:
        for main in mains.values():
            await nursery.start(main.run)
        await nursery.start(ProxyBroker(proxy_nodes[101]).run)
        az2_scope = trio.CancelScope()

        async def run_az2_proxy(*, task_status: trio.TaskStatus[None]) -> None:
            with az2_scope:
                await ProxyBroker(proxy_nodes[102]).run(task_status=task_status)

        await nursery.start(run_az2_proxy)
        main1 = mains[1]
        await _until_live(main1, {101, 102})
        assert await _brokers_seen(main1, "zone=az2") == {2, 102}

        az2_scope.cancel()  # proxy 102 goes away
        await _until_live(main1, {101})
        assert await _brokers_seen(main1, "zone=az2") == {1, 2}  # the real mains
        assert await _brokers_seen(main1, "zone=az1") == {1, 101}  # az1 is unaffected

        await nursery.start(ProxyBroker(proxy_nodes[102]).run)  # it comes back
        await _until_live(main1, {101, 102})
        assert await _brokers_seen(main1, "zone=az2") == {2, 102}
        nursery.cancel_scope.cancel()


async def test_a_started_main_waits_for_its_proxies_before_falling_back(tmp_path: Path) -> None:
    # A restarted main heard from no proxy yet; it showed every zone's clients the real mains
    # until the proxies re-subscribed (about a second), which sent them cross-zone and made
    # librdkafka create and then destroy broker handles under running admin requests.
    _, config = write_zones_toml(tmp_path / "fleet", zones=2)
    for m in config.mains:
        m.broker.proxy_resubscribe_grace_s = 1.5
    mains = {m.broker.node_id: MainBroker(m.broker) for m in config.mains}
    async with trio.open_nursery() as nursery:
        for main in mains.values():
            await nursery.start(main.run)
        main1 = mains[1]
        assert await _brokers_seen(main1, "zone=az2") == {2, 102}  # no proxy yet: on its way
        await _until_live(main1, set())  # the grace is over and no proxy came
        assert await _brokers_seen(main1, "zone=az2") == {1, 2}
        proxy = next(p.proxy for p in config.proxies if p.proxy.node_id == 102)
        await nursery.start(ProxyBroker(proxy).run)
        await _until_live(main1, {102})
        assert await _brokers_seen(main1, "zone=az2") == {2, 102}
        nursery.cancel_scope.cancel()
