"""The log cleaner's offset map: key hash -> the latest offset of that key, in a fixed byte
budget (Kafka's `SkimpyOffsetMap` sized by `log.cleaner.dedupe.buffer.size`).

Pure, no I/O. Each slot is 24 bytes, as Kafka's (a 16-byte MD5 and an 8-byte offset): here
two independent 64-bit hashes of the key (CPython's SipHash of the bytes and a CRC-32C mixed
with the length) and the offset, in three flat `array`s allocated once, open addressing with
linear probing. Python objects per entry would cost about five times as much; these arrays
are the whole footprint, so the map's resident size is its budget.

Like Kafka's, the map never grows and never evicts: it takes entries up to `load_factor` of
its slots (0.9, `log.cleaner.io.buffer.load.factor`'s default) and then says it is full. The
cleaner stops its dirty section there (`s3_commit.cleaner.build_offset_map`). Two keys whose
hashes collide in all 128 bits would be taken for one; Kafka accepts the same for MD5.

The hashes are per process (SipHash is salted at start), which suits a map that lives for one
cleaning pass.
"""

from __future__ import annotations

from array import array

from crc32c import crc32c

__all__ = ["BYTES_PER_ENTRY", "DEFAULT_LOAD_FACTOR", "OffsetMap"]

BYTES_PER_ENTRY = 24
DEFAULT_LOAD_FACTOR = 0.9
_EMPTY = 0


def _hashes(key: bytes) -> tuple[int, int]:
    h1 = hash(key) or 1  # 0 marks an empty slot
    h2 = crc32c(key) | len(key) << 32
    return h1, h2


class OffsetMap:
    """Key -> latest offset, at most `capacity` entries within `budget_bytes`."""

    __slots__ = ("_h1", "_h2", "_offsets", "budget_bytes", "capacity", "entries", "slots")

    def __init__(self, budget_bytes: int, load_factor: float = DEFAULT_LOAD_FACTOR) -> None:
        # 1/256 of the budget is left for the arrays' headers and the last pages' rounding, so
        # the resident size stays within the budget (bench/cleaner.py measures it).
        slots = (budget_bytes - budget_bytes // 256) // BYTES_PER_ENTRY
        if slots < 2:
            raise ValueError(
                f"an offset map of {budget_bytes} bytes holds fewer than two "
                f"{BYTES_PER_ENTRY}-byte slots"
            )
        if not 0 < load_factor <= 1:
            raise ValueError(f"load factor {load_factor} must be in (0, 1]")
        self.budget_bytes = budget_bytes
        self.slots = slots
        # One slot always stays empty, so a probe for a missing key ends.
        self.capacity = max(1, min(slots - 1, int(slots * load_factor)))
        self.entries = 0
        zeros = bytes(8 * slots)
        self._h1 = array("q", zeros)
        self._h2 = array("q", zeros)
        self._offsets = array("q", zeros)

    @property
    def full(self) -> bool:
        return self.entries >= self.capacity

    @property
    def free(self) -> int:
        return self.capacity - self.entries

    @property
    def nbytes(self) -> int:
        """The bytes the slot arrays take (what the budget bounds)."""
        return 3 * 8 * self.slots

    def clear(self) -> None:
        zeros = bytes(8 * self.slots)
        self._h1 = array("q", zeros)
        self._h2 = array("q", zeros)
        self._offsets = array("q", zeros)
        self.entries = 0

    def put(self, key: bytes, offset: int) -> bool:
        """Record `offset` as the key's latest (a put of a known key replaces it). False, and
        nothing stored, when the key is new and the map is full."""
        h1, h2 = _hashes(key)
        h1s, h2s = self._h1, self._h2
        n = self.slots
        slot = h1 % n
        while True:
            current = h1s[slot]
            if current == _EMPTY:
                if self.entries >= self.capacity:
                    return False
                h1s[slot] = h1
                h2s[slot] = h2
                self._offsets[slot] = offset
                self.entries += 1
                return True
            if current == h1 and h2s[slot] == h2:
                self._offsets[slot] = offset
                return True
            slot += 1
            if slot == n:
                slot = 0

    def put_all(self, keys: list[bytes], offsets: list[int]) -> int:
        """`put` of each key with its offset, in order; how many went in before the map was
        full (len(keys) when all did). One call per batch: the cleaner's hot loop."""
        h1s, h2s, offs = self._h1, self._h2, self._offsets
        n = self.slots
        capacity = self.capacity
        entries = self.entries
        for i, key in enumerate(keys):
            h1 = hash(key) or 1
            h2 = crc32c(key) | len(key) << 32
            slot = h1 % n
            while True:
                current = h1s[slot]
                if current == _EMPTY:
                    if entries >= capacity:
                        self.entries = entries
                        return i
                    h1s[slot] = h1
                    h2s[slot] = h2
                    offs[slot] = offsets[i]
                    entries += 1
                    break
                if current == h1 and h2s[slot] == h2:
                    offs[slot] = offsets[i]
                    break
                slot += 1
                if slot == n:
                    slot = 0
        self.entries = entries
        return len(keys)

    def get_all(self, keys: list[bytes]) -> list[int]:
        """`get` of each key (one call per batch)."""
        h1s, h2s, offs = self._h1, self._h2, self._offsets
        n = self.slots
        out: list[int] = []
        append = out.append
        for key in keys:
            h1 = hash(key) or 1
            h2 = crc32c(key) | len(key) << 32
            slot = h1 % n
            while True:
                current = h1s[slot]
                if current == _EMPTY:
                    append(-1)
                    break
                if current == h1 and h2s[slot] == h2:
                    append(offs[slot])
                    break
                slot += 1
                if slot == n:
                    slot = 0
        return out

    def get(self, key: bytes) -> int:
        """The key's latest offset, -1 when the map does not hold it."""
        h1, h2 = _hashes(key)
        h1s, h2s = self._h1, self._h2
        n = self.slots
        slot = h1 % n
        while True:
            current = h1s[slot]
            if current == _EMPTY:
                return -1
            if current == h1 and h2s[slot] == h2:
                return self._offsets[slot]
            slot += 1
            if slot == n:
                slot = 0

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) >= 0

    def __len__(self) -> int:
        return self.entries
