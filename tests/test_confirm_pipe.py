"""The proxy's confirm pipe against a scripted main: pipelining, sessions, order, size."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import msgpack
import pytest
import trio
import trio.testing
from kio.schema.errors import ErrorCode

from internal_rpc import RpcError, RpcRemoteError, RpcTimeout, RpcUnavailable
from internal_rpc.messages import CONFIRM_VERSION, BatchSummary, ConfirmParams
from proxy_broker.confirm_pipe import (
    SESSION_IDLE_RESET_S,
    ConfirmPipe,
    ConfirmRequest,
    PreparedPart,
)
from shared_wal import AppendTicket, WalError, WalPosition
from tests.test_rpc_messages import PARAMS_V2

_positions = itertools.count(1000, 100)


@dataclass
class Call:
    params: dict[str, Any]
    timeout: float
    retries: int
    idempotent: bool
    answered: trio.Event = field(default_factory=trio.Event)
    error: RpcError | None = None

    @property
    def confirm(self) -> ConfirmParams:
        return ConfirmParams.from_wire(self.params)

    @property
    def session(self) -> str:
        assert self.confirm.session is not None
        return self.confirm.session

    @property
    def seq(self) -> int:
        assert self.confirm.seq is not None
        return self.confirm.seq

    @property
    def positions(self) -> list[int]:
        return [p.position for p in self.confirm.parts]

    def answer(self) -> None:
        self.answered.set()

    def fail(self, error: RpcError) -> None:
        self.error = error
        self.answered.set()


class ScriptedMain:
    """Stands in for RpcClient: each confirm waits until the test answers or fails it; the
    answer gives every partition its PREPARED byte position as base offset, so a test can see
    which request got which row."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._changed = trio.Event()

    async def call(
        self, method: str, params: dict[str, Any], *, timeout: float, retries: int, idempotent: bool
    ) -> Any:
        assert method == "confirm"
        call = Call(params, timeout, retries, idempotent)
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._changed.set()
        self._changed = trio.Event()
        try:
            await call.answered.wait()
        finally:
            self.in_flight -= 1
        if call.error is not None:
            raise call.error
        return {"parts": [[0, p, -1, 0, None] for p in call.positions]}

    async def wait_calls(self, n: int) -> list[Call]:
        with trio.fail_after(5):
            while len(self.calls) < n:
                await self._changed.wait()
        return self.calls

    async def settled_calls(self) -> list[Call]:
        """The calls made once the pipe can make no more progress on its own."""
        await trio.testing.wait_all_tasks_blocked()
        return self.calls


SUMMARY = BatchSummary(70, 0, 1, 1764201600000, 1764201600000, -1, -1, -1)


class PreparedTicket:
    """A PREPARED record's WAL ticket, made durable (or failed) by the test."""

    def __init__(self, planned: WalPosition) -> None:
        self.planned = planned
        self.position: WalPosition | None = None
        self.done = False
        self._event = trio.Event()

    def resolve(self) -> None:
        self.position, self.done = self.planned, True
        self._event.set()

    def fail(self) -> None:
        self.done = True
        self._event.set()

    async def wait(self) -> WalPosition:
        await self._event.wait()
        if self.position is None:
            raise WalError("fsync failed")
        return self.position


def _request(parts: int = 1, *, prepared: bool = True, api_version: int = 9) -> ConfirmRequest:
    rows = []
    for i in range(parts):
        position = WalPosition("proxy-102", 0, next(_positions), 100)
        if prepared:
            rows.append(PreparedPart("t", i, SUMMARY, position=position))
        else:
            ticket = cast(AppendTicket, PreparedTicket(position))
            rows.append(PreparedPart("t", i, SUMMARY, ticket=ticket, payload=memoryview(b"x")))
    return ConfirmRequest(api_version, 30000, rows)


def _tickets(request: ConfirmRequest) -> list[PreparedTicket]:
    return [cast(PreparedTicket, p.ticket) for p in request.parts if p.ticket is not None]


def _make_durable(request: ConfirmRequest) -> None:
    for ticket in _tickets(request):
        ticket.resolve()


