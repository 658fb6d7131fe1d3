"""Typed internal messages (confirm, relay, meta_changed): golden bytes, strict decoding, and
the shapes of the previous release still accepted (docs/formats.md, "Confirm", "Relay and
metadata poke")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest

from internal_rpc.messages import (
    BatchSummary,
    ConfirmParams,
    ConfirmPart,
    ConfirmResult,
    MainUnreachable,
    MalformedMessage,
    MetaChanged,
    PartitionOutcome,
    Probe,
    RelayParams,
    RelayResult,
    UnsupportedMessageVersion,
)
from kafka_wire.hot_codecs import ProducePartitionResult
from kafka_wire.record_batch import build_batch, parse_batch_header

PARAMS = ConfirmParams(
    produce_version=9,
    timeout_ms=30000,
    parts=(ConfirmPart("orders", 3, "proxy-102", 4194304, 123456, 65536),),
    session="0a1b2c3d4e5f",
    seq=5,
)
PARAMS_GOLDEN = (
    "86"  # fixmap(6)
    "a26d76"
    "01"  # "mv": 1
    "a473657373"
    "ac306131623263336434653566"  # "sess": "0a1b2c3d4e5f"
    "a3736571"
    "05"  # "seq": 5
    "a3746d6f"
    "cd7530"  # "tmo": 30000
    "a176"
    "09"  # "v": 9
    "a570617274739196"  # "parts": [[6 elements]]
    "a66f7264657273"
    "03"
    "a970726f78792d313032"  # "orders", 3, "proxy-102"
    "ce00400000"
    "ce0001e240"
    "ce00010000"  # segment, position, length
)
# Version 2: each part carries its batch's header summary.
PARAMS_V2 = ConfirmParams(
    produce_version=9,
    timeout_ms=30000,
    parts=(
        ConfirmPart(
            "orders",
            3,
            "proxy-102",
            4194304,
            123456,
            65536,
            BatchSummary(65480, 0, 10, 1764201600000, 1764201600009, 4001, 0, 120),
        ),
    ),
    session="0a1b2c3d4e5f",
    seq=5,
)
PARAMS_V2_GOLDEN = (
    "86"  # fixmap(6)
    "a26d76"
    "02"  # "mv": 2
    "a473657373"
    "ac306131623263336434653566"  # "sess": "0a1b2c3d4e5f"
    "a3736571"
    "05"  # "seq": 5
    "a3746d6f"
    "cd7530"  # "tmo": 30000
    "a176"
    "09"  # "v": 9
    "a570617274739197"  # "parts": [[7 elements]]
    "a66f7264657273"
    "03"
    "a970726f78792d313032"  # "orders", 3, "proxy-102"
    "ce00400000"
    "ce0001e240"
    "ce00010000"  # segment, position, length
    "98"  # batch: [size, attributes, record count, first and max timestamp, pid, epoch, seq]
    "cdffc8"
    "00"
    "0a"
    "cf0000019ac29c1400"
    "cf0000019ac29c1409"
    "cd0fa1"
    "00"
    "78"
)
# Version 3: the same confirm packed tighter; `h` holds [session, seq, tmo, v] and the
# batch's max timestamp is relative to its first.
PARAMS_V3_GOLDEN = (
    "83"  # fixmap(3)
    "a26d76"
    "03"  # "mv": 3
    "a168"
    "94"  # "h": [
    "ac306131623263336434653566"  # session "0a1b2c3d4e5f"
    "05"  # seq 5
    "cd7530"  # tmo 30000
    "09"  # v 9 ]
    "a570617274739197"  # "parts": [[7 elements]]
    "a66f7264657273"
    "03"
    "a970726f78792d313032"  # "orders", 3, "proxy-102"
    "ce00400000"
    "ce0001e240"
    "ce00010000"  # segment, position, length
    "98"  # batch: [size, attributes, record count, first timestamp, max - first, pid, epoch, seq]
    "cdffc8"
    "00"
    "0a"
    "cf0000019ac29c1400"
    "09"
    "cd0fa1"
    "00"
    "78"
)
RESULT = ConfirmResult(
    (
        PartitionOutcome(0, 42, -1, 0, None),
        PartitionOutcome(87, -1, -1, 0, "keyless", ((1, "no key"),)),
    )
)
RESULT_GOLDEN = (
    "82"  # fixmap(2)
    "a26d76"
    "01"  # "mv": 1
    "a5706172747392"  # "parts": [2 rows]
    "95"
    "00"
    "2a"
    "ff"
    "00"
    "c0"  # [0, 42, -1, 0, nil]
    "96"
    "57"
    "ff"
    "ff"
    "00"
    "a76b65796c657373"  # [87, -1, -1, 0, "keyless",
    "91"
    "92"
    "01"
    "a66e6f206b6579"  #  [[1, "no key"]]]
)


def _packed(msg: Any) -> str:
    return msgpack.packb(msg, use_bin_type=True).hex()


def _unpacked(golden: str) -> Any:
    return msgpack.unpackb(bytes.fromhex(golden), raw=False)


def test_confirm_params_golden() -> None:
    assert _packed(PARAMS.to_wire()) == PARAMS_GOLDEN
    assert ConfirmParams.from_wire(_unpacked(PARAMS_GOLDEN)) == PARAMS
    assert len(bytes.fromhex(PARAMS_GOLDEN)) <= 100


def test_confirm_params_v2_golden() -> None:
    assert _packed(PARAMS_V2.to_wire(2)) == PARAMS_V2_GOLDEN
    assert ConfirmParams.from_wire(_unpacked(PARAMS_V2_GOLDEN)) == PARAMS_V2
    assert len(bytes.fromhex(PARAMS_V2_GOLDEN)) <= 200


def test_confirm_params_v3_golden() -> None:
    assert _packed(PARAMS_V2.to_wire()) == PARAMS_V3_GOLDEN
    assert ConfirmParams.from_wire(_unpacked(PARAMS_V3_GOLDEN)) == PARAMS_V2
    # 20 bytes less than version 2, on every batch a proxy takes.
    assert len(bytes.fromhex(PARAMS_V3_GOLDEN)) == len(bytes.fromhex(PARAMS_V2_GOLDEN)) - 20


def test_an_earlier_version_is_sent_on_request() -> None:
    """What a proxy sends a main of an earlier release (ConfirmPipe.version steps down)."""
    for version in (1, 2, 3):
        wire = PARAMS_V2.to_wire(version)
        assert wire["mv"] == version
        back = ConfirmParams.from_wire(wire)
        # Version 1 has no batch summaries: that main reads each payload back.
        without = replace(PARAMS_V2, parts=tuple(replace(p, batch=None) for p in PARAMS_V2.parts))
        assert back == (PARAMS_V2 if version > 1 else without)


def test_a_batch_summary_stands_for_its_header() -> None:
    """The main sees the header it would have parsed itself, offsets unassigned."""
    buf = build_batch(
        [(b"k", b"v")] * 3, timestamp_ms=1764201600000, producer_id=7, base_sequence=4
    )
    info = parse_batch_header(buf)
    summary = BatchSummary.of(info)
    seen = summary.batch_info()
    for name in (
        "size",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
        "last_sequence",
    ):
        assert getattr(seen, name) == getattr(info, name), name


def test_a_confirm_mixing_versions_of_parts_is_refused() -> None:
    part = PARAMS_V2.parts[0]
    bare = ConfirmPart("orders", 4, "proxy-102", 0, 0, 10)
    with pytest.raises(MalformedMessage, match="every part"):
        ConfirmParams(9, 100, (part, bare)).to_wire()


def test_confirm_result_golden() -> None:
    assert _packed(RESULT.to_wire()) == RESULT_GOLDEN
    assert ConfirmResult.from_wire(_unpacked(RESULT_GOLDEN), expected_parts=2) == RESULT


def test_an_unsequenced_confirm_leaves_out_sess_and_seq() -> None:
    params = ConfirmParams(7, 100, ())
    assert params.to_wire() == {"mv": 3, "h": [None, None, 100, 7], "parts": []}
    assert params.to_wire(2) == {"mv": 2, "tmo": 100, "v": 7, "parts": []}
    for version in (1, 2, 3):
        assert ConfirmParams.from_wire(params.to_wire(version)) == params
    with pytest.raises(MalformedMessage, match="together"):
        ConfirmParams(7, 100, (), session="s")


def test_the_previous_release_shapes_are_still_read() -> None:
    """No `mv`, and an `acks` that was never read: what a proxy of the previous release sends,
    and a main of the previous release answers."""
    old_params = {
        "sess": "0a1b2c3d4e5f",
        "seq": 5,
        "acks": -1,
        "tmo": 30000,
        "v": 9,
        "parts": [["orders", 3, "proxy-102", 4194304, 123456, 65536]],
    }
    assert ConfirmParams.from_wire(old_params) == PARAMS
    old_result = {"parts": [[0, 42, -1, 0, None], [87, -1, -1, 0, "keyless", [[1, "no key"]]]]}
    assert ConfirmResult.from_wire(old_result) == RESULT


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"mv": 4}, "version 4"),
        ({"mv": 3}, r"confirm\.parts\[0\] must have 7"),
        ({"mv": 3, "parts": []}, r"confirm\.h must be an array"),
        ({"mv": 3, "parts": [], "h": [None, None, 1]}, r"confirm\.h must have 4"),
        ({"mv": 3, "parts": [], "h": [5, 1, 1, 9]}, r"confirm\.h\.sess must be a string"),
        ({"mv": 3, "parts": [], "h": [None, None, 1.5, 9]}, r"confirm\.h\.tmo"),
        ({"mv": 3, "parts": [], "h": ["0a", None, 1, 9]}, "together"),
        ({"mv": "1"}, r"confirm\.mv must be an integer"),
        ({"mv": 2}, r"confirm\.parts\[0\] must have 7"),
        (
            {"mv": 2, "parts": [["t", 0, "w", 0, 0, 1, [0, 1, 2, 3, 4, 5, 6]]]},
            r"\.batch must have 8",
        ),
        (
            {"mv": 2, "parts": [["t", 0, "w", 0, 0, 1, [9, 0, 1, 2, 3.5, 4, 5, 6]]]},
            r"confirm\.parts\[0\]\.batch\.max_ts",
        ),
        ({"parts": None}, r"confirm\.parts must be an array"),
        ({"parts": [["t", 0, "w", 0, 0]]}, r"confirm\.parts\[0\] must have 6"),
        ({"parts": [["t", True, "w", 0, 0, 1]]}, r"confirm\.parts\[0\]\.partition"),
        ({"parts": [[b"t", 0, "w", 0, 0, 1]]}, r"confirm\.parts\[0\]\.topic"),
        ({"tmo": 1.5}, r"confirm\.tmo"),
        ({"sess": 5}, r"confirm\.sess"),
        ({"seq": None}, "together"),
    ],
)
def test_a_malformed_confirm_is_refused_by_name(change: dict[str, Any], match: str) -> None:
    msg = dict(PARAMS.to_wire(), **change)
    with pytest.raises(MalformedMessage, match=match):
        ConfirmParams.from_wire(msg)


def test_an_unknown_version_is_its_own_error() -> None:
    with pytest.raises(UnsupportedMessageVersion):
        ConfirmResult.from_wire({"mv": 9, "parts": []})


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ([], "must be a map"),
        ({"parts": [[0, 1, 2, 3]]}, r"parts\[0\] must have 5 or 6"),
        ({"parts": [[0, 1, 2, 3, 4]]}, r"error_message must be a string"),
        ({"parts": [[0, 1, 2, 3, None, [[1]]]]}, r"record_errors\[0\] must have 2"),
        ({"parts": [[0, 1, 2, 3, None]]} | {"mv": 0}, "version 0"),
    ],
)
def test_a_malformed_result_is_refused_by_name(msg: Any, match: str) -> None:
    with pytest.raises(MalformedMessage, match=match):
        ConfirmResult.from_wire(msg)


def test_a_result_must_answer_every_part() -> None:
    with pytest.raises(MalformedMessage, match="1 parts for the 2 confirmed"):
        ConfirmResult.from_wire({"mv": 1, "parts": [[0, 1, 2, 3, None]]}, expected_parts=2)


def test_an_outcome_round_trips_a_produce_partition_result() -> None:
    result = ProducePartitionResult(index=3, error_code=87, base_offset=-1, log_start_offset=0)
    result.error_message, result.record_errors = "keyless", [(1, "no key")]
    outcome = PartitionOutcome.of(result)
    assert outcome == RESULT.parts[1]
    into = ProducePartitionResult(index=3)
    outcome.apply_to(into)
    assert into == result


# ApiVersions v3 request header, correlation id 7, client id "test" (no body: enough here).
RELAY_FRAME = bytes.fromhex("0012000300000007000474657374")


@pytest.mark.parametrize(
    ("message", "golden"),
    [
        (
            RelayParams(RELAY_FRAME, "10.0.0.1"),
            "83a26d7601a56672616d65c40e0012000300000007000474657374a4686f7374a831302e302e302e31",
        ),
        (RelayParams(RELAY_FRAME), "82a26d7601a56672616d65c40e0012000300000007000474657374"),
        (
            RelayParams(RELAY_FRAME, "10.0.0.1", "User:alice"),
            "84a26d7601a56672616d65c40e0012000300000007000474657374a4686f7374a831302e302e302e31"
            "a97072696e636970616caa557365723a616c696365",
        ),
        (RelayResult(bytes.fromhex("0000000700")), "82a26d7601a56672616d65c4050000000700"),
        (RelayResult(None), "82a26d7601a56672616d65c0"),
        (MetaChanged(), "81a26d7601"),
    ],
)
def test_relay_and_meta_changed_golden(
    message: RelayParams | RelayResult | MetaChanged, golden: str
) -> None:
    assert _packed(message.to_wire()) == golden
    assert type(message).from_wire(_unpacked(golden)) == message


def test_relay_and_meta_changed_of_the_previous_release_are_read() -> None:
    assert RelayParams.from_wire({"frame": RELAY_FRAME, "host": "h"}) == RelayParams(
        RELAY_FRAME, "h"
    )
    assert RelayParams.from_wire({"frame": RELAY_FRAME}) == RelayParams(RELAY_FRAME)
    assert RelayResult.from_wire({"frame": None}) == RelayResult(None)
    assert MetaChanged.from_wire({}) == MetaChanged()


@pytest.mark.parametrize(
    ("decode", "msg", "match"),
    [
        (RelayParams.from_wire, {"frame": "text"}, r"relay\.frame must be binary"),
        (RelayParams.from_wire, {}, r"relay\.frame must be binary, not NoneType"),
        (RelayParams.from_wire, {"frame": b"x", "host": 1}, r"relay\.host must be a string"),
        (RelayResult.from_wire, {}, r"relay result\.frame is missing"),
        (RelayResult.from_wire, {"frame": [1]}, r"relay result\.frame must be binary"),
        (MetaChanged.from_wire, {"mv": 2}, "meta_changed version 2"),
        (MetaChanged.from_wire, None, "must be a map"),
    ],
)
def test_malformed_relay_and_meta_changed_are_refused_by_name(
    decode: Any, msg: Any, match: str
) -> None:
    with pytest.raises(MalformedMessage, match=match):
        decode(msg)


@pytest.mark.parametrize(
    ("message", "golden"),
    [
        (Probe(2), "82a26d7601a46e6f646502"),
        (
            MainUnreachable(3, "state stream lost"),
            "83a26d7601a46e6f646503a6726561736f6eb173746174652073747265616d206c6f7374",
        ),
    ],
)
def test_liveness_messages_golden(message: Probe | MainUnreachable, golden: str) -> None:
    """`probe` and `main_unreachable` (main_broker/cluster/watch.py, docs/formats.md)."""
    assert _packed(message.to_wire()) == golden
    assert type(message).from_wire(_unpacked(golden)) == message


def test_liveness_messages_are_strict() -> None:
    with pytest.raises(MalformedMessage, match=r"probe\.node"):
        Probe.from_wire({"mv": 1})
    with pytest.raises(UnsupportedMessageVersion):
        MainUnreachable.from_wire({"mv": 2, "node": 1, "reason": ""})
    # A reason is only for the log: a long one is cut, not refused.
    assert len(MainUnreachable.from_wire({"mv": 1, "node": 1, "reason": "x" * 999}).reason) == 200
