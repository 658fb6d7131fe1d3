"""Which sealed segments retention may delete."""

from __future__ import annotations


def segments_to_delete(
    sizes: dict[int, int],
    last_write_ms: dict[int, float],
    *,
    active: int | None,
    now_ms: float,
    retention_bytes: int | None,
    retention_ms: int | None,
    floor: int | None = None,
) -> list[int]:
    """The oldest sealed segments beyond the byte budget or older than ``retention_ms``.

    Always a prefix of the log (so what stays is contiguous), never the active segment, and
    never a segment with bytes at or beyond ``floor`` (data the owner still needs).
    """
    sealed = [s for s in sizes if s != active]
    sealed.sort()
    if active is not None:
        sealed = [s for s in sealed if s < active]
    if floor is not None:
        sealed = [s for s in sealed if s + sizes[s] <= floor]
    by_bytes = 0
    if retention_bytes is not None:
        total = sum(sizes.values())
        for s in sealed:
            if total <= retention_bytes:
                break
            total -= sizes[s]
            by_bytes += 1
    by_time = 0
    if retention_ms is not None:
        for s in sealed:
            if last_write_ms.get(s, now_ms) > now_ms - retention_ms:
                break
            by_time += 1
    return sealed[: max(by_bytes, by_time)]


def prepared_segments_to_delete(
    sizes: dict[int, int],
    last_write_ms: dict[int, float],
    *,
    active: int | None,
    now_ms: float,
    floor: int,
    complete: bool,
    min_age_ms: float,
    max_age_ms: float | None,
) -> list[int]:
    """A proxy's PREPARED segments no main needs any more: the oldest sealed segments that lie
    wholly below ``floor`` (what the mains that reported need) and were sealed ``min_age_ms``
    ago, provided every main reported (``complete``) or, failing that, they were sealed more
    than ``max_age_ms`` ago.

    Always a prefix of the log, never the active segment.
    """
    out: list[int] = []
    for s in sorted(sizes):
        if active is not None and s >= active:
            break
        age = now_ms - last_write_ms.get(s, now_ms)
        old = max_age_ms is not None and age > max_age_ms
        if s + sizes[s] > floor or age < min_age_ms or not (complete or old):
            break
        out.append(s)
    return out
