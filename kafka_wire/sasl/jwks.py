"""The JWKS of an OAuth provider, fetched and kept fresh for OAUTHBEARER (`oauthbearer.py`).

`JwksKeys` holds the last key set that parsed. `keep_fresh` fetches it at once, then every
`jwks_refresh_ms`; a fetch that fails is retried after 100 ms, doubling up to 10 s (Kafka's
`sasl.oauthbearer.jwks.endpoint.retry.backoff.ms` defaults), and the old set stays in use
meanwhile. A token whose `kid` the set lacks asks for a fetch at once (`refreshed`, from the
worker thread that checks the token): it joins a fetch under way, and otherwise a new one
starts only if the last started at least `jwks_min_refresh_ms` ago, so a flood of made-up
`kid`s costs the provider at most one request per that interval. At most one fetch runs.

`http://`, `https://` (the system's CAs; `SSL_CERT_FILE` and the proxy variables are
honoured) and `file://` URLs are read; a response is at most `MAX_JWKS_BYTES`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import unquote, urlsplit

import trio

from kafka_wire.sasl.oauthbearer import JwksError, KeySet, OAuthBearerSettings, parse_jwks

__all__ = ["MAX_JWKS_BYTES", "JwksFetchError", "JwksKeys", "fetch_jwks"]

log = logging.getLogger("zonefleet.sasl.oauthbearer")

MAX_JWKS_BYTES: Final = 1 << 20
RETRY_BACKOFF_S: Final = 0.1
RETRY_BACKOFF_MAX_S: Final = 10.0


class JwksFetchError(Exception):
    """A JWKS that could not be read (the message says why; it holds no secret)."""


async def fetch_jwks(url: str, timeout_s: float) -> bytes:
    """The body of a GET of `url` (http, https or file)."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        try:
            data = await trio.Path(unquote(parts.path)).read_bytes()
        except OSError as exc:
            raise JwksFetchError(f"{url}: {exc.strerror or exc}") from None
        if len(data) > MAX_JWKS_BYTES:
            raise JwksFetchError(f"{url}: more than {MAX_JWKS_BYTES} bytes")
        return data
    if parts.scheme not in ("http", "https"):
        raise JwksFetchError(f"{url}: not an http, https or file URL")
    import httpx  # only nodes with OAUTHBEARER need it

    try:
        async with (
            httpx.AsyncClient(timeout=timeout_s, follow_redirects=True) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise JwksFetchError(f"{url}: HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise JwksFetchError(f"{url}: more than {MAX_JWKS_BYTES} bytes")
            return bytes(body)
    except httpx.HTTPError as exc:
        raise JwksFetchError(f"{url}: {type(exc).__name__}: {exc}") from None


class JwksKeys:
    """An `oauthbearer.KeySource` over one JWKS URL. `loaded` is set once a set parsed.
    Times are `clock()` seconds (trio's clock by default)."""

    def __init__(
        self,
        settings: OAuthBearerSettings,
        fetch: Callable[[str, float], Awaitable[bytes]] = fetch_jwks,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.url = settings.jwks_endpoint_url
        self.refresh_s = max(0.001, settings.jwks_refresh_ms / 1000)
        self.min_refresh_s = max(0.0, settings.jwks_min_refresh_ms / 1000)
        self.timeout_s = max(0.001, settings.jwks_timeout_ms / 1000)
        self._fetch_bytes = fetch
        self._clock = clock
        self.keys = KeySet()
        self.loaded = trio.Event()
        self.fetches = 0  # started, for tests and the log
        self._last_started = -float("inf")
        self._inflight: trio.Event | None = None
        self._last_ok = False
        self._token: trio.lowlevel.TrioToken | None = None

    # -- KeySource -------------------------------------------------------------------------

    def current(self) -> KeySet:
        return self.keys

    def refreshed(self, kid: str | None) -> KeySet:
        """Called from a worker thread of the listener: waits for a rate-limited fetch."""
        if self._token is None:  # keep_fresh has not started: nothing to wait for
            return self.keys
        return trio.from_thread.run(self.refresh_for, kid, trio_token=self._token)

    # -- the event loop's side -------------------------------------------------------------

    async def refresh_for(self, kid: str | None) -> KeySet:
        """The set after a fetch for an unknown `kid`, unless the rate limit says no."""
        if kid is not None and kid in self.keys.kids:  # a fetch since the token was checked
            return self.keys
        if self._inflight is None and self._clock() - self._last_started < self.min_refresh_s:
            log.info(
                "JWKS %s not refreshed for kid %r: the last fetch was under %.1f s ago",
                self.url,
                (kid or "")[:64],
                self.min_refresh_s,
            )
            return self.keys
        await self.fetch()
        return self.keys

    async def fetch(self) -> bool:
        """Fetches the set now, or waits for the fetch under way; whether it parsed."""
        if self._inflight is not None:
            await self._inflight.wait()
            return self._last_ok
        done = self._inflight = trio.Event()
        self._last_started = self._clock()
        self.fetches += 1
        ok = False
        try:
            with trio.fail_after(self.timeout_s):
                data = await self._fetch_bytes(self.url, self.timeout_s)
            keys = parse_jwks(data)
            ok = True
        except (JwksFetchError, JwksError, trio.TooSlowError) as exc:
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
            log.warning("JWKS %s not refreshed: %s", self.url, reason)
        finally:
            self._last_ok = ok
            self._inflight = None
            done.set()
        if ok:
            if keys.kids != self.keys.kids or not self.loaded.is_set():
                log.info("JWKS %s: keys %s", self.url, sorted(keys.kids) or "(no kid)")
                for skipped in keys.skipped:
                    log.info("JWKS %s: skipped %s", self.url, skipped)
            self.keys = keys
            self.loaded.set()
        return ok

    async def keep_fresh(self) -> None:
        """Runs for the listener's life: fetches now, then every refresh interval."""
        self._token = trio.lowlevel.current_trio_token()
        backoff = RETRY_BACKOFF_S
        while True:
            if await self.fetch():
                backoff = RETRY_BACKOFF_S
                await trio.sleep(self.refresh_s)
            else:
                await trio.sleep(backoff)
                backoff = min(RETRY_BACKOFF_MAX_S, backoff * 2)
