"""A blocking raw-socket Kafka client for tests that need exact control over the bytes."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka_wire.codec import build_request, decode_response, encode_request


class RawKafka:
    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str = "raw-test") -> None:
        self.client_id = client_id
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def send_frame(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(body)) + body)

    def recv_frame(self) -> bytes | None:
        head = self._recv_exact(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        self.correlation_id += 1
        req = build_request(api_key, version, data)
        self.send_frame(encode_request(api_key, version, self.correlation_id, self.client_id, req))
        frame = self.recv_frame()
        assert frame is not None, "connection closed"
        cid, resp = decode_response(api_key, version, frame)
        assert cid == self.correlation_id
        return resp

    def latest_offset(self, topic: str, partition: int = 0) -> int:
        """ListOffsets latest (-1): the log end offset a consumer could read up to."""
        resp = self.request(
            2,
            5,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": partition,
                                "timestamp": -1,
                                "current_leader_epoch": -1,
                            }
                        ],
                    }
                ],
            },
        )
        offset: int = resp.topics[0].partitions[0].offset
        return offset

    def fetch(self, topic: str, offsets: dict[int, int], leader_epoch: int = -1) -> dict[int, Any]:
        """Fetch v12 (no wait, 64 KiB a partition) from `offsets` (partition -> fetch offset),
        naming `leader_epoch` as the current one: the response's partitions by index."""
        resp = self.request(1, 12, fetch_v12(topic, offsets, leader_epoch))
        return {p.partition_index: p for t in resp.responses for p in t.partitions}

    def is_closed(self, timeout: float = 5.0) -> bool:
        """True when the broker closed the connection (EOF or reset) within the timeout."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def fetch_v12(
    topic: str, offsets: dict[int, int], leader_epoch: int = -1, partition_bytes: int = 1 << 16
) -> dict[str, Any]:
    """A Fetch v12 request's data: no wait, from `offsets` (partition -> fetch offset)."""
    return {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": p,
                        "current_leader_epoch": leader_epoch,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": partition_bytes,
                    }
                    for p, offset in offsets.items()
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
