"""Kafka requests built from kio's schemas (walked by kafka_wire.entities) for the tests that
throw every API at the brokers: zero values with one element in every array, and hypothesis
strategies of arbitrary, mostly invalid, arguments for any request version."""

from __future__ import annotations

import struct
import time
import uuid
from functools import partial
from typing import Any

from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_wire.codec import build_request, encode_request
from kafka_wire.entities import FieldKind, FieldSpec, entity_spec
from kafka_wire.record_batch import build_batch

# Primitive arrays hold ints, strings and uuids (kio reads the zero uuid as None).
_ELEMENT_ZERO: dict[str, Any] = {"string": "", "uuid": None, "bool": False}


def one_of_each(cls: type, nulls: bool) -> dict[str, Any]:
    """Zero values with one element in every array (empty arrays skip what lies inside);
    with `nulls`, every nullable field null instead."""
    out: dict[str, Any] = {}
    for spec in entity_spec(cls).fields:
        if nulls and spec.nullable:
            out[spec.name] = None
        elif spec.kind is FieldKind.ENTITY_ARRAY:
            assert spec.entity is not None
            out[spec.name] = [one_of_each(spec.entity, nulls)]
        elif spec.kind is FieldKind.ENTITY:
            assert spec.entity is not None
            out[spec.name] = one_of_each(spec.entity, nulls)
        elif spec.kind is FieldKind.PRIMITIVE_ARRAY:
            out[spec.name] = [_ELEMENT_ZERO.get(spec.kafka_type or "", 0)]
    return out


_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_UINT_BITS = {"uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
# A timedelta or datetime of every int64 does not exist in Python; these are wide enough.
_TIME_BOUND = 2**45
# Huge arrays stay at the top level: nested ones would multiply past the frame limit.
HUGE_PRIMITIVES = 20_000
HUGE_ENTITIES = 1_000


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (-2, -1, 0, 1, 2, 3, low, high, high - 1) if low <= v <= high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _primitive(kafka_type: str, names: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    if kafka_type in _INT_BITS:
        bits = _INT_BITS[kafka_type]
        return _ints(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if kafka_type in _UINT_BITS:
        return _ints(0, 2 ** _UINT_BITS[kafka_type] - 1)
    if kafka_type in ("timedelta_i32", "timedelta_i64", "datetime_i64"):
        high = 2**31 - 1 if kafka_type == "timedelta_i32" else _TIME_BOUND
        low = -1 if kafka_type == "datetime_i64" else -(2**31)
        return _ints(low, high)
    if kafka_type == "string":
        return names
    if kafka_type == "bytes":
        return st.binary(max_size=32)
    if kafka_type == "records":
        batch = build_batch([(b"k", b"v")], timestamp_ms=int(time.time() * 1000))
        return st.one_of(st.just(batch), st.binary(max_size=80))
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "float64":
        return st.floats()
    if kafka_type == "uuid":
        return st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    if kafka_type == "error_code":
        return st.sampled_from(list(ErrorCode))
    raise AssertionError(f"no strategy for {kafka_type}")


def _field(spec: FieldSpec, top: bool, names: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    if spec.kind is FieldKind.PRIMITIVE:
        assert spec.kafka_type is not None
        value = _primitive(spec.kafka_type, names)
    elif spec.kind is FieldKind.ENTITY:
        assert spec.entity is not None
        value = _entity(spec.entity, False, names)
    else:
        if spec.kind is FieldKind.PRIMITIVE_ARRAY:
            assert spec.kafka_type is not None
            element: st.SearchStrategy[Any] = _primitive(spec.kafka_type, names)
            huge = HUGE_PRIMITIVES
        else:
            assert spec.entity is not None
            element, huge = _entity(spec.entity, False, names), HUGE_ENTITIES
        value = st.lists(element, max_size=3)
        if top:
            value = st.one_of(value, element.map(partial(_repeated, huge)))
    if spec.nullable:
        value = st.one_of(st.none(), value)
    return value


def _repeated(count: int, value: Any) -> list[Any]:
    return [value] * count


def _entity(cls: type, top: bool, names: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    fields = {f.name: _field(f, top, names) for f in entity_spec(cls).fields}
    return st.fixed_dictionaries(fields)


def request_data(
    key: int, version: int, names: st.SearchStrategy[str]
) -> st.SearchStrategy[dict[str, Any]]:
    """Request dicts (for `build_request`) of any shape the schema allows: edge and random
    numbers, strings from `names`, null where nullable, and now and then a top-level array
    of a thousand or more copies of one element."""
    return _entity(type(build_request(key, version, {})), True, names)


def encodable(key: int, version: int, data: dict[str, Any]) -> Any:
    """The request entity when kio can build and encode it (strings fit their length
    prefix, and so on), else None."""
    try:
        request = build_request(key, version, data)
        encode_request(key, version, 1, "x", request)
    except (ValueError, TypeError, OverflowError, struct.error):
        return None
    return request
