"""Which availability zone this host is in, from the EC2 instance metadata service (IMDSv2).

The endpoint follows the AWS SDKs: `AWS_EC2_METADATA_SERVICE_ENDPOINT` wins over the configured
URL (`[fleet] imds_url`), `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6` picks the IPv6 address
when neither names one, and `AWS_EC2_METADATA_DISABLED=true` turns the lookup off.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import trio

__all__ = [
    "DEFAULT_IMDS_URL",
    "DEFAULT_IMDS_URL_IPV6",
    "ENDPOINT_ENV",
    "DiscoveredZone",
    "ImdsError",
    "Placement",
    "discover_placement",
    "discover_zone",
    "discover_zone_blocking",
    "imds_disabled",
    "imds_endpoint",
]

log = logging.getLogger(__name__)

DEFAULT_IMDS_URL = "http://169.254.169.254"
DEFAULT_IMDS_URL_IPV6 = "http://[fd00:ec2::254]"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
ENDPOINT_MODE_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"
DISABLED_ENV = "AWS_EC2_METADATA_DISABLED"
TOKEN_PATH = "/latest/api/token"
ZONE_PATH = "/latest/meta-data/placement/availability-zone"
ZONE_ID_PATH = "/latest/meta-data/placement/availability-zone-id"
REGION_PATH = "/latest/meta-data/placement/region"
TOKEN_TTL_S = 60  # the token only has to outlive the reads that follow


class ImdsError(RuntimeError):
    """IMDSv2 did not answer what was asked (unreachable, no token, a missing value)."""


@dataclass(frozen=True)
class DiscoveredZone:
    """How a node with `zone = "auto"` learned its zone, for its log."""

    zone: str
    az_id: str | None
    endpoint: str

    def describe(self) -> str:
        return f"zone {self.zone} (AZ id {self.az_id or '?'}) through IMDSv2 at {self.endpoint}"


@dataclass(frozen=True)
class Placement:
    """This instance's placement as IMDSv2 reports it."""

    zone: str
    az_id: str | None
    region: str
    endpoint: str


def imds_endpoint(configured: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The IMDS base URL: the SDKs' environment variable, else `configured`, else the default."""
    env = os.environ if env is None else env
    override = env.get(ENDPOINT_ENV, "").strip()
    if override:
        return override.rstrip("/")
    if configured:
        return configured.rstrip("/")
    if env.get(ENDPOINT_MODE_ENV, "").strip().lower() == "ipv6":
        return DEFAULT_IMDS_URL_IPV6
    return DEFAULT_IMDS_URL


def imds_disabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(DISABLED_ENV, "").strip().lower() == "true"


async def _imds_read(
    base_url: str, paths: list[tuple[str, bool]], timeout: float
) -> dict[str, str | None]:
    """A token, then each (path, required) GET with it; raises ImdsError on what is missing.

    An optional path answering anything but 200 reads as None.
    """
    base = base_url.rstrip("/")
    out: dict[str, str | None] = {}
    # Proxies must not apply: IMDS is link-local and a proxy would answer for its own host.
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        try:
            reply = await client.put(
                base + TOKEN_PATH,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            if reply.status_code != 200 or not reply.text.strip():
                raise ImdsError(f"IMDSv2 token request to {base} answered {reply.status_code}")
            headers = {"X-aws-ec2-metadata-token": reply.text.strip()}
            for path, required in paths:
                got = await client.get(base + path, headers=headers)
                value = got.text.strip() if got.status_code == 200 else ""
                if required and not value:
                    raise ImdsError(f"IMDSv2 {base}{path} answered {got.status_code}")
                out[path] = value or None
        except httpx.HTTPError as exc:
            raise ImdsError(f"no EC2 instance metadata at {base}: {exc!r}") from None
    return out


async def discover_zone(
    base_url: str = DEFAULT_IMDS_URL, timeout: float = 1.0
) -> tuple[str, str | None] | None:
    """(zone name, AZ id) of this host, or None when there is no usable IMDS.

    The AZ id is optional (None when IMDS does not serve it); the zone name is not.
    """
    try:
        got = await _imds_read(base_url, [(ZONE_PATH, True), (ZONE_ID_PATH, False)], timeout)
    except ImdsError as exc:
        log.info("%s", exc)
        return None
    zone = got[ZONE_PATH]
    assert zone is not None  # required above
    return zone, got[ZONE_ID_PATH]


async def discover_placement(base_url: str, timeout: float = 2.0) -> Placement:
    """Zone, AZ id and region of this instance; raises ImdsError when IMDSv2 cannot say."""
    got = await _imds_read(
        base_url, [(ZONE_PATH, True), (ZONE_ID_PATH, False), (REGION_PATH, True)], timeout
    )
    zone, region = got[ZONE_PATH], got[REGION_PATH]
    assert zone is not None and region is not None  # required above
    return Placement(zone, got[ZONE_ID_PATH], region, base_url.rstrip("/"))


def discover_zone_blocking(
    base_url: str = DEFAULT_IMDS_URL, timeout: float = 1.0
) -> tuple[str, str | None] | None:
    """`discover_zone` for synchronous callers (config loading), inside trio or not."""
    if imds_disabled():
        log.info("%s=true: no zone discovery", DISABLED_ENV)
        return None
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return trio.run(discover_zone, base_url, timeout)
    # Called from inside a trio run (config loaded by a running node or test): a nested
    # trio.run is not allowed, so the lookup gets its own thread for its few round trips.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(trio.run, discover_zone, base_url, timeout).result()
