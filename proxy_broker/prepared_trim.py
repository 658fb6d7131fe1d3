"""Which of this proxy's PREPARED records the mains may still need: the floor for its WAL's
retention (issue 4, "Trim rules").

Each main's state stream carries its links floor (main_broker/links_floor.py): per proxy
writer, the lowest PREPARED offset one of its LINKs not yet in committed objects points to.
This proxy's segments wholly below the lowest of those floors are free. A main that is not
connected or has not sent its first full frame since (re)subscribing may need more than it last
said: it blocks the trim, and only the age limit of shared_wal.PreparedTrim frees segments
then, still never above the last floor any main reported (a disconnected main's included).
That covers a restart of the proxy too: nothing goes before the age limit until every main has
told it its floor afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["FloorSource", "prepared_floor"]


class FloorSource(Protocol):
    @property
    def connected(self) -> bool: ...

    @property
    def links(self) -> dict[str, int] | None: ...


def prepared_floor(writer: str, mains: Iterable[FloorSource], wal_end: int) -> tuple[int, bool]:
    """The lowest offset of `writer`'s WAL that a main's last reported floor still needs
    (`wal_end`: none), and whether every main is connected and reported since subscribing."""
    floor, complete = wal_end, True
    for main in mains:
        links = main.links
        if not main.connected or links is None:
            complete = False
        if links is not None and writer in links:
            floor = min(floor, links[writer])
    return floor, complete
