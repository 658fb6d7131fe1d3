"""Nothing hangs (issue 5): every advertised API key and version, through a zone proxy and
directly to a main of `zonefleet up --zones 3`, with zero values, with invalid arguments drawn
from the request's own schema (hypothesis), and as mutated bytes. A schema-valid request gets
a well-formed answer; garbage gets an answer or a clean close; never a hang, and the fleet
keeps serving. APIs that are not advertised get a clean close (ApiVersions: UNSUPPORTED_VERSION).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_wire.codec import (
    API_VERSIONS_KEY,
    KIO_VERSION_RANGES,
    MalformedMessage,
    build_request,
    decode_request,
    decode_response,
    encode_request,
    parse_request_header,
)
from main_broker.broker import advertised_versions
from tests.fleet_process import FleetProcess
from tests.kafka_requests import encodable, one_of_each, request_data
from tests.raw_kafka import RawKafka
from tests.zone_fleet import ZoneFleet, _healthy, create_topic, start_up_fleet

ADVERTISED = advertised_versions()
NOT_ADVERTISED = sorted(set(KIO_VERSION_RANGES) - set(ADVERTISED))
API_PRODUCE, API_FETCH, API_JOIN_GROUP = 0, 1, 11
ANSWER_WITHIN_S = 5.0
# A JoinGroup that really joins waits out the initial rebalance delay; still seconds.
JOIN_WITHIN_S = 10.0
TOPIC = f"every-api-{uuid.uuid4().hex[:6]}"
GROUP = f"every-api-group-{uuid.uuid4().hex[:6]}"
TARGETS = ("proxy", "main")
# Examples per API version and mutated requests in all: the module runs in about two minutes.
# Raise them for a deeper run (EVERY_API_EXAMPLES=25 EVERY_API_MUTATIONS=2000 --timeout 0).
EXAMPLES = int(os.environ.get("EVERY_API_EXAMPLES", "2"))
MUTATIONS = int(os.environ.get("EVERY_API_MUTATIONS", "150"))


class Fleet:
    def __init__(self, proc: FleetProcess, zones: ZoneFleet) -> None:
        self.proc = proc
        self.zones = zones

    def __repr__(self) -> str:  # hypothesis prints it with every failing example
        return "Fleet()"

    def bootstrap(self, target: str) -> str:
        # The az2 proxy relays to mains of other zones too; the main is az3's own.
        if target == "proxy":
            return self.zones.bootstrap("az2")
        main = next(m.broker for m in self.zones.config.mains if m.broker.zone == "az3")
        return f"{main.host}:{main.port}"

    def check_alive(self) -> None:
        """Every node answers /healthz, none was restarted, no handler raised."""
        config = self.zones.config
        admins = [(m.admin_host, m.admin_port) for m in config.mains]
        admins += [(p.admin_host, p.admin_port) for p in config.proxies]
        sick = [a for a in admins if not _healthy(*a)]
        assert not sick, f"unhealthy nodes {sick}:\n" + "".join(self.proc.output[-40:])
        assert self.proc.proc is not None and self.proc.proc.poll() is None
        self.check_log(0)

    def log_mark(self) -> int:
        return len(self.proc.output)

    def check_log(self, mark: int) -> None:
        """No node exited or had a handler raise since `mark` (a `log_mark`)."""
        output = "".join(self.proc.output[mark:])
        for sign in (" exited with ", "request handler failed"):
            if sign in output:
                pytest.fail(f"{sign!r} in the fleet output:\n{_around(output, sign)}")
        failures = [e for e in _raised(output) if not e.startswith(CLOSE_CONNECTION)]
        if failures:
            pytest.fail(f"handlers raised: {failures}")


# A relayed request the main refuses as Kafka does (a close) comes back to the proxy as an
# RPC error, which the RPC layer logs with its traceback; any other exception is a bug.
CLOSE_CONNECTION = "kafka_wire.server_loop.CloseConnection"


def _raised(output: str) -> list[str]:
    """The exception line of every traceback in the fleet's log output."""
    lines = output.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.lstrip(" +|").startswith(("Traceback", "Exception Group Traceback")):
            continue
        for after in lines[i + 1 :]:
            text = after.lstrip(" +|")
            if text and after.lstrip(" ") == after and not text.startswith("Traceback"):
                out.append(text)
                break
    return out


