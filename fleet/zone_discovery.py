"""Which availability zone this host is in, from the EC2 instance metadata service (IMDSv2)."""

from __future__ import annotations

import concurrent.futures
import logging

import httpx
import trio

__all__ = ["DEFAULT_IMDS_URL", "discover_zone", "discover_zone_blocking"]

log = logging.getLogger(__name__)

DEFAULT_IMDS_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
ZONE_PATH = "/latest/meta-data/placement/availability-zone"
ZONE_ID_PATH = "/latest/meta-data/placement/availability-zone-id"
TOKEN_TTL_S = 60  # the token only has to outlive the two reads that follow


async def discover_zone(
    base_url: str = DEFAULT_IMDS_URL, timeout: float = 1.0
) -> tuple[str, str | None] | None:
    """(zone name, AZ id) of this host, or None when there is no usable IMDS.

    The AZ id is optional (None when IMDS does not serve it); the zone name is not.
    """
    base = base_url.rstrip("/")
    # Proxies must not apply: IMDS is link-local and a proxy would answer for its own host.
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        try:
            reply = await client.put(
                base + TOKEN_PATH,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            if reply.status_code != 200 or not reply.text:
                log.info("IMDS token request answered %d", reply.status_code)
                return None
            headers = {"X-aws-ec2-metadata-token": reply.text.strip()}
            zone_reply = await client.get(base + ZONE_PATH, headers=headers)
            if zone_reply.status_code != 200 or not zone_reply.text.strip():
                log.info("IMDS availability-zone answered %d", zone_reply.status_code)
                return None
            id_reply = await client.get(base + ZONE_ID_PATH, headers=headers)
        except httpx.HTTPError as exc:
            log.info("no EC2 instance metadata at %s: %r", base, exc)
            return None
    az_id = id_reply.text.strip() if id_reply.status_code == 200 else ""
    return zone_reply.text.strip(), az_id or None


def discover_zone_blocking(
    base_url: str = DEFAULT_IMDS_URL, timeout: float = 1.0
) -> tuple[str, str | None] | None:
    """`discover_zone` for synchronous callers (config loading), inside trio or not."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return trio.run(discover_zone, base_url, timeout)
    # Called from inside a trio run (config loaded by a running node or test): a nested
    # trio.run is not allowed, so the lookup gets its own thread for its few round trips.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(trio.run, discover_zone, base_url, timeout).result()
