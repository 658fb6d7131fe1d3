"""Request/response codec facade over kio: headers, bodies, and the ApiVersions fallback.

The brokers use only this module (never kio directly) to turn frames into kio entities and
kio entities into response bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from typing_extensions import Buffer

from kafka_wire.entities import (
    SchemaWalkError,
    build_entity,
    entity_spec,
    scan_entity,
    skip_tagged_fields,
    strip_unknown_tags,
    walk_strip,
)

log = logging.getLogger("zonefleet.wire.codec")

__all__ = [
    "API_VERSIONS_KEY",
    "KIO_VERSION_RANGES",
    "MalformedMessage",
    "MalformedRequest",
    "MalformedResponse",
    "RequestHeader",
    "UnsupportedApi",
    "api_versions_unsupported",
    "build_request",
    "build_response",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "entity_to_data",
    "parse_request_header",
    "request_is_flexible",
    "strip_unknown_tags",
    "warm_up",
]

API_VERSIONS_KEY: Final = 18
_HEADER_FIXED: Final = struct.Struct(">hhih")  # api_key, api_version, correlation_id, len
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_HEADER_IDS: Final = struct.Struct(">hhi")


class MalformedMessage(Exception):
    """Bytes that cannot be decoded; the message says why."""


class MalformedRequest(MalformedMessage):
    """A request frame that cannot be decoded."""


class MalformedResponse(MalformedMessage):
    """A response frame that cannot be decoded."""


class UnsupportedApi(ValueError):
    """kio has no schema for this api key and version."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes the header occupies in the frame


def _kio_ranges(entity_type: EntityType) -> dict[int, tuple[int, int]]:
    ranges: dict[int, tuple[int, int]] = {}
    for api_key, name in api_key_map.items():
        versions = [v for v, kinds in schema_name_map[name].items() if entity_type in kinds]
        if versions:
            ranges[api_key] = (min(versions), max(versions))
    return ranges


#: Per api key, the (min, max) versions kio has request schemas for.
KIO_VERSION_RANGES: Final[dict[int, tuple[int, int]]] = _kio_ranges(EntityType.request)


# Caches are keyed only by versions kio knows, never by arbitrary values off the wire.
_load_request: Final = functools.cache(load_request_schema)
_load_response: Final = functools.cache(load_response_schema)


def _request_class(api_key: int, api_version: int) -> type[Any] | None:
    low, high = KIO_VERSION_RANGES.get(api_key, (0, -1))
    if not low <= api_version <= high:
        return None
    return _load_request(api_key, api_version)


def _response_class(api_key: int, api_version: int) -> type[Any] | None:
    low, high = KIO_VERSION_RANGES.get(api_key, (0, -1))
    if not low <= api_version <= high:
        return None
    return _load_response(api_key, api_version)


def warm_up(versions: Mapping[int, tuple[int, int]]) -> int:
    """Load the schemas of every (api, version) a broker serves; returns how many.

    kio imports a schema module on first use, which costs milliseconds per version; a broker
    calls this before it listens so the first requests of a client do not pay for it.
    """
    count = 0
    for api_key, (low, high) in versions.items():
        for version in range(low, high + 1):
            for cls in (_request_class(api_key, version), _response_class(api_key, version)):
                if cls is not None:
                    entity_spec(cls)  # type: ignore[arg-type]
                    count += 1
            request_is_flexible(api_key, version)
    return count


@functools.cache
def _first_flexible(api_key: int) -> int | None:
    low, high = KIO_VERSION_RANGES[api_key]
    for version in range(low, high + 1):
        cls = _request_class(api_key, version)
        if cls is not None and cls.__flexible__:
            return version
    return None


def request_is_flexible(api_key: int, api_version: int) -> bool:
    """Whether the request uses header v2 and compact encodings.

    Kafka's flexible ranges are open-ended ("N+"), so a version above what kio knows is
    flexible when kio's newest is. Unknown api keys are not flexible (header v1).
    """
    cls = _request_class(api_key, api_version)
    if cls is not None:
        return bool(cls.__flexible__)
    if api_key not in KIO_VERSION_RANGES or api_version < 0:
        return False
    first = _first_flexible(api_key)
    if first is None:
        return False
    return api_version >= first or first == KIO_VERSION_RANGES[api_key][0]


