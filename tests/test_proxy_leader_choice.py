"""Which main's mirror a proxy serves a partition from while a reassignment spreads: the
mains' state streams name the new leader at different moments (and a killed main's mirror
keeps its last view). Fed with state frames, no fleet running."""

from __future__ import annotations

from pathlib import Path

from internal_rpc import RpcClient
from proxy_broker.broker import ProxyBroker
from proxy_broker.config import MainEndpoint
from proxy_broker.mirror import MainMirror, MirrorCache
from shared_wal import open_wal_fs
from shared_wal.batch_reader import BatchReader
from tests.zone_fleet import write_zones_toml

TOPIC_ID = bytes(range(16))


def _proxy(tmp_path: Path) -> ProxyBroker:
    _, config = write_zones_toml(tmp_path / "fleet")
    proxy = ProxyBroker(config.proxies[0].proxy)
    batches = BatchReader(open_wal_fs(f"osfs://{tmp_path}"))
    for node in (1, 2, 3):
        proxy.mirrors[node] = MainMirror(
            MainEndpoint(node, f"az{node}", "127.0.0.1", 1, 1),
            RpcClient(101, b"s" * 32, "127.0.0.1", 1),  # never called: the test feeds frames
            batches,
            MirrorCache(1 << 20),
            "proxy-101",
            lambda segment, position: None,
            lambda: None,
        )
    return proxy


def _frame(proxy: ProxyBroker, node: int, leader: int, epoch: int, end: int) -> None:
    """Main `node`'s view: partition 0 of topic t led by `leader` at `epoch`, log end `end`."""
    mirror = proxy.mirrors[node]
    mirror.apply_frame(
        {
            "full": True,
            "node": node,
            "writer": f"main-{node}",
            "wal_end": 0,
            "topics": {"t": [TOPIC_ID, 1, {}, [leader]]},
            "parts": [["t", 0, epoch, end, end, 0, end]],
        }
    )
    mirror.connected = True


def test_the_leader_is_served_only_once_its_own_stream_says_so(tmp_path: Path) -> None:
    proxy = _proxy(tmp_path)
    for node in (1, 2, 3):
        _frame(proxy, node, leader=1, epoch=0, end=100 if node == 1 else 0)
    assert proxy.owner_of("t", 0) == 1
    topic = proxy.topic_by_name("t")
    assert topic is not None and topic.partitions[0].owned
    assert topic.partitions[0].next_offset == 100

    # Main 3 read the document first: it names main 2 at epoch 1. Main 2's own stream still
    # shows its old view (never led, log end 0): serving from it would answer a consumer at
    # offset 100 OFFSET_OUT_OF_RANGE, so the proxy answers NOT_LEADER_OR_FOLLOWER meanwhile.
    _frame(proxy, 3, leader=2, epoch=1, end=0)
    assert proxy.owner_of("t", 0) == 2
    topic = proxy.topic_by_name("t")
    assert topic is not None and not topic.partitions[0].owned

    _frame(proxy, 2, leader=2, epoch=1, end=120)
    topic = proxy.topic_by_name("t")
    assert topic is not None and topic.partitions[0].owned
    assert (topic.partitions[0].leader_epoch, topic.partitions[0].next_offset) == (1, 120)
    assert topic.leaders == [2]


def test_a_dead_mains_stale_view_loses(tmp_path: Path) -> None:
    proxy = _proxy(tmp_path)
    _frame(proxy, 1, leader=1, epoch=0, end=100)  # killed: its last view stays
    proxy.mirrors[1].connected = False
    _frame(proxy, 2, leader=2, epoch=1, end=100)
    _frame(proxy, 3, leader=2, epoch=1, end=0)
    assert proxy.owner_of("t", 0) == 2
    # Same epoch everywhere: a connected mirror's view wins over a disconnected one's.
    _frame(proxy, 1, leader=1, epoch=1, end=100)
    proxy.mirrors[1].connected = False
    assert proxy.owner_of("t", 0) == 2