def _around(text: str, needle: str, lines: int = 60) -> str:
    at = text.index(needle)
    start = text.rfind("\n", 0, at - 200) + 1
    return "\n".join(text[start:].splitlines()[:lines])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    proc, zones = start_up_fleet(tmp_path_factory.mktemp("every-api"))
    try:
        create_topic(zones, "az1", TOPIC, 3)
        _commit_offset(zones.bootstrap("az1"))
        yield Fleet(proc, zones)
    finally:
        code = proc.stop()
        assert code == 0, "zonefleet up did not stop cleanly:\n" + "".join(proc.output[-40:])


# What a client retries on OffsetCommit: the group's coordinator may be a main that has not yet
# read the new topic from the cluster metadata document (it polls it), or may be moving.
_COMMIT_RETRIABLE = {
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available,
    ErrorCode.not_coordinator,
}


def _commit_offset(bootstrap: str, timeout: float = 30.0) -> None:
    """GROUP exists (an empty group with a committed offset), so that the group APIs meet a
    real group as well as unknown ones."""
    partition = {"partition_index": 0, "committed_offset": 0, "committed_metadata": "m"}
    topics = [{"name": TOPIC, "partitions": [partition]}]
    deadline = time.monotonic() + timeout
    while True:
        raw = RawKafka(bootstrap)
        try:
            resp = raw.request(8, 2, {"group_id": GROUP, "topics": topics})
        finally:
            raw.close()
        code = resp.topics[0].partitions[0].error_code
        if code not in _COMMIT_RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a poll with a deadline: the coordinator learns the topic
    assert code == ErrorCode.none


# -- talking to a broker -----------------------------------------------------------------------


class Hang(AssertionError):
    pass


def _request_frame(key: int, version: int, data: dict[str, Any], correlation_id: int) -> bytes:
    return encode_request(
        key, version, correlation_id, "every-api", build_request(key, version, data)
    )


def _exchange(bootstrap: str, frame: bytes, within: float, expect_answer: bool = True) -> Any:
    """Sends one request frame on a new connection: its response frame, or None when the
    broker closed the connection. Then checks the connection is still in step (an
    ApiVersions on it is answered) unless it was closed."""
    raw = RawKafka(bootstrap, timeout=within)
    try:
        raw.send_frame(frame)
        answer: bytes | None = None
        if expect_answer:
            try:
                answer = raw.recv_frame()
            except (ConnectionResetError, BrokenPipeError):
                return None
            except TimeoutError:
                raise Hang(f"no answer and no close in {within} s") from None
            if answer is None:
                return None
        try:
            follow = raw.request(API_VERSIONS_KEY, 0, {})
        except (ConnectionResetError, BrokenPipeError, AssertionError):
            follow = None
        except TimeoutError:
            raise Hang(f"no answer to the next request in {within} s") from None
        if follow is None:
            if not expect_answer:
                return None
            pytest.fail("the broker answered, then closed the connection")
        assert follow.error_code == ErrorCode.none
        return answer if expect_answer else b""
    finally:
        raw.close()


def _error_codes(entity: Any) -> Iterator[ErrorCode]:
    if isinstance(entity, ErrorCode):
        yield entity
    elif dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        for f in dataclasses.fields(entity):
            yield from _error_codes(getattr(entity, f.name))
    elif isinstance(entity, tuple):
        for item in entity:
            yield from _error_codes(item)


