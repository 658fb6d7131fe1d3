"""The links floor: per proxy WAL writer, the lowest PREPARED record this main still needs.

A LINK entry's batch lives in a proxy's PREPARED record until a committed object holds it.
The main publishes, per writer, the logical WAL offset (segment + position) of the lowest such
record on its state stream; a proxy deletes a PREPARED segment only once every main's floor is
past it (issue 4, "Trim rules"). A writer missing from the floors is needed by no LINK.

Pure bookkeeping, no I/O. `links_floor` recomputes from the partitions (after each upload);
`lower` folds in one new link (on every LINK append or replay), so between uploads the floors
only fall: a floor may be too low (a proxy keeps a segment longer), never too high.
"""

from __future__ import annotations

from collections.abc import Iterable

from main_broker.partition_log import PartitionLog
from s3_commit.manifest import StreamKey
from shared_wal import WalPosition

__all__ = ["links_floor", "lower"]


def lower(floors: dict[str, int], target: WalPosition) -> bool:
    """Fold one LINK's target into `floors`; returns whether a floor moved."""
    offset = target.segment + target.position
    current = floors.get(target.writer)
    if current is not None and current <= offset:
        return False
    floors[target.writer] = offset
    return True


def links_floor(
    plogs: Iterable[PartitionLog], uploaded_end: dict[StreamKey, int]
) -> dict[str, int]:
    """Per writer, the lowest PREPARED offset of a LINK entry no committed object holds."""
    floors: dict[str, int] = {}
    for plog in plogs:
        entries = plog.entries
        first = plog.index.first_index_at(
            uploaded_end.get(StreamKey(plog.topic_id, plog.partition), 0)
        )
        for i in range(first, len(entries)):
            link = entries[i].link
            if link is not None:
                lower(floors, link.target)
    return floors