def _positions_of(request: ConfirmRequest) -> list[int]:
    out = []
    for part in request.parts:
        position = part.position
        if position is None and part.ticket is not None:
            position = cast(PreparedTicket, part.ticket).planned
        assert position is not None
        out.append(position.position)
    return out


async def _done(*requests: ConfirmRequest) -> None:
    with trio.fail_after(5):
        for request in requests:
            await request.done.wait()


def _assert_own_rows(request: ConfirmRequest) -> None:
    assert [row.error_code for row in request.results] == [ErrorCode.none] * len(request.parts)
    assert [row.base_offset for row in request.results] == _positions_of(request)


@pytest.fixture
async def piped() -> AsyncIterator[tuple[ConfirmPipe, ScriptedMain]]:
    main = ScriptedMain()
    pipe = ConfirmPipe(main, main_id=1, timeout_s=10.0, max_in_flight=3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        yield pipe, main
        nursery.cancel_scope.cancel()


async def test_calls_pipeline_up_to_the_limit_then_coalesce(
    piped: tuple[ConfirmPipe, ScriptedMain],
) -> None:
    pipe, main = piped
    first = [_request() for _ in range(3)]
    for request in first:
        pipe.submit(request)
        await main.wait_calls(len(main.calls) + 1)  # sent while the earlier ones are out
    assert main.in_flight == pipe.in_flight == 3
    waiting = [_request(), _request(2)]
    for request in waiting:
        pipe.submit(request)
    assert len(await main.settled_calls()) == 3  # no fourth call while three are out
    assert not any(r.done.is_set() for r in first + waiting)

    main.calls[1].answer()
    calls = await main.wait_calls(4)
    # What queued while all slots were busy goes out in one call once one frees up.
    assert calls[3].positions == _positions_of(waiting[0]) + _positions_of(waiting[1])
    assert len(await main.settled_calls()) == 4
    for call in calls:
        call.answer()
    await _done(*first, *waiting)
    for request in first + waiting:
        _assert_own_rows(request)
    assert main.max_in_flight == 3
    assert pipe.in_flight == 0 and pipe.calls == 4
    assert [c.seq for c in calls] == [0, 1, 2, 3]
    # The RPC contract is unchanged: one attempt plus one retry, never resent once written.
    assert all((c.timeout, c.retries, c.idempotent) == (10.0, 1, False) for c in calls)


async def test_one_in_flight_sends_the_next_call_only_after_the_previous_answer() -> None:
    main = ScriptedMain()
    pipe = ConfirmPipe(main, main_id=1, timeout_s=10.0, max_in_flight=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        requests = [_request() for _ in range(3)]
        pipe.submit(requests[0])
        await main.wait_calls(1)
        pipe.submit(requests[1])
        pipe.submit(requests[2])
        assert len(await main.settled_calls()) == 1
        main.calls[0].answer()
        calls = await main.wait_calls(2)
        assert calls[1].positions == _positions_of(requests[1]) + _positions_of(requests[2])
        calls[1].answer()
        await _done(*requests)
        assert main.max_in_flight == 1
        nursery.cancel_scope.cancel()


async def test_seq_numbers_are_consecutive_and_answers_map_back_out_of_order(
    piped: tuple[ConfirmPipe, ScriptedMain],
) -> None:
    pipe, main = piped
    requests = [_request(1), _request(3), _request(2)]
    for request in requests:
        pipe.submit(request)
        await main.wait_calls(len(main.calls) + 1)
    calls = main.calls
    assert len({c.session for c in calls}) == 1
    assert len(calls[0].session) == 12 and int(calls[0].session, 16) >= 0
    assert [c.seq for c in calls] == [0, 1, 2]
    for call, request in zip(calls, requests, strict=True):
        assert call.positions == _positions_of(request)

    # The main answers the last call first, then the first, then the middle one.
    calls[2].answer()
    await _done(requests[2])
    assert not requests[0].done.is_set() and not requests[1].done.is_set()
    calls[0].answer()
    await _done(requests[0])
    calls[1].answer()
    await _done(requests[1])
    for request in requests:
        _assert_own_rows(request)

    # The session goes on where it was while the pipe stays busy.
    later = [_request(), _request()]
    for request in later:
        pipe.submit(request)
        await main.wait_calls(len(main.calls) + 1)
    assert [(c.session, c.seq) for c in main.calls[3:]] == [
        (calls[0].session, 3),
        (calls[0].session, 4),
    ]
    for call in main.calls[3:]:
        call.answer()
    await _done(*later)


def _sent(error: RpcUnavailable) -> RpcUnavailable:
    error.request_sent = True
    return error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RpcTimeout("confirm timed out"), ErrorCode.request_timed_out),
        # Never written to the main: surely not appended.
        (RpcUnavailable("connection refused"), ErrorCode.not_leader_or_follower),
        # Written, then the connection dropped (the main was killed): possibly appended, so
        # the client must retry with its sequence, not bump its epoch and resend as new.
        (_sent(RpcUnavailable("connection dropped")), ErrorCode.request_timed_out),
    ],
)
async def test_a_failed_call_starts_a_new_session_for_later_calls(
    piped: tuple[ConfirmPipe, ScriptedMain], error: RpcError, code: ErrorCode
) -> None:
    pipe, main = piped
    old = [_request(), _request(2)]
    for request in old:
        pipe.submit(request)
        await main.wait_calls(len(main.calls) + 1)
    session = main.calls[0].session
    assert [(c.session, c.seq) for c in main.calls] == [(session, 0), (session, 1)]

    main.calls[0].fail(error)
    await _done(old[0])
    assert [row.error_code for row in old[0].results] == [code]
    assert pipe.session != session

    later = [_request(), _request()]
    for request in later:
        pipe.submit(request)
        await main.wait_calls(len(main.calls) + 1)
    new = pipe.session
    assert len(new) == 12
    assert [(c.session, c.seq) for c in main.calls[2:]] == [(new, 0), (new, 1)]

    # The old session's straggler fails too; the new session is not thrown away for it.
    main.calls[1].fail(RpcTimeout("behind the lost seq"))
    await _done(old[1])
    assert [row.error_code for row in old[1].results] == [ErrorCode.request_timed_out] * 2
    assert pipe.session == new
    for call in main.calls[2:]:
        call.answer()
    await _done(*later)
    for request in later:
        _assert_own_rows(request)
    tail = _request()
    pipe.submit(tail)
    call = (await main.wait_calls(5))[4]
    assert (call.session, call.seq) == (new, 2)
    call.answer()
    await _done(tail)