def _check_answer(
    key: int, version: int, frame: bytes, correlation_id: int, request: Any = None
) -> Any:
    """The response decodes with its schema, answers this request and carries only Kafka
    error codes, none of them UNKNOWN_SERVER_ERROR (which means a handler failed) unless
    Kafka answers it too."""
    try:
        cid, response = decode_response(key, version, frame)
    except MalformedMessage as exc:
        pytest.fail(f"api {key} v{version}: response does not decode: {exc}")
    assert cid == correlation_id
    codes = list(_error_codes(response))
    if ErrorCode.unknown_server_error in codes and not _kafka_fails(key, request, response):
        pytest.fail(f"api {key} v{version}: UNKNOWN_SERVER_ERROR in {response!r:.2000}")
    return response


API_ALTER_USER_SCRAM_CREDENTIALS = 51


def _kafka_fails(key: int, request: Any, response: Any) -> bool:
    """Where Kafka itself answers UNKNOWN_SERVER_ERROR: a SCRAM upsertion with an empty
    salted password (its HMAC refuses the empty key in the controller)."""
    if key != API_ALTER_USER_SCRAM_CREDENTIALS or request is None:
        return False
    empty = {u.name for u in request.upsertions if not u.salted_password}
    failed = {r.user for r in response.results if r.error_code == ErrorCode.unknown_server_error}
    return failed <= empty


API_CREATE_ACLS, API_DESCRIBE_ACLS, API_DELETE_ACLS = 30, 29, 31


def _kafka_closes(key: int, request: Any) -> bool:
    """Requests that are schema-valid but that Kafka refuses while parsing (its request
    constructors validate), so it closes the connection: ACL bindings and filters with a
    field that is exactly the UNKNOWN code 0 (CreateAclsRequest.validate,
    DescribeAclsRequest/DeleteAclsRequest.normalizeAndValidate)."""

    def unknown(item: Any, *fields: str) -> bool:
        return any(getattr(item, f) == 0 for f in fields)

    acl = ("operation", "permission_type")
    if key == API_CREATE_ACLS:
        fields = ("resource_type", "resource_pattern_type", *acl)
        return any(unknown(c, *fields) for c in request.creations)
    if key == API_DESCRIBE_ACLS:
        return unknown(request, "resource_type_filter", "pattern_type_filter", *acl)
    if key == API_DELETE_ACLS:
        fields = ("resource_type_filter", "pattern_type_filter", *acl)
        return any(unknown(f, *fields) for f in request.filters)
    return False


def _no_answer_expected(key: int, request: Any) -> bool:
    return key == API_PRODUCE and request.acks == 0


def _within(key: int) -> float:
    return JOIN_WITHIN_S if key == API_JOIN_GROUP else ANSWER_WITHIN_S


def _send_valid(fleet: Fleet, target: str, key: int, version: int, request: Any) -> Any:
    """A schema-valid request must get a well-formed answer (Kafka answers every request it
    can parse, invalid arguments with error codes), promptly, on a connection still usable."""
    correlation_id = 4242
    frame = encode_request(key, version, correlation_id, "every-api", request)
    expect = not _no_answer_expected(key, request)
    mark = fleet.log_mark()
    try:
        answer = _exchange(fleet.bootstrap(target), frame, _within(key), expect)
    except Hang as exc:
        pytest.fail(f"{target}: api {key} v{version} hung: {exc}\n{request!r:.2000}")
    _check_closed_cleanly(fleet, mark, answer)
    if not expect:
        assert answer == b"", f"{target}: acks=0 Produce: connection closed"
        return None
    if _kafka_closes(key, request):
        assert answer is None, f"{target}: api {key} v{version}: answered, Kafka closes"
        return None
    assert answer is not None, (
        f"{target}: api {key} v{version}: connection closed, Kafka answers\n{request!r:.2000}"
    )
    return _check_answer(key, version, answer, correlation_id, request)


def _check_closed_cleanly(fleet: Fleet, mark: int, answer: bytes | None) -> None:
    """A close must be a refusal the broker meant (logged as such), not a handler that
    raised: the nodes' log since `mark` says which."""
    if answer is None:
        time.sleep(0.1)  # the nodes log before they close; the lines come through a pipe
    fleet.check_log(mark)


# -- what is advertised ------------------------------------------------------------------------


