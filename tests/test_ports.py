"""The test port allocator stays out of the ephemeral range and never hands a port out twice."""

from __future__ import annotations

import socket

import pytest

from tests import ports


def test_blocks_are_free_below_the_ephemeral_range_and_never_repeated() -> None:
    low = ports._ephemeral_low()
    seen: set[int] = set()
    for count in (1, 7, 35, 45):
        base = ports.free_port_block(count)
        block = set(range(base, base + count))
        assert ports.LOWEST_PORT <= base and base + count <= low
        assert not block & seen
        seen |= block
        for port in block:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        elsewhere = ports.free_port_block(10)
        monkeypatch.setattr(ports, "_reserved", {})
        tries = iter([taken - 5, elsewhere])
        monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(tries))
        assert ports.free_port_block(10) == elsewhere