def _byte_view(buf: Buffer) -> memoryview:
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    # kio's Rust decoder refuses writable buffers; a read-only view costs no copy.
    return view.toreadonly()


def parse_request_header(frame: Buffer) -> RequestHeader:
    """Parses the request header at the start of `frame`.

    Works for unsupported apis/versions too; raises only MalformedRequest.
    """
    try:
        view = _byte_view(frame)
    except (TypeError, ValueError) as exc:
        raise MalformedRequest(f"not a byte buffer: {exc}") from exc
    if view.nbytes < _HEADER_FIXED.size:
        raise MalformedRequest(f"request header truncated ({view.nbytes} bytes)")
    api_key, api_version, correlation_id, id_len = _HEADER_FIXED.unpack_from(view, 0)
    pos = _HEADER_FIXED.size
    client_id: str | None
    if id_len == -1:
        client_id = None
    elif id_len < 0:
        raise MalformedRequest(f"client_id has negative length {id_len}")
    elif pos + id_len > view.nbytes:
        raise MalformedRequest("client_id runs past the end of the frame")
    else:
        # Kafka decodes client ids leniently; so do we.
        client_id = str(view[pos : pos + id_len], "utf-8", "replace")
        pos += id_len
    if request_is_flexible(api_key, api_version):
        try:
            pos = skip_tagged_fields(view, pos)
        except SchemaWalkError as exc:
            raise MalformedRequest(f"bad request header tagged fields: {exc}") from exc
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


def _decode_body(cls: type, view: memoryview, offset: int, error: type[MalformedMessage]) -> Any:
    name = cls.__name__
    # Walk first: kio would abort the process on absurd array counts, and it rejects the
    # unknown tagged fields that KIP-482 says to skip.
    try:
        end, unknown_tags = scan_entity(cls, view, offset)
        if end != view.nbytes:
            if error is not MalformedRequest:
                raise error(f"{view.nbytes - end} trailing bytes after {name}")
            # Kafka ignores bytes after a request's last field, and librdkafka relies on it:
            # from 2.x it writes an all-topics Metadata (v9+) topics count as 4 bytes where a
            # 1-byte varint belongs (confluentinc/librdkafka#5049); Kafka reads the first as
            # a null array, then the booleans, and skips the rest. So do we.
            log.debug("ignoring %d trailing bytes after %s", view.nbytes - end, name)
            view = view[:end]
        if unknown_tags:
            body: memoryview | bytes = walk_strip(cls, view, offset)[0]
            offset = 0
        else:
            body = view
        entity, size = _reader(cls)(body, offset)
    except MalformedMessage:
        raise
    except Exception as exc:
        raise error(f"cannot decode {name}: {exc!r}") from exc
    if offset + size != len(body):
        raise error(f"{name} decoded {size} of {len(body) - offset} bytes")
    return entity


def decode_request(header: RequestHeader, frame: Buffer) -> Any:
    """The kio request entity in `frame` after the header; raises only MalformedRequest."""
    cls = _request_class(header.api_key, header.api_version)
    if cls is None:
        raise MalformedRequest(f"no schema for api {header.api_key} v{header.api_version}")
    try:
        view = _byte_view(frame)
    except (TypeError, ValueError) as exc:
        raise MalformedRequest(f"not a byte buffer: {exc}") from exc
    return _decode_body(cls, view, header.size, MalformedRequest)


def _response_header_flexible(api_key: int, response_cls: type[Any]) -> bool:
    # ApiVersions answers with header v0 at every version, so that a client can always
    # read the error and the supported ranges.
    return api_key != API_VERSIONS_KEY and bool(response_cls.__flexible__)


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """Response header plus body, without the frame size prefix."""
    cls = type(response)
    buf = io.BytesIO()
    buf.write(_I32.pack(header.correlation_id))
    if _response_header_flexible(header.api_key, cls):
        buf.write(b"\x00")  # no tagged fields
    entity_writer(cls)(buf, response)
    return buf.getvalue()


