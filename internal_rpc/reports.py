"""Telling the mains that a main looks gone: what a proxy or a main sends when its
connection to a main breaks (`MainUnreachable`), so the controller probes that main at once
instead of at its next round (main_broker/cluster/watch.py decides)."""

from __future__ import annotations

from collections.abc import Mapping

import trio

from internal_rpc.client import RpcClient
from internal_rpc.errors import RpcError
from internal_rpc.messages import MainUnreachable

__all__ = ["report_unreachable"]

REPORT_TIMEOUT_S = 1.0


async def report_unreachable(rpcs: Mapping[int, RpcClient], node: int, reason: str) -> None:
    """Tell every main in `rpcs` but `node` that main `node` could not be reached."""
    message = MainUnreachable(node, reason).to_wire()

    async def tell(rpc: RpcClient) -> None:
        try:
            await rpc.call("main_unreachable", message, timeout=REPORT_TIMEOUT_S, retries=0)
        except RpcError:
            pass  # that main may be down too; the controller probes on its own anyway

    async with trio.open_nursery() as nursery:
        for other, rpc in rpcs.items():
            if other != node:
                nursery.start_soon(tell, rpc)
