"""A lease held by compare-and-swap on one object: at most one holder at a time, taken over
when the holder stops renewing.

The controller lease of the mains (DESIGN.md, "Cluster metadata") is one of these, at
`cluster/controller.json`. S3's conditional writes are the only linearisable primitive: a
candidate writes the lease with If-Match (or If-None-Match when there is none) once the stored
one expired, and the holder renews it the same way every third of its duration. Expiry is wall
time, so holders stop acting as holder `safety_ms` before the expiry they wrote, which covers
clock skew between nodes up to that margin. Bytes (docs/formats.md, "Controller lease"):

    {"format": 1, "holder": int, "epoch": int, "acquired_ms": int, "expires_ms": int}

The epoch grows by one each time the lease changes hands, so whatever a holder writes under
the lease can carry the epoch and be told apart from a deposed holder's writes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from s3_commit.async_store import AsyncObjectStore
from s3_commit.json_fields import expect_int
from s3_commit.object_store import ConditionalPutUnknown, ObjectStoreError, PreconditionFailed

__all__ = ["CONTROLLER_LEASE_KEY", "Lease", "LeaseFormatError", "LeaseKeeper", "next_lease"]

log = logging.getLogger("zonefleet.s3_commit.lease")

FORMAT = 1
CONTROLLER_LEASE_KEY = "cluster/controller.json"


class LeaseFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Lease:
    holder: int
    epoch: int
    acquired_ms: int
    expires_ms: int

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "holder": self.holder,
            "epoch": self.epoch,
            "acquired_ms": self.acquired_ms,
            "expires_ms": self.expires_ms,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Lease:
        try:
            raw: Any = json.loads(data)
        except ValueError as exc:
            raise LeaseFormatError(f"lease is not JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise LeaseFormatError("not a format-1 lease object")
        fields = ("holder", "epoch", "acquired_ms", "expires_ms")
        return cls(*(expect_int(raw.get(name), name, LeaseFormatError) for name in fields))


def next_lease(
    current: Lease | None, me: int, at_ms: int, duration_ms: int, dead_holder: int | None = None
) -> Lease | None:
    """The lease `me` should write now: a renewal of its own, a takeover of an expired one (or
    of none, or of `dead_holder`'s: a holder whose process is known to be gone), or None
    while someone else's is still valid."""
    if current is None:
        return Lease(me, 1, at_ms, at_ms + duration_ms)
    if current.holder == me and current.expires_ms > at_ms:
        return Lease(me, current.epoch, current.acquired_ms, at_ms + duration_ms)
    if current.expires_ms <= at_ms or (dead_holder is not None and current.holder == dead_holder):
        return Lease(me, current.epoch + 1, at_ms, at_ms + duration_ms)
    return None


def _now_ms() -> int:
    return int(time.time() * 1000)


class LeaseKeeper:
    """Competes for the lease at `key` and keeps it while this node lives.

    `holding` says whether this node may act as holder right now; `changed` is set (and then
    replaced) whenever that flips, so the holder's duties can start and stop with it.
    """

    def __init__(
        self,
        store: AsyncObjectStore,
        me: int,
        key: str = CONTROLLER_LEASE_KEY,
        duration_s: float = 10.0,
        safety_s: float = 2.0,
    ) -> None:
        if not 0 <= safety_s < duration_s / 3:
            raise ValueError("the safety margin must be under a third of the lease duration")
        self.store = store
        self.me = me
        self.key = key
        self.duration_ms = int(duration_s * 1000)
        self.safety_ms = int(safety_s * 1000)
        self.lease: Lease | None = None  # the last one seen or written
        self.etag: str | None = None
        self._valid_until = 0.0  # trio clock: act as holder only before this
        self.changed = trio.Event()
        # False while this node should not hold the lease (it may be the one cut off): it
        # gives the lease up and takes it no more until this says True again.
        self.eligible: Callable[[], bool] = lambda: True
        self._was_holding = False
        self.takeovers = 0

    @property
    def holding(self) -> bool:
        return (
            self.lease is not None
            and self.lease.holder == self.me
            and trio.current_time() < self._valid_until
        )

    @property
    def holder(self) -> int | None:
        """The holder of the last lease seen, if it has not expired."""
        if self.lease is None or self.lease.expires_ms <= _now_ms():
            return None
        return self.lease.holder

    async def seize(self, dead_holder: int) -> bool:
        """Take the lease from `dead_holder` without waiting for it to expire: only for a
        holder whose process is gone (its port refuses connections), which renews and acts no
        more. True once this node holds it."""
        await self.step(dead_holder)
        return self.holding

    async def step(self, dead_holder: int | None = None) -> None:
        """Read the lease and renew or take it when due; never raises for a lost race."""
        found = await self.store.get(self.key)
        current: Lease | None = None
        if found is not None:
            try:
                current = Lease.from_bytes(found[0])
            except LeaseFormatError as exc:
                log.warning("replacing unreadable lease %s: %s", self.key, exc)
                current = Lease(-1, 0, 0, 0)  # expired: anyone may take it
        self.lease, self.etag = current, found[1] if found is not None else None
        started = trio.current_time()
        wanted = next_lease(current, self.me, _now_ms(), self.duration_ms, dead_holder)
        if wanted is not None and not self.eligible():
            if self.holding:
                await self.release()
            wanted = None
        if wanted is not None:
            try:
                self.etag = await self.store.put(
                    self.key, wanted.to_bytes(), if_match=self.etag, if_none_match=found is None
                )
            except (PreconditionFailed, ConditionalPutUnknown) as exc:
                # Someone else wrote first (or our write's fate is unknown): re-read next round.
                log.debug("lease %s: %s", self.key, exc)
            else:
                if current is None or current.holder != self.me:
                    self.takeovers += 1
                    log.info("took lease %s, epoch %d", self.key, wanted.epoch)
                self.lease = wanted
                # Counted from before the write: the stored expiry can only be later.
                self._valid_until = started + (self.duration_ms - self.safety_ms) / 1000
        self._note_change()

    def _note_change(self) -> None:
        holding = self.holding
        if holding != self._was_holding:
            self._was_holding = holding
            self.changed.set()
            self.changed = trio.Event()

    async def run(self) -> None:
        """Renew every third of the duration while holding; otherwise check as often, so a
        dead holder's lease is taken about when it expires."""
        interval = self.duration_ms / 3000
        while True:
            try:
                await self.step()
            except (ObjectStoreError, OSError) as exc:
                log.warning("lease %s not renewed: %s", self.key, exc)
                self._note_change()
            with trio.move_on_at(min(trio.current_time() + interval, self._wake_at())):
                await trio.sleep_forever()

    def _wake_at(self) -> float:
        # A holder whose renewals fail must notice at once when its margin runs out.
        return self._valid_until if self._was_holding else float("inf")

    async def release(self) -> None:
        """Give the lease up at a clean stop, so another main takes it without waiting."""
        if not self.holding or self.lease is None:
            return
        gone = Lease(self.me, self.lease.epoch, self.lease.acquired_ms, _now_ms())
        try:
            await self.store.put(self.key, gone.to_bytes(), if_match=self.etag)
        except ObjectStoreError as exc:
            log.info("lease %s not released: %s", self.key, exc)
        self.lease = gone
        self._valid_until = 0.0
        self._note_change()
