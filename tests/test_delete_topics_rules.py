"""DeleteTopics request rules as Kafka applies them (ControllerApis.deleteTopics), pure."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from main_broker.api.topics_admin import (
    NAME_AND_ID,
    NAME_OF_GIVEN_ID,
    NEITHER_NAME_NOR_ID,
    UNKNOWN_TOPIC_ID_MESSAGE,
    UNKNOWN_TOPIC_MESSAGE,
    plan_delete_topics,
)

FOO, BAR, BAZ = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
EXISTING = {"foo": FOO.bytes, "bar": BAR.bytes, "baz": BAZ.bytes}
INVALID = ErrorCode.invalid_request


def _rows(errors: list[dict[str, object]]) -> set[tuple[object, ...]]:
    return {(e["name"], e["topic_id"], e["error_code"], e["error_message"]) for e in errors}


def test_kafkas_invalid_rows_delete_nothing() -> None:
    # The rows of Kafka's ControllerApisTest for the same rules.
    rows = [
        (None, None),
        ("foo", FOO),
        ("bar", None),
        (None, BAR),
        ("quux", None),
        ("quux", None),
        ("quux", None),
        (None, BAZ),
        (None, BAZ),
        (None, BAZ),
    ]
    delete, errors = plan_delete_topics([], rows, EXISTING)
    assert delete == {}
    assert _rows(errors) == {
        (None, None, INVALID, NEITHER_NAME_NOR_ID),
        ("foo", FOO, INVALID, NAME_AND_ID),
        ("bar", BAR, INVALID, NAME_OF_GIVEN_ID),
        ("quux", None, INVALID, "Duplicate topic name."),
        (None, BAZ, INVALID, "Duplicate topic id."),
    }
    assert len(errors) == 5


def test_by_name_and_by_id() -> None:
    unknown = uuid.uuid4()
    delete, errors = plan_delete_topics(
        [], [("foo", None), (None, BAR), (None, unknown), ("nope", None)], EXISTING
    )
    assert delete == {FOO: "foo", BAR: "bar"}
    assert _rows(errors) == {
        (None, unknown, ErrorCode.unknown_topic_id, UNKNOWN_TOPIC_ID_MESSAGE),
        ("nope", None, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE),
    }


def test_v0_to_v5_names() -> None:
    delete, errors = plan_delete_topics(["foo", "baz", "baz", "", "nope"], [], EXISTING)
    assert delete == {FOO: "foo"}
    assert _rows(errors) == {
        ("baz", None, INVALID, "Duplicate topic name."),
        ("", None, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE),
        ("nope", None, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE),
    }
