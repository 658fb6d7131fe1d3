"""A small Kafka request/response client over one connection (CLI and tests)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any, Final

import trio

from kafka_wire.codec import (
    API_VERSIONS_KEY,
    KIO_VERSION_RANGES,
    build_request,
    decode_response,
    encode_request,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.framing import FrameReader, send_frame

__all__ = ["KafkaClient", "KafkaClientError", "KafkaConnectionError", "UnsupportedVersion"]

_PRODUCE_KEY: Final = 0
_API_VERSIONS_PREFERRED: Final = 3
_CORRELATION: Final = struct.Struct(">i")


class KafkaClientError(Exception):
    """A request could not be completed."""


class KafkaConnectionError(KafkaClientError):
    """The connection is closed or broken; every pending and later request fails."""


class UnsupportedVersion(KafkaClientError):
    """Neither side supports a common version of the api."""


@dataclass(slots=True)
class _Pending:
    api_key: int
    api_version: int
    frame: bytearray | None = None


def _software_version() -> str:
    try:
        return package_version("zonefleet")
    except PackageNotFoundError:
        return "0"


class KafkaClient:
    """Sends requests and matches responses by correlation id.

    Concurrent requests share the connection: whichever task holds the read lock reads
    frames and hands each one to the request it answers.
    """

    def __init__(self, stream: trio.abc.Stream, client_id: str = "zonefleet-cli") -> None:
        self._stream = stream
        self._reader = FrameReader(stream)
        self.client_id = client_id
        self._correlation = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._send_lock = trio.Lock()
        self._read_lock = trio.Lock()
        self._broken: BaseException | None = None
        self.versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        client_id: str = "zonefleet-cli",
        *,
        negotiate: bool = True,
    ) -> KafkaClient:
        """Opens a connection and (unless `negotiate` is False) fetches ApiVersions."""
        stream = await trio.open_tcp_stream(host, port)
        client = cls(stream, client_id)
        if negotiate:
            try:
                await client.api_versions()
            except BaseException:
                await client.aclose()
                raise
        return client

    def _next_correlation_id(self) -> int:
        return next(self._correlation) & 0x7FFFFFFF

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise KafkaConnectionError(f"connection unusable: {self._broken!r}")

    async def request(
        self,
        api_key: int,
        api_version: int,
        data: Mapping[str, Any] | Any,
        timeout: float = 30.0,
    ) -> Any:
        """Sends one request and returns the decoded response entity.

        `data` is a kio request entity or a dict of its fields. Produce with acks=0 gets no
        response and returns None. Raises trio.TooSlowError after `timeout` seconds.
        """
        if isinstance(data, Mapping):
            entity = build_request(api_key, api_version, data)
        else:
            entity = data
        correlation_id = self._next_correlation_id()
        payload = encode_request(api_key, api_version, correlation_id, self.client_id, entity)
        expects_response = not (api_key == _PRODUCE_KEY and getattr(entity, "acks", 1) == 0)
        slot = _Pending(api_key, api_version)
        with trio.fail_after(timeout):
            self._check_usable()
            if expects_response:
                self._pending[correlation_id] = slot
            try:
                async with self._send_lock:
                    self._check_usable()
                    try:
                        await send_frame(self._stream, [payload])
                    except BaseException as exc:
                        # A partly written frame leaves the stream out of sync.
                        self._broken = exc
                        raise
                if not expects_response:
                    return None
                await self._await_response(slot)
            finally:
                self._pending.pop(correlation_id, None)
        assert slot.frame is not None
        got_id, response = decode_response(api_key, api_version, slot.frame)
        if got_id != correlation_id:
            raise KafkaClientError(f"response {got_id} filed under {correlation_id}")
        return response

    async def _await_response(self, slot: _Pending) -> None:
        async with self._read_lock:
            while slot.frame is None:
                self._check_usable()
                try:
                    frame = await self._reader.read_frame()
                except (trio.Cancelled, trio.TooSlowError):
                    raise  # the reader is cancellation-safe; the stream stays in sync
                except BaseException as exc:
                    self._broken = exc
                    raise KafkaConnectionError(f"connection failed: {exc!r}") from exc
                if frame is None:
                    self._broken = EOFError("peer closed the connection")
                    raise KafkaConnectionError("peer closed the connection")
                if len(frame) < 4:
                    self._broken = ValueError(f"response frame of {len(frame)} bytes")
                    raise KafkaConnectionError(str(self._broken))
                (correlation_id,) = _CORRELATION.unpack_from(frame, 0)
                target = self._pending.get(correlation_id)
                # Responses to requests that timed out are dropped.
                if target is not None:
                    target.frame = frame

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        """Asks the broker for its version ranges (v3, else v0) and remembers them."""
        low, high = KIO_VERSION_RANGES[API_VERSIONS_KEY]
        version = min(_API_VERSIONS_PREFERRED, high)
        response = await self.request(
            API_VERSIONS_KEY,
            version,
            {
                "client_software_name": "zonefleet",
                "client_software_version": _software_version(),
            },
        )
        if response.error_code == ErrorCode.unsupported_version and version > low:
            # The broker answered in v0 and listed what it takes.
            ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            broker_low, broker_high = ranges.get(API_VERSIONS_KEY, (low, low))
            retry = min(version - 1, broker_high)
            if retry < max(low, broker_low):
                raise UnsupportedVersion("no common ApiVersions version")
            response = await self.request(API_VERSIONS_KEY, retry, {})
        if response.error_code != ErrorCode.none:
            raise KafkaClientError(f"ApiVersions failed: {response.error_code!r}")
        self.versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
        }
        return dict(self.versions)

    def pick_version(self, api_key: int, wanted_max: int) -> int:
        """The highest version ≤ `wanted_max` that both the broker and kio support."""
        if api_key not in self.versions:
            raise UnsupportedVersion(f"the broker does not offer api {api_key}")
        if api_key not in KIO_VERSION_RANGES:
            raise UnsupportedVersion(f"kio has no schema for api {api_key}")
        broker_low, broker_high = self.versions[api_key]
        kio_low, kio_high = KIO_VERSION_RANGES[api_key]
        chosen = min(wanted_max, broker_high, kio_high)
        if chosen < max(broker_low, kio_low):
            raise UnsupportedVersion(
                f"api {api_key}: broker {broker_low}-{broker_high}, kio {kio_low}-{kio_high}, "
                f"wanted at most {wanted_max}"
            )
        return chosen

    async def aclose(self) -> None:
        if self._broken is None:
            self._broken = KafkaConnectionError("client closed")
        await self._stream.aclose()

    async def __aenter__(self) -> KafkaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