def build_response(api_key: int, api_version: int, data: Mapping[str, Any]) -> Any:
    """The kio response entity of exactly this version, built from a plain dict."""
    cls = _response_class(api_key, api_version)
    if cls is None:
        raise UnsupportedApi(f"no response schema for api {api_key} v{api_version}")
    return build_entity(cls, data)


def entity_to_data(entity: Any) -> Any:
    """A decoded kio entity as plain dicts and lists, the form `build_response` takes back.

    Lets a relay rewrite a response (zone routing) without knowing its version's classes.
    """
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        return {f.name: entity_to_data(getattr(entity, f.name)) for f in dataclasses.fields(entity)}
    if isinstance(entity, tuple | list):
        return [entity_to_data(item) for item in entity]
    return entity


def build_request(api_key: int, api_version: int, data: Mapping[str, Any]) -> Any:
    """The kio request entity of exactly this version, built from a plain dict."""
    cls = _request_class(api_key, api_version)
    if cls is None:
        raise UnsupportedApi(f"no request schema for api {api_key} v{api_version}")
    return build_entity(cls, data)


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, request: Any
) -> bytes:
    """Request header plus body, without the frame size prefix."""
    cls = type(request)
    if (cls.__api_key__, cls.__version__) != (api_key, api_version):
        raise ValueError(
            f"{cls.__name__} is api {cls.__api_key__} v{cls.__version__}, "
            f"not api {api_key} v{api_version}"
        )
    buf = io.BytesIO()
    buf.write(_HEADER_IDS.pack(api_key, api_version, correlation_id))
    if client_id is None:
        buf.write(_I16.pack(-1))
    else:
        encoded = client_id.encode()
        buf.write(_I16.pack(len(encoded)))
        buf.write(encoded)
    if cls.__flexible__:
        buf.write(b"\x00")  # header v2: no tagged fields
    entity_writer(cls)(buf, request)
    return buf.getvalue()


def decode_response(api_key: int, api_version: int, frame: Buffer) -> tuple[int, Any]:
    """(correlation_id, entity) from a response frame; raises only MalformedResponse.

    An ApiVersions response carrying UNSUPPORTED_VERSION is decoded as v0, which is the
    layout brokers use for it whatever version was asked.
    """
    cls = _response_class(api_key, api_version)
    if cls is None:
        raise MalformedResponse(f"no response schema for api {api_key} v{api_version}")
    try:
        view = _byte_view(frame)
    except (TypeError, ValueError) as exc:
        raise MalformedResponse(f"not a byte buffer: {exc}") from exc
    if view.nbytes < 4:
        raise MalformedResponse("response header truncated")
    (correlation_id,) = _I32.unpack_from(view, 0)
    pos = 4
    if _response_header_flexible(api_key, cls):
        try:
            pos = skip_tagged_fields(view, pos)
        except SchemaWalkError as exc:
            raise MalformedResponse(f"bad response header tagged fields: {exc}") from exc
    if (
        api_key == API_VERSIONS_KEY
        and api_version > 0
        and view.nbytes >= pos + 2
        and _I16.unpack_from(view, pos)[0] == ErrorCode.unsupported_version.value
    ):
        cls = ApiVersionsResponseV0
    return correlation_id, _decode_body(cls, view, pos, MalformedResponse)


def api_versions_unsupported(
    correlation_id: int, supported: Mapping[int, tuple[int, int]]
) -> bytes:
    """A full ApiVersions v0 response (header v0 + body) with UNSUPPORTED_VERSION (35)
    and our supported ranges; clients retry with a version from it."""
    body = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=tuple(
            ApiVersionV0(api_key=key, min_version=low, max_version=high)  # type: ignore[arg-type]
            for key, (low, high) in sorted(supported.items())
        ),
    )
    buf = io.BytesIO()
    buf.write(_I32.pack(correlation_id))
    entity_writer(ApiVersionsResponseV0)(buf, body)
    return buf.getvalue()