async def test_an_idle_pipe_starts_a_new_session(mock_clock: trio.testing.MockClock) -> None:
    main = ScriptedMain()
    pipe = ConfirmPipe(main, main_id=1, timeout_s=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        for expected_seq in (0, 1):
            request = _request()
            pipe.submit(request)
            call = (await main.wait_calls(expected_seq + 1))[-1]
            call.answer()
            await _done(request)
            assert call.seq == expected_seq
        session = main.calls[0].session
        assert main.calls[1].session == session
        mock_clock.jump(SESSION_IDLE_RESET_S)  # the main may have forgotten it, or restarted
        request = _request()
        pipe.submit(request)
        call = (await main.wait_calls(3))[-1]
        assert call.session != session and call.seq == 0
        call.answer()
        await _done(request)
        nursery.cancel_scope.cancel()


async def test_requests_are_sent_in_queue_order_once_prepared(
    piped: tuple[ConfirmPipe, ScriptedMain],
) -> None:
    pipe, main = piped
    remembered: list[WalPosition] = []
    pipe.on_prepared = lambda position, payload: remembered.append(position)
    head = _request(prepared=False)
    ready = _request()
    pipe.submit(head)
    pipe.submit(ready)
    assert await main.settled_calls() == []  # a prepared request never overtakes the head

    _make_durable(head)
    calls = await main.wait_calls(1)
    assert calls[0].positions == _positions_of(head) + _positions_of(ready)

    # Only the prepared prefix goes out: c waits behind b though it is ready.
    a, b, c = _request(), _request(prepared=False), _request()
    for request in (a, b, c):
        pipe.submit(request)
    calls = await main.settled_calls()
    assert len(calls) == 2 and calls[1].positions == _positions_of(a)
    _make_durable(b)
    calls = await main.wait_calls(3)
    assert calls[2].positions == _positions_of(b) + _positions_of(c)
    assert [call.seq for call in calls] == [0, 1, 2]
    for call in calls:
        call.answer()
    await _done(head, ready, a, b, c)

    # A request that failed while preparing is dropped, not sent; d still goes out.
    broken, d = _request(prepared=False), _request()
    pipe.submit(broken)
    pipe.submit(d)
    for ticket in _tickets(broken):
        ticket.fail()
    calls = await main.wait_calls(4)
    assert calls[3].positions == _positions_of(d)
    calls[3].answer()
    await _done(d)
    for request in (head, ready, a, b, c, d):
        _assert_own_rows(request)
    assert broken.results[0].error_code == ErrorCode.kafka_storage_error
    # The proxy keeps the bytes of each durable PREPARED record, in WAL order.
    assert [p.position for p in remembered] == _positions_of(head) + _positions_of(b)


async def test_api_versions_are_not_mixed_in_one_call(
    piped: tuple[ConfirmPipe, ScriptedMain],
) -> None:
    pipe, main = piped
    for n in range(1, 4):
        pipe.submit(_request())
        await main.wait_calls(n)
    v9, v7, v7b = _request(api_version=9), _request(api_version=7), _request(api_version=7)
    for request in (v9, v7, v7b):
        pipe.submit(request)
    for call in main.calls[:3]:
        call.answer()
    calls = await main.wait_calls(5)
    assert [(c.confirm.produce_version, c.positions) for c in calls[3:]] == [
        (9, _positions_of(v9)),
        (7, _positions_of(v7) + _positions_of(v7b)),
    ]
    for call in calls[3:]:
        call.answer()
    await _done(v9, v7, v7b)


async def test_one_partition_confirm_stays_small(piped: tuple[ConfirmPipe, ScriptedMain]) -> None:
    pipe, main = piped
    # A realistic worst case: a long topic name, a segment far into the log, a 1 MiB batch.
    # Its summary at every field's limit: 2 GiB, every attribute bit, 2**31-1 records,
    # timestamps and a producer id at 2**62, the highest epoch and sequence.
    summary = BatchSummary(2**31 - 1, 0x7F, 2**31 - 1, 2**62, 2**62, 2**62, 2**15 - 1, 2**31 - 1)
    position = WalPosition("proxy-102", 2**40, 2**26, 2**20)
    request = ConfirmRequest(
        9, 30000, [PreparedPart("orders.eu-west-1.v2", 11, summary, position=position)]
    )
    pipe._next_seq = 2**31  # a long-lived session
    pipe.submit(request)
    call = (await main.wait_calls(1))[0]
    size = len(msgpack.packb(call.params, use_bin_type=True))
    assert size <= 200, size
    typical = replace(call.confirm, seq=5, parts=PARAMS_V2.parts)
    typical_size = len(msgpack.packb(typical.to_wire(), use_bin_type=True))
    assert typical_size <= 100, typical_size
    call.answer()
    await _done(request)


def test_the_limit_must_allow_a_call() -> None:
    with pytest.raises(ValueError):
        ConfirmPipe(ScriptedMain(), main_id=1, timeout_s=1.0, max_in_flight=0)


async def test_a_main_of_an_earlier_release_gets_the_version_it_reads(
    piped: tuple[ConfirmPipe, ScriptedMain],
) -> None:
    """A rolling upgrade: a main of an earlier release refuses a newer confirm before it
    decodes any part; the pipe answers those partitions with a retriable error and sends that
    main one version lower from then on, down to version 1 (no batch summaries)."""
    pipe, main = piped
    for n, version in enumerate(range(CONFIRM_VERSION, 1, -1)):
        request = _request()
        pipe.submit(request)
        call = (await main.wait_calls(n + 1))[n]
        assert call.params["mv"] == version
        assert all(p.batch is not None for p in call.confirm.parts)
        call.fail(
            RpcRemoteError("UnsupportedMessageVersion", f"confirm version {version}; knows 1")
        )
        await _done(request)
        assert request.results[0].error_code == ErrorCode.not_leader_or_follower
    retry = _request()
    pipe.submit(retry)
    call = (await main.wait_calls(CONFIRM_VERSION))[-1]
    assert call.params["mv"] == 1 and len(call.params["parts"][0]) == 6
    call.answer()
    await _done(retry)
    _assert_own_rows(retry)


async def test_a_request_answered_while_queued_is_never_confirmed() -> None:
    # The proxy answers a Produce whose confirm did not come in time (a main across a
    # partition) and fails its request: the client may send those records again under a new
    # producer epoch, so the queued confirm must not reach the main when it is back.
    main = ScriptedMain()
    pipe = ConfirmPipe(main, main_id=1, timeout_s=10.0, max_in_flight=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        first, answered, later = _request(), _request(), _request()
        pipe.submit(first)
        await main.wait_calls(1)
        pipe.submit(answered)
        pipe.submit(later)
        answered.fail(ErrorCode.request_timed_out, "answered before its confirm")
        main.calls[0].answer()
        call = (await main.wait_calls(2))[1]
        assert call.positions == _positions_of(later)  # `answered` was skipped
        call.answer()
        await _done(first, later)
        assert len(await main.settled_calls()) == 2
        nursery.cancel_scope.cancel()


async def test_a_failed_call_fails_what_waits_behind_it_and_reports_the_doubt() -> None:
    """A request queued behind a failed confirm came before the client heard of the failure:
    sent on, a producer's later batch could be appended while the failed one was not (the
    main answers OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka then sends both again as new).
    It fails too, and each part answered "possibly written" is reported."""
    main = ScriptedMain()
    doubted: list[tuple[int, int]] = []
    pipe = ConfirmPipe(
        main,
        main_id=1,
        timeout_s=10.0,
        max_in_flight=1,
        on_outcome=lambda part, doubt: (
            doubted.append((part.partition, part.position.position)) if doubt else None
        ),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        first, queued = _request(), _request(2)
        pipe.submit(first)
        await main.wait_calls(1)
        pipe.submit(queued)  # waits: one call in flight at most
        await trio.testing.wait_all_tasks_blocked()
        main.calls[0].fail(RpcTimeout("confirm timed out"))
        await _done(first, queued)
        assert [r.error_code for r in first.results] == [ErrorCode.request_timed_out]
        assert [r.error_code for r in queued.results] == [ErrorCode.request_timed_out] * 2
        assert "an earlier confirm failed" in (queued.results[0].error_message or "")
        assert sorted(doubted) == sorted(
            (p.partition, pos)
            for r in (first, queued)
            for p, pos in zip(r.parts, _positions_of(r), strict=True)
        )
        # Nothing of it was sent; the next request goes out on a new session.
        assert len(await main.settled_calls()) == 1
        later = _request()
        pipe.submit(later)
        call = (await main.wait_calls(2))[1]
        assert (call.session, call.seq) == (pipe.session, 0)
        call.answer()
        await _done(later)
        nursery.cancel_scope.cancel()


async def test_calls_riding_a_broken_session_are_in_doubt_until_answered() -> None:
    """The main applies a session's confirms in order: once one call fails, the others still
    out on that session may never be applied, or only late. Their batches are in doubt (a
    later batch of their producers must not overtake them) until their answers come."""
    main = ScriptedMain()
    told: list[tuple[int, bool]] = []
    pipe = ConfirmPipe(
        main,
        main_id=1,
        timeout_s=10.0,
        max_in_flight=2,
        on_outcome=lambda part, doubt: told.append((part.position.position, doubt)),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.run)
        first, second = _request(), _request()
        for request in (first, second):
            pipe.submit(request)
            await main.wait_calls(len(main.calls) + 1)
        main.calls[0].fail(RpcTimeout("confirm timed out"))
        await _done(first)
        [p1], [p2] = _positions_of(first), _positions_of(second)
        assert told == [(p1, True), (p2, True)]
        main.calls[1].answer()  # applied after all
        await _done(second)
        assert told[-1] == (p2, False)
        nursery.cancel_scope.cancel()
