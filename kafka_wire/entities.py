"""Introspection of kio's schema dataclasses: field kinds and zero values, dict-to-entity
building, and a schema-driven walker that drops unknown tagged fields (KIP-482)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import struct
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

from kafka_wire.varint import SchemaWalkError, read_uvarint, skip_tagged_fields_at

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


def _put_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _byte_view(buf: Buffer) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# Entities compile to plans (lists of ops) once, which keeps the walk cheap.
_FIXED, _COMPACT, _LEGACY, _ARRAY_FIXED, _ARRAY_VAR, _STRUCT, _NULLABLE, _STRUCTS = range(8)
_UNPACK_WIDTH: Final = {2: struct.Struct(">h").unpack_from, 4: struct.Struct(">i").unpack_from}
_UNPACK_I32: Final = _UNPACK_WIDTH[4]


@dataclasses.dataclass(slots=True)
class _Plan:
    ops: list[tuple[Any, ...]]
    tagged: bool  # ends with a tagged-field section
    tags: dict[int, _Plan]  # known tags, each a one-field plan
    fixed: int = -1  # size of the untagged part when it is all fixed-size fields


def _scalar_op(kafka_type: str, compact: bool, nullable: bool) -> tuple[Any, ...]:
    size = _FIXED_SIZE.get(kafka_type)
    if size is not None:
        return (_FIXED, size)
    if kafka_type not in ("string", "bytes", "records"):
        raise SchemaWalkError(f"unknown kafka_type {kafka_type!r}")
    if compact:
        return (_COMPACT, nullable)
    width = 2 if kafka_type == "string" else 4
    return (_LEGACY, _UNPACK_WIDTH[width], width, nullable)


def _field_op(field: FieldSpec, flexible: bool, in_tag: bool, legacy: bool) -> tuple[Any, ...]:
    kind = field.kind
    if kind is FieldKind.PRIMITIVE:
        assert field.kafka_type is not None
        # RequestHeader.client_id stays a legacy string even in header v2.
        return _scalar_op(field.kafka_type, flexible and not legacy, field.nullable)
    if kind is FieldKind.PRIMITIVE_ARRAY:
        assert field.kafka_type is not None
        element = _scalar_op(field.kafka_type, flexible, False)
        if element[0] == _FIXED:
            return (_ARRAY_FIXED, flexible, element[1], field.nullable)
        return (_ARRAY_VAR, flexible, element, field.nullable)
    assert field.entity is not None
    sub = _plan(field.entity)
    if kind is FieldKind.ENTITY_ARRAY:
        return (_STRUCTS, flexible, sub, field.nullable)
    # Nullable structs (KIP-893) carry an int8 marker; tagged ones are never null.
    return (_NULLABLE if field.nullable and not in_tag else _STRUCT, sub)


@functools.cache
def _plan(cls: type) -> _Plan:
    spec = entity_spec(cls)
    ops: list[tuple[Any, ...]] = []
    for field in spec.untagged:
        legacy = spec.is_request_header and field.name == "client_id"
        op = _field_op(field, spec.flexible, False, legacy)
        if op[0] == _FIXED and ops and ops[-1][0] == _FIXED:
            ops[-1] = (_FIXED, ops[-1][1] + op[1])  # one bounds check per fixed run
        else:
            ops.append(op)
    tags = {
        tag: _Plan([_field_op(field, True, True, False)], False, {})
        for tag, field in spec.tagged.items()
    }
    fixed = 0 if not ops else ops[0][1] if len(ops) == 1 and ops[0][0] == _FIXED else -1
    return _Plan(ops, spec.flexible, tags, fixed)


def _count_at(
    buf: memoryview, pos: int, end: int, compact: bool, nullable: bool
) -> tuple[int, int]:
    if compact:
        n, pos = read_uvarint(buf, pos, end)
        n -= 1
    else:
        if pos + 4 > end:
            raise SchemaWalkError(f"array length runs past the end at {pos}")
        n = _UNPACK_I32(buf, pos)[0]
        pos += 4
        if n < -1:
            raise SchemaWalkError(f"negative array length {n} at {pos - 4}")
    if n == -1 and not nullable:
        # Kafka cannot parse it either ("non-nullable field ... was serialized as null").
        raise SchemaWalkError(f"null array where the schema allows none, at {pos}")
    # Every element takes at least one byte: this bounds what a decoder may preallocate.
    if n > end - pos:
        raise SchemaWalkError(f"array of {n} elements in {end - pos} bytes")
    return max(n, 0), pos


def _scan_scalar(op: tuple[Any, ...], buf: memoryview, pos: int, end: int) -> int:
    code = op[0]
    if code == _FIXED:
        pos += op[1]
    elif code == _COMPACT:
        n, pos = read_uvarint(buf, pos, end)
        if n:
            pos += n - 1
        elif not op[1]:
            raise SchemaWalkError(f"null value where the schema allows none, at {pos}")
    else:
        width = op[2]
        if pos + width > end:
            raise SchemaWalkError(f"length runs past the end at {pos}")
        n = op[1](buf, pos)[0]
        pos += width
        if n < -1:
            raise SchemaWalkError(f"negative length {n} at {pos - width}")
        if n > 0:
            pos += n
        elif n == -1 and not op[3]:
            raise SchemaWalkError(f"null value where the schema allows none, at {pos}")
    if pos > end:
        raise SchemaWalkError(f"value runs past the end ({pos} > {end})")
    return pos


def _walk(
    plan: _Plan, buf: memoryview, pos: int, end: int, out: bytearray | None
) -> tuple[int, int]:
    """Walks one entity; returns (end offset, unknown tags seen). With `out`, also
    re-emits it there without the unknown tags."""
    unknown = 0
    mark = pos  # buf[mark:pos] is walked but not yet copied to out
    for op in plan.ops:
        code = op[0]
        if code <= _LEGACY:
            pos = _scan_scalar(op, buf, pos, end)
        elif code == _STRUCTS:
            count, pos = _count_at(buf, pos, end, op[1], op[3])
            sub = op[2]
            fixed = sub.fixed
            if fixed >= 0 and out is None:
                # Fast path for arrays of fixed-size structs (e.g. fetch partitions).
                if not sub.tagged:
                    pos += count * fixed
                    if pos > end:
                        raise SchemaWalkError(f"array runs past the end ({pos} > {end})")
                    continue
                while count and pos + fixed < end and buf[pos + fixed] == 0:
                    pos += fixed + 1  # no tagged fields in this element
                    count -= 1
            for _ in range(count):
                if out is not None:
                    out += buf[mark:pos]
                pos, found = _walk(sub, buf, pos, end, out)
                mark = pos
                unknown += found
        elif code == _ARRAY_FIXED:
            count, pos = _count_at(buf, pos, end, op[1], op[3])
            pos += count * op[2]
            if pos > end:
                raise SchemaWalkError(f"array runs past the end ({pos} > {end})")
        elif code == _ARRAY_VAR:
            count, pos = _count_at(buf, pos, end, op[1], op[3])
            element = op[2]
            for _ in range(count):
                pos = _scan_scalar(element, buf, pos, end)
        else:
            if code == _NULLABLE:
                if pos >= end:
                    raise SchemaWalkError(f"struct marker runs past the end at {pos}")
                marker = buf[pos]
                pos += 1
                if marker == 0xFF:
                    continue
                if marker != 1:
                    # Java reads any negative marker as null, kio only -1: accept just the
                    # canonical markers so that this walk and kio's decode cannot disagree.
                    raise SchemaWalkError(f"nullable struct marker {marker} at {pos - 1}")
            if out is not None:
                out += buf[mark:pos]
            pos, found = _walk(op[1], buf, pos, end, out)
            mark = pos
            unknown += found
    if out is not None:
        out += buf[mark:pos]
    if not plan.tagged:
        return pos, unknown
    count, pos = read_uvarint(buf, pos, end)
    if count > end - pos:
        raise SchemaWalkError(f"{count} tagged fields in {end - pos} bytes")
    kept: list[tuple[int, bytearray]] = []
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        tag_end = pos + size
        if tag_end > end:
            raise SchemaWalkError(f"tag {tag} runs past the end ({tag_end} > {end})")
        sub_plan = plan.tags.get(tag)
        if sub_plan is None:
            unknown += 1  # KIP-482: skip it
        else:
            # Known tags are walked too: they may hold arrays, or unknown tags.
            inner = None if out is None else bytearray()
            inner_end, found = _walk(sub_plan, buf, pos, tag_end, inner)
            if inner_end != tag_end:
                raise SchemaWalkError(f"tag {tag} has {tag_end - inner_end} trailing bytes")
            unknown += found
            if inner is not None:
                kept.append((tag, inner))
        pos = tag_end
    if out is not None:
        _put_uvarint(out, len(kept))
        for tag, data in kept:
            _put_uvarint(out, tag)
            _put_uvarint(out, len(data))
            out += data
    return pos, unknown


def _start(buf: Buffer, offset: int) -> memoryview:
    view = _byte_view(buf)
    if not 0 <= offset <= view.nbytes:
        raise SchemaWalkError(f"offset {offset} outside the buffer")
    return view


def scan_entity(entity_cls: type, buf: Buffer, offset: int = 0) -> tuple[int, int]:
    """Checks the entity at `offset` against its schema without copying.

    Returns (offset just past the entity, number of unknown tagged fields).
    """
    view = _start(buf, offset)
    return _walk(_plan(entity_cls), view, offset, view.nbytes, None)


def walk_strip(entity_cls: type, buf: Buffer, offset: int = 0) -> tuple[bytes, int]:
    """Re-encodes the entity at `offset` without unknown tagged fields.

    Returns the new bytes and the offset just past the entity in `buf`.
    """
    view = _start(buf, offset)
    out = bytearray()
    end, _ = _walk(_plan(entity_cls), view, offset, view.nbytes, out)
    return bytes(out), end


def strip_unknown_tags(entity_cls: type, buf: Buffer, offset: int = 0) -> bytes:
    """The entity at `offset` re-encoded with unknown tagged fields removed, known kept."""
    return walk_strip(entity_cls, buf, offset)[0]


def skip_tagged_fields(buf: Buffer, offset: int) -> int:
    """Offset just past the tagged-field section that starts at `offset`."""
    view = _start(buf, offset)
    return skip_tagged_fields_at(view, offset, view.nbytes)