def _api_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    raw = RawKafka(bootstrap)
    try:
        resp = raw.request(API_VERSIONS_KEY, 3, {"client_software_name": "t"})
    finally:
        raw.close()
    assert resp.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


def test_every_node_advertises_the_same_apis(fleet: Fleet) -> None:
    config = fleet.zones.config
    nodes = [fleet.zones.bootstrap(z) for z in fleet.zones.zones]
    nodes += [f"{m.broker.host}:{m.broker.port}" for m in config.mains]
    for node in nodes:
        assert _api_versions(node) == ADVERTISED, node
    for key, (low, high) in ADVERTISED.items():
        kio_low, kio_high = KIO_VERSION_RANGES[key]
        assert kio_low <= low <= high <= kio_high


# -- 1. zero values ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(ADVERTISED))
def test_zero_value_request_of_every_version_is_answered(fleet: Fleet, key: int) -> None:
    low, high = ADVERTISED[key]
    for version in range(low, high + 1):
        cls = type(build_request(key, version, {}))
        for data in ({}, one_of_each(cls, nulls=False), one_of_each(cls, nulls=True)):
            request = build_request(key, version, data)
            for target in TARGETS:
                _send_valid(fleet, target, key, version, request)
    fleet.check_alive()


# -- 2. invalid arguments from each version's schema ------------------------------------------


def _names() -> st.SearchStrategy[str]:
    pool = [
        "",
        " ",
        ".",
        "..",
        "a" * 250,  # longer than a topic name may be
        "bad/name",
        "bad name",
        "\x00",
        "ünïcödé",
        "__consumer_offsets",
        "unknown-topic",
        TOPIC,
        GROUP,
    ]
    return st.one_of(st.sampled_from(pool), st.text(max_size=12))


def _tame(key: int, data: dict[str, Any]) -> dict[str, Any]:
    """Arguments that make Kafka itself wait, set to what lets it answer in seconds: a fetch's
    long poll, and a JoinGroup into a group that a member of an earlier example holds (it
    waits for that member to rejoin or time out)."""
    if key == API_FETCH:
        data["max_wait"] = min(max(data["max_wait"], -1), 100)
    if key == API_JOIN_GROUP and data["group_id"]:
        data["group_id"] = f"{data['group_id']}-{uuid.uuid4().hex}"
    return data


ADVERTISED_VERSIONS = [
    (k, v) for k, (low, high) in sorted(ADVERTISED.items()) for v in range(low, high + 1)
]


