"""Certificate rotation without a restart: a server context rebuilt when its files change.

Each handshake takes the context current when it starts (trio's `SSLStream` is given a
context per stream), so connections already up keep the certificate they were made with and
new ones get the new certificate, as Kafka's dynamic `ssl.keystore.*` update behaves.

A rotation that leaves bad material (a corrupt certificate, a key that does not match, a key
written a moment after its certificate) must not take the listener down: the old context stays
until the files build a good one.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable

import trio

from kafka_wire.tls.context import TlsConfigError, TlsSettings, server_context

__all__ = ["Fingerprint", "ReloadingContext", "watch"]

log = logging.getLogger("zonefleet.tls")

# (mtime_ns, size, inode) of a file, None while it is missing. The inode catches a file replaced
# by rename (how certificates are rotated atomically) within the same mtime tick, which on
# Linux is a few milliseconds long.
Fingerprint = tuple[int, int, int] | None


def _fingerprints(paths: tuple[str, ...]) -> tuple[Fingerprint, ...]:
    result: list[Fingerprint] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            result.append(None)
        else:
            result.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(result)


class ReloadingContext:
    """The current `ssl.SSLContext` for `settings`, rebuilt by `reload()`.

    Building at construction raises `TlsConfigError`: a listener that cannot start with its
    material should not start. Later failures only log.
    """

    def __init__(
        self,
        settings: TlsSettings,
        build: Callable[[TlsSettings], ssl.SSLContext] = server_context,
    ) -> None:
        self._settings = settings
        self._build = build
        self._paths = settings.files()
        # Fingerprints are taken before the build: a file replaced while it is being read then
        # differs from what was recorded, and the next poll reloads again.
        self._seen = _fingerprints(self._paths)
        self._context = build(settings)

    @property
    def settings(self) -> TlsSettings:
        return self._settings

    @property
    def context(self) -> ssl.SSLContext:
        """The context for the next handshake."""
        return self._context

    def changed(self) -> bool:
        """Whether a file's (mtime_ns, size, inode) differs from when it was last loaded or refused.

        A refused state counts as seen, so a poller warns once per bad rotation, not once per
        poll; the next write to any of the files makes this true again.
        """
        return _fingerprints(self._paths) != self._seen

    def reload(self) -> bool:
        """Rebuild from the files; swap and return True if that works, else keep the current
        context, log one warning line and return False."""
        seen = _fingerprints(self._paths)
        try:
            context = self._build(self._settings)
        except TlsConfigError as e:
            self._seen = seen
            log.warning("TLS material not reloaded, keeping the current context: %s", e)
            return False
        self._seen = seen
        self._context = context
        log.info("TLS material reloaded from %s", ", ".join(self._paths))
        return True


async def watch(ctx: ReloadingContext, interval_s: float = 5.0) -> None:
    """Poll `ctx`'s files every `interval_s` seconds and reload when they change. Runs until
    cancelled."""
    while True:
        await trio.sleep(interval_s)
        if ctx.changed():
            ctx.reload()
