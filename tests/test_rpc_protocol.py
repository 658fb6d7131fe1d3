"""The sans-I/O core of internal RPC, driven directly: no socket, no trio."""

from __future__ import annotations

import math

import pytest

from internal_rpc.frames import decode_body, encode_frame
from internal_rpc.protocol import (
    CallStarted,
    CancelRequested,
    ClientSession,
    ProtocolViolation,
    Refused,
    ServerSession,
    SubscriptionStarted,
    end_message,
    error_message,
    push_message,
    result_message,
)


def test_a_request_starts_a_call_with_its_deadline() -> None:
    server = ServerSession({"echo"}, set())
    event = server.receive(ClientSession.request(1, "echo", {"a": 1}, 2.5))
    assert event == CallStarted(1, "echo", {"a": 1}, 2.5)
    assert server.in_flight == {1}
    server.finish(1)
    assert server.in_flight == set()


def test_a_request_without_a_deadline_waits_forever() -> None:
    event = ServerSession({"echo"}, set()).receive({"t": "req", "id": 4, "m": "echo"})
    assert event == CallStarted(4, "echo", {}, math.inf)


def test_refusals_name_the_method_and_answer_in_the_call_kind() -> None:
    server = ServerSession({"echo"}, {"state"}, max_in_flight=2)
    assert isinstance(server.receive(ClientSession.request(1, "echo", {}, 1)), CallStarted)
    duplicate = server.receive(ClientSession.request(1, "echo", {}, 1))
    assert isinstance(duplicate, Refused)
    assert duplicate.message == {"t": "err", "id": 1, "code": "DuplicateId", "msg": "echo"}
    unknown = server.receive(ClientSession.subscription(2, "nope", {}))
    assert isinstance(unknown, Refused)
    assert unknown.message == {"t": "end", "id": 2, "code": "UnknownStream", "msg": "nope"}
    unknown_method = server.receive(ClientSession.request(3, "nope", {}, 1))
    assert isinstance(unknown_method, Refused) and unknown_method.code == "UnknownMethod"
    assert isinstance(
        server.receive(ClientSession.subscription(4, "state", {})), SubscriptionStarted
    )
    full = server.receive(ClientSession.request(5, "echo", {}, 1))
    assert isinstance(full, Refused) and full.code == "TooManyRequests"
    assert server.in_flight == {1, 4}


def test_a_cancel_only_reaches_what_is_in_flight() -> None:
    server = ServerSession({"echo"}, set())
    server.receive(ClientSession.request(9, "echo", {}, 1))
    assert server.receive(ClientSession.cancel(9)) == CancelRequested(9)
    assert server.receive(ClientSession.cancel(10)) is None


@pytest.mark.parametrize(
    "msg",
    [
        {"t": "req", "m": "echo", "p": {}},
        {"t": "req", "id": True, "m": "echo", "p": {}},
        {"t": "res", "id": 1, "r": 1},
        {"t": "req", "id": 1, "m": 5, "p": {}},
        {"t": "sub", "id": 1, "m": "echo", "p": [1]},
    ],
)
def test_a_malformed_client_message_is_a_protocol_violation(msg: dict[str, object]) -> None:
    with pytest.raises(ProtocolViolation):
        ServerSession({"echo"}, set()).receive(msg)


def test_the_client_files_replies_and_pushes_in_their_slots() -> None:
    client = ClientSession()
    rid_call, call = client.open("echo", "tag")
    rid_sub, sub = client.open("state")
    assert (rid_call, rid_sub) == (1, 2)
    assert client.receive(push_message(rid_sub, "a")) is sub
    assert list(sub.items) == ["a"] and sub.ready() and not call.ready()
    assert client.receive(result_message(rid_call, 42)) is call
    assert call.reply == {"t": "res", "id": 1, "r": 42} and call.tag == "tag"
    client.close(rid_call)
    assert client.receive(result_message(rid_call, 43)) is None  # late: the caller gave up
    assert client.receive(end_message(rid_sub, "Boom", "x")) is sub
    assert sub.reply == {"t": "end", "id": 2, "code": "Boom", "msg": "x"}


def test_a_subscriber_that_falls_behind_overflows_and_drops_the_rest() -> None:
    client = ClientSession(max_buffered_pushes=2)
    rid, slot = client.open("state")
    for i in range(4):
        client.receive(push_message(rid, i))
    assert list(slot.items) == [0, 1] and slot.overflow


def test_the_deadline_sent_is_clamped_to_whole_milliseconds() -> None:
    assert ClientSession.request(1, "m", {}, -math.inf)["dl"] == 1
    assert ClientSession.request(1, "m", {}, 0.25)["dl"] == 250
    assert ClientSession.request(1, "m", {}, math.inf)["dl"] == 86_400_000


GOLDEN = [
    (
        ClientSession.request(7, "confirm", {}, 0.5),
        "00000022a4916b5d85a174a3726571a2696407a16da7636f6e6669726da17080a2646ccd01f4",
    ),
    (
        ClientSession.subscription(8, "state", {}),
        "0000001ae6d7e02e84a174a3737562a2696408a16da57374617465a17080",
    ),
    (ClientSession.cancel(7), "0000001228ebd1c982a174a663616e63656ca2696407"),
    (result_message(7, "ok"), "00000014137b551b83a174a3726573a2696407a172a26f6b"),
    (
        error_message(7, "DeadlineExceeded", "confirm"),
        "000000318be1232184a174a3657272a2696407a4636f6465b0446561646c696e65457863656564"
        "6564a36d7367a7636f6e6669726d",
    ),
    (push_message(8, {"e": 1}), "0000001646b4d91d83a174a470757368a2696408a16481a16501"),
    (end_message(8), "0000000fba39232e82a174a3656e64a2696408"),
]


@pytest.mark.parametrize(("msg", "golden"), GOLDEN)
def test_golden_messages(msg: dict[str, object], golden: str) -> None:
    frame = encode_frame(msg)
    assert frame.hex() == golden
    assert decode_body(frame[4:]) == msg
