"""Introspection of kio's schema dataclasses: field kinds and zero values, dict-to-entity
building, and a schema-driven walker that drops unknown tagged fields (KIP-482)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.serial.readers import tz_aware_from_i64
from kio.static.primitive import i64
from typing_extensions import Buffer

__all__ = [
    "EntitySpec",
    "FieldKind",
    "FieldSpec",
    "SchemaWalkError",
    "build_entity",
    "entity_spec",
    "scan_entity",
    "skip_tagged_fields",
    "strip_unknown_tags",
    "walk_strip",
    "zero_value",
]


class FieldKind(enum.Enum):
    PRIMITIVE = "primitive"
    PRIMITIVE_ARRAY = "primitive_array"
    ENTITY = "entity"
    ENTITY_ARRAY = "entity_array"


_NO_DEFAULT: Final = object()


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """One schema field. `kafka_type` is the (element) wire type of primitive fields;
    `nullable` says whether the field itself (scalar, struct or array) may be null."""

    name: str
    kind: FieldKind
    kafka_type: str | None
    entity: type | None
    nullable: bool
    tag: int | None
    default: Any  # _NO_DEFAULT when the schema gives none


@dataclasses.dataclass(frozen=True, slots=True)
class EntitySpec:
    cls: type
    flexible: bool
    fields: tuple[FieldSpec, ...]  # all fields, declaration order
    untagged: tuple[FieldSpec, ...]  # wire order
    tagged: Mapping[int, FieldSpec]
    by_name: Mapping[str, FieldSpec]
    is_request_header: bool


def _strip_none(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return args[0], True
    return tp, False


def _field_spec(f: dataclasses.Field[Any], tp: Any) -> FieldSpec:
    inner, nullable = _strip_none(tp)
    kafka_type = f.metadata.get("kafka_type")
    entity: type | None = None
    if typing.get_origin(inner) is tuple:
        element, _ = _strip_none(typing.get_args(inner)[0])
        if dataclasses.is_dataclass(element):
            kind, entity = FieldKind.ENTITY_ARRAY, typing.cast(type, element)
        else:
            kind = FieldKind.PRIMITIVE_ARRAY
    elif dataclasses.is_dataclass(inner):
        kind, entity = FieldKind.ENTITY, typing.cast(type, inner)
    else:
        kind = FieldKind.PRIMITIVE
    if kind in (FieldKind.PRIMITIVE, FieldKind.PRIMITIVE_ARRAY) and not kafka_type:
        raise TypeError(f"field {f.name} has no kafka_type")
    if f.default is not dataclasses.MISSING:
        default: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = _NO_DEFAULT
    tag = f.metadata.get("tag")
    return FieldSpec(
        name=f.name,
        kind=kind,
        kafka_type=kafka_type,
        entity=entity,
        nullable=nullable,
        tag=None if tag is None else int(tag),
        default=default,
    )


@functools.cache
def entity_spec(cls: type) -> EntitySpec:
    """Field layout of a kio entity class (cached)."""
    hints = typing.get_type_hints(cls)
    specs = tuple(_field_spec(f, hints[f.name]) for f in dataclasses.fields(cls))
    return EntitySpec(
        cls=cls,
        flexible=bool(getattr(cls, "__flexible__", False)),
        fields=specs,
        untagged=tuple(s for s in specs if s.tag is None),
        tagged={s.tag: s for s in specs if s.tag is not None},
        by_name={s.name: s for s in specs},
        is_request_header=cls.__name__ == "RequestHeader",
    )


_PRIMITIVE_ZERO: Final[Mapping[str, Any]] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint8": 0,
    "uint16": 0,
    "uint32": 0,
    "uint64": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "records": b"",
    "uuid": uuid.UUID(int=0),
    "error_code": ErrorCode.none,
    "timedelta_i32": timedelta(0),
    "timedelta_i64": timedelta(0),
    "datetime_i64": tz_aware_from_i64(i64(0)),
}


def zero_value(spec: FieldSpec) -> Any:
    """The schema default of a field, else its zero value."""
    if spec.default is not _NO_DEFAULT:
        return spec.default
    if spec.nullable:
        return None
    if spec.kind is FieldKind.ENTITY:
        assert spec.entity is not None
        return build_entity(spec.entity, {})
    if spec.kind is not FieldKind.PRIMITIVE:
        return ()
    assert spec.kafka_type is not None
    return _PRIMITIVE_ZERO[spec.kafka_type]


def _coerce_primitive(kafka_type: str, value: Any) -> Any:
    # Handlers may give plain ints for the types kio models as enums or time objects.
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and not isinstance(value, timedelta):
        return timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and not isinstance(value, datetime):
        return tz_aware_from_i64(i64(int(value)))
    if kafka_type == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    return value


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # An entity of another version: carry over the fields both versions have.
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"expected a dict or a kio entity, got {type(value).__name__}")


def _convert(spec: FieldSpec, value: Any) -> Any:
    if value is None:
        if spec.nullable:
            return None
        if spec.tag is not None:
            return zero_value(spec)  # tagged fields are optional by definition
        raise ValueError("not nullable")
    kind = spec.kind
    if kind is FieldKind.PRIMITIVE:
        assert spec.kafka_type is not None
        return _coerce_primitive(spec.kafka_type, value)
    if kind is FieldKind.PRIMITIVE_ARRAY:
        assert spec.kafka_type is not None
        kafka_type = spec.kafka_type
        return tuple(_coerce_primitive(kafka_type, v) for v in value)
    assert spec.entity is not None
    if kind is FieldKind.ENTITY:
        return value if type(value) is spec.entity else build_entity(spec.entity, value)
    entity = spec.entity
    return tuple(v if type(v) is entity else build_entity(entity, v) for v in value)


def build_entity(cls: type, data: Mapping[str, Any] | Any) -> Any:
    """Builds a kio entity of `cls` from a dict keyed by schema field names, recursively.

    Keys the class lacks are dropped; missing fields get their default or zero value.
    """
    if type(data) is cls:
        return data
    values = _as_mapping(data)
    spec = entity_spec(cls)
    kwargs: dict[str, Any] = {}
    for field in spec.fields:
        if field.name in values:
            try:
                kwargs[field.name] = _convert(field, values[field.name])
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{cls.__name__}.{field.name}: {exc}") from exc
        else:
            kwargs[field.name] = zero_value(field)
    return cls(**kwargs)


# --- schema walking: validation and unknown tagged field stripping ---------------------
#
# kio's Rust decoder preallocates arrays from the wire count and aborts the whole process
# when that allocation fails, and it rejects unknown tags. So every body is walked here
# first: counts and lengths are checked against the bytes left, and unknown tags found.


class SchemaWalkError(ValueError):
    """The bytes do not follow the schema."""


_FIXED_SIZE: Final[Mapping[str, int]] = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


class _Cursor:
    """Reads `buf[pos:end]`; copies what it reads to `out` unless that is None."""

    __slots__ = ("buf", "end", "out", "pos", "unknown_tags")

    def __init__(self, buf: memoryview, pos: int, end: int, out: bytearray | None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end
        self.out = out
        self.unknown_tags = 0

    def skip(self, n: int) -> int:
        """Advances over `n` bytes; returns where they start."""
        start = self.pos
        if n < 0 or start + n > self.end:
            raise SchemaWalkError(f"need {n} bytes at {start}, have {self.end - start}")
        self.pos = start + n
        return start

    def copy(self, n: int) -> None:
        start = self.skip(n)
        if self.out is not None:
            self.out += self.buf[start : self.pos]

    def copy_since(self, start: int) -> None:
        if self.out is not None:
            self.out += self.buf[start : self.pos]

    def int_be(self, n: int) -> int:
        start = self.skip(n)
        return int.from_bytes(self.buf[start : self.pos], "big", signed=True)

    def uvarint(self) -> int:
        value = shift = 0
        buf, end = self.buf, self.end
        for _ in range(5):
            if self.pos >= end:
                raise SchemaWalkError(f"varint runs past the end at {self.pos}")
            byte = buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise SchemaWalkError(f"unsigned varint longer than 5 bytes at {self.pos}")


def _put_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _walk_length_prefixed(cur: _Cursor, compact: bool, legacy_width: int) -> None:
    start = cur.pos
    if compact:
        n = cur.uvarint() - 1
    else:
        n = cur.int_be(legacy_width)
        if n < -1:
            raise SchemaWalkError(f"negative length {n} at {start}")
    cur.skip(max(n, 0))
    cur.copy_since(start)


def _walk_primitive(kafka_type: str, compact: bool, cur: _Cursor) -> None:
    size = _FIXED_SIZE.get(kafka_type)
    if size is not None:
        cur.copy(size)
    elif kafka_type == "string":
        _walk_length_prefixed(cur, compact, 2)
    elif kafka_type in ("bytes", "records"):
        _walk_length_prefixed(cur, compact, 4)
    else:
        raise SchemaWalkError(f"unknown kafka_type {kafka_type!r}")


def _array_count(cur: _Cursor, compact: bool) -> int:
    start = cur.pos
    if compact:
        n = cur.uvarint() - 1
    else:
        n = cur.int_be(4)
        if n < -1:
            raise SchemaWalkError(f"negative array length {n} at {start}")
    cur.copy_since(start)
    # Every element takes at least one byte: this bounds what a decoder may preallocate.
    if n > cur.end - cur.pos:
        raise SchemaWalkError(f"array of {n} elements in {cur.end - cur.pos} bytes")
    return max(n, 0)


def _walk_field(
    field: FieldSpec,
    flexible: bool,
    cur: _Cursor,
    *,
    in_tag: bool = False,
    legacy_string: bool = False,
) -> None:
    kind = field.kind
    if kind is FieldKind.PRIMITIVE:
        assert field.kafka_type is not None
        _walk_primitive(field.kafka_type, flexible and not legacy_string, cur)
    elif kind is FieldKind.PRIMITIVE_ARRAY:
        assert field.kafka_type is not None
        for _ in range(_array_count(cur, flexible)):
            _walk_primitive(field.kafka_type, flexible, cur)
    elif kind is FieldKind.ENTITY:
        assert field.entity is not None
        # Nullable structs (KIP-893) carry an int8 marker; tagged ones are never null.
        if field.nullable and not in_tag:
            start = cur.pos
            marker = cur.int_be(1)
            cur.copy_since(start)
            if marker == -1:
                return
            if marker != 1:
                # Java reads any negative as null, kio only -1: accept just the canonical
                # markers so that this walk and kio's decode cannot disagree.
                raise SchemaWalkError(f"nullable struct marker {marker} at {start}")
        _walk_entity(entity_spec(field.entity), cur)
    else:
        assert field.entity is not None
        spec = entity_spec(field.entity)
        for _ in range(_array_count(cur, flexible)):
            _walk_entity(spec, cur)


def _walk_entity(spec: EntitySpec, cur: _Cursor) -> None:
    for field in spec.untagged:
        _walk_field(
            field,
            spec.flexible,
            cur,
            legacy_string=spec.is_request_header and field.name == "client_id",
        )
    if not spec.flexible:
        return
    out = cur.out
    kept: list[tuple[int, bytearray]] = []
    for _ in range(cur.uvarint()):
        tag = cur.uvarint()
        size = cur.uvarint()
        start = cur.skip(size)
        tagged = spec.tagged.get(tag)
        if tagged is None:
            cur.unknown_tags += 1  # KIP-482: skip it
            continue
        # Walk known tags too: they may hold arrays, or unknown tags further down.
        inner = _Cursor(cur.buf, start, cur.pos, None if out is None else bytearray())
        _walk_field(tagged, True, inner, in_tag=True)
        if inner.pos != inner.end:
            raise SchemaWalkError(f"tag {tag} has {inner.end - inner.pos} trailing bytes")
        cur.unknown_tags += inner.unknown_tags
        if out is not None:
            assert inner.out is not None
            kept.append((tag, inner.out))
    if out is not None:
        _put_uvarint(out, len(kept))
        for tag, data in kept:
            _put_uvarint(out, tag)
            _put_uvarint(out, len(data))
            out += data


def _byte_view(buf: Buffer) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def scan_entity(entity_cls: type, buf: Buffer, offset: int = 0) -> tuple[int, int]:
    """Checks the entity at `offset` against its schema without copying.

    Returns (offset just past the entity, number of unknown tagged fields).
    """
    view = _byte_view(buf)
    cur = _Cursor(view, offset, view.nbytes, None)
    _walk_entity(entity_spec(entity_cls), cur)
    return cur.pos, cur.unknown_tags


def walk_strip(entity_cls: type, buf: Buffer, offset: int = 0) -> tuple[bytes, int]:
    """Re-encodes the entity at `offset` without unknown tagged fields.

    Returns the new bytes and the offset just past the entity in `buf`.
    """
    view = _byte_view(buf)
    cur = _Cursor(view, offset, view.nbytes, bytearray())
    _walk_entity(entity_spec(entity_cls), cur)
    assert cur.out is not None
    return bytes(cur.out), cur.pos


def strip_unknown_tags(entity_cls: type, buf: Buffer, offset: int = 0) -> bytes:
    """The entity at `offset` re-encoded with unknown tagged fields removed, known kept."""
    return walk_strip(entity_cls, buf, offset)[0]


def skip_tagged_fields(buf: Buffer, offset: int) -> int:
    """Offset just past the tagged-field section that starts at `offset`."""
    view = _byte_view(buf)
    cur = _Cursor(view, offset, view.nbytes, None)
    for _ in range(cur.uvarint()):
        cur.uvarint()
        cur.skip(cur.uvarint())
    return cur.pos
