"""Reading Kafka's unsigned varints and skipping tagged-field sections (KIP-482), shared by the
schema walker and the hand-written hot codecs."""

from __future__ import annotations

__all__ = ["SchemaWalkError", "read_uvarint", "skip_tagged_fields_at"]


class SchemaWalkError(ValueError):
    """The bytes do not follow the schema."""


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the offset just past it; it must end before ``end``."""
    # One-byte varints are the norm (lengths, counts, empty tag buffers): keep them cheap.
    if pos < end:
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
    value = shift = 0
    for _ in range(5):
        if pos >= end:
            raise SchemaWalkError(f"varint runs past the end at {pos}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise SchemaWalkError(f"unsigned varint longer than 5 bytes at {pos}")


def skip_tagged_fields_at(buf: memoryview, pos: int, end: int) -> int:
    """Offset just past the tagged-field section at ``pos``, which must end by ``end``."""
    if pos < end and not buf[pos]:
        return pos + 1  # the usual empty section
    count, pos = read_uvarint(buf, pos, end)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        pos += size
        if pos > end:
            raise SchemaWalkError(f"tagged field runs past the end ({pos} > {end})")
    return pos