@pytest.mark.parametrize(("key", "version"), ADVERTISED_VERSIONS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_invalid_arguments_get_an_answer(
    fleet: Fleet, key: int, version: int, data: st.DataObject
) -> None:
    drawn = data.draw(request_data(key, version, _names()), label="data")
    assume(encodable(key, version, drawn) is not None)
    for target in TARGETS:
        # Tamed for each target: the second of two members of one group waits for the first.
        request = encodable(key, version, _tame(key, dict(drawn)))
        _send_valid(fleet, target, key, version, request)


# -- 3. mutated bytes of valid requests --------------------------------------------------------


def _mutated(data: st.DataObject) -> tuple[int, int, bytes]:
    key = data.draw(st.sampled_from(sorted(ADVERTISED)), label="key")
    version = data.draw(st.integers(*ADVERTISED[key]), label="version")
    cls = type(build_request(key, version, {}))
    shape = data.draw(st.sampled_from([{}, one_of_each(cls, nulls=False)]), label="base")
    base = bytearray(_request_frame(key, version, shape, 4243))
    for _ in range(data.draw(st.integers(1, 8))):
        # The api key, version and correlation id stay: the answer must then be this
        # request's (another api's answers are the zero-value and schema tests' business).
        pos = data.draw(st.integers(8, len(base) - 1)) if len(base) > 8 else len(base) - 1
        base[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(8, len(base)))
    return key, version, bytes(base[:cut]) + data.draw(st.binary(max_size=24))


def _legitimately_waits(frame: bytes) -> bool:
    """Whether the mutated request, as Kafka reads it, asks the broker to wait or not answer:
    a long-poll Fetch, an acks=0 Produce."""
    try:
        header = parse_request_header(frame)
        request = decode_request(header, frame)
    except MalformedMessage:
        return False
    if header.api_key == API_FETCH:
        return bool(request.max_wait > timedelta(0))
    return _no_answer_expected(header.api_key, request)


@settings(max_examples=MUTATIONS, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_requests_get_an_answer_or_a_close(fleet: Fleet, data: st.DataObject) -> None:
    key, version, frame = _mutated(data)
    assume(not _legitimately_waits(frame))
    target = data.draw(st.sampled_from(TARGETS), label="target")
    mark = fleet.log_mark()
    try:
        answer = _exchange(fleet.bootstrap(target), frame, _within(key))
    except Hang as exc:
        pytest.fail(f"{target}: mutated api {key} v{version} hung: {exc}\n{frame!r}")
    _check_closed_cleanly(fleet, mark, answer)
    if answer is not None:
        _check_answer(key, version, answer, 4243)


def test_after_the_fuzzing_every_node_is_alive(fleet: Fleet) -> None:
    fleet.check_alive()
    for target in TARGETS:
        assert _api_versions(fleet.bootstrap(target)) == ADVERTISED


# -- the negative side: what is not advertised --------------------------------------------------


def _closes(bootstrap: str, frame: bytes) -> bool:
    raw = RawKafka(bootstrap, timeout=ANSWER_WITHIN_S)
    try:
        raw.send_frame(frame)
        return raw.is_closed(timeout=ANSWER_WITHIN_S)
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        raw.close()


def _unadvertised_versions() -> list[tuple[int, int]]:
    """(key, version) pairs kio can encode that no node advertises: every version of the keys
    not advertised, and the versions just outside each advertised range."""
    out = [(key, KIO_VERSION_RANGES[key][1]) for key in NOT_ADVERTISED]
    for key, (low, high) in sorted(ADVERTISED.items()):
        if key == API_VERSIONS_KEY:
            continue
        kio_low, kio_high = KIO_VERSION_RANGES[key]
        out += [(key, v) for v in (low - 1, high + 1) if kio_low <= v <= kio_high]
    return out


@pytest.mark.parametrize(("key", "version"), _unadvertised_versions())
def test_unadvertised_api_gets_a_clean_close(fleet: Fleet, key: int, version: int) -> None:
    assert key != API_VERSIONS_KEY  # ApiVersions answers every version: next test
    frame = _request_frame(key, version, {}, 4244)
    for target in TARGETS:
        started = time.monotonic()
        assert _closes(fleet.bootstrap(target), frame), f"{target}: api {key} v{version}"
        assert time.monotonic() - started < ANSWER_WITHIN_S


@pytest.mark.parametrize("version", [ADVERTISED[API_VERSIONS_KEY][1] + 1, 99, 32767])
def test_api_versions_of_an_unknown_version_gets_unsupported_version(
    fleet: Fleet, version: int
) -> None:
    # A version kio has no schema for: the header is v2 (ApiVersions v3+ is flexible).
    frame = struct.pack(">hhih", API_VERSIONS_KEY, version, 4245, 1) + b"t" + b"\x00" + b"\x00"
    for target in TARGETS:
        answer = _exchange(fleet.bootstrap(target), frame, ANSWER_WITHIN_S)
        assert answer is not None, target
        # The error answer has the v0 layout, which decode_response knows for kio's versions.
        known = version <= KIO_VERSION_RANGES[API_VERSIONS_KEY][1]
        response = _check_answer(API_VERSIONS_KEY, version if known else 0, answer, 4245)
        assert response.error_code == ErrorCode.unsupported_version
        assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == ADVERTISED


# -- what the fuzzing found ---------------------------------------------------------------------


def _both(fleet: Fleet, key: int, version: int, data: dict[str, Any]) -> list[Any]:
    """The answers of the proxy and of the main to one request."""
    return [
        _send_valid(fleet, target, key, version, build_request(key, version, data))
        for target in TARGETS
    ]


def test_fetch_of_the_zero_topic_id_gets_unknown_topic_id(fleet: Fleet) -> None:
    # kio reads the zero UUID as None, which the fetch handler did not expect (a close).
    partition = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}
    data = {"max_wait": 0, "topics": [{"topic_id": None, "partitions": [partition]}]}
    for response in _both(fleet, API_FETCH, 13, data):
        [topic] = response.responses
        assert [p.error_code for p in topic.partitions] == [ErrorCode.unknown_topic_id]


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_v11_by_topic_id_gets_invalid_request(fleet: Fleet, version: int) -> None:
    # Kafka refuses topic ids and null names before v12 (the handler answered with a null
    # name the v10/v11 response cannot carry, and the connection was dropped).
    topic = f"meta-{version}-{uuid.uuid4().hex[:6]}"  # the fuzzing may have deleted TOPIC
    create_topic(fleet.zones, "az1", topic, 3)
    some_id = uuid.uuid4()
    topics = [{"name": None, "topic_id": some_id}, {"name": topic, "topic_id": None}]
    for response in _both(fleet, 3, version, {"topics": topics}):
        assert [(t.error_code, t.name, t.topic_id) for t in response.topics] == [
            (ErrorCode.invalid_request, "", some_id),
            (ErrorCode.invalid_request, topic, None),
        ]
        assert all(t.partitions == () for t in response.topics)
        assert response.brokers == ()  # as Kafka's error response, through a proxy too
    for response in _both(fleet, 3, version, {"topics": [{"name": None, "topic_id": None}]}):
        assert [(t.error_code, t.name) for t in response.topics] == [
            (ErrorCode.invalid_request, "")
        ]
    # By name, as before; and v12 takes topic ids.
    for response in _both(fleet, 3, version, {"topics": [{"name": topic}]}):
        assert [(t.error_code, len(t.partitions)) for t in response.topics] == [(ErrorCode.none, 3)]
    for response in _both(fleet, 3, 12, {"topics": [{"name": None, "topic_id": some_id}]}):
        assert [(t.error_code, t.name) for t in response.topics] == [
            (ErrorCode.unknown_topic_id, None)
        ]


def test_metadata_answers_each_topic_once_and_creates_no_kafka_internal_topic(
    fleet: Fleet,
) -> None:
    # Kafka reads the requested names and ids as sets; a repeated one got a row each. And a
    # Metadata request with auto-creation made an ordinary topic named __consumer_offsets,
    # which zonefleet has no use for (group offsets live in the WAL).
    topic = f"once-{uuid.uuid4().hex[:6]}"
    create_topic(fleet.zones, "az1", topic, 2)
    [described] = _both(fleet, 3, 12, {"topics": [{"name": topic}]})[1].topics
    missing = uuid.uuid4()
    by_id = [{"name": None, "topic_id": i} for i in (described.topic_id, missing, missing)]
    for response in _both(fleet, 3, 12, {"topics": [{"name": topic}, *by_id]}):
        assert [(t.name, t.error_code) for t in response.topics] == [
            (topic, ErrorCode.none),
            (None, ErrorCode.unknown_topic_id),
        ]
    for name in ("__consumer_offsets", "__transaction_state"):
        request = {"topics": [{"name": name}, {"name": name}], "allow_auto_topic_creation": True}
        for response in _both(fleet, 3, 12, request):
            assert [(t.name, t.error_code, t.is_internal) for t in response.topics] == [
                (name, ErrorCode.unknown_topic_or_partition, True)
            ]


def test_delete_topics_by_name_and_id_at_once_gets_invalid_request(fleet: Fleet) -> None:
    # Was: deleted by the name, ignoring the id; Kafka refuses such a row and deletes nothing.
    topic = f"delete-{uuid.uuid4().hex[:6]}"
    create_topic(fleet.zones, "az1", topic, 1)
    raw = RawKafka(fleet.bootstrap("main"))
    try:
        [described] = raw.request(3, 12, {"topics": [{"name": topic}]}).topics
    finally:
        raw.close()
    rows = [
        {"name": topic, "topic_id": described.topic_id},
        {"name": None, "topic_id": None},
        {"name": "gone", "topic_id": None},
        {"name": "gone", "topic_id": None},
    ]
    for response in _both(fleet, 20, 6, {"topics": rows}):
        answered = [(r.name, r.error_code, r.error_message) for r in response.responses]
        assert len(answered) == 3 and set(answered) == {
            (None, ErrorCode.invalid_request, "Neither topic name nor id were specified."),
            ("gone", ErrorCode.invalid_request, "Duplicate topic name."),
            (topic, ErrorCode.invalid_request, "You may not specify both topic name and topic id."),
        }
    for response in _both(fleet, 3, 12, {"topics": [{"name": topic}]}):
        assert [t.error_code for t in response.topics] == [ErrorCode.none]


@pytest.mark.parametrize(
    "frame",
    [
        # DescribeLogDirs v1: 1000 topics in 4 bytes.
        struct.pack(">hhih", 35, 1, 9, -1) + struct.pack(">i", 1000),
        # ListGroups v4 (flexible): 125 states in no bytes.
        struct.pack(">hhih", 16, 4, 9, -1) + b"\x00" + b"\x7e",
    ],
    ids=["describe-log-dirs", "list-groups"],
)
def test_a_malformed_request_split_over_mains_closes_cleanly(fleet: Fleet, frame: bytes) -> None:
    # A proxy relays these whole to several mains; when every main refused the frame the
    # proxy's relay failed with an exception group (logged as a handler failure).
    mark = fleet.log_mark()
    assert _exchange(fleet.bootstrap("proxy"), frame, ANSWER_WITHIN_S) is None
    _check_closed_cleanly(fleet, mark, None)


@pytest.mark.parametrize(("key", "version"), [(33, 0), (33, 2), (44, 1)])
def test_a_resource_named_many_times_is_refused_at_once(
    fleet: Fleet, key: int, version: int
) -> None:
    # Was: one cluster-document change per occurrence, seconds for a thousand of them (past
    # the client's patience); Kafka refuses every occurrence of a repeated resource.
    topic = f"configs-{key}-{version}-{uuid.uuid4().hex[:6]}"
    create_topic(fleet.zones, "az1", topic, 1)
    entry: dict[str, Any] = {"name": "retention.ms", "value": "60000"}
    resource = {"resource_type": 2, "resource_name": topic, "configs": [entry]}
    once = {"resource_type": 2, "resource_name": TOPIC, "configs": []}
    for response in _both(fleet, key, version, {"resources": [resource] * 1000 + [once]}):
        rows = [(r.resource_name, r.error_code, r.error_message) for r in response.responses]
        assert (
            rows[:1000]
            == [(topic, ErrorCode.invalid_request, "Each resource must appear at most once.")]
            * 1000
        )
        assert rows[1000][:2] in (
            (TOPIC, ErrorCode.none),
            (TOPIC, ErrorCode.unknown_topic_or_partition),
        )
    for response in _both(fleet, key, version, {"resources": [resource]}):
        assert [r.error_code for r in response.responses] == [ErrorCode.none]


@pytest.mark.parametrize("target", TARGETS)
def test_a_null_array_the_schema_does_not_allow_closes_cleanly(fleet: Fleet, target: str) -> None:
    # ListOffsets v2 whose topics array is null: Kafka cannot parse it and closes; the proxy's
    # relay plan and the main's handler met a None instead (a handler failure, then a close).
    frame = struct.pack(">hhih", 2, 2, 9, -1) + struct.pack(">ibi", -1, 0, -1)
    mark = fleet.log_mark()
    assert _exchange(fleet.bootstrap(target), frame, ANSWER_WITHIN_S) is None
    _check_closed_cleanly(fleet, mark, None)
